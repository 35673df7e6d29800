"""A pretrained-model folder as a user brings one, at small size: a model with more output rows than its tokenizer
has tokens (a padded embedding, as Qwen3's 151,936 rows for 151,669 tokens), loaded by name, trained for a step."""

from __future__ import annotations

import json

import torch
from tiny_run import FORMAT_REWARD_SETS, LOG_EVERY_STEP_SETS

from dfpo.trainer.config import apply_overrides, config_from_dict
from dfpo.trainer.policy import build_char_tokenizer
from dfpo.trainer.run.layout import RunDir
from dfpo.trainer.train import Trainer

PADDED_ROWS = 200
"""Rows beyond the tokenizer's: a random-init model samples them often (the char tokenizer has ~100 tokens)."""


CHAT_TEMPLATE = "{% for m in messages %}[{{ m['role'] }}]{{ m['content'] }}{% endfor %}{% if add_generation_prompt %}[assistant]{% endif %}"
"""A chat template the char tokenizer can spell (brackets around the roles)."""


def padded_model_folder(folder) -> int:
    """A Qwen2 model (hidden 32) with the char tokenizer, a chat template, and ``PADDED_ROWS`` output rows the
    tokenizer lacks; its rows."""
    from transformers import AutoModelForCausalLM, Qwen2Config

    tok = build_char_tokenizer()
    tok.chat_template = CHAT_TEMPLATE
    rows = len(tok) + PADDED_ROWS
    config = Qwen2Config(
        vocab_size=rows, hidden_size=32, intermediate_size=64, num_hidden_layers=1, num_attention_heads=2, num_key_value_heads=1,
        max_position_embeddings=256, pad_token_id=tok.pad_token_id, eos_token_id=tok.eos_token_id, tie_word_embeddings=True,
    )  # fmt: skip
    torch.manual_seed(0)
    AutoModelForCausalLM.from_config(config).save_pretrained(folder)
    tok.save_pretrained(folder)
    return rows


def test_a_model_with_more_output_rows_than_tokens_trains_and_logs_energy(tmp_path):
    """The Energy diagnostic buckets the ids the model samples: the model's rows, not the tokenizer's size (a sampled
    padded-row id was an IndexError in the update)."""
    rows = padded_model_folder(tmp_path / "model")
    sets = [
        f'model.name="{tmp_path / "model"}"',
        f'run_dir="{tmp_path / "run"}"',
        "train.steps=1",
        "rollout.max_new_tokens=8",
        "log.diagnostics=true",
    ]
    cfg = config_from_dict(apply_overrides({}, [*LOG_EVERY_STEP_SETS, *FORMAT_REWARD_SETS, "data.max_operand=9", *sets]))
    trainer = Trainer(cfg, quiet=True)
    assert trainer.policy.vocab_size == rows > len(trainer.policy.tok)
    trainer.run()
    row = json.loads(RunDir(tmp_path / "run").metrics.read_text().splitlines()[0])
    energy = {k: v for k, v in row.items() if k.startswith("energy/")}
    assert energy and all(0 <= v <= 1 for v in energy.values()), sorted(row)  # a gradient (format reward) to bucket


def test_samples_show_the_prompt_as_the_model_read_it(tmp_path):
    """With a chat template the model reads more than the task's prompt: samples.jsonl keeps both, so a user sees
    the template (a real checkpoint's <|im_start|>... turns) the completions were sampled after."""
    padded_model_folder(tmp_path / "model")
    sets = [f'model.name="{tmp_path / "model"}"', f'run_dir="{tmp_path / "run"}"', "train.steps=1", "rollout.max_new_tokens=4"]
    Trainer(config_from_dict(apply_overrides({}, [*LOG_EVERY_STEP_SETS, "data.max_operand=9", *sets])), quiet=True).run()
    samples = [json.loads(line) for line in RunDir(tmp_path / "run").samples.read_text().splitlines()]
    assert samples and all(s["model_input"] == f"[user]{s['prompt']}[assistant]" for s in samples), samples[0]
