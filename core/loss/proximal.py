"""The proximal penalty: tau/2 times the squared token log-ratio to the behaviour policy, added to each token's loss
(Kimi k1.5, arXiv 2501.12599 eq 3; ROLL ``pg_variant='kimi15'``).

Kimi k1.5's online mirror descent gives the gradient (1/k) sum_j [grad log pi(y_j) (r_j - rbar) - tau/2 grad (log
pi(y_j) / pi_old(y_j))^2]; ROLL's ``ActorWorker._compute_kimi15_loss`` (roll/pipeline/rlvr/actor_pg_worker.py) writes
it per token as

    loss_t = -A * log pi(y_t) + tau/2 * (log pi(y_t) - log pi_old(y_t))^2

and aggregates that with its ``loss_agg_mode``. Here the first part is the ``pg`` clip rule and the second is this
component's ``token_step``: it adds tau/2 * d_t^2, d_t = log pi - log pi_old (clamped to +-LOG_RATIO_BOUND like every
ratio of the core), at each kept token before the rollout correction, so a correction weight multiplies the penalty
too, as ROLL multiplies its ``train_infer_is_weight`` into the whole kimi15 loss.

It differs from the KL term (``beta``, ``kl_estimator='k2'``): that one is to the reference policy, this one to
pi_old, the policy that sampled the batch (the trust region of a mirror-descent step, not a KL anchor).

Cancellation: the penalty is not advantage-weighted. Its gradient at a token is tau * d_t times the token's aggregation
weight, so a token shared by every completion of a group gets tau * d * (the sum of its copies' weights) on top of
whatever the policy term leaves: zero on the first inner step (pi = pi_old, d = 0), non-zero once the policy has moved
(ledger claim ``proximal-penalty-cancel``; ``tests/core/test_peer_losses.py``).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from torch import Tensor

from .fields import NONNEG, Component, component_field
from .ratios import token_log_ratio

if TYPE_CHECKING:  # spec imports this module
    from .spec import ObjectiveSpec


def proximal_step(spec: ObjectiveSpec, ctx, per_token: Tensor) -> tuple[Tensor, dict[str, Tensor]]:
    """per_token + tau/2 * (log pi - log pi_old)^2 at the kept tokens (B, T), and ``proximal/penalty``, the penalty's
    token mean over kept tokens (unchanged when tau = 0)."""
    if spec.proximal_coef <= 0:
        return per_token, {}
    x = ctx.x
    d = token_log_ratio(x.logp, x.old_logp, ctx.kept)  # (B, T), 0 off the kept tokens
    penalty = 0.5 * spec.proximal_coef * d * d  # (B, T)
    mean = penalty.detach().sum() / ctx.kept.sum().clamp(min=1)
    return per_token + penalty, {"proximal/penalty": mean}


# ----------------------------------------------------------------------------- the proximal component's settings

PROXIMAL_COEF = component_field(
    0.0,
    "proximal",
    "number",
    "0: no penalty (ROLL's kimi15_tau = 0.1 applies only with pg_variant='kimi15')",
    trust_region=True,
    bounds=NONNEG,
    doc="Kimi k1.5's tau: each kept token's loss plus tau/2 (log pi - log pi_old)^2, the squared log-ratio to the policy "
    "that sampled the batch (ROLL pg_variant='kimi15').",
)

PROXIMAL_COMPONENT = Component("proximal", token_step=proximal_step)
