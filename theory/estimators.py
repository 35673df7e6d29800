"""A claim extending the premise of eq 2 (sum_i A_i = 0 within a group) to the length-weighted and best-of-group
advantage estimators verl ships: OPO's optimal baseline, REINFORCE++ with a group baseline, and grpo_passk.

OPO subtracts b = sum_j L_j R_j / sum_j L_j, so sum_i A_i = G (mean R - b): zero exactly when b is the plain mean,
which equal lengths guarantee. REINFORCE++-baseline whitens group-centred rewards c_i over the batch's tokens, so every
A_i is shifted by the token mean sum_i L_i c_i / sum_i L_i, zero at equal lengths. grpo_passk puts the whole signal on
the group's best completion, so sum_i A_i is that completion's advantage.
"""

from __future__ import annotations

import sympy as sp
import torch

from ..core.loss import group_advantages, policy_loss
from ..core.loss.cancellation import make_shared_prefix_group
from .claim import FAILS, HOLDS_UNDER_CONDITIONS, Claim
from .tabular import fmt

REWARDS = (1.0, 0.0, 1.0, 0.0)
UNEQUAL = (5, 9, 12, 7)


def _residual(scale: str, lengths: tuple[int, ...], rewards: tuple[float, ...] = REWARDS) -> tuple[float, float]:
    """(sum_i A_i, the largest shared-token residual under dapo) for one group of the given lengths and rewards."""
    r = torch.tensor(rewards, dtype=torch.float64)
    group = make_shared_prefix_group(r, list(lengths), seed=2)
    adv = group_advantages(r, group.group_ids, scale=scale, lengths=torch.tensor(lengths))
    loss, _ = policy_loss("dapo", logp=group.logp(), old_logp=group.old_logp, advantages=adv, mask=group.mask, group_ids=group.group_ids)
    (grad,) = torch.autograd.grad(loss, group.shared_logp)
    return float(adv.sum()), float(grad.abs().max())


def check_peer_estimators_zero_sum() -> Claim:
    """Do OPO, REINFORCE++-baseline and grpo_passk keep sum_i A_i = 0 in a group?"""
    R, L = sp.symbols("R1:5"), sp.symbols("L1:5", positive=True)
    b = sum(l_ * r_ for l_, r_ in zip(L, R)) / sum(L)
    opo_sum = sp.simplify(sum(r_ - b for r_ in R))
    opo_equal = sp.simplify(opo_sum.subs({l_: L[0] for l_ in L[1:]}))
    weighted = sp.simplify(sum(l_ * (r_ - b) for l_, r_ in zip(L, R)))
    equal = {s: _residual(s, (8, 8, 8, 8)) for s in ("opo", "reinforce_pp_baseline")}
    unequal = {s: _residual(s, UNEQUAL) for s in ("opo", "reinforce_pp_baseline")}
    passk = _residual("grpo_passk", (8, 8, 8, 8), (1.0, 0.0, 0.5, 0.0))
    ok = opo_equal == 0 and opo_sum != 0 and weighted == 0
    ok &= all(abs(s) < 1e-12 and g < 1e-12 for s, g in equal.values())
    ok &= all(abs(s) > 1e-3 and g > 1e-6 for s, g in unequal.values()) and passk[0] > 0.1 and passk[1] > 1e-6
    return Claim(
        id="peer-estimators-zero-sum",
        source="premise of eq 2 (sum_i A_i = 0 in a group), for verl's opo, reinforce_plus_plus_baseline and grpo_passk estimators",
        statement="OPO's baseline, REINFORCE++ with a group baseline and verl's pass@k advantage sum to zero within each group.",
        conditions=(
            "OPO and REINFORCE++-baseline only when every completion of the batch has one length (OPO makes sum_i L_i A_i = 0 "
            "instead; the token whitening shifts every group); grpo_passk never, unless the best reward is tied."
        ),
        method="symbolic+numeric",
        met_by="OPO and REINFORCE++-baseline on groups whose completions have equal lengths (e.g. every completion truncated at max_new_tokens)",
        verdict=HOLDS_UNDER_CONDITIONS if ok else FAILS,
        evidence=(
            f"sympy, G = 4: OPO sum_i A_i = {opo_sum}; at equal L: {opo_equal}; sum_i L_i A_i = {weighted}. dapo, rewards "
            "1, 0, 1, 0, (sum_i A_i, shared-token residual): equal lengths "
            + ", ".join(f"{k} ({fmt(s)}, {fmt(g)})" for k, (s, g) in equal.items())
            + f"; lengths {UNEQUAL} "
            + ", ".join(f"{k} ({fmt(s)}, {fmt(g)})" for k, (s, g) in unequal.items())
            + f"; grpo_passk on rewards 1, 0, 0.5, 0 ({fmt(passk[0])}, {fmt(passk[1])})"
        ),
        notes=(
            "Length weighting is the point of both verl estimators (OPO's optimal baseline for a sequence-summed score, "
            "REINFORCE++'s token-level whitening), and it is exactly what moves the group's sum off zero when lengths differ: "
            "the shared prompt-adjacent tokens then drift with the group's length profile. verl's pass@k advantage is a "
            "best-of-group signal by design and pushes the shared tokens of every group with a unique best completion up."
        ),
    )


CHECKS = (check_peer_estimators_zero_sum,)
