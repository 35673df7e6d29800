"""Skywork-OR1's adaptive entropy coefficient in the LLM trainer (issue 30): the trainer holds its state, the loss of
each step reads it, metrics.jsonl logs it, and a run SIGKILLed at a random point and resumed ends bit-identically."""

import json
from pathlib import Path

import torch
from test_llm_e2e import tiny_config
from tiny_run import FORMAT_REWARD_SETS, LOG_EVERY_STEP_SETS, TINY_MODEL_SETS, sigkill_then_resume, timeless_records

from dfpo.trainer.run.layout import RunDir
from dfpo.trainer.train import Trainer

RISING = [  # a target no tiny model reaches: the coefficient rises by delta every step and the bonus stays on
    "objective.name=dapo",
    "objective.overrides.entropy_target=100.0",
    "objective.overrides.entropy_coef_delta=0.01",
    "objective.overrides.entropy_coef_max=1.0",
]


def _rows(run: Path) -> list[dict]:
    return [json.loads(line) for line in (run / RunDir.METRICS).read_text().splitlines()]


def test_the_coefficient_moves_each_step_and_reaches_the_loss(tmp_path):
    """Step 1's loss uses entropy_coef (0), step 2's 0.01 (its entropy bonus is then in the loss), the checkpoint holds 0.02."""
    Trainer(tiny_config(tmp_path, *RISING, "train.steps=2", "eval.every=0"), quiet=True).run()
    rows = _rows(tmp_path / "run")
    assert [r["entropy/coef"] for r in rows] == [0.0, 0.01]
    assert "entropy/bonus" not in rows[0] and rows[1]["entropy/bonus"] > 0
    assert all(r["entropy/controlled"] > 0 for r in rows)
    saved = torch.load(tmp_path / "run" / RunDir.CHECKPOINT, weights_only=True)
    assert saved["entropy_control"] == {"coef": 0.02, "enabled": True}


def test_above_the_target_the_bonus_is_off_and_the_coefficient_falls_to_its_minimum(tmp_path):
    sets = ["objective.name=dapo", "objective.overrides.entropy_target=0.0", "objective.overrides.entropy_coef=0.015",
            "objective.overrides.entropy_coef_delta=0.01", "objective.overrides.entropy_coef_max=1.0"]  # fmt: skip
    Trainer(tiny_config(tmp_path, *sets, "train.steps=2", "eval.every=0"), quiet=True).run()
    assert [r["entropy/coef"] for r in _rows(tmp_path / "run")] == [0.015, 0.0]  # step 1 still uses the initial value
    saved = torch.load(tmp_path / "run" / RunDir.CHECKPOINT, weights_only=True)
    assert saved["entropy_control"] == {"coef": 0.0, "enabled": False}


STEPS = 4
SETS = [
    *TINY_MODEL_SETS,
    "data.train_size=40",
    "data.eval_size=4",
    "rollout.prompts_per_step=2",
    "rollout.group_size=4",
    "rollout.max_new_tokens=3",
    *FORMAT_REWARD_SETS,
    *RISING,
    "optim.lr=1e-2",
    "optim.epochs=2",
    f"train.steps={STEPS}",
    *LOG_EVERY_STEP_SETS,
]


def test_sigkill_then_resume_continues_the_coefficient_bit_identically(tmp_path):
    full, killed, seed = sigkill_then_resume(tmp_path, SETS, STEPS)
    a = torch.load(full / RunDir.CHECKPOINT, weights_only=True)
    b = torch.load(killed / RunDir.CHECKPOINT, weights_only=True)
    assert a["entropy_control"] == b["entropy_control"] and a["entropy_control"]["coef"] > 0.03
    for name in a["model"]:
        assert torch.equal(a["model"][name], b["model"][name]), f"{name} differs (kill seed {seed})"
    full_rows, killed_rows = timeless_records(full / RunDir.METRICS), timeless_records(killed / RunDir.METRICS)
    assert full_rows == killed_rows, f"kill seed {seed}"
    assert [r["entropy/coef"] for r in full_rows] == [0.0, 0.01, 0.02, 0.03]
