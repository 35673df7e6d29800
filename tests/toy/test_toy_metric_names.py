"""The toy logs a quantity the LLM trainer logs too under the trainer's name (dfpo.core.metric_registry), so
the explorer draws toy and trainer runs in the same charts; older toy run folders are read under today's names."""

from __future__ import annotations

import json

import numpy as np
import pytest

from dfpo.cli import main
from dfpo.core.metric_registry import lookup
from dfpo.toy.metric_names import RENAMED
from dfpo.toy.report import read_metrics
from dfpo.toy.tasks import tenplusten
from dfpo.toy.train import ToyConfig, train_objective

pytestmark = pytest.mark.usefixtures("one_thread")


def _records(out) -> list[dict]:
    return [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]


def test_a_toy_run_logs_the_trainers_names_for_what_the_trainer_logs_too(tmp_path):
    """Before the fix the toy logged the batch's mean reward as reward/sampled and no weights/asym."""
    out = tmp_path / "run"
    assert main(["toy", "run", "--task", "tenplusten", "--objectives", "gspo,dfpo_min", "--seeds", "2", "--steps", "3", "--no-plots", "--out", str(out)]) == 0  # fmt: skip
    keys = set(_records(out)[0])
    shared = {"reward/mean", "weights/asym", "clip/frac_low", "clip/frac_high"}
    assert shared <= keys and not keys & set(RENAMED)
    for key in shared:
        assert lookup(key).where in ("trainer", "policy_loss")  # declared, with the meaning the trainer gives it


def test_weights_asym_is_the_loss_cores_and_equals_the_toys_own_asym_when_nothing_is_clipped():
    """K = 1: every ratio is 1, nothing is clipped, so the core's post-clip Asym and the toy's gradient-read Asym agree;
    the core's is pooled over seeds, which is the mean of the toy's per-seed values (every seed has as many groups)."""
    config = ToyConfig(task="tenplusten", objectives=("gspo",), seeds=3, steps=4, inner_steps=1, lr=0.5)
    h = train_objective(tenplusten(), "gspo", config)
    np.testing.assert_allclose(h["weights/asym"].mean(1), h["asym"].mean(1), rtol=1e-5)
    assert h["reward/mean"].shape == (4, 3)


def test_exact_mode_logs_no_weights_asym():
    """Exact mode scales each advantage by pi_old(y) before the loss: the core's Asym would be of A_i c_i, not eq 23."""
    config = ToyConfig(task="tenplusten", objectives=("gspo",), mode="exact", seeds=1, steps=2, inner_steps=2)
    h = train_objective(tenplusten(), "gspo", config)
    assert "weights/asym" not in h and "asym" in h


def test_an_older_toy_run_is_read_under_todays_names(tmp_path):
    out = tmp_path / "run"
    assert main(["toy", "run", "--task", "tenplusten", "--objectives", "gspo", "--seeds", "2", "--steps", "3", "--no-plots", "--out", str(out)]) == 0  # fmt: skip
    rows = _records(out)
    old = [{("reward/sampled" if k == "reward/mean" else k): v for k, v in row.items()} for row in rows]
    (out / "metrics.jsonl").write_text("".join(json.dumps(row) + "\n" for row in old))
    res = read_metrics(out)["gspo"]
    assert "reward/sampled" not in res
    np.testing.assert_array_equal(res["reward/mean"][:, 0], [r["reward/mean"] for r in rows if r["seed"] == 0])
