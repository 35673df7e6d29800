"""The entropy bonus (TRL ``entropy_coef``; Skywork-OR1's fixed coefficient): minus coef times the mean entropy.

The bonus is a token mean over the tokens the policy term keeps, whatever the aggregation (as TRL computes
it), so it is read with its gradient: ``policy_loss`` needs ``entropy`` from the model, not detached.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch
from torch import Tensor

from .fields import NONNEG, Component, component_field

if TYPE_CHECKING:  # spec imports this module
    from .spec import ObjectiveSpec


def entropy_term(spec: ObjectiveSpec, ctx) -> tuple[Tensor | None, dict[str, Tensor]]:
    """-coef * (token mean of the entropy over kept tokens) and ``entropy/bonus`` (nothing when coef = 0)."""
    if spec.entropy_coef <= 0:
        return None, {}
    bonus = torch.where(ctx.kept, ctx.entropy, 0.0).sum() / ctx.kept.sum().clamp(min=1)
    return -(spec.entropy_coef * bonus), {"entropy/bonus": bonus.detach()}


# ----------------------------------------------------------------------------- the entropy component's settings

ENTROPY_COEF = component_field(
    0.0,
    "entropy",
    "number",
    "0: no entropy bonus (TRL GRPOConfig entropy_coef=0.0)",
    trust_region=True,
    bounds=NONNEG,
    doc="Entropy bonus: the loss minus entropy_coef times the mean entropy over the tokens the policy term keeps.",
)


def _entropy_inputs(spec: ObjectiveSpec) -> dict[str, str]:
    return {"entropy": f"entropy_coef={spec.entropy_coef!r} (entropy with its gradient)"} if spec.entropy_coef > 0 else {}


def _entropy_coupling(spec: ObjectiveSpec) -> list[str]:
    if spec.entropy_coef > 0 and (spec.aggregation != "token_mean" or spec.token_mask != "none"):
        return ["the entropy bonus is a mean over kept tokens, weighted unlike the aggregation's micro-batches"]
    return []


ENTROPY_COMPONENT = Component("entropy", required_inputs=_entropy_inputs, batch_coupling=_entropy_coupling, loss_term=entropy_term)
