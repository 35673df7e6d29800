"""App. K: the bias of Min-Replace (eq 92), its bound (eq 93), the trust-region bound (eqs 95-96)
and "Min-Replace updates are more conservative" (K.3-K.4).

The per-trajectory direction G_i = sum_t alpha_it grad log pi(y_it) (eq 90, alpha = 1/|y_i|) is
computed by autograd on a softmax table; the two estimators are the loss core's gradients
of ``gspo`` (clip off: the linear segment, eq 86) and ``dfpo_min`` (score form, eq 85).
"""

from __future__ import annotations

import math

import numpy as np
import sympy as sp
import torch

from ..core.loss import policy_loss
from .claim import FAILS, HOLDS, Claim
from .tabular import equals, log_ratios_for, tabular_group


def _estimators(seq_log_ratios, lengths, adv, seed, clip: str = "none"):
    """(g_base, g_min, per-sequence G_i, sbar, s_min) as ascent directions on the table (flattened).

    ``clip="none"``: the linear segment of eqs 85-86; ``clip="ppo"``: GSPO's clip range, default (ratio) form.
    """
    group = tabular_group(log_ratios_for(seq_log_ratios, lengths, 0.03), seed=seed)
    B = len(lengths)
    a = torch.tensor(adv, dtype=torch.float64)
    gids = torch.zeros(B, dtype=torch.long)
    out = {}
    for name in ("gspo", "dfpo_min"):
        loss, _ = policy_loss(name, logp=group.logp(), old_logp=group.old_logp(), advantages=a, mask=group.mask, group_ids=gids, clip=clip)
        (g,) = torch.autograd.grad(loss, group.table)
        out[name] = -g.flatten()
    logp = group.logp()
    per_seq = torch.where(group.mask, logp, torch.zeros_like(logp)).sum(-1) / group.mask.sum(-1)  # (B,)
    Gs = [torch.autograd.grad(per_seq[i], group.table, retain_graph=True)[0].flatten() for i in range(B)]
    sbar = torch.exp(torch.tensor(seq_log_ratios, dtype=torch.float64))
    return out["gspo"], out["dfpo_min"], Gs, sbar, float(sbar.min())


def _eq_92_gap(clip: str) -> float:
    """max |(g_min - g_base) - (1/G) sum_i A_i (s_min - sbar_i) G_i| over 8 random softmax tables."""
    worst = 0.0
    rng = np.random.default_rng(7)
    for seed in range(8):
        G = int(rng.integers(2, 6))
        adv = list(rng.normal(size=G))
        adv = [x - sum(adv) / G for x in adv]
        lengths = list(rng.integers(2, 7, G))
        seq = list(rng.normal(0, 0.4, G))
        g_base, g_min, Gs, sbar, smin = _estimators(seq, lengths, adv, seed, clip=clip)
        bias = sum(adv[i] * (smin - float(sbar[i])) * Gs[i] for i in range(G)) / G
        worst = max(worst, float((g_min - g_base - bias).abs().max()))
    return worst


def check_eq_92() -> Claim:
    worst = _eq_92_gap("none")
    worst_clipped = _eq_92_gap("ppo")
    A, s, smin_s, Gv = sp.symbols("A s s_min Gv")
    residual = sp.simplify(A * smin_s * Gv - A * s * Gv - A * (smin_s - s) * Gv)
    identity = residual == 0 and worst < 1e-12
    return Claim(
        id="eq-92",
        source="App. K.3, eqs 90-92 (derived on the linear segment of K.2)",
        statement="The Min-Replace estimator differs from the baseline by (1/G) sum_i A_i (s_min - sbar_i) G_i, which is generally non-zero.",
        conditions=(
            "The linear segment, as the paper states it: K.2 'Consider the linear segment (ignoring subgradient details at the "
            "breakpoints)', where eqs 85-86 and the estimators of eqs 90-91 are written. Checked there: no sequence clipped (clip "
            "off, where the score and ratio stop-gradient forms agree); 8 random softmax tables, G=2..5, unequal lengths, both "
            "advantage signs."
        ),
        method="symbolic+numeric",
        verdict=HOLDS if identity else FAILS,
        evidence=(
            f"sympy residual {residual}; loss core dfpo_min - gspo vs eq 92 on 8 tables, no clipping: max |difference| {equals(worst)}; "
            f"outside the linear segment, at GSPO's clip range (default ratio form, most sequences clipped): max |difference| {equals(worst_clipped)}"
        ),
        notes=(
            "An identity of the two estimators on the linear segment the paper states; 'generally non-zero' since s_min - sbar_i < 0 "
            "for every non-minimal i. Outside that segment (sequences clipped) both estimators drop the clipped sequences (GSPO's "
            "zero gradient, kept by the ratio form), so the difference is no longer eq 92's sum over the whole group."
        ),
    )


def check_eq_93() -> Claim:
    slack = float("inf")
    rng = np.random.default_rng(11)
    for seed in range(12):
        G = int(rng.integers(2, 6))
        adv = list(rng.normal(size=G))
        adv = [x - sum(adv) / G for x in adv]
        g_base, g_min, Gs, sbar, smin = _estimators(list(rng.normal(0, 0.5, G)), list(rng.integers(2, 7, G)), adv, seed)
        lhs = float((g_min - g_base).norm())
        rhs = sum(abs(adv[i]) * (float(sbar[i]) - smin) * float(Gs[i].norm()) for i in range(G)) / G
        slack = min(slack, rhs - lhs)
    return Claim(
        id="eq-93",
        source="App. K.3, eq 93",
        statement="||Bias|| <= E[(1/G) sum_i |A_i| (sbar_i - s_min) ||G_i||].",
        conditions="Per-sample version (the expectation follows by Jensen); 12 random softmax tables, G=2..5, unequal lengths.",
        method="numeric",
        verdict=HOLDS if slack >= -1e-12 else FAILS,
        evidence=f"min over 12 tables of (bound - ||g_min - g_base||) {equals(slack)} (>= 0 up to float rounding; equality when one term dominates, e.g. G=2)",
        notes="Triangle inequality plus ||E X|| <= E||X||; it holds for every sample, so there is nothing to break.",
    )


