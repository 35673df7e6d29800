"""Step-size-matched controls: run labels with their own learning rate, the calibration of a control's learning
rate to a method's effective step, and tables that show both controls of a method."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest

from dfpo.cli import main
from dfpo.core.calibration import calibrate
from dfpo.core.labels import parse_run_label, with_lr
from dfpo.toy.checks import comparison_pairs
from dfpo.toy.tasks import make_task
from dfpo.toy.train import ToyConfig, train_objective, validate

pytestmark = pytest.mark.usefixtures("one_thread")

LA = "dfpo_min:stopgrad=score:length_aware=true"


def test_a_run_label_carries_its_own_learning_rate():
    assert parse_run_label("gspo_noclip@lr=0.44").lr == 0.44
    assert parse_run_label("dfpo_min:stopgrad=score").lr is None
    assert with_lr("gspo_noclip", 0.441234) == "gspo_noclip@lr=0.4412"
    for bad, message in (("gspo@lr=0", "finite number > 0"), ("gspo@lr=x", "must be a number"), ("gspo@eps=1", "after '@' comes lr")):
        with pytest.raises(ValueError, match=message):
            parse_run_label(bad)
    with pytest.raises(ValueError, match="after '@' comes lr"):
        validate(ToyConfig(objectives=("gspo@steps=3",)))


def test_a_label_at_twice_the_learning_rate_takes_twice_the_first_sgd_step():
    """The first update of SGD is lr times the gradient at the same (seeded) start: the update norm doubles."""
    config = ToyConfig(task="tenplusten", objectives=("gspo",), seeds=2, steps=1, inner_steps=1, lr=0.5)
    task = make_task("tenplusten")
    base = train_objective(task, "gspo", config)["update/norm"]
    double = train_objective(task, "gspo@lr=1", config)["update/norm"]
    np.testing.assert_allclose(double.numpy(), 2 * base.numpy(), rtol=1e-5)


def test_calibration_finds_the_learning_rate_where_the_control_matches_the_method():
    """A closed-form stand-in for training: steps to kappa = 30 / lr for the control, 66 for the method."""
    value = lambda label: 66.0 if label == LA else 30.0 / parse_run_label(label).lr  # noqa: E731
    cal = calibrate(LA, "gspo_noclip", "steps", lr0=0.5, evaluate=value, seed_set="--seed 1000, 16 seeds")
    assert cal.lr == pytest.approx(30 / 66, rel=0.005) and abs(cal.value - 66) <= 0.005 * 66
    assert cal.trace[0] == (0.5, 60.0) and len(cal.trace) <= 3  # a power law: the secant lands in one or two steps
    assert cal.label == f"gspo_noclip@lr={cal.lr:.4g}"
    up = calibrate(
        LA,
        "gspo_noclip",
        "update",
        lr0=0.5,
        seed_set="s",
        evaluate=lambda label: 0.9 if label == LA else 2 * parse_run_label(label).lr ** 1.3,
    )
    assert 2 * up.lr**1.3 == pytest.approx(0.9, rel=0.006)


def test_a_calibrated_control_is_a_matched_control_of_its_method_only():
    config = ToyConfig(
        objectives=("gspo_noclip", "dfpo_min:stopgrad=score", LA, "gspo_noclip@lr=0.44"),
        match_step="steps",
        step_matched={"gspo_noclip@lr=0.44": LA},
    )
    pairs = {(p.method, p.baseline): p for p in comparison_pairs(config.objectives, config)}
    assert pairs[(LA, "gspo_noclip@lr=0.44")].step_matched and not pairs[(LA, "gspo_noclip@lr=0.44")].unmatched
    assert pairs[(LA, "gspo_noclip@lr=0.44")].match_text(config) == "yes, and step size (lr 0.44 calibrated on steps)"
    assert not pairs[(LA, "gspo_noclip")].step_matched and pairs[(LA, "gspo_noclip")].match_text(config) == "yes"
    assert ("dfpo_min:stopgrad=score", "gspo_noclip@lr=0.44") not in pairs  # another lr, calibrated for another method


def test_match_step_calibrates_on_a_disjoint_seed_set_and_the_confirmation_reuses_it(tmp_path, capsys):
    argv = ["toy", "run", "--task", "family", "--objectives", f"gspo_noclip,{LA}", "--seeds", "2", "--steps", "20", "--no-plots"]
    argv += ["--match-step", "update", "--calibration-seeds", "2"]
    assert main([*argv, "--seed", "5", "--calibration-seed", "5", "--out", str(tmp_path / "x")]) == 2
    assert "--calibration-seed 5 is the run's --seed" in capsys.readouterr().err
    assert main([*argv, "--seed", "5", "--out", str(tmp_path / "first")]) == 0
    first = json.loads((tmp_path / "first" / "config.json").read_text())
    (control,) = first["step_matched"]
    assert control.startswith("gspo_noclip@lr=") and first["step_matched"][control] == LA and first["match_step"] == "update"
    (cal,) = first["calibrations"]
    assert cal["seed_set"] == "--seed 1005, 2 seeds" and math.isclose(cal["lr"], parse_run_label(control).lr, rel_tol=1e-3)
    summary = (tmp_path / "first" / "summary.md").read_text()
    assert f"| {LA} | {control} | yes, and step size (lr " in summary and f"| {LA} | gspo_noclip | yes |" in summary
    assert main([*argv, "--seed", "6", "--discovery", str(tmp_path / "first"), "--out", str(tmp_path / "second")]) == 0
    second = json.loads((tmp_path / "second" / "config.json").read_text())
    assert second["objectives"] == first["objectives"] and second["step_matched"] == first["step_matched"]
    assert "step-size-matched controls from" in capsys.readouterr().out


def test_the_plot_band_is_the_summary_tables_interval(tmp_path):
    """Before, the band was mean +- 1.96 s.e. while the table printed a Student-t interval: at 3 seeds twice as narrow."""
    pytest.importorskip("matplotlib")
    from dfpo.core import stats
    from dfpo.toy.plots import BOUNDS

    rng = np.random.default_rng(0)
    y = rng.gamma(0.3, 0.01, (20, 3))
    mean, low, high = stats.mean_band(y, bounds=BOUNDS["tax/kl_cum"])
    ci = stats.mean_interval(y[-1], bounds=(0.0, None))
    assert (low[-1], high[-1]) == pytest.approx((ci.low, ci.high))
    assert high[-1] - mean[-1] > 1.96 * y[-1].std(ddof=1) / math.sqrt(3) * 2  # t_{0.975, 2} = 4.30


def test_a_censored_cell_prints_greater_or_equal_and_never_averages_the_censored_value(tmp_path):
    """Before: '151.0 [151.0, 151.0] (0/8 reached)' and paired differences built on it. No seed reaches kappa in 3 steps."""
    out = tmp_path / "run"
    assert main(["toy", "run", "--objectives", "gspo,dfpo_min", "--seeds", "2", "--steps", "3", "--no-plots", "--out", str(out)]) == 0
    summary = (out / "summary.md").read_text()
    assert "| >=4.0 [>=4.0, >=4.0] (0/2 reached) |" in summary and "4.0 [4.0, 4.0]" not in summary
    steps = next(line for line in summary.splitlines() if line.startswith("| Prediction 1") and "| dfpo_min | gspo |" in line)
    assert "median unknown (censored), no interval (n = 2 seeds: a sign-test interval" in steps and "| inconclusive |" in steps
    assert "[-inf, inf]" not in summary  # an interval that cannot be bounded says why instead
