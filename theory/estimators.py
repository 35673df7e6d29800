"""A claim extending the premise of eq 2 (sum_i A_i = 0 within a group) to the length-weighted and best-of-group
advantage estimators verl ships: OPO's optimal baseline, REINFORCE++ with a group baseline, and grpo_passk.

OPO subtracts b = sum_j L_j R_j / sum_j L_j, so sum_i A_i = G (mean R - b): zero exactly when b is the plain mean,
which equal lengths guarantee. REINFORCE++-baseline whitens group-centred rewards c_i over the batch's tokens, so every
A_i is shifted by the token mean sum_i L_i c_i / sum_i L_i, zero at equal lengths. grpo_passk puts the whole signal on
the group's best completion, so sum_i A_i is that completion's advantage. GDPO (TRL's normalize_then_sum) normalises every
reward function within the group first: each column's normalised values sum to 0, so their weighted sum does, and the batch
normalisation after it subtracts a mean that is 0 -- zero-sum at any lengths. ReMax subtracts the greedy completion's reward
b, so sum_i A_i = G (mean R - b): zero only when the greedy completion scores the group's mean. The optimal token
baseline gives one advantage per token, A_t = R - B_t with B_t the realized-energy-weighted mean of the rewards of the
completions alive at t: on a shared prefix every completion has the same energy, so B_t is the plain mean and the sum at
that position vanishes; past it the energies differ.
"""

from __future__ import annotations

import sympy as sp
import torch

from ..core.loss import group_advantages, policy_loss
from ..core.loss.advantages import optimal_token_baseline
from ..core.loss.cancellation import make_shared_prefix_group
from .claim import FAILS, HOLDS_UNDER_CONDITIONS, Claim
from .tabular import fmt

REWARDS = (1.0, 0.0, 1.0, 0.0)
UNEQUAL = (5, 9, 12, 7)


FORMAT = (1.0, 1.0, 0.0, 0.0)
"""A second reward function's values for GDPO's second column (a format reward)."""
GREEDY = 1.0
"""ReMax's greedy reward in the numeric check: not the group's mean (0.5)."""


def _residual(scale: str, lengths: tuple[int, ...], rewards: tuple[float, ...] = REWARDS) -> tuple[float, float]:
    """(sum_i A_i, the largest shared-token residual under dapo) for one group of the given lengths and rewards."""
    r = torch.tensor(rewards, dtype=torch.float64)
    group = make_shared_prefix_group(r, list(lengths), seed=2)
    extra = {"lengths": torch.tensor(lengths), "baselines": torch.full_like(r, GREEDY)}
    matrix = torch.stack([r, torch.tensor(FORMAT, dtype=torch.float64)], -1)  # (G, 2) GDPO's two reward functions
    adv = group_advantages(matrix if scale == "gdpo" else r, group.group_ids, scale=scale, **extra)
    loss, _ = policy_loss("dapo", logp=group.logp(), old_logp=group.old_logp, advantages=adv, mask=group.mask, group_ids=group.group_ids)
    (grad,) = torch.autograd.grad(loss, group.shared_logp)
    return float(adv.sum()), float(grad.abs().max())


