"""The KL term to a reference policy: beta times an aggregated per-token estimator of KL(pi || pi_ref) (DeepSeekMath
GRPO; TRL ``beta``; verl ``use_kl_loss`` with ``kl_loss_type``), with d_t = log pi(y_t) - log pi_ref(y_t):

    k3   exp(-d) + d - 1          Schulman's k3, unbiased, >= 0 (DeepSeekMath eq 4, TRL; verl 'low_var_kl' / 'k3')
    k2   d^2 / 2                  the squared log-ratio (verl kl_penalty 'mse' / 'k2')
    k1   d                        the plain log-ratio (verl kl_penalty 'kl' / 'k1')

``kl_ratio_weight`` multiplies the estimator by the objective's importance ratio pi_theta / pi_old, *with* its gradient
(TRL ``use_bias_correction_kl=True``, the DeepSeek-V3.2 unbiased KL gradient, arXiv 2512.02556 eq 7): ``token``
exp(log pi - log pi_old) at each token (TRL importance_sampling_level='token'), ``sequence`` exp of its mean over the
completion at every token of it (TRL 'sequence').

The term is aggregated like the policy term (same mode, same tokens), as TRL adds ``beta * per_token_kl`` before its
aggregation. Log-ratios are clamped to +-LOG_RATIO_BOUND like every ratio of the core.

Cancellation: the KL term is not advantage-weighted, so it adds beta * (sum of the copies' aggregation weights) *
dk/dd at a shared token to whatever the policy term leaves; it vanishes only where pi = pi_ref at that token (k2, k3)
and never for k1 (dk/dd = 1). A token-level ratio weight keeps that (its gradient multiplies the shared token's own
k); a sequence-level one does not: its gradient at the shared token carries each completion's whole KL
(``tests/core/test_kl.py``).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch
from torch import Tensor

from .aggregation import aggregate
from .fields import NONNEG, Component, component_field
from .ratios import LOG_RATIO_BOUND, level_log_ratio

if TYPE_CHECKING:  # spec imports this module
    from .spec import ObjectiveSpec

KL_ESTIMATORS = ("k3", "k2", "k1")
KL_RATIO_WEIGHTS = ("none", "token", "sequence")


def k3_kl(logp: Tensor, ref_logp: Tensor) -> Tensor:
    """Per-token k3 estimator of KL(pi || pi_ref) (B, T), the log-ratio bounded like the core's ratios."""
    ref_gap = (ref_logp - logp).clamp(-LOG_RATIO_BOUND, LOG_RATIO_BOUND)  # (B, T)
    return torch.exp(ref_gap) - ref_gap - 1


def kl_estimate(logp: Tensor, ref_logp: Tensor, estimator: str) -> Tensor:
    """Per-token k1, k2 or k3 estimate of KL(pi || pi_ref) (B, T), with gradient through ``logp``."""
    if estimator == "k3":
        return k3_kl(logp, ref_logp)
    d = (logp - ref_logp).clamp(-LOG_RATIO_BOUND, LOG_RATIO_BOUND)  # (B, T)
    return 0.5 * d * d if estimator == "k2" else d


def kl_ratio(logp: Tensor, old_logp: Tensor, mask: Tensor, level: str) -> Tensor:
    """pi_theta / pi_old at each token (B, T) with gradient: the token's own, or exp of the completion's mean log-ratio."""
    log_r = torch.where(mask, logp - old_logp, 0.0)  # (B, T)
    log_r = log_r if level == "token" else level_log_ratio(log_r, mask, "geometric")
    return torch.exp(log_r.clamp(-LOG_RATIO_BOUND, LOG_RATIO_BOUND))  # (B, T)


def penalty_term(
    coef: float, estimate: Tensor, agg_mask: Tensor, agg_lengths: Tensor, spec: ObjectiveSpec, x, key: str
) -> tuple[Tensor, dict[str, Tensor]]:
    """``coef * aggregate(estimate)`` over ``agg_mask`` with the objective's aggregation, and ``{key: the estimate's
    token mean over the real tokens}`` (the KL to pi_ref here, the penalty to pi_old in ``old_kl``). ``estimate`` (B, T)."""
    term = coef * aggregate(estimate, agg_mask, spec.aggregation, spec.max_completion_length, agg_lengths)
    n_real = x.lengths.sum().clamp(min=1).to(x.logp.dtype)
    return term, {key: torch.where(x.mask, estimate.detach(), 0.0).sum() / n_real}


def kl_term(spec: ObjectiveSpec, ctx) -> tuple[Tensor | None, dict[str, Tensor]]:
    """beta * aggregate(weighted estimator) and ``kl/ref``, its token mean over real tokens (nothing when beta = 0)."""
    if spec.beta <= 0:
        return None, {}
    x = ctx.x
    kl = kl_estimate(x.logp, ctx.ref_logp, spec.kl_estimator)  # (B, T)
    if spec.kl_ratio_weight != "none":
        kl = kl * kl_ratio(x.logp, x.old_logp, x.mask, spec.kl_ratio_weight)  # (B, T)
    return penalty_term(spec.beta, kl, ctx.agg_mask, ctx.agg_lengths, spec, x, "kl/ref")


# ----------------------------------------------------------------------------- the KL component's settings

BETA = component_field(
    0.0,
    "kl",
    "number",
    "0: no KL term (TRL GRPOConfig default; DAPO, Dr. GRPO and GSPO drop it)",
    trust_region=True,
    bounds=NONNEG,
    doc="Weight of the KL estimate to ``ref_logp`` (``kl_estimator``).",
)
KL_ESTIMATOR = component_field(
    "k3",
    "kl",
    "choice",
    "k3: DeepSeekMath eq 4 and TRL's per_token_kl (verl kl_loss_type 'low_var_kl')",
    trust_region=True,
    choices=KL_ESTIMATORS,
    doc="Per-token estimator of KL(pi || pi_ref), read when beta > 0: k3 exp(-d) + d - 1, k2 d^2 / 2 (verl 'mse'), k1 d (verl 'kl'), d = log pi - log pi_ref.",
)
KL_RATIO_WEIGHT = component_field(
    "none",
    "kl",
    "choice",
    "none: DeepSeekMath's k3 has no ratio (TRL's default use_bias_correction_kl=True is 'token')",
    trust_region=True,
    choices=KL_RATIO_WEIGHTS,
    doc="Read when beta > 0: multiply the KL estimate by pi_theta / pi_old with its gradient (TRL use_bias_correction_kl): token, or the "
    "completion's geometric mean (TRL with importance_sampling_level='sequence').",
)


def _kl_inputs(spec: ObjectiveSpec) -> dict[str, str]:
    return {"ref_logp": f"beta={spec.beta!r} (the {spec.kl_estimator} KL to the reference policy)"} if spec.beta > 0 else {}


KL_COMPONENT = Component("kl", required_inputs=_kl_inputs, loss_term=kl_term)
