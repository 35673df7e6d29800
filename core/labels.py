"""Run labels: an objective label with the training settings a comparison varies per label.

    gspo_noclip                          the objective, trained at the run's learning rate
    gspo_noclip@lr=0.44                  the same objective at learning rate 0.44
    dfpo_min:stopgrad=score@lr=2.5e-4    an objective label (preset:key=value...) and its learning rate

The part before ``@`` is an objective label (``dfpo.core.loss.objective_from_label`` parses it); after
``@`` come ``key=value`` settings of the training run, separated by ``@``. Only ``lr`` exists: a
step-size-matched control (``dfpo toy ablate --match-step``, ``dfpo compare --match-step``) is its
trust-region-matched control at a calibrated learning rate, and the learning rate is a setting of the
optimiser, not a component of the objective. Standard library only: the toy, the trainer and the
explorer read labels without torch.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

RUN_SETTINGS = ("lr",)
"""Settings a run label may carry after '@'."""


@dataclass(frozen=True)
class RunLabel:
    """A parsed run label: the objective label and the run settings it overrides (None: the run's own)."""

    label: str
    objective: str
    lr: float | None = None


def parse_run_label(text: str) -> RunLabel:
    """``OBJECTIVE[@lr=VALUE]`` -> RunLabel; ValueError naming the label and what is wrong with it."""
    objective, *settings = str(text).split("@")
    if not objective.strip():
        raise ValueError(f"label {text!r} names no objective before '@'")
    lr = None
    for item in settings:
        key, sep, value = item.partition("=")
        if not sep or key.strip() not in RUN_SETTINGS:
            raise ValueError(f"label {text!r}: after '@' comes lr=VALUE (the run's learning rate), got {item!r}")
        try:
            lr = float(value)
        except ValueError:
            raise ValueError(f"label {text!r}: lr must be a number, got lr={value!r}") from None
        if not math.isfinite(lr) or lr <= 0:
            raise ValueError(f"label {text!r}: lr must be a finite number > 0, got lr={value!r}")
    return RunLabel(str(text), objective.strip(), lr)


def with_lr(objective: str, lr: float) -> str:
    """The run label of ``objective`` trained at learning rate ``lr`` (4 significant digits, enough to rerun it)."""
    return f"{parse_run_label(objective).objective}@lr={lr:.4g}"
