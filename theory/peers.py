"""Claims that extend the paper's cancellation argument (eq 2) to the losses and advantage estimators
its peers run: where they keep "a token shared by the whole group gets zero net gradient", and where not.

Both follow from one line: the residual on a shared token is sum_i A_i c_i (per-copy coefficients c_i,
one per completion of the group). It vanishes for every group when every c_i is the same AND
sum_i A_i = 0. A soft gate changes c_i with the sign of A; a batch baseline changes sum_i A_i.
"""

from __future__ import annotations

import sympy as sp
import torch

from ..core.loss import group_advantages
from ..core.loss.cancellation import make_shared_prefix_group, shared_token_gradient
from .claim import FAILS, HOLDS_UNDER_CONDITIONS, Claim
from .tabular import fmt


def _shared_residual(objective: str, shared_log_ratio: float, advantages: torch.Tensor | None = None, **overrides) -> float:
    """Largest |gradient| on a 3-token prefix shared by 4 equal-length completions (rewards 1, 0, 1, 0)."""
    import dataclasses

    group = make_shared_prefix_group(torch.tensor([1.0, 0.0, 1.0, 0.0]), [7, 7, 7, 7], shared_log_ratio=shared_log_ratio, seed=5)
    if advantages is not None:
        group = dataclasses.replace(group, advantages=advantages)
    return float(shared_token_gradient(objective, group, **overrides).abs().max())


def check_soft_gate_cancel() -> Claim:
    """SAPO's soft gate: does a shared token still cancel?"""
    r, tau = sp.symbols("r tau", positive=True)
    gate = sp.exp(tau * (r - 1)) / (1 + sp.exp(tau * (r - 1))) * 4 / tau  # sigmoid(tau (r - 1)) * 4 / tau
    slope = sp.simplify(sp.diff(gate, r) * r)  # d gate / d log r
    at_one = sp.simplify(slope.subs(r, 1))
    depends_on_tau = sp.simplify(sp.diff(slope, tau)) != 0
    inside = _shared_residual("sapo", 0.0)
    outside = _shared_residual("sapo", 0.5)
    outside_equal_tau = _shared_residual("sapo", 0.5, sapo_tau_neg=1.0)
    ok = at_one == 1 and depends_on_tau and inside < 1e-12 and outside > 1e-6 and outside_equal_tau < 1e-12
    return Claim(
        id="soft-gate-cancel",
        met_by="the first inner step of every rollout batch (every ratio is 1), or SAPO with tau_pos = tau_neg",
        source="extension of eq 2 to SAPO (arXiv 2511.20347; TRL loss_type='sapo')",
        statement="A soft gate in place of the hard clip keeps shared-token cancellation.",
        conditions="Only where the gate's slope is the same for every copy: at r* = 1 (slope 1 for any tau) or with tau_pos = tau_neg.",
        method="symbolic+numeric",
        verdict=HOLDS_UNDER_CONDITIONS if ok else FAILS,
        evidence=(
            f"sympy: d gate / d log r = {slope}, = {at_one} at r = 1, depends on tau elsewhere: {depends_on_tau}. "
            f"policy_loss('sapo'), G=4, equal lengths, rewards (1,0,1,0): residual {fmt(inside)} at r*=1, {fmt(outside)} at r*=e^0.5 "
            f"(tau_pos=1.0, tau_neg=1.05), {fmt(outside_equal_tau)} at r*=e^0.5 with tau_neg=1.0"
        ),
        notes=(
            "SAPO's default temperatures differ by the sign of A (1.0 and 1.05), so once the shared token's ratio leaves 1 the "
            "positive and negative copies are weighted 4 sigma (1 - sigma) r* with different sigma and the token keeps a small net "
            "gradient. It is far smaller than hard PPO clipping's (Cor. F.1), where one sign's copies get no gradient at all."
        ),
    )


def check_advantage_zero_sum() -> Claim:
    """Do the advantage estimators peers use keep sum_i A_i = 0 within a group (the premise of eq 2)?"""
    rloo_sums = []
    for G in range(2, 9):  # sum_i (R_i - mean of the other G - 1 rewards), symbolic rewards
        R = sp.symbols(f"R1:{G + 1}")
        rloo_sums.append(sp.simplify(sum(R[k] - (sum(R) - R[k]) / (G - 1) for k in range(G))))
    rloo_sum = sp.Integer(0) if all(x == 0 for x in rloo_sums) else rloo_sums
    rewards = torch.tensor([1.0, 0.0, 0.0, 0.0, 1.0, 1.0, 1.0, 0.0], dtype=torch.float64)
    ids = torch.tensor([0, 0, 0, 0, 1, 1, 1, 1])
    sums = {scale: float(group_advantages(rewards, ids, scale=scale)[:4].sum()) for scale in ("group", "rloo", "reinforce_pp")}
    residual = {scale: _shared_residual("grpo", 0.0, group_advantages(rewards, ids, scale=scale)[:4]) for scale in sums}
    ok = rloo_sum == 0 and abs(sums["group"]) < 1e-12 and abs(sums["rloo"]) < 1e-12 and abs(sums["reinforce_pp"]) > 0.1
    ok &= residual["group"] < 1e-12 and residual["rloo"] < 1e-12 and residual["reinforce_pp"] > 1e-6
    return Claim(
        id="advantage-zero-sum",
        met_by="GRPO's own group-standardised advantages (eq 43), Dr. GRPO's and RLOO's",
        source="premise of eq 2 (sum_i A_i = 0 in a group), for the estimators of TRL's RLOO and OpenRLHF's REINFORCE++",
        statement="The advantage estimators used with group-relative losses sum to zero within each group, so shared tokens can cancel.",
        conditions="Group-centred estimators only (GRPO's, Dr. GRPO's, RLOO); REINFORCE++ with a batch baseline does not.",
        method="symbolic+numeric",
        verdict=HOLDS_UNDER_CONDITIONS if ok else FAILS,
        evidence=(
            f"sympy: sum_i (R_i - mean of the others) = {rloo_sum} for G = 2..8. Rewards (1,0,0,0 | 1,1,1,0): group sums of the first group "
            + ", ".join(f"{k} {fmt(v)}" for k, v in sums.items())
            + "; shared-token residual under grpo with those advantages: "
            + ", ".join(f"{k} {fmt(v)}" for k, v in residual.items())
        ),
        notes=(
            "A batch baseline subtracts the batch's mean reward, so a group that is harder or easier than the batch has "
            "sum_i A_i != 0 and every token its completions share is pushed up or down as a whole: the template tokens "
            "drift even under a token-level, length-free objective."
        ),
    )


CHECKS = (check_soft_gate_cancel, check_advantage_zero_sum)
