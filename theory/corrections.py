"""A claim that extends the paper's cancellation argument (eq 2) to the rollout corrections and rejections the peers
ship (verl's rollout_corr, OpenRLHF's tis / icepop / seq-mask-tis, ROLL's train_infer_correction, TRL's vLLM IS).

The residual on a shared token is sum_i A_i c_i w_i k_i, with c_i the objective's coefficient of copy i, w_i the
correction's weight of that copy and k_i in {0, 1} whether a rejection keeps it. It vanishes wherever the uncorrected
objective cancels (sum_i A_i c_i = 0) exactly when w_i k_i is the same for every copy: a weight or verdict read off
the shared token alone is; one read off the whole completion is not.
"""

from __future__ import annotations

import sympy as sp
import torch

from ..core.loss.cancellation import make_shared_prefix_group, rejecting_one, shared_token_gradient
from ..core.loss.correction import CORRECTIONS
from ..core.loss.rejection import REJECTIONS, TOKEN_LEVEL
from .claim import FAILS, HOLDS_UNDER_CONDITIONS, Claim
from .tabular import fmt


def _worst(objective: str, lengths: list[int], key: str, mode: str, seeds: int = 4, **extra) -> float:
    """The largest shared-token residual over ``seeds`` groups (rewards 1, 0, 1, 0; sampler off pi_old by 0.3)."""
    worst = 0.0
    for seed in range(seeds):
        group = make_shared_prefix_group(torch.tensor([1.0, 0.0, 1.0, 0.0], dtype=torch.float64), lengths, seed=seed)
        more = rejecting_one(mode, group) if key == "rollout_rejection" else {"rollout_low": 0.01, "rollout_cap": 100.0}
        worst = max(worst, float(shared_token_gradient(objective, group, **{key: mode}, **more, **extra).abs().max()))
    return worst


def check_rollout_correction_cancel() -> Claim:
    """Which rollout corrections and rejections keep shared-token cancellation?"""
    A = sp.symbols("A1:5")
    w = sp.symbols("w")
    shared = sp.expand(sum(a * w for a in A) - w * sum(A))  # one weight for every copy: w sum_i A_i
    own = sp.symbols("w1:5")
    per_copy = sp.expand(sum(a * v for a, v in zip(A, own)).subs(A[3], -sum(A[:3])))  # sum_i A_i w_i with sum_i A_i = 0
    unequal = [5, 9, 12, 7]
    weights = {m: _worst("dapo", unequal, "rollout_correction", m) for m in CORRECTIONS if m != "none"}
    rejections = {m: _worst("dapo", unequal, "rollout_rejection", m) for m in REJECTIONS if m != "none"}
    renormalised = max(_worst("grpo", [8] * 4, "rollout_rejection", m) for m in TOKEN_LEVEL)
    zeroed = max(_worst("grpo", [8] * 4, "rollout_rejection", m, rollout_rs_renormalise=False) for m in TOKEN_LEVEL)
    keeps = {m for m, v in {**weights, **rejections}.items() if v < 1e-12}
    expected = {m for m in weights if m.startswith("token")} | set(TOKEN_LEVEL)
    ok = shared == 0 and per_copy != 0 and keeps == expected and renormalised > 1e-6 and zeroed < 1e-12
    return Claim(
        id="rollout-correction-cancel",
        source="extension of eq 2 to the rollout corrections of TRL (vLLM IS), verl (rollout_corr), OpenRLHF and ROLL",
        statement="A rollout correction or rejection keeps the shared-token cancellation of the objective it is applied to.",
        conditions=(
            "Only a token-level one (rollout_correction token_*, rollout_rejection token_k*): a weight or verdict read off the "
            "shared token alone is the same in every copy. Completion-level ones (sequence, geometric, segment; seq_sum / "
            "seq_mean / seq_max / segment_mean) break it; a renormalised token rejection also breaks GRPO's per-sequence mean."
        ),
        method="symbolic+numeric",
        met_by="a token-level correction (token_truncate, token_mask = IcePop) or a token_k* rejection that is not renormalised, on any objective that cancels",
        verdict=HOLDS_UNDER_CONDITIONS if ok else FAILS,
        evidence=(
            f"sympy: sum_i A_i w - w sum_i A_i = {shared}; with sum_i A_i = 0, sum_i A_i w_i = {per_copy} (not 0 for unequal w_i). "
            "dapo at unequal lengths (5, 9, 12, 7), r* = 1, 4 seeds, largest residual: "
            + ", ".join(f"{m} {fmt(v)}" for m, v in {**weights, **rejections}.items())
            + f". GRPO at equal lengths under a token rejection: renormalised {fmt(renormalised)}, zeroed {fmt(zeroed)}"
        ),
        notes=(
            "The shared event has one sampler log-prob, as it has one pi_old, so its rho* is one number in every copy. A "
            "completion-level weight (TRL/verl sequence IS, ROLL's geometric and segment weights) or a completion-level "
            "rejection (verl's geometric-mean and sequence k1/k2/k3 rejections, OpenRLHF's seq-mask-tis) carries each "
            "completion's own mismatch into its copy. Rejections are read where they reject part of the group: rejecting "
            "all, none, or two completions of opposite advantage cancels again by arithmetic."
        ),
    )


CHECKS = (check_rollout_correction_cancel,)
