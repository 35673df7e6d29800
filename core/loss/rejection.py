"""Rejection of tokens or whole completions whose trainer/sampler mismatch is too large (the correction component's
``rollout_rejection``; verl ``rollout_corr.rollout_rs``, OpenRLHF ``seq-mask-tis``, ROLL's ratio filters).

From rho_t = pi_old(y_t) / pi_rollout(y_t) (``correction.token_log_rho``; in bypass mode sg(pi_theta) / pi_old), a
per-token divergence estimate

    k1 = log rho_t            k2 = (log rho_t)^2 / 2            k3 = rho_t - 1 - log rho_t      (Schulman's k1, k2, k3)

is read at one level: ``token_*`` each token alone; ``seq_sum_*`` / ``seq_mean_*`` / ``seq_max_*`` its completion's
sum, mean or maximum (every token of the completion shares the verdict); ``segment_mean_k1`` the mean over each run of
consecutive real tokens (ROLL's segment filter). A k1 statistic is kept when its ratio exp(k1) lies in
[``rollout_rs_low``, ``rollout_rs_high``]: ``seq_mean_k1`` is the geometric-mean rejection (verl's geo-RS presets,
OpenRLHF's seq-mask-tis filter), ``seq_sum_k1`` the sequence ratio prod_t rho_t. A k2 / k3 statistic is kept when it
is at most ``rollout_rs_max``.

Rejected tokens leave the policy gradient. With ``rollout_rs_renormalise`` (verl: the rejection rewrites the response
mask) they also leave the aggregation's count, as a renormalised token mask does; without it (OpenRLHF multiplies the
loss by 0) they are counted.

Where this departs from verl: verl's k1 is -log rho with its thresholds "lower_upper" bounding rho_rollout / rho_old; here
the band bounds rho = pi_old / pi_rollout itself, so verl's ``rollout_rs_threshold="a_b"`` is ``rollout_rs_low = 1/b,
rollout_rs_high = 1/a`` (the same band when a = 1/b, verl's default for a single number).
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

import torch
from torch import Tensor

from ..settings import Bounds
from .fields import POSITIVE, UNIT, When, component_field
from .ratios import LOG_RATIO_BOUND, level_log_ratio

if TYPE_CHECKING:  # spec imports this module
    from .spec import ObjectiveSpec

ESTIMATORS = ("k1", "k2", "k3")
LEVELS = ("token", "seq_sum", "seq_mean", "seq_max", "segment_mean")
REJECTIONS = (
    "none",
    *(f"token_{k}" for k in ESTIMATORS),
    *(f"seq_sum_{k}" for k in ESTIMATORS),
    *(f"seq_mean_{k}" for k in ESTIMATORS),
    "seq_max_k2",
    "seq_max_k3",
    "segment_mean_k1",
)
"""Every ``rollout_rejection``: none, or LEVEL_ESTIMATOR (verl's rollout_rs names, and ROLL's segment filter)."""
TOKEN_LEVEL = ("token_k1", "token_k2", "token_k3")
"""The rejections whose verdict on a token reads that token alone (they keep a shared token's cancellation)."""


def token_divergence(log_rho: Tensor, estimator: str) -> Tensor:
    """k1 = log rho, k2 = (log rho)^2 / 2 or k3 = rho - 1 - log rho per token (B, T), from log rho (B, T)."""
    if estimator == "k1":
        return log_rho
    if estimator == "k2":
        return 0.5 * log_rho**2
    return torch.exp(log_rho) - 1.0 - log_rho


def level_statistic(stat: Tensor, mask: Tensor, level: str) -> Tensor:
    """The level's statistic at every real token (B, T): the token's own, its completion's sum / mean / max, or the mean
    over its run of consecutive real tokens."""
    if level == "token":
        return stat
    if level == "seq_sum":
        return level_log_ratio(stat, mask, "sequence")
    if level == "seq_mean":
        return level_log_ratio(stat, mask, "geometric")
    if level == "segment_mean":
        return level_log_ratio(stat, mask, "segment")
    worst = torch.where(mask, stat, float("-inf")).amax(-1, keepdim=True)  # (B, 1) seq_max
    return torch.where(mask, worst.expand_as(stat), 0.0)


def rejected_tokens(log_rho: Tensor, mask: Tensor, mode: str, low: float, high: float, bound: float) -> Tensor:
    """The real tokens ``mode`` rejects (B, T) bool, from the detached token log-ratios log rho (B, T)."""
    level, _, estimator = mode.rpartition("_")
    stat = level_statistic(token_divergence(log_rho, estimator), mask, level)  # (B, T)
    if estimator == "k1":
        lo = -math.inf if low <= 0 else math.log(low)
        keep = (stat >= lo) & (stat <= math.log(high))
    else:
        keep = stat <= bound
    return mask & ~keep


def rejection_filter(spec: ObjectiveSpec, log_rho: Tensor, mask: Tensor) -> tuple[Tensor, bool, dict[str, Tensor]]:
    """(rejected tokens (B, T), whether they leave the aggregation's count, metrics): ``rollout/rejected_frac`` (share of
    real tokens) and ``rollout/rejected_seq_frac`` (share of non-empty completions with a rejected token)."""
    clamped = log_rho.clamp(-LOG_RATIO_BOUND, LOG_RATIO_BOUND)
    rejected = rejected_tokens(clamped, mask, spec.rollout_rejection, spec.rollout_rs_low, spec.rollout_rs_high, spec.rollout_rs_max)
    rows = mask.any(-1)  # (B,)
    dtype = log_rho.dtype
    metrics = {
        "rollout/rejected_frac": (rejected.sum() / mask.sum().clamp(min=1)).to(dtype),
        "rollout/rejected_seq_frac": ((rejected.any(-1) & rows).sum() / rows.sum().clamp(min=1)).to(dtype),
    }
    return rejected, spec.rollout_rs_renormalise, metrics


def rejection_coupling(spec: ObjectiveSpec) -> list[str]:
    if spec.rollout_rejection != "none" and spec.rollout_rs_renormalise and spec.aggregation != "constant":
        return [
            "rollout_rs_renormalise=True divides by the tokens the rejection keeps, not by the real tokens micro-batches are weighted by"
        ]
    return []


# ----------------------------------------------------------------------------- the rejection's settings (correction component)

_K1 = tuple(m for m in REJECTIONS if m.endswith("k1"))
ROLLOUT_REJECTION = component_field(
    "none",
    "correction",
    "choice",
    "none, as verl's rollout_rs (null by default)",
    trust_region=True,
    choices=REJECTIONS,
    doc="Reject tokens or completions whose mismatch rho = pi_old / pi_rollout is too large (needs ``rollout_logp`` unless "
    "``rollout_bypass``): LEVEL_ESTIMATOR, level token / seq_sum / seq_mean / seq_max / segment_mean, estimator k1 / k2 / k3 "
    "(verl rollout_rs names; seq_mean_k1 is the geometric-mean rejection); see ``dfpo.core.loss.rejection``.",
)
ROLLOUT_RS_LOW = component_field(
    0.5,
    "correction",
    "number",
    "verl RolloutCorrectionConfig.decoupled_seq_is_rs: rollout_rs_threshold '0.5_2.0' (verl's geo-RS presets use "
    "'0.999_1.001', OpenRLHF seq-mask-tis [0.5, 5.0])",
    trust_region=True,
    bounds=UNIT,
    active_when=When("rollout_rejection", _K1),
    doc="k1 rejections: the lower end of the kept band of the ratio (token rho, prod rho, or geometric mean).",
)
ROLLOUT_RS_HIGH = component_field(
    2.0,
    "correction",
    "number",
    "verl RolloutCorrectionConfig.decoupled_seq_is_rs: rollout_rs_threshold '0.5_2.0'",
    trust_region=True,
    bounds=Bounds(1.0, math.inf),
    active_when=When("rollout_rejection", _K1),
    doc="k1 rejections: the upper end of the kept band of the ratio.",
)
ROLLOUT_RS_MAX = component_field(
    0.01,
    "correction",
    "number",
    "verl RolloutCorrectionConfig.bypass_ppo_clip_k3_rs: rollout_rs_threshold 0.01",
    trust_region=True,
    bounds=POSITIVE,
    active_when=When("rollout_rejection", tuple(m for m in REJECTIONS if m[-2:] in ("k2", "k3"))),
    doc="k2 / k3 rejections: the largest divergence estimate kept.",
)
ROLLOUT_RS_RENORMALISE = component_field(
    True,
    "correction",
    "bool",
    "True: verl's rejection rewrites the response mask (OpenRLHF's seq-mask-tis multiplies the loss by 0: False)",
    trust_region=True,
    active_when=When("rollout_rejection", ("none",), negate=True),
    doc="Rejected tokens also leave the aggregation's count (verl); False keeps them counted with a zero loss (OpenRLHF).",
)
