"""The shared-prompt forward (``optim.shared_prompt``): with "auto" the decoder runs each distinct prompt of a batch
once and the completions against its repeated keys and values; its hidden states, log-probs and every parameter's
gradient equal one pass over every row to float32 round-off, on tiny Qwen2, Qwen3 and Llama models with eager and sdpa
attention. A batch or model it cannot serve takes the one pass, bit for bit, and a tiny run trains the same either way."""

import math

import pytest
import torch
from tiny_run import FORMAT_REWARD_SETS, TINY_MODEL_SETS, timeless_records

from dfpo import resolve_objective
from dfpo.trainer import forward
from dfpo.trainer.config import apply_overrides, config_from_dict
from dfpo.trainer.minibatches import accumulation_weights, micro_batch
from dfpo.trainer.policy import build_char_tokenizer
from dfpo.trainer.run.layout import RunDir
from dfpo.trainer.sampler import RolloutBatch, build_batch
from dfpo.trainer.stages.old_logp import batch_logp
from dfpo.trainer.stages.update import accumulate_gradients
from dfpo.trainer.train import Trainer

pytestmark = pytest.mark.usefixtures("one_thread")

KINDS = ("qwen2", "qwen3", "llama")
ATTENTION = ("sdpa", "eager")


def _model(kind: str = "qwen2", attention: str = "sdpa", seed: int = 0, **extra):
    """A tiny randomly initialised float32 causal LM of ``kind`` over the char tokenizer's vocabulary (2 layers, GQA)."""
    from transformers import AutoModelForCausalLM, LlamaConfig, Qwen2Config, Qwen3Config

    tok = build_char_tokenizer()
    shape = dict(
        vocab_size=len(tok),
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=128,
        pad_token_id=tok.pad_token_id,
        eos_token_id=tok.eos_token_id,
    )
    config = {"qwen2": Qwen2Config, "qwen3": Qwen3Config, "llama": LlamaConfig}[kind](
        **shape, **({"head_dim": 8} if kind == "qwen3" else {}), **extra
    )
    torch.manual_seed(seed)
    return AutoModelForCausalLM.from_config(config, attn_implementation=attention).float()


def _batch(groups: int = 3, group_size: int = 4, seed: int = 0, max_len: int = 7) -> RolloutBatch:
    """``groups`` prompts of different lengths (left padding), ``group_size`` rows each, completions of 1 to
    ``max_len`` tokens (right padding), one of them ``max_len`` long."""
    tok = build_char_tokenizer()
    rng = torch.Generator().manual_seed(seed)
    prompts = [tok(f"{'9' * i}{i * 37}+{i}=", add_special_tokens=False).input_ids for i in range(groups)]
    lengths = [int(torch.randint(1, max_len + 1, (1,), generator=rng)) for _ in range(groups * group_size)]
    lengths[0] = max_len
    completions = [torch.randint(3, 13, (n,), generator=rng).tolist() for n in lengths]
    return build_batch(prompts, completions, group_size, pad_id=tok.pad_token_id, eos_ids={tok.eos_token_id}, max_new_tokens=max_len)


def _today(model, batch: RolloutBatch) -> torch.Tensor:
    """``completion_hidden`` as it was before the shared path: one decoder pass over every row (B, T, H)."""
    att = batch.attention_mask  # (B, L)
    position_ids = (att.cumsum(-1) - 1).clamp(min=0)  # (B, L)
    out = forward._base_model(model).get_decoder()(
        input_ids=batch.input_ids, attention_mask=att, position_ids=position_ids, use_cache=False
    )
    P, T = batch.prompt_width, batch.mask.shape[1]
    return out.last_hidden_state[:, P - 1 : P + T - 1]  # (B, T, H)


def _grads(model) -> dict[str, torch.Tensor]:
    """Every parameter's gradient (cloned), then the gradients zeroed."""
    grads = {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}
    model.zero_grad(set_to_none=True)
    return grads


