"""Step-size-matched controls: the learning rate at which a control's effective step matches a method's.

A trust-region-matched control shares everything with the method but the in-group transform, the learning
rate included. A transform that shrinks the weights (length-aware Min-Replace: every sequence but the longest
of its group) then also takes a smaller step, and a difference in speed, tax or entropy may come from the
step, not from cancellation. The step-size-matched control is the same control at the learning rate lr* at
which its effective step equals the method's, measured on a **calibration seed set** disjoint from the seed
sets the tables report:

- ``steps``: the mean over the calibration seeds of the steps to kappa, each restricted to the run's length
  (a seed that never reaches kappa counts steps + 1; a calibration target, never a reported level);
- ``update``: the mean over steps and seeds of the update norm |theta after a rollout batch's K steps - theta
  before| (``update/norm``).

Both are monotone in the learning rate (steps fall, the update norm grows), so lr* is found by the secant
method on log(value) against log(lr), starting from the run's learning rate and a first guess that assumes
value ~ lr^(-1) (steps) or lr^(+1) (update), and stopped when the value is within ``rtol`` of the method's or
after ``max_evals`` trainings; the closest evaluation wins and every evaluation is kept in ``trace``.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from ..core.labels import parse_run_label, with_lr
from ..core.metrics import steps_to
from .config import ToyConfig

CRITERIA = {"steps": -1, "update": +1}
"""Each criterion and the sign of its dependence on the learning rate."""


@dataclass(frozen=True)
class Calibration:
    """One step-size-matched control: ``label`` (CONTROL@lr=lr) trains at the step the method takes."""

    method: str
    control: str
    criterion: str
    target: float
    lr: float
    value: float
    trace: tuple[tuple[float, float], ...]
    seed: int
    seeds: int

    @property
    def label(self) -> str:
        return with_lr(self.control, self.lr)

    def sentence(self) -> str:
        """How the control was calibrated, in one sentence for the run's notes."""
        what = "steps to kappa (restricted mean)" if self.criterion == "steps" else "update norm per rollout batch (mean)"
        tried = ", ".join(f"lr {lr:.4g}: {v:.4g}" for lr, v in self.trace)
        return (
            f"- {self.label} is {self.control} step-size-matched to {self.method}: on the calibration seed set --seed {self.seed} "
            f"({self.seeds} seeds) {self.method} has {what} {self.target:.4g}, {self.control} at lr {self.lr:.4g} has {self.value:.4g} "
            f"(tried {tried})."
        )


def measure(config: ToyConfig, label: str, criterion: str) -> float:
    """The criterion's value of ``label`` trained alone under ``config`` (its seed set)."""
    from .report import to_numpy
    from .train import run

    _, results = run(dataclasses.replace(config, objectives=(label,), step_matched={}, match_step="none"))
    h = to_numpy(results)[label]
    if criterion == "steps":
        steps, _ = steps_to(h["reward"].T, config.kappa)  # (S,), a seed that never reaches kappa at steps + 1
        return float(np.mean(steps))
    return float(np.mean(h["update/norm"]))


def calibrate(
    config: ToyConfig,
    method: str,
    control: str,
    criterion: str,
    *,
    max_evals: int = 8,
    rtol: float = 0.005,
    evaluate: Callable[[str], float] | None = None,
) -> Calibration:
    """The learning rate at which ``control`` matches ``method``'s effective step on ``config``'s seed set (the
    calibration set). ``evaluate(label) -> value`` replaces the training (tests use a closed form)."""
    if criterion not in CRITERIA:
        raise ValueError(f"--match-step must be one of none, {', '.join(CRITERIA)}; got {criterion!r}")
    evaluate = evaluate or (lambda label: measure(config, label, criterion))
    target = evaluate(method)
    lr0 = parse_run_label(control).lr or config.lr
    trace = [(lr0, evaluate(with_lr(control, lr0)))]
    if target <= 0 or trace[0][1] <= 0:
        raise ValueError(
            f"cannot calibrate {control!r} on {criterion}: a value is not positive ({method}: {target}, {control}: {trace[0][1]})"
        )
    slope = float(CRITERIA[criterion])  # d log value / d log lr, first guess
    while len(trace) < max_evals and abs(trace[-1][1] - target) > rtol * target:
        lr_a, v_a = trace[-1]
        if len(trace) >= 2:
            lr_b, v_b = trace[-2]
            if lr_a != lr_b and v_a != v_b:
                measured = (math.log(v_a) - math.log(v_b)) / (math.log(lr_a) - math.log(lr_b))
                if measured * CRITERIA[criterion] > 0:  # keep the sign the criterion must have
                    slope = measured
        lr_next = lr_a * math.exp((math.log(target) - math.log(v_a)) / slope)
        lr_next = min(max(lr_next, lr_a / 4), lr_a * 4)  # a secant step of at most a factor 4
        if any(abs(lr_next - lr) <= 1e-6 * lr for lr, _ in trace):
            break  # the step lands on a learning rate already tried: nothing new to learn
        trace.append((float(f"{lr_next:.4g}"), evaluate(with_lr(control, float(f"{lr_next:.4g}")))))
    lr, value = min(trace, key=lambda t: abs(t[1] - target))
    return Calibration(method, control, criterion, target, lr, value, tuple(trace), config.seed, config.seeds)


def step_matched_controls(
    config: ToyConfig, criterion: str, *, seed: int, seeds: int, progress=None
) -> tuple[ToyConfig, list[Calibration]]:
    """``config`` with a step-size-matched control added for every DFPO label that has a trust-region-matched
    control in the run, calibrated on the seed set (``seed``, ``seeds``); and the calibrations."""
    from .checks import comparison_pairs

    if seed == config.seed:
        raise ValueError(f"--calibration-seed {seed} is the run's --seed: calibrate on a seed set disjoint from the one the tables report")
    calibration_config = dataclasses.replace(config, seed=seed, seeds=seeds)
    calibrations, labels, matched = [], list(config.objectives), {}
    for pair in comparison_pairs(config.objectives, config):
        if pair.unmatched or parse_run_label(pair.baseline).lr is not None:
            continue
        if progress:
            progress(f"toy: calibrating {pair.baseline}'s learning rate to {pair.method}'s {criterion} (--seed {seed}, {seeds} seeds)")
        cal = calibrate(calibration_config, pair.method, pair.baseline, criterion)
        calibrations.append(cal)
        matched[cal.label] = ",".join([*filter(None, matched.get(cal.label, "").split(",")), pair.method])
        if cal.label not in labels:
            labels.insert(labels.index(pair.method) + 1, cal.label)
    return dataclasses.replace(config, objectives=tuple(dict.fromkeys(labels)), match_step=criterion, step_matched=matched), calibrations
