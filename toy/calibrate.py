"""Step-size-matched controls in the toy (``dfpo toy run/ablate --match-step``): the training behind
``dfpo.core.calibration``'s secant search, and the controls it adds to a run."""

from __future__ import annotations

import dataclasses

import numpy as np

from ..core.calibration import Calibration, calibrate
from ..core.labels import parse_run_label
from ..core.metrics import steps_to
from .config import ToyConfig

__all__ = ["Calibration", "measure", "step_matched_controls"]


def measure(config: ToyConfig, label: str, criterion: str) -> float:
    """The criterion's value of ``label`` trained alone under ``config`` (its seed set): the mean over seeds of the
    steps to kappa (a seed that never reaches kappa counts steps + 1), or of the update norm over steps."""
    from .report import to_numpy
    from .train import run

    _, results = run(dataclasses.replace(config, objectives=(label,), step_matched={}, match_step="none"))
    h = to_numpy(results)[label]
    if criterion == "steps":
        steps, _ = steps_to(h["reward"].T, config.kappa)  # (S,)
        return float(np.mean(steps))
    return float(np.mean(h["update/norm"]))


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
        cal = calibrate(
            pair.method,
            pair.baseline,
            criterion,
            lr0=config.lr,
            evaluate=lambda label: measure(calibration_config, label, criterion),
            seed_set=f"--seed {seed}, {seeds} seeds",
        )
        calibrations.append(cal)
        matched[cal.label] = ",".join([*filter(None, matched.get(cal.label, "").split(",")), pair.method])
        if cal.label not in labels:
            labels.insert(labels.index(pair.method) + 1, cal.label)
    return dataclasses.replace(config, objectives=tuple(dict.fromkeys(labels)), match_step=criterion, step_matched=matched), calibrations