def _assert_same_grads(shared: dict, one_pass: dict) -> None:
    """Every parameter's gradient agrees to float32 round-off: |g_shared - g_one_pass| / |g_one_pass| < 1e-4."""
    assert shared.keys() == one_pass.keys()
    for name, g in one_pass.items():
        rel = float((shared[name] - g).norm() / g.norm().clamp(min=1e-30))
        assert rel < 1e-4, (name, rel)


def test_prompt_runs_are_the_contiguous_groups_of_equal_prompts():
    """Three groups of four rows: runs (4, 4, 4); every row its own prompt, or a prompt in rows apart: None."""
    batch = _batch()
    P = batch.prompt_width
    assert forward.prompt_runs(batch.input_ids, batch.attention_mask, P).tolist() == [4, 4, 4]
    one_each = _batch(groups=4, group_size=1)
    assert forward.prompt_runs(one_each.input_ids, one_each.attention_mask, one_each.prompt_width) is None
    apart = batch.rows(torch.tensor([0, 4, 1, 5, 2, 6, 3, 7]))  # groups 0 and 1 interleaved
    assert forward.prompt_runs(apart.input_ids, apart.attention_mask, P) is None
    assert forward.prompt_runs(batch.input_ids, batch.attention_mask, 0) is None
    with pytest.raises(ValueError, match=r"^prompt_width must be in \[0, \d+\] \(the batch's columns\), got prompt_width=99$"):
        forward.prompt_runs(batch.input_ids, batch.attention_mask, 99)


def test_an_equal_prompt_with_another_padding_mask_is_another_prompt():
    """The prompt region compares the attention mask too: the same ids with a column masked are a different prompt."""
    batch = _batch(groups=1, group_size=4)
    att = batch.attention_mask.clone()
    att[2:, 0] = 1 - att[2:, 0]
    assert forward.prompt_runs(batch.input_ids, att, batch.prompt_width).tolist() == [2, 2]


@pytest.mark.parametrize("attention", ATTENTION)
@pytest.mark.parametrize("kind", KINDS)
def test_shared_prompt_hidden_states_equal_one_pass(kind, attention):
    """(B, T, H) hidden states of the shared path == one pass over every row, left-padded prompts of three lengths."""
    model = _model(kind, attention)
    batch = _batch()
    assert forward.shared_prompt_runs(model, batch, "auto").tolist() == [4, 4, 4]
    with torch.no_grad():
        shared = forward.completion_hidden(model, batch, "cpu", shared_prompt="auto")
        one_pass = forward.completion_hidden(model, batch, "cpu", shared_prompt="off")
    assert shared.shape == one_pass.shape == (12, 7, 32)
    torch.testing.assert_close(shared, one_pass, rtol=0, atol=1e-5)


@pytest.mark.parametrize("attention", ATTENTION)
@pytest.mark.parametrize("kind", KINDS)
def test_shared_prompt_log_probs_and_every_gradient_equal_one_pass(kind, attention):
    """log-probs and d(sum w * logp)/d theta of every parameter: the prompt pass's gradient is the sum over its rows."""
    model = _model(kind, attention)
    batch = _batch(groups=2, group_size=3, seed=1)
    w = torch.randn(batch.mask.shape, generator=torch.Generator().manual_seed(3))
    out = {}
    for mode in ("auto", "off"):
        scores = forward.completion_logprobs(model, batch, "cpu", shared_prompt=mode)
        (scores.logp * w).sum().backward()
        out[mode] = scores.logp.detach(), scores.entropy.detach(), _grads(model)
    torch.testing.assert_close(out["auto"][0], out["off"][0], rtol=0, atol=1e-5)
    torch.testing.assert_close(out["auto"][1], out["off"][1], rtol=0, atol=1e-5)
    _assert_same_grads(out["auto"][2], out["off"][2])


