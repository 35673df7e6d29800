"""Skywork-OR1's adaptive entropy coefficient (arXiv 2505.22312, sec. "adaptive entropy control"): the entropy bonus's
coefficient moves by a fixed step each training step, up while the policy's entropy is below a target and down once it
is above, clipped to [min, max]; the bonus is on only while the entropy is below the target.

As the authors' code computes it (SkyworkAI/Skywork-OR1, ``verl/trainer/ppo/core_algos.py``: ``EntController.update``,
called by ``ray_trainer.py`` ``fit`` after each step with ``metrics["actor/entropy_loss"]``; the loss reads
``entropy_coeff * entropy_loss_enabled`` in ``verl/workers/actor/dp_actor.py`` ``update_policy``):

    measured  = -mean of log pi_old over the step's real tokens     (dp_actor ``get_entropy_metric``: 'actor/entropy_loss')
    coef     <- clip(coef + delta if measured < target else coef - delta, min, max)
    enabled  <- measured < target
    the next step's loss: ... - coef * enabled * (token mean of the policy's entropy)

starting from coef = ``entropy_coef`` (the scripts' ENTROPY_COEFF = 0) and enabled = True. The measured entropy is the
sampled tokens' mean surprisal under pi_old (an estimate of the entropy from the batch), not the full-vocabulary entropy
the bonus itself rewards; dfpo measures it the same way.

The loss core is pure: ``policy_loss`` reads ``entropy_coef`` as this step's coefficient and the adaptive fields only to
require the entropy input and to declare the coupling the bonus may bring. The state (coef, enabled) lives in the
trainer (``dfpo.trainer.entropy_control``), which resolves each step's spec with ``entropy_coef = coef * enabled``,
moves the state with ``next_entropy_control`` after the step, checkpoints it with the run's counters and logs the
coefficient as ``entropy/coef``. TRL's ``DFPOGRPOTrainer`` keeps it the same way in a callback
(``dfpo.integrations.trl.AdaptiveEntropyCallback``: once per optimiser step, saved in trainer_state.json); verl's
policy-loss registry has no place for it and refuses it (``dfpo.integrations.verl``). A caller of ``policy_loss`` that
sets ``entropy_target`` moves the coefficient itself.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import TYPE_CHECKING

from ..settings import Bounds
from .fields import NONNEG, Component, component_field

if TYPE_CHECKING:  # spec imports this module
    from .spec import ObjectiveSpec


@dataclass(frozen=True)
class EntropyControl:
    """The state of the adaptive coefficient between steps (EntController's ``value`` and ``entropy_loss_enabled``)."""

    coef: float
    enabled: bool = True

    @property
    def coef_in_loss(self) -> float:
        """The coefficient the next step's loss uses: coef while the entropy is below the target, else 0."""
        return self.coef if self.enabled else 0.0


def initial_entropy_control(spec: ObjectiveSpec) -> EntropyControl:
    """The state before the first step: coef = ``entropy_coef`` (EntController's init_ent_coef), the bonus on."""
    return EntropyControl(coef=float(spec.entropy_coef), enabled=True)


def next_entropy_control(state: EntropyControl, measured: float, spec: ObjectiveSpec) -> EntropyControl:
    """EntController.update: one step of ``entropy_coef_delta`` toward the target, clipped to [min, max] (float64)."""
    if not math.isfinite(measured):
        raise ValueError(f"the measured entropy must be finite to move the adaptive entropy coefficient, got {measured!r}")
    below = measured < spec.entropy_target
    coef = state.coef + spec.entropy_coef_delta if below else state.coef - spec.entropy_coef_delta
    return EntropyControl(coef=min(max(coef, spec.entropy_coef_min), spec.entropy_coef_max), enabled=below)


def measured_entropy(old_logp, mask) -> float:
    """-mean of log pi_old over real tokens (Skywork-OR1's 'actor/entropy_loss'); (B, T) tensors, one device sync."""
    n = mask.sum().clamp(min=1)
    return float(-(old_logp.double() * mask).sum() / n)


# ----------------------------------------------------------------------------- the adaptive coefficient's settings

_SKYWORK = "Skywork-OR1 or1_scripts/train/*.sh"
ENTROPY_TARGET = component_field(
    None,
    "entropy_control",
    "optional_number",
    f"None: a fixed entropy_coef (Skywork-OR1's ppo_trainer.yaml adaptive_entropy.enabled=False; {_SKYWORK}: TGT_ENTROPY=0.2)",
    trust_region=True,
    bounds=NONNEG,
    doc="Skywork-OR1's adaptive entropy coefficient: the target of the policy's entropy (mean -log pi_old over real "
    "tokens); entropy_coef is the first step's coefficient, then the trainer (dfpo train, or TRL's DFPOGRPOTrainer per "
    "optimiser step; verl refuses it) moves it by entropy_coef_delta each step (up below the target, down above it) and "
    "the bonus is on only below it. None: off (a fixed entropy_coef).",
)
ENTROPY_COEF_DELTA = component_field(
    1e-4,
    "entropy_control",
    "number",
    f"{_SKYWORK}: DELTA_ENT_COEF=0.0001 (the fork's ppo_trainer.yaml default is 0.001)",
    trust_region=True,
    bounds=NONNEG,
    doc="Adaptive entropy: the step of the coefficient per training step.",
)
ENTROPY_COEF_MIN = component_field(
    0.0,
    "entropy_control",
    "number",
    f"{_SKYWORK}: MIN_ENT_COEF=0 (also the fork's ppo_trainer.yaml default)",
    trust_region=True,
    bounds=NONNEG,
    doc="Adaptive entropy: the smallest coefficient.",
)
ENTROPY_COEF_MAX = component_field(
    0.005,
    "entropy_control",
    "number",
    f"{_SKYWORK}: MAX_ENT_COEF=0.005 (the fork's ppo_trainer.yaml default is 0.5)",
    trust_region=True,
    bounds=Bounds(0.0, math.inf),
    doc="Adaptive entropy: the largest coefficient.",
)


def _check_control(spec: ObjectiveSpec) -> None:
    if spec.entropy_target is not None and spec.entropy_coef_min > spec.entropy_coef_max:
        raise ValueError(
            f"entropy_coef_min={spec.entropy_coef_min!r} must be at most entropy_coef_max={spec.entropy_coef_max!r} "
            "for the adaptive entropy coefficient"
        )


def _control_inputs(spec: ObjectiveSpec) -> dict[str, str]:
    if spec.entropy_target is None:
        return {}
    return {"entropy": f"entropy_target={spec.entropy_target!r} (the adaptive entropy bonus, with its gradient)"}


def _control_coupling(spec: ObjectiveSpec) -> list[str]:
    if spec.entropy_target is not None and (spec.aggregation != "token_mean" or spec.token_mask != "none"):
        return ["the adaptive entropy bonus is a mean over kept tokens, weighted unlike the aggregation's micro-batches"]
    return []


ENTROPY_CONTROL_COMPONENT = Component(
    "entropy_control", validate=_check_control, required_inputs=_control_inputs, batch_coupling=_control_coupling
)
