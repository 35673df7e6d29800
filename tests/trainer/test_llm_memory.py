"""Settings that cannot fit in memory are refused before any work, in one sentence naming the setting and its value;
the estimate is a lower bound, so a run that fits is never refused."""

from __future__ import annotations

import sys
import time
from pathlib import Path

import pytest

from dfpo.trainer.config import apply_overrides, config_from_dict
from dfpo.trainer.memory import check_memory, memory_needs, pretrained_shape, tiny_shape, total_bytes
from dfpo.trainer.policy import build_char_tokenizer, build_tiny_model
from dfpo.trainer.train import Trainer

sys.path.insert(0, str(Path(__file__).parent))
from test_llm_e2e import tiny_config  # noqa: E402

GIB = 2**30
VOCAB = len(build_char_tokenizer())


def _needs(*sets: str, shortest_prompt: int = 4, with_ref: bool = False):
    cfg = config_from_dict(apply_overrides({}, list(sets)))
    return memory_needs(cfg, tiny_shape(cfg.model, VOCAB), shortest_prompt=shortest_prompt, with_ref=with_ref)


@pytest.mark.parametrize(
    "sets", [(), ("model.tiny_hidden=128", "model.tiny_layers=3", "model.tiny_heads=8", "model.tiny_intermediate=100")]
)
def test_the_tiny_models_parameters_are_counted_exactly(sets):
    cfg = config_from_dict(apply_overrides({}, list(sets)))
    tok = build_char_tokenizer()
    model = build_tiny_model(cfg.model, tok, seed=0)
    assert tiny_shape(cfg.model, len(tok)).params == sum(p.numel() for p in model.parameters())


def test_a_pretrained_configs_parameters_are_counted_exactly():
    from transformers import AutoModelForCausalLM, Qwen2Config

    config = Qwen2Config(
        vocab_size=300, hidden_size=64, intermediate_size=96, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2
    )
    model = AutoModelForCausalLM.from_config(config)
    assert pretrained_shape(config).params == sum(p.numel() for p in model.parameters())


def test_the_defaults_need_little_and_fit():
    needs = _needs()
    assert total_bytes(needs) < 64 * 2**20
    check_memory(needs, 1 * GIB, "RAM")  # nothing raised


@pytest.mark.parametrize(
    "setting, named",
    [
        (
            "model.sft_batch_size=1000000000",
            r"model.sft_batch_size=1000000000: at least .* for the supervised warm start's logits and activations",
        ),
        (
            "rollout.prompts_per_step=100000000",
            r"rollout.prompts_per_step=100000000 and rollout.group_size=8: at least .* for sampling 800000000 completions at once",
        ),
        (
            "optim.minibatch_groups=8000000",
            r"optim.minibatch_groups=8000000 and rollout.group_size=8: at least .* for the update's activations",
        ),
        (
            "model.tiny_hidden=4096",
            r"model.tiny_hidden=4096: at least 38.3 GiB for the gradients and AdamW state, 52.3 GiB for the whole run,",
        ),
    ],
)
def test_what_cannot_fit_is_refused_naming_the_setting_that_dominates(setting, named):
    extra = {"optim.minibatch_groups": ["rollout.prompts_per_step=8000000"], "model.tiny_hidden": ["model.tiny_layers=64"]}.get(
        setting.split("=")[0], []
    )
    needs = _needs(setting, *extra)
    with pytest.raises(ValueError, match=rf"^{named}.* more than the 16.0 GiB of RAM available; lower "):
        check_memory(needs, 16 * GIB, "RAM")


def test_processes_sharing_the_memory_each_need_their_own():
    needs = _needs("model.tiny_hidden=1024", "model.tiny_intermediate=4096", "model.tiny_layers=8")
    total = total_bytes(needs)
    check_memory(needs, total, "RAM")
    with pytest.raises(ValueError, match="more than the"):
        check_memory(needs, total, "RAM", processes=2)


def test_sampling_in_chunks_counts_the_chunk_not_the_batch():
    whole, chunked = _needs("rollout.prompts_per_step=4096"), _needs("rollout.prompts_per_step=4096", "rollout.batch_size=64")
    assert total_bytes(chunked) < total_bytes(whole)
    assert total_bytes(_needs("rollout.batch_size=1000000000")) == total_bytes(_needs())  # a chunk larger than the batch


def test_an_unknown_amount_of_memory_checks_nothing():
    check_memory(_needs("model.sft_batch_size=1000000000"), None, "RAM")