@pytest.mark.parametrize("fused_head", ["eager", "off"])
def test_the_update_with_a_shared_prompt_takes_the_same_gradient(fused_head):
    """accumulate_gradients over two micro-batches of whole groups (the first optimiser step: its own old log-probs),
    fused head or log-probs first: the same gradients and loss metrics with shared_prompt "auto" and "off"."""
    model = _model()
    batch = _batch()
    spec = resolve_objective("grpo")
    adv = torch.randn(12, generator=torch.Generator().manual_seed(2))
    parts = [torch.arange(0, 8), torch.arange(8, 12)]
    weights = accumulation_weights([batch.mask[r] for r in parts], spec.aggregation)
    out = {}
    for mode in ("auto", "off"):
        micros = [micro_batch(batch, r, None, None, adv, w) for r, w in zip(parts, weights)]
        metrics, finite = accumulate_gradients(model, micros, spec, torch.device("cpu"), fused_head=fused_head, shared_prompt=mode)
        assert finite
        out[mode] = metrics, _grads(model)
    assert out["auto"][0].keys() == out["off"][0].keys()
    for key, value in out["off"][0].items():
        assert math.isclose(out["auto"][0][key], value, rel_tol=1e-4, abs_tol=1e-6), key
    _assert_same_grads(out["auto"][1], out["off"][1])


def test_no_grad_log_probs_in_trimmed_chunks_equal_one_pass():
    """The old-log-prob pass (no grad, chunks of whole groups, each trimmed of padding) with "auto" == "off"."""
    model = _model()
    batch = _batch()
    shared = batch_logp(model, batch, "cpu", 4, None, "autocast", "auto")
    one_pass = batch_logp(model, batch, "cpu", 4, None, "autocast", "off")
    for a, b in zip(shared, one_pass):
        torch.testing.assert_close(a, b, rtol=0, atol=1e-5)


def test_one_token_completions_are_the_prompt_pass_alone():
    """T = 1: the hidden state predicting the one completion token is the prompt's last position, repeated."""
    model = _model()
    batch = _batch(max_len=1)
    assert batch.mask.shape[1] == 1
    with torch.no_grad():
        shared = forward.completion_hidden(model, batch, "cpu", shared_prompt="auto")
        one_pass = forward.completion_hidden(model, batch, "cpu", shared_prompt="off")
    torch.testing.assert_close(shared, one_pass, rtol=0, atol=1e-5)


@pytest.mark.parametrize("rows", [None, [0, 4, 1, 5, 2, 6, 3, 7]], ids=["every prompt distinct", "equal prompts apart"])
def test_a_batch_the_shared_path_cannot_serve_takes_one_pass_bit_for_bit(rows):
    """Every row its own prompt, or a group's rows not contiguous: shared_prompt_runs says None, and "auto" gives
    exactly the bits of "off"."""
    model = _model()
    batch = _batch(groups=6, group_size=1) if rows is None else _batch().rows(torch.tensor(rows))
    assert forward.shared_prompt_runs(model, batch, "auto") is None
    with torch.no_grad():
        assert torch.equal(
            forward.completion_hidden(model, batch, "cpu", shared_prompt="auto"),
            forward.completion_hidden(model, batch, "cpu", shared_prompt="off"),
        )


def test_off_is_the_one_pass_as_before_bit_for_bit():
    """shared_prompt "off" (every caller's default) is the decoder pass ``completion_hidden`` ran before, bit for bit."""
    model = _model()
    batch = _batch()
    assert forward.shared_prompt_runs(model, batch, "off") is None
    with torch.no_grad():
        assert torch.equal(forward.completion_hidden(model, batch, "cpu"), _today(model, batch))
        assert torch.equal(forward.completion_hidden(model, batch, "cpu", shared_prompt="off"), _today(model, batch))


