"""Tests that bite step-size calibration (``dfpo.core.calibration``; issue 57 item 11, mutation/realmodel.toml): closed-form
stand-ins for training (steps to kappa = 30 / lr for the control) with noise where a test needs it."""

from __future__ import annotations

import pytest

from dfpo.core.calibration import calibrate
from dfpo.core.labels import parse_run_label

METHOD = "dfpo_min:stopgrad=score"


def _lr(label: str) -> float:
    return parse_run_label(label).lr


def _steps(target: float, control=lambda lr: 30.0 / lr):
    """evaluate(label): ``target`` for the method, ``control(lr)`` for the control at its learning rate."""
    return lambda label: target if label == METHOD else control(_lr(label))


def test_each_step_moves_the_learning_rate_by_at_most_a_factor_4():
    """A target 100x away (lr* = 0.005 from 0.5) is approached in steps of at most 4x, and still reached."""
    cal = calibrate(METHOD, "gspo_noclip", "steps", lr0=0.5, evaluate=_steps(6000.0), seed_set="s", max_evals=8)
    lrs = [lr for lr, _ in cal.trace]
    assert all(0.25 * (1 - 1e-3) <= b / a <= 4 * (1 + 1e-3) for a, b in zip(lrs, lrs[1:]))  # 1e-3: the label's 4 digits
    assert lrs[1] == 0.125 and cal.lr == pytest.approx(0.005, rel=0.005)


def test_a_measured_slope_of_the_wrong_sign_is_not_followed():
    """Steps to kappa fall as the lr grows. One noisy evaluation below the target right after a step down makes the
    measured slope positive; the search keeps the criterion's sign and steps the lr down again, towards the target."""
    cal = calibrate(
        METHOD, "gspo_noclip", "steps", lr0=0.5, evaluate=_steps(66.0, lambda lr: 55.0 if lr == 0.4545 else 30.0 / lr), seed_set="s"
    )
    (lr0, v0), (lr1, v1), (lr2, _) = cal.trace[:3]
    assert (lr0, v0, lr1, v1) == (0.5, 60.0, 0.4545, 55.0)
    assert lr2 < lr1  # below the target after a step down: steps must rise, so the lr goes down


def test_a_control_named_at_its_own_learning_rate_starts_there():
    cal = calibrate(METHOD, "gspo_noclip@lr=0.2", "steps", lr0=0.5, evaluate=_steps(66.0), seed_set="s")
    assert cal.trace[0] == (0.2, 150.0) and cal.lr == pytest.approx(30 / 66, rel=0.005)


def test_when_the_evaluations_run_out_the_closest_learning_rate_wins():
    """Noise after the first evaluation: the first stays the closest, and the last is not it."""
    cal = calibrate(
        METHOD, "gspo_noclip", "steps", lr0=0.5, evaluate=_steps(66.0, lambda lr: 65.0 if lr == 0.5 else 80.0), seed_set="s", max_evals=3
    )
    assert len(cal.trace) == 3 and cal.trace[-1][1] == 80.0
    assert (cal.lr, cal.value) == (0.5, 65.0)


@pytest.mark.parametrize("target, control", [(0.0, 60.0), (66.0, 0.0)], ids=["method", "control"])
def test_a_value_of_zero_is_refused_in_one_sentence(target, control):
    with pytest.raises(ValueError, match=r"^cannot calibrate 'gspo_noclip' on steps: a value is not positive"):
        calibrate(METHOD, "gspo_noclip", "steps", lr0=0.5, evaluate=_steps(target, lambda lr: control), seed_set="s")


def test_the_tolerance_is_relative_to_the_target():
    """A first value within 0.5% of a target of 1000 (1003) ends the search at once: nothing more is trained."""
    calls = []
    evaluate = _steps(1000.0, lambda lr: 501.5 / lr)
    cal = calibrate(METHOD, "gspo_noclip", "steps", lr0=0.5, evaluate=lambda label: calls.append(label) or evaluate(label), seed_set="s")
    assert cal.trace == ((0.5, 1003.0),) and len(calls) == 2


def test_no_learning_rate_is_trained_twice():
    """With a tolerance finer than the label's 4 digits can reach, the secant lands on an lr already tried: it stops."""
    cal = calibrate(METHOD, "gspo_noclip", "steps", lr0=0.5, evaluate=_steps(66.0), seed_set="s", rtol=1e-9)
    lrs = [lr for lr, _ in cal.trace]
    assert len(lrs) == len(set(lrs)) and len(lrs) < 8 and cal.lr == 0.4545
