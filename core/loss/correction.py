"""Rollout / trainer mismatch correction: a detached importance weight pi_old / pi_rollout on the policy term.

The sampler (vLLM, another precision, tempered sampling) is not exactly pi_old. Like TRL's
``vllm_importance_sampling_correction`` and verl's ``rollout_is``, the per-token policy loss is multiplied by
a detached weight built from rho_t = pi_old(y_t) / pi_rollout(y_t):

    token_truncate     w_t = min(rho_t, cap)                       (truncated importance sampling)
    token_mask         w_t = rho_t if low <= rho_t <= cap else 0
    sequence_truncate  w_i = min(prod_t rho_t, cap), at every token of completion i
    sequence_mask      w_i = prod_t rho_t if low <= it <= cap else 0

How it composes with the group transforms: DFPO's transforms act on pi / pi_old (the trust-region ratio),
the correction is a separate factor on top of the transformed surrogate, never inside the transform.
Shared-token cancellation needs every copy of the shared token to carry the same coefficient: a correction
that differs across the completions of a group breaks it (a test measures the residual), one shared by the
group (or equal to 1, as for float32 sampling from the policy itself) keeps it.
"""

from __future__ import annotations

import math

import torch
from torch import Tensor

from ..settings import Bounds
from .fields import UNIT, Component, When, component_field
from .ratios import LOG_RATIO_BOUND

CORRECTIONS = ("none", "token_truncate", "token_mask", "sequence_truncate", "sequence_mask")


def rollout_weights(old_logp: Tensor, rollout_logp: Tensor, mask: Tensor, mode: str, low: float, cap: float) -> Tensor:
    """The detached correction weight (B, T) of ``mode`` (1 on padding and for ``none``)."""
    if mode == "none":
        return torch.ones_like(old_logp)
    gap = torch.where(mask, (old_logp - rollout_logp).detach(), 0.0).clamp(-LOG_RATIO_BOUND, LOG_RATIO_BOUND)  # (B, T) log rho
    if mode.startswith("sequence"):
        gap = gap.sum(-1, keepdim=True).clamp(-LOG_RATIO_BOUND, LOG_RATIO_BOUND).expand_as(gap)  # (B, T) log prod_t rho
    rho = torch.exp(gap)  # (B, T)
    if mode.endswith("truncate"):
        weight = rho.clamp(max=cap)
    else:
        weight = torch.where((rho >= low) & (rho <= cap), rho, 0.0)
    return torch.where(mask, weight, 1.0)


def correction_metrics(old_logp: Tensor, rollout_logp: Tensor, mask: Tensor, weight: Tensor, cap: float) -> dict[str, Tensor]:
    """The weights' mean, the share of real tokens zeroed (mask modes) or truncated at the cap, and the
    sequence-level ratio prod_t rho_t's min / mean / max over non-empty completions."""
    n = mask.sum().clamp(min=1)
    gap = torch.where(mask, (old_logp - rollout_logp).detach(), 0.0)  # (B, T)
    rho = torch.exp(gap.clamp(-LOG_RATIO_BOUND, LOG_RATIO_BOUND))  # (B, T)
    seq = torch.exp(gap.sum(-1).clamp(-LOG_RATIO_BOUND, LOG_RATIO_BOUND))[mask.any(-1)]  # (B',)
    out = {
        "rollout/weight_mean": torch.where(mask, weight, 0.0).sum() / n,
        "rollout/weight_zero_frac": ((mask & (weight == 0)).sum() / n).to(weight.dtype),
        "rollout/token_truncated_frac": ((mask & (rho > cap)).sum() / n).to(weight.dtype),
    }
    if seq.numel():
        out.update({"rollout/seq_ratio_min": seq.min(), "rollout/seq_ratio_mean": seq.mean(), "rollout/seq_ratio_max": seq.max()})
    return out


def correction_step(spec, ctx, per_token: Tensor) -> tuple[Tensor, dict[str, Tensor]]:
    """The policy term times the detached correction weight, and the correction's metrics (nothing for ``none``)."""
    if spec.rollout_correction == "none":
        return per_token, {}
    x = ctx.x
    weight = rollout_weights(x.old_logp, ctx.rollout_logp, x.mask, spec.rollout_correction, spec.rollout_low, spec.rollout_cap)  # (B, T)
    return per_token * weight, correction_metrics(x.old_logp, ctx.rollout_logp, x.mask, weight, spec.rollout_cap)


# ----------------------------------------------------------------------------- the correction component's settings

ROLLOUT_CORRECTION = component_field(
    "none",
    "correction",
    "choice",
    "none, as TRL's vllm_importance_sampling_correction and verl's rollout_is are off by default",
    True,
    choices=CORRECTIONS,
    doc="Detached pi_old / pi_rollout weight on the policy term (needs ``rollout_logp``): none, token_truncate, token_mask, sequence_truncate, sequence_mask (see ``dfpo.core.loss.correction``).",
)
ROLLOUT_LOW = component_field(
    0.5,
    "correction",
    "number",
    "verl rollout_is mask lower bound 0.5 (TRL vllm_importance_sampling_clip_min)",
    True,
    bounds=UNIT,
    active_when=When("rollout_correction", ("token_mask", "sequence_mask")),
    doc="Lower bound of the mask modes' kept interval [low, cap].",
)
ROLLOUT_CAP = component_field(
    2.0,
    "correction",
    "number",
    "TRL vllm_importance_sampling_cap 2.0 (verl rollout_is_threshold 2.0)",
    True,
    bounds=Bounds(1.0, math.inf),
    active_when=When("rollout_correction", ("none",), negate=True),
    doc="Truncation cap of the truncate modes, upper bound of the mask modes.",
)


def _correction_inputs(spec) -> dict[str, str]:
    return {} if spec.rollout_correction == "none" else {"rollout_logp": f"rollout_correction={spec.rollout_correction!r}"}


CORRECTION_COMPONENT = Component("correction", required_inputs=_correction_inputs, token_step=correction_step)
