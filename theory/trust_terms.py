"""A claim extending eq 2's cancellation to the trust terms of issue 30: prime-rl's default loss (DPPO-Binary-TV plus a
squared log-ratio penalty to the sampling policy) and M2PO's batch second-moment bound.

prime-rl's penalty kl_tau (log pi - log pi_old)^2 carries no advantage: at a shared token each copy adds
2 kl_tau d* times its aggregation weight, so no sum_i A_i = 0 removes it; it vanishes exactly where d* = 0, i.e. the
shared token's ratio r* = 1. M2PO is PPO clipping whose cap tau on |log r| is read off the whole batch: a shared token
with r* > 1 is harmful for its A > 0 copies only, so they lose their gradient once log r* > tau while the A < 0 copies
keep theirs (Cor. F.1 at a batch-dependent range); below the cap it cancels as token PPO.
"""

from __future__ import annotations

import sympy as sp
import torch

from ..core.loss.cancellation import make_shared_prefix_group, shared_token_gradient
from .claim import FAILS, HOLDS_UNDER_CONDITIONS, Claim
from .tabular import fmt

REWARDS = (1.0, 0.0, 1.0, 0.0)
LENGTHS = [5, 9, 12, 7]


def _residual(objective: str, shared_log_ratio: float, **overrides) -> float:
    """The largest shared-token residual of ``objective`` on one group with unequal lengths (token mean)."""
    group = make_shared_prefix_group(torch.tensor(REWARDS, dtype=torch.float64), LENGTHS, shared_log_ratio=shared_log_ratio, seed=4)
    return float(shared_token_gradient(objective, group, **overrides).abs().max())


def check_peer_trust_terms_cancel() -> Claim:
    """Do prime-rl's default loss and M2PO keep a shared token's cancellation?"""
    d, kl_tau = sp.symbols("d kl_tau", real=True)
    penalty_grad = sp.diff(kl_tau * d**2, d)
    zero_at = sp.solve(sp.Eq(penalty_grad, 0), d)
    prime = {r: _residual("prime_rl", r) for r in (0.0, 0.2)}
    prime_no_penalty = _residual("prime_rl", 0.2, old_kl_coef=0.0)
    m2po_wide, m2po_tight = _residual("m2po", 0.5, m2po_budget=10.0), _residual("m2po", 0.5, m2po_budget=0.01)
    ok = zero_at == [0] and prime[0.0] < 1e-12 and prime[0.2] > 1e-8 and prime_no_penalty < 1e-12
    ok &= m2po_wide < 1e-12 and m2po_tight > 1e-8
    return Claim(
        id="peer-trust-terms-cancel",
        source="eq 2 (a shared token's gradient sum_i c_i = 0) for prime-rl's default loss_fn and M2PO's compute_m2po_policy_loss",
        statement="prime-rl's default loss and M2PO cancel a token shared by a whole group, as token-level objectives with a "
        "length-free aggregation do.",
        conditions=(
            "prime-rl: only where the shared token's ratio is 1 (its squared log-ratio penalty to pi_old has no advantage and "
            "adds 2 kl_tau log r* per copy) and inside the TV bound for A > 0; M2PO: only while the batch's cap tau on harmful "
            "|log r| is at least log r* (above it the A > 0 copies are clipped, the A < 0 ones are not)."
        ),
        method="symbolic+numeric",
        met_by="the first optimiser step on fresh samples (pi = pi_old, r* = 1 at every token) for both; for M2PO also any batch "
        "whose harmful tokens' mean squared log-ratio is within M2_budget (no bound applies)",
        verdict=HOLDS_UNDER_CONDITIONS if ok else FAILS,
        evidence=(
            f"sympy: d/dd (kl_tau d^2) = {penalty_grad}, zero at d = {zero_at}. One group, rewards {REWARDS}, lengths {LENGTHS}, "
            f"token mean; largest shared-token residual: prime_rl at r* = 1 {fmt(prime[0.0])}, at r* = e^0.2 {fmt(prime[0.2])} "
            f"(without the penalty {fmt(prime_no_penalty)}); m2po at r* = e^0.5 with M2_budget 10 (no bound) {fmt(m2po_wide)}, "
            f"with M2_budget 0.01 {fmt(m2po_tight)}"
        ),
        notes=(
            "The penalty is a soft trust region that pulls every token back to pi_old whatever its advantage, so after the first "
            "optimiser step of a batch it is a source of shared-token drift of order kl_tau |log r*|, small against the policy "
            "term at prime-rl's kl_tau = 1e-3. M2PO's cap depends on the batch, so whether a shared token cancels depends on the "
            "other tokens of its batch (and, in the authors' verl actor, on the micro-batch it falls in)."
        ),
    )


CHECKS = (check_peer_trust_terms_cancel,)
