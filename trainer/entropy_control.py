"""Where the trainer keeps Skywork-OR1's adaptive entropy coefficient (``dfpo.core.loss.adaptive_entropy``).

The loss core is pure, so the state (coef, enabled) is the trainer's: ``RunState.entropy_control``, None when the
objective's ``entropy_target`` is None. Each step:

1. ``step_spec``: the update stage's objective is the run's spec with ``entropy_coef = coef * enabled`` (the state
   as the previous step left it; at step 1 the spec's own ``entropy_coef``, Skywork's init_ent_coef);
2. after the update, ``advance``: the measured entropy (-mean log pi_old over the step's real tokens, every row's, the
   same on every process) moves the state one ``entropy_coef_delta`` (``next_entropy_control``);
3. metrics.jsonl logs ``entropy/coef`` (the coefficient this step's loss used) and ``entropy/controlled`` (the
   measured entropy that moved it).

A SIGKILL-resume continues bit-identically: the checkpoint written after a step holds the state that step left, as
plain floats and a bool (``state_dict`` / ``load_state``: the checkpoint's tensors-only format), and a resume reads it
back before the next step. A checkpoint without it (the objective had no target) cannot resume a run with one: the
config check refuses that first, as ``entropy_target`` is part of the objective's overrides.
"""

from __future__ import annotations

import dataclasses

import torch

from ..core.loss import ObjectiveSpec
from ..core.loss.adaptive_entropy import EntropyControl, initial_entropy_control, measured_entropy, next_entropy_control

CHECKPOINT_KEY = "entropy_control"
"""The checkpoint's entry for the state: {"coef": float, "enabled": bool}."""


def initial_state(spec: ObjectiveSpec) -> EntropyControl | None:
    """The state before the first step, or None when the objective's coefficient is fixed."""
    return None if spec.entropy_target is None else initial_entropy_control(spec)


def step_spec(spec: ObjectiveSpec, state: EntropyControl | None) -> ObjectiveSpec:
    """The objective of this step's update: the run's spec with the adaptive coefficient in ``entropy_coef``."""
    return spec if state is None else dataclasses.replace(spec, entropy_coef=state.coef_in_loss)


def advance(spec: ObjectiveSpec, state: EntropyControl, old_logp: torch.Tensor, mask: torch.Tensor) -> tuple[EntropyControl, dict]:
    """The state after a step whose pi_old log-probs (B, T) over real tokens ``mask`` (B, T) are given, and the step's
    metrics ``entropy/coef`` (the coefficient the step's loss used) and ``entropy/controlled`` (what moved it)."""
    measured = measured_entropy(old_logp, mask)
    return next_entropy_control(state, measured, spec), {"entropy/coef": state.coef_in_loss, "entropy/controlled": measured}


def state_dict(state: EntropyControl) -> dict:
    """The state as plain data for checkpoint.pt (a Python float keeps every bit of the coefficient)."""
    return {"coef": float(state.coef), "enabled": bool(state.enabled)}


def load_state(saved: dict, run_dir) -> EntropyControl:
    """The state ``state_dict`` wrote; ValueError in one sentence when the checkpoint lacks it or it is malformed."""
    entry = saved.get(CHECKPOINT_KEY)
    if not isinstance(entry, dict) or not isinstance(entry.get("coef"), float) or not isinstance(entry.get("enabled"), bool):
        raise ValueError(
            f"--resume {run_dir}: checkpoint.pt holds no adaptive entropy state (entropy_control: {entry!r}) although the "
            "objective sets entropy_target; it was not written for this objective: start the run again"
        )
    return EntropyControl(coef=entry["coef"], enabled=entry["enabled"])