def _otb_position_sums(lengths: tuple[int, ...], prefix: int = 3) -> tuple[float, float]:
    """The optimal token baseline on one group sharing its first ``prefix`` tokens (same pi_old and sum pi^2 there):
    the largest |sum_i A_t^i| over the shared positions and over the later positions where every completion is alive."""
    gen = torch.Generator().manual_seed(2)
    T = max(lengths)
    mask = torch.arange(T)[None, :] < torch.tensor(lengths)[:, None]  # (G, T)
    old = -0.1 - torch.rand(len(lengths), T, generator=gen, dtype=torch.float64)  # (G, T)
    pi_sq = 0.2 + 0.5 * torch.rand(len(lengths), T, generator=gen, dtype=torch.float64)
    old[:, :prefix], pi_sq[:, :prefix] = old[:1, :prefix], pi_sq[:1, :prefix]
    r = torch.tensor(REWARDS, dtype=torch.float64)
    sums = optimal_token_baseline(r, torch.zeros(len(lengths), dtype=torch.long), mask, old, pi_sq).sum(0).abs()  # (T,)
    return float(sums[:prefix].max()), float(sums[prefix : min(lengths)].max())


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
    X = sp.Matrix(4, 2, sp.symbols("x1:9"))  # (G, K) two reward functions' values in a group of 4
    sd = sp.symbols("s1:3", positive=True)  # each column's std + eps
    gdpo_sum = sp.simplify(sum(sum((X[i, k] - sum(X[:, k]) / 4) / sd[k] for k in range(2)) for i in range(4)))
    b = sp.Symbol("b")
    remax_sum = sp.simplify(sum(r_ - b for r_ in R))
    gdpo, remax = _residual("gdpo", UNEQUAL), _residual("remax", UNEQUAL)
    otb_prefix, otb_after = _otb_position_sums(UNEQUAL)
    ok = opo_equal == 0 and opo_sum != 0 and weighted == 0 and gdpo_sum == 0 and remax_sum != 0
    ok &= abs(gdpo[0]) < 1e-12 and gdpo[1] < 1e-12 and abs(remax[0] - 4 * (0.5 - GREEDY)) < 1e-12 and remax[1] > 1e-6
    ok &= otb_prefix < 1e-6 and otb_after > 1e-3  # (B_t divides by sum W + 1e-8: the prefix sums are 0 up to that)
    ok &= all(abs(s) < 1e-12 and g < 1e-12 for s, g in equal.values())
    ok &= all(abs(s) > 1e-3 and g > 1e-6 for s, g in unequal.values()) and passk[0] > 0.1 and passk[1] > 1e-6
    return Claim(
        id="peer-estimators-zero-sum",
        source="premise of eq 2 (sum_i A_i = 0 in a group), for verl's opo, reinforce_plus_plus_baseline, grpo_passk, remax "
        "and optimal_token_baseline estimators and TRL's GDPO (multi_objective_aggregation='normalize_then_sum')",
        statement="OPO's baseline, REINFORCE++ with a group baseline, verl's pass@k advantage, ReMax, GDPO and the optimal "
        "token baseline sum to zero within each group.",
        conditions=(
            "OPO and REINFORCE++-baseline only when every completion of the batch has one length (OPO makes sum_i L_i A_i = 0 "
            "instead; the token whitening shifts every group); grpo_passk never, unless the best reward is tied; ReMax only when "
            "the greedy completion scores the group's mean reward; GDPO always; the optimal token baseline, per position, at "
            "shared-prefix positions only."
        ),
        method="symbolic+numeric",
        met_by="OPO and REINFORCE++-baseline on groups whose completions have equal lengths (e.g. every completion truncated at "
        "max_new_tokens); GDPO on any group",
        verdict=HOLDS_UNDER_CONDITIONS if ok else FAILS,
        evidence=(
            f"sympy, G = 4: OPO sum_i A_i = {opo_sum}; at equal L: {opo_equal}; sum_i L_i A_i = {weighted}. dapo, rewards "
            "1, 0, 1, 0, (sum_i A_i, shared-token residual): equal lengths "
            + ", ".join(f"{k} ({fmt(s)}, {fmt(g)})" for k, (s, g) in equal.items())
            + f"; lengths {UNEQUAL} "
            + ", ".join(f"{k} ({fmt(s)}, {fmt(g)})" for k, (s, g) in unequal.items())
            + f"; grpo_passk on rewards 1, 0, 0.5, 0 ({fmt(passk[0])}, {fmt(passk[1])})"
            + f". sympy, GDPO's group sum of two normalised columns: {gdpo_sum}; ReMax's: {remax_sum}. At lengths {UNEQUAL}: "
            f"gdpo with a second column {FORMAT} ({fmt(gdpo[0])}, {fmt(gdpo[1])}), remax with greedy reward {fmt(GREEDY)} "
            f"({fmt(remax[0])}, {fmt(remax[1])}); otb, the largest |sum_i A_t^i| over the 3 shared-prefix positions "
            f"{fmt(otb_prefix)}, over the positions after it where all are alive {fmt(otb_after)}"
        ),
        notes=(
            "Length weighting is the point of both verl estimators (OPO's optimal baseline for a sequence-summed score, "
            "REINFORCE++'s token-level whitening), and it is exactly what moves the group's sum off zero when lengths differ: "
            "the shared prompt-adjacent tokens then drift with the group's length profile. verl's pass@k advantage is a "
            "best-of-group signal by design and pushes the shared tokens of every group with a unique best completion up. ReMax's "
            "baseline comes from outside the group (the greedy completion), so a group that beats it pushes its shared tokens up "
            "and one that falls short pushes them down; GDPO's decoupling keeps every reward function's signal zero-sum."
        ),
    )


CHECKS = (check_peer_estimators_zero_sum,)
