"""A penalty on the divergence from the sampling policy pi_old (not from a reference model): coef times an aggregated
per-token estimator of KL(pi || pi_old), d_t = log pi(y_t) - log pi_old(y_t), with its gradient. The estimators are the
KL component's (``kl.kl_estimate``: k3, k2 = d^2 / 2, k1 = d), read at ``old_logp`` instead of ``ref_logp``.

It is prime-rl's default regulariser (``src/prime_rl/trainer/rl/loss.py``: ``default_loss_fn``, "Kimi-K2.5 KL Loss",
arXiv 2602.02276): ``kl_tau * log_importance_ratio**2`` at every token of ``loss_mask`` with
``log_importance_ratio = trainer_logprobs - inference_logprobs``, kl_tau = 1e-3 (``DefaultLossConfig``), summed with
the policy term and divided by the step's real-token count (``train.py``: ``rl_scale``). d^2 = 2 k2, so prime-rl's
term is ``old_kl_coef = 2 * kl_tau = 2e-3`` with ``old_kl_estimator = 'k2'``.

Where prime-rl differs from verl and from dfpo's KL component: verl's squared log-ratio (``kl_penalty='mse'``, k2) and
dfpo's ``beta`` term read a frozen reference model (``ref_logp``); prime-rl's reads the policy that sampled the batch
(prime-rl has no old-log-prob pass: ``inference_logprobs`` is pi_old), so it is a soft trust region that pulls the
update back towards pi_old, zero with zero gradient at the first step on fresh samples (pi = pi_old), and needs no
reference model. Like prime-rl, the penalty reads every real token, also those a clip rule or a token filter drops
from the policy gradient, and is aggregated with the objective's ``aggregation`` over them. Log-ratios are clamped to
+-LOG_RATIO_BOUND like every ratio of the core.

Cancellation: at a shared token the penalty adds coef * (sum of the copies' aggregation weights) * dk/dd, which is zero
exactly where pi = pi_old there (k2, k3) and never for k1; it does not depend on the advantages, so no group sum
removes it (``tests/core/test_cancellation.py``).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from torch import Tensor

from .fields import NONNEG, Component, component_field
from .kl import KL_ESTIMATORS, kl_estimate, penalty_term

if TYPE_CHECKING:  # spec imports this module
    from .spec import ObjectiveSpec


def old_kl_term(spec: ObjectiveSpec, ctx) -> tuple[Tensor | None, dict[str, Tensor]]:
    """coef * aggregate(k(log pi - log pi_old)) over every real token, and ``kl/old``, its token mean (nothing at coef 0)."""
    if spec.old_kl_coef <= 0:
        return None, {}
    x = ctx.x
    k = kl_estimate(x.logp, x.old_logp, spec.old_kl_estimator)  # (B, T) with gradient through logp
    return penalty_term(spec.old_kl_coef, k, x.mask, x.lengths, spec, x, "kl/old")


# ----------------------------------------------------------------------------- the old-policy penalty's settings

OLD_KL_COEF = component_field(
    0.0,
    "old_kl",
    "number",
    "0: no penalty to pi_old (TRL, verl and OpenRLHF have none; prime-rl's default_loss_fn: kl_tau=1e-3 on d^2, i.e. 2e-3 on k2)",
    trust_region=True,
    bounds=NONNEG,
    doc="Weight of a penalty on KL(pi || pi_old) at every real token (prime-rl's 'KL' term, Kimi K2.5): the old policy, "
    "not a reference model, so it needs no ``ref_logp``.",
)
OLD_KL_ESTIMATOR = component_field(
    "k2",
    "old_kl",
    "choice",
    "k2: prime-rl's log_importance_ratio**2 is 2 k2 (src/prime_rl/trainer/rl/loss.py default_loss_fn)",
    trust_region=True,
    choices=KL_ESTIMATORS,
    doc="Per-token estimator of KL(pi || pi_old), read when old_kl_coef > 0: k2 d^2 / 2 (prime-rl), k3, k1; d = log pi - log pi_old.",
)


OLD_KL_COMPONENT = Component("old_kl", loss_term=old_kl_term)