@pytest.mark.parametrize(
    "setting, message",
    [
        ("model.sft_batch_size=1000000000", r"^model.sft_batch_size=1000000000: at least .* for the supervised warm start's"),
        ("eval.k=1000000000", r"^data.eval_size=4 and eval.k=1000000000: at least .* for evaluating 4000000000 completions at once"),
    ],
)
def test_a_trainer_refuses_what_cannot_fit_before_any_work(tmp_path, setting, message):
    """These passed validation and then grew memory with no message (the warm start's batch of a billion prompts)."""
    t0 = time.monotonic()
    with pytest.raises(ValueError, match=message):
        Trainer(tiny_config(tmp_path, setting), quiet=True)
    assert time.monotonic() - t0 < 30
    assert not (tmp_path / "run").exists()


def test_prompts_per_step_beyond_the_train_split_is_refused_before_any_work(tmp_path):
    with pytest.raises(ValueError, match=r"^rollout.prompts_per_step=100000000 is more than the 50 prompts of the train split"):
        Trainer(tiny_config(tmp_path, "rollout.prompts_per_step=100000000"), quiet=True)
    assert not (tmp_path / "run").exists()


def test_a_tiny_model_whose_heads_have_an_odd_size_is_refused_before_any_work(tmp_path):
    """hidden 6 over 2 heads: heads of 3, which rotary embeddings cannot rotate (a RuntimeError in the first forward)."""
    with pytest.raises(ValueError, match=r"^model.tiny_hidden=6 must be a multiple of model.tiny_heads=2 with an even head size"):
        Trainer(tiny_config(tmp_path, "model.tiny_hidden=6", "model.tiny_heads=2"), quiet=True)
    assert not (tmp_path / "run").exists()


def _qwen3_06b_needs(**kw):
    """configs/qwen3-0.6b-gsm8k.toml's needs on Qwen3-0.6B's shape, with a shortest prompt of 60 tokens."""
    from dfpo.trainer.config import load_config
    from dfpo.trainer.memory import ModelShape, decoder_params
    from dfpo.trainer.model_shapes import QWEN3_06B

    f = QWEN3_06B
    kv = f["num_key_value_heads"] * f["head_dim"]
    params = decoder_params(
        f["vocab_size"],
        f["hidden_size"],
        f["intermediate_size"],
        f["num_hidden_layers"],
        f["num_attention_heads"] * f["head_dim"],
        kv,
        True,
    )
    shape = ModelShape(params, f["vocab_size"], f["hidden_size"], f["intermediate_size"], f["num_hidden_layers"], kv, tied=True)
    cfg = load_config(Path(__file__).parents[2] / "configs" / "qwen3-0.6b-gsm8k.toml")
    return {n.what: n for n in memory_needs(cfg, shape, shortest_prompt=60, with_ref=False, **kw)}


def test_a_static_cache_is_counted_whole_and_held_and_the_decoding_copy_beside_the_weights():
    """CUDA's static cache holds every row at its full width from the start and stays allocated between rollouts (the
    update included): for configs/qwen3-0.6b-gsm8k.toml the larger is evaluation's (1024 completions at once, bf16 keys
    and values, 28 layers x 8 x 128 of each per token), at least 1024 x 576 columns (60 + 512 rounded up to 64) x
    112 KiB = 63 GiB held the whole run, where a dynamic cache's lower bound is evaluation's phase at the 61-token
    prompt; and the bf16 copy of the linear weights the rollout decodes from (the tied head included) is held too."""
    dynamic = _qwen3_06b_needs(amp_bytes=2)
    static = _qwen3_06b_needs(amp_bytes=2, static_width=576)
    per_token = 28 * 2 * 8 * 128 * 2
    evaluation = "evaluating 1024 completions at once"
    held = static["the static KV cache of 1024 completions x 576 positions"]
    assert held.phase == "" and held.bytes == 1024 * 576 * per_token and 62 * GIB < held.bytes < 64 * GIB
    assert held.settings == (("data.eval_size", 256), ("eval.k", 4))
    assert dynamic[evaluation].bytes - static[evaluation].bytes == 1024 * 61 * per_token  # the phase keeps the logits only
    assert total_bytes(list(static.values())) > total_bytes(list(dynamic.values())) + 55 * GIB  # 62.5 held, 6.7 of a phase before
    copy = static["the decoding copy of the linear weights in the autocast dtype"]
    assert copy.phase == "" and copy.bytes == 2 * (static["the weights"].bytes // 4 - (2 * 28 + 1) * 1024)
    assert "the decoding copy of the linear weights in the autocast dtype" not in _qwen3_06b_needs(static_width=576)  # no autocast


def test_the_decoding_copy_counts_what_the_engine_holds():
    import torch

    from dfpo.trainer.memory import linear_params
    from dfpo.trainer.policy import decode_copy

    cfg = config_from_dict(apply_overrides({}, []))
    tok = build_char_tokenizer()
    model = build_tiny_model(cfg.model, tok, seed=0)
    assert decode_copy(model, torch.bfloat16).bytes == 2 * linear_params(tiny_shape(cfg.model, len(tok)))