def check_eq_96() -> Claim:
    delta = sp.Symbol("delta", positive=True)
    gap = sp.exp(delta) - sp.exp(-delta)
    lim = sp.limit(gap, delta, 0)
    rng = np.random.default_rng(3)
    worst_gap, worst_phi = -1.0, -1.0
    for _ in range(2000):
        d = float(rng.uniform(1e-4, 2.0))
        s = np.exp(rng.uniform(-d, d, int(rng.integers(2, 9))))
        smin = s.min()
        worst_gap = max(worst_gap, float((s - smin).max() - (math.exp(d) - math.exp(-d))))
        worst_phi = max(worst_phi, float(math.exp(-2 * d) - (smin / s).min()))
    tight = sp.simplify((sp.exp(delta) - sp.exp(-delta)) - gap) == 0  # attained at s = (e^d, e^-d)
    ok = worst_gap <= 1e-12 and worst_phi <= 1e-12 and lim == 0 and tight
    return Claim(
        id="eq-96",
        source="App. K.5, eqs 95-96",
        statement="If |log sbar_i| <= delta in a group then 0 <= sbar_i - s_min <= e^delta - e^-delta and phi_i in [e^(-2 delta), 1]; the bias bound vanishes as delta -> 0.",
        conditions="2000 random groups, G=2..8, delta in (0, 2]; symbolic limit.",
        method="symbolic+numeric",
        verdict=HOLDS if ok else FAILS,
        evidence=f"max (gap - bound) {equals(worst_gap)}, max (e^-2delta - phi) {equals(worst_phi)}; bounds attained at sbar = (e^delta, e^-delta); lim_(delta->0) (e^delta - e^-delta) = {lim}",
        notes="The premise (95) is not implied by GSPO's clipping: for A < 0 sbar = max(s, clip(s)) is unbounded above, and for A >= 0 sbar = min(s, clip(s)) can be arbitrarily small.",
    )


def check_sec_k_4() -> Claim:
    # Exact counterexample: G=2, A=(-1,1), sbar=(1,2), G_1 = x, G_2 = x/2 (aligned directions, different norms).
    x = sp.Symbol("x", positive=True)
    base = (-1) * 1 * x + 1 * 2 * (x / 2)
    mnr = (-1) * 1 * x + 1 * 1 * (x / 2)

    # Loss core, the same geometry on a softmax table: sequence 1 = the shared token only, sequence 2 = the
    # shared token + a nearly deterministic token (small score), sbar = (1, 2).
    def norms(shift):
        group = tabular_group([[0.0], [0.0, math.log(4.0)]], seed=1)
        with torch.no_grad():
            group.table[int(group.states[1, 1]), int(group.tokens[1, 1])] += shift
        out = []
        for name in ("gspo", "dfpo_min"):
            loss, _ = policy_loss(
                name,
                logp=group.logp(),
                old_logp=group.old_logp(),
                advantages=torch.tensor([-1.0, 1.0], dtype=torch.float64),
                mask=group.mask,
                group_ids=torch.zeros(2, dtype=torch.long),
                clip="none",
            )
            out.append(float(torch.autograd.grad(loss, group.table)[0].norm()))
        return out

    n_base, n_min = norms(8.0)
    # Random tables (directions mostly orthogonal): how often does Min-Replace take the larger step?
    rng = np.random.default_rng(5)
    larger, tried = 0, 0
    for seed in range(15):
        G = int(rng.integers(2, 5))
        R = rng.integers(0, 2, G)
        if R.min() == R.max():
            continue
        adv = list(R - R.mean())
        g_base, g_min, Gs, sbar, smin = _estimators(list(rng.normal(0, 0.5, G)), list(rng.integers(2, 7, G)), adv, seed)
        larger += int(float(g_min.norm()) > float(g_base.norm()) * (1 + 1e-9))
        tried += 1
    ok_fail = base == 0 and mnr != 0 and n_min > n_base
    return Claim(
        id="sec-K.4",
        source="App. K.3-K.4 and App. C ('updates become more conservative, effective step sizes are smaller')",
        statement="Min-Replace makes the update more conservative: a smaller effective step than the baseline estimator.",
        conditions="No sequence clipped (clip off: the linear segment the claim is derived on); per-trajectory coefficients and the summed update; exact 1-d vectors; loss core on random softmax tables, G=2..4.",
        method="symbolic+numeric",
        verdict=FAILS if ok_fail else HOLDS,
        evidence=(
            f"exact: A=(-1,1), sbar=(1,2), G_1=x, G_2=x/2: baseline update {base}, Min-Replace update {mnr}; "
            f"loss core on a softmax table (seq 1 = shared token, seq 2 = shared token + a nearly deterministic token, sbar=(1,2), A=(-1,1)): "
            f"||grad gspo|| {equals(n_base)} < ||grad dfpo_min|| {equals(n_min)}; on {tried} random tables Min-Replace took the larger step {larger} times"
        ),
        notes="Per trajectory the coefficient shrinks (phi_i <= 1, Thm. K.1), but the summed update need not: shrinking unequally removes the cancellation between trajectories that the baseline had, so the total step can grow.",
    )


CHECKS = (check_eq_92, check_eq_93, check_eq_96, check_sec_k_4)