def test_models_the_shared_path_cannot_serve_take_one_pass():
    """Gradient checkpointing, sliding-window layers and an attention implementation it is not checked against: one pass."""
    from dfpo.trainer.policy import enable_checkpointing

    batch = _batch()
    assert forward.shared_prompt_model(_model())
    checkpointed = _model()
    enable_checkpointing(checkpointed)
    sliding = _model(use_sliding_window=True, sliding_window=4, max_window_layers=0)
    other_attention = _model()
    other_attention.config._attn_implementation = "flex_attention"
    for model in (checkpointed, sliding, other_attention):
        assert not forward.shared_prompt_model(model)
        assert forward.shared_prompt_runs(model, batch, "auto") is None


def test_a_lora_model_shares_its_prompt_with_the_same_gradients():
    """A peft LoRA model: the shared path runs through the injected adapters and gives the same adapter gradients."""
    peft = pytest.importorskip("peft")
    model = peft.get_peft_model(_model(), peft.LoraConfig(r=4, lora_alpha=8, target_modules="all-linear", init_lora_weights=False))
    batch = _batch(groups=2, group_size=3)
    assert forward.shared_prompt_runs(model, batch, "auto") is not None
    out = {}
    for mode in ("auto", "off"):
        scores = forward.completion_logprobs(model, batch, "cpu", shared_prompt=mode)
        scores.logp.sum().backward()
        out[mode] = scores.logp.detach(), _grads(model)
    torch.testing.assert_close(out["auto"][0], out["off"][0], rtol=0, atol=1e-5)
    _assert_same_grads(out["auto"][1], out["off"][1])


def test_a_bad_shared_prompt_value_is_refused_naming_it():
    """The forward refuses a value outside ("auto", "off"); the config refuses it by its choices."""
    with pytest.raises(ValueError, match=r"^shared_prompt must be one of auto, off, got shared_prompt='on'$"):
        forward.completion_hidden(_model(), _batch(), "cpu", shared_prompt="on")
    assert config_from_dict({}).optim.shared_prompt == "auto"
    with pytest.raises(ValueError, match="on"):
        config_from_dict(apply_overrides({}, ["optim.shared_prompt=on"]))


TINY = [
    *TINY_MODEL_SETS,
    "data.train_size=50",
    "data.eval_size=4",
    "rollout.prompts_per_step=2",
    "rollout.group_size=4",
    "rollout.max_new_tokens=3",
    "rollout.old_logp=recompute",
    *FORMAT_REWARD_SETS,
    "optim.lr=1e-2",
    "optim.minibatch_groups=1",
    "optim.epochs=2",
    "train.steps=2",
    "train.save_every=0",
    "threads=1",
    "eval.every=0",
    "log.tensorboard=false",
    "log.progress=false",
]
"""A 2-step tiny run whose old log-probs are recomputed (the later optimiser steps' rows go through ``batch_logp``)."""


def test_a_tiny_run_trains_the_same_with_a_shared_prompt(tmp_path, monkeypatch):
    """Two steps of the tiny model with "auto" (which takes the shared path) and "off": every logged metric agrees to 1e-4."""
    calls = []
    real = forward._shared_prompt_hidden
    monkeypatch.setattr(forward, "_shared_prompt_hidden", lambda *a, **k: calls.append(1) or real(*a, **k))
    records = {}
    for mode in ("auto", "off"):
        before = len(calls)
        run = tmp_path / mode
        Trainer(config_from_dict(apply_overrides({}, [*TINY, f"optim.shared_prompt={mode}", f'run_dir="{run}"'])), quiet=True).run()
        assert (len(calls) > before) == (mode == "auto")
        records[mode] = timeless_records(run / RunDir.METRICS)
    assert len(records["auto"]) == len(records["off"]) == 2
    for auto, off in zip(records["auto"], records["off"]):
        assert auto.keys() == off.keys()
        for key, value in off.items():
            if isinstance(value, float):
                assert math.isclose(auto[key], value, rel_tol=1e-4, abs_tol=1e-4), (key, auto[key], value)
            else:
                assert auto[key] == value, key
