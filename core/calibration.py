"""The learning rate at which a control's effective step matches a method's: a secant search shared by
``dfpo toy --match-step`` and ``dfpo compare --match-step``.

A trust-region-matched control shares everything with the method but the in-group transform, the learning rate
included. A transform that shrinks the weights (length-aware Min-Replace: every sequence but the longest of its
group) then also takes a smaller step, so a difference in speed, tax or entropy may come from the step, not from
cancellation. The step-size-matched control is the same control at the learning rate lr* at which a measure of
its effective step equals the method's on a **calibration seed set** disjoint from the sets the tables report:
steps to kappa (restricted to the run's length: a run that never reaches kappa counts its length + 1; a
calibration target, never a reported level) or the update norm per rollout batch. Both are monotone in the
learning rate (steps fall, the update norm grows), so lr* is found by the secant method on log(value) against
log(lr), from the run's learning rate and a first guess that assumes value ~ lr^(-1) (steps) or lr^(+1) (update),
each step at most a factor 4, until the value is within ``rtol`` of the method's or ``max_evals`` trainings
are spent; the closest evaluation wins and every one is kept in ``trace``. Standard library only.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

from .labels import parse_run_label, with_lr

CRITERIA = {"steps": -1, "update": +1}
"""Each criterion and the sign of its dependence on the learning rate."""

DESCRIBE = {"steps": "steps to kappa (restricted mean)", "update": "update norm per rollout batch (mean)"}


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
    seed_set: str
    """The calibration seeds, as a reader reruns them: '--seed 1002, 16 seeds' or 'seeds 4000..4007'."""

    @property
    def label(self) -> str:
        return with_lr(self.control, self.lr)

    def sentence(self, *, own_lr: bool = False) -> str:
        """How the control was calibrated, in one sentence for a run's notes; ``own_lr``: the control at its own
        learning rate matched, so no CONTROL@lr= label trains (``dfpo compare``)."""
        tried = ", ".join(f"lr {lr:.4g}: {v:.4g}" for lr, v in self.trace)
        if own_lr:
            return (
                f"- {self.control} at its own lr {self.lr:.4g} is also step-size-matched to {self.method}: on the calibration seed set "
                f"({self.seed_set}) {self.method} has {DESCRIBE[self.criterion]} {self.target:.4g}, {self.control} {self.value:.4g} "
                f"(tried {tried})."
            )
        return (
            f"- {self.label} is {self.control} step-size-matched to {self.method}: on the calibration seed set ({self.seed_set}) "
            f"{self.method} has {DESCRIBE[self.criterion]} {self.target:.4g}, {self.control} at lr {self.lr:.4g} has {self.value:.4g} "
            f"(tried {tried})."
        )

    @classmethod
    def from_dict(cls, raw: dict) -> Calibration:
        """The inverse of ``dataclasses.asdict`` (as a JSON file holds it)."""
        return cls(**{**raw, "trace": tuple(tuple(float(x) for x in t) for t in raw["trace"])})


def calibrate(
    method: str,
    control: str,
    criterion: str,
    *,
    lr0: float,
    evaluate: Callable[[str], float],
    seed_set: str,
    max_evals: int = 8,
    rtol: float = 0.005,
) -> Calibration:
    """The learning rate at which ``control`` matches ``method``'s effective step; ``evaluate(label)`` trains a run
    label on the calibration seed set and returns the criterion's value."""
    if criterion not in CRITERIA:
        raise ValueError(f"--match-step must be one of none, {', '.join(CRITERIA)}; got {criterion!r}")
    target = evaluate(method)
    lr0 = parse_run_label(control).lr or lr0
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
        lr_next = float(f"{min(max(lr_next, lr_a / 4), lr_a * 4):.4g}")  # at most a factor 4, as the label prints it
        if any(abs(lr_next - lr) <= 1e-6 * lr for lr, _ in trace):
            break  # the step lands on a learning rate already tried: nothing new to learn
        trace.append((lr_next, evaluate(with_lr(control, lr_next))))
    lr, value = min(trace, key=lambda t: abs(t[1] - target))
    return Calibration(method, control, criterion, target, lr, value, tuple(trace), seed_set)
