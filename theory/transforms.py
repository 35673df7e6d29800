"""DFPO's in-group transforms: Orth-Proj (eq 18), Positive Orth-Proj (eq 51), truncate-and-
rebalance (eqs 52-55), the no-reverse-update theorems (Thm. C.1, Thm. K.1), the Asym metric
(eq 23) and the "no stop-grad" ablation (Table 3).

The loss core's transforms (``dfpo.core.loss``) are what is checked; the exact parts use
``fractions.Fraction`` so that a counterexample is a set of rationals a reader can redo by hand.
"""

from __future__ import annotations

import math
from fractions import Fraction as F

import numpy as np
import sympy as sp
import torch

from ..core.loss import (
    group_advantages,
    min_replace,
    orth_projection,
    policy_loss,
    positive_orth_projection,
    sequence_log_ratio,
    sign_aware_clip,
    truncate_rebalance,
)
from .claim import FAILS, HOLDS, HOLDS_UNDER_CONDITIONS, Claim
from .tabular import ZERO_TOL, equals, fmt, log_ratios_for, own_token_coefficients, shared_gradient, tabular_group


def _t(xs) -> torch.Tensor:
    return torch.tensor([float(x) for x in xs], dtype=torch.float64)


def random_groups(n: int, seed: int, *, max_g: int = 8, spread: float = 0.6):
    """Yield (adv, sbar, lengths) for n random groups: binary rewards (both signs), GSPO-clipped weights."""
    rng = np.random.default_rng(seed)
    made = 0
    while made < n:
        G = int(rng.integers(2, max_g + 1))
        R = rng.integers(0, 2, G)
        if R.min() == R.max():
            continue
        adv = group_advantages(_t(R), torch.zeros(G, dtype=torch.long))
        s = torch.exp(_t(rng.normal(0.0, spread, G)))
        el, eh = [(0.2, 0.2), (3e-4, 4e-4), (0.2, 0.28)][made % 3]
        sbar = sign_aware_clip(s, adv, el, eh)
        lengths = torch.tensor(rng.integers(1, 40, G))
        made += 1
        yield adv, sbar, lengths


def _fvar(v):
    mu = sum(v) / len(v)
    return sum((x - mu) ** 2 for x in v) / len(v)


def check_eq_18() -> Claim:
    worst = 0.0
    for adv, sbar, lengths in random_groups(300, 1):
        g = torch.zeros_like(adv, dtype=torch.long)
        for L in (None, lengths):
            v = orth_projection(sbar, adv, g, L)
            a = adv if L is None else adv / L
            worst = max(worst, float((a * v).sum().abs()))
    # Exact negative component: A=(-1/3,-1/3,2/3), sbar=(10,1,1) (a negative-advantage sequence far above the clip range).
    A = [F(-1, 3), F(-1, 3), F(2, 3)]
    s = [F(10), F(1), F(1)]
    c = sum(a * x for a, x in zip(A, s)) / sum(a * a for a in A)
    v = [x - c * a for a, x in zip(A, s)]
    core = orth_projection(_t(s), _t(A), torch.zeros(3, dtype=torch.long)).tolist()
    ok = worst < 1e-12 and min(v) < 0 and max(abs(x - float(y)) for x, y in zip(core, v)) < 1e-12
    return Claim(
        id="eq-18",
        source="sec. 4.4.2 eq 18 (Adv-Orthogonal reweighting); App. B.4.2 ('could result in negative components')",
        statement="stilde = sbar - (A.sbar/|A|^2) A is orthogonal to A (sum_i stilde_i A_i = 0) and may have negative components.",
        conditions="300 random groups (G=2..8, binary rewards, GSPO/GRPO/DAPO clip ranges), paper form and length-aware form; exact rationals for the negative case.",
        method="numeric+symbolic",
        verdict=HOLDS if ok else FAILS,
        evidence=f"max |a.stilde| over 600 loss-core projections {equals(worst)}; exact: A=(-1/3,-1/3,2/3), sbar=(10,1,1) -> stilde = ({', '.join(str(x) for x in v)}), loss core agrees",
        notes=(
            "A negative stilde_i flips the sign of A_i*stilde_i: a reverse update on sequence i (the case Thm. K.1 excludes for "
            "Min-Replace). It happens when one side of the group carries a weight far from the others: a negative-advantage "
            "sequence far above the clip range (the example), or a positive-advantage sequence with a tiny ratio; PPO-style "
            "clipping bounds neither."
        ),
    )


def _kkt_violation(v: torch.Tensor, s: torch.Tensor, a: torch.Tensor) -> float:
    """Largest violation of the KKT conditions of min 1/2|v-s|^2 s.t. a.v=0, v>=0."""
    support = (v > 1e-12) & (a != 0)
    if not bool(support.any()):
        return float("inf")
    lam = ((s - v)[support] / a[support]).mean()
    stationarity = ((v - s + lam * a)[v > 1e-12]).abs().max()
    dual = torch.relu(-(-s + lam * a)[v <= 1e-12]).max() if bool((v <= 1e-12).any()) else torch.tensor(0.0)
    return float(max(stationarity, dual, (v.clamp(max=0)).abs().max(), (a * v).sum().abs()))


def check_eq_51() -> Claim:
    worst_kkt, zero_hits, agree, n = 0.0, 0, 0.0, 0
    tr_farther = 0.0
    for adv, sbar, lengths in random_groups(300, 2):
        g = torch.zeros_like(adv, dtype=torch.long)
        for L in (None, lengths):
            a = adv if L is None else adv / L
            v = positive_orth_projection(sbar, adv, g, L)
            worst_kkt = max(worst_kkt, _kkt_violation(v, sbar, a))
            zero_hits += int(bool((v == 0).all()))
            o = orth_projection(sbar, adv, g, L)
            if bool((o >= 0).all()):
                agree = max(agree, float((o - v).abs().max()))
            tr = truncate_rebalance(sbar, adv, g, L)
            d_qp, d_tr = float((v - sbar).norm()), float((tr - sbar).norm())
            tr_farther = max(tr_farther, d_tr / max(d_qp, 1e-300) if d_qp > 0 else 1.0)
            n += 1
    ok = worst_kkt < 1e-9 and zero_hits == 0 and agree < 1e-12
    return Claim(
        id="eq-51",
        source="App. B.4.2 eq 51 (Positive Orth-Proj QP)",
        statement="argmin 1/2|v - sbar|^2 s.t. A.v = 0, v >= 0 has a non-trivial solution when A has both signs; it is the non-negative version of eq 18.",
        conditions="300 random groups (G=2..8, both advantage signs, three clip ranges), paper and length-aware constraint; KKT certificate for every loss-core solution.",
        method="numeric",
        verdict=HOLDS if ok else FAILS,
        evidence=(
            f"{n} exact loss-core QP solutions: max KKT violation (stationarity, dual feasibility, v>=0, A.v=0) {equals(worst_kkt)}; "
            f"all-zero solutions: {zero_hits}; where eq 18 is already non-negative the two agree to {fmt(agree)}; "
            f"truncate-and-rebalance lies up to {fmt(tr_farther)}x farther from sbar than the projection"
        ),
        notes=(
            "Non-trivial always: sbar > 0 and a feasible v >= 0 with sbar.v > 0 exists, so 0 is never the projection. "
            "Truncate-and-rebalance (eqs 52-55) is feasible but is not the projection (the 'closed-form approximation' is "
            "not close in general)."
        ),
    )


def check_eq_55() -> Claim:
    P, N = sp.symbols("P N", positive=True)  # P = sum_P A s+, N = sum_N (-A) s+
    beta_printed = -P / N
    beta_right = P / N
    dot_printed = sp.simplify(P + beta_printed * (-N))  # A.stilde when delta < 0
    dot_right = sp.simplify(P + beta_right * (-N))
    alpha = N / P
    # Exact counterexample for the printed beta: A=(-1,1), sbar=(3,1): delta=-2.
    A = [F(-1), F(1)]
    s = [F(3), F(1)]
    Pv = sum(a * x for a, x in zip(A, s) if a > 0)
    Nv = sum(-a * x for a, x in zip(A, s) if a < 0)
    b = -Pv / Nv
    st = [b * x if a < 0 else x for a, x in zip(A, s)]
    dot = sum(a * x for a, x in zip(A, st))
    # The eps-floor claim: A=(-1,1/2,1/2), sbar=(1,1/20,3), eps=1/10.
    A2 = [F(-1), F(1, 2), F(1, 2)]
    eps = F(1, 10)
    splus = [max(x, eps) for x in (F(1), F(1, 20), F(3))]
    P2 = sum(a * x for a, x in zip(A2, splus) if a > 0)
    N2 = sum(-a * x for a, x in zip(A2, splus) if a < 0)
    st2 = [(N2 / P2) * x if a > 0 else x for a, x in zip(A2, splus)]
    core2 = truncate_rebalance(_t([1, F(1, 20), 3]), _t(A2), torch.zeros(3, dtype=torch.long), floor=0.1).tolist()
    core1 = truncate_rebalance(_t(s), _t(A), torch.zeros(2, dtype=torch.long)).tolist()
    worst_dot, min_v = 0.0, float("inf")
    for adv, sbar, _lengths in random_groups(300, 3):
        v = truncate_rebalance(sbar, adv, torch.zeros_like(adv, dtype=torch.long))
        worst_dot = max(worst_dot, float((adv * v).sum().abs()))
        min_v = min(min_v, float(v.min()))
    fails = (
        dot_printed == 2 * P
        and dot_right == 0
        and b < 0
        and dot != 0
        and min(st2) < eps
        and max(abs(x - float(y)) for x, y in zip(core2, st2)) < 1e-12
    )
    return Claim(
        id="eq-55",
        source="App. B.4.2 eqs 52-55 (truncate-and-rebalance)",
        statement="With alpha, beta as printed in eq 55 (both in (0,1]), the rebalanced weights satisfy stilde >= eps*1 and A.stilde = 0 exactly.",
        conditions="Both branches (delta > 0 and delta < 0), exact rationals; loss core truncate_rebalance on 300 random groups.",
        method="symbolic+numeric",
        verdict=FAILS if fails else HOLDS,
        evidence=(
            f"alpha = {alpha} is right (in (0,1) when delta > 0). beta as printed = {beta_printed} < 0: then A.stilde = {dot_printed} != 0 "
            f"(with beta = {beta_right}: {dot_right}). Exact counterexample A=(-1,1), sbar=(3,1): printed beta = {b}, stilde = "
            f"({', '.join(str(x) for x in st)}) (negative), A.stilde = {dot}; corrected (loss core): {[round(x, 12) for x in core1]}. "
            f"Floor claim: A=(-1,1/2,1/2), sbar=(1,1/20,3), eps=1/10 -> stilde = ({', '.join(str(x) for x in st2)}) with 2/31 < eps "
            f"(loss core agrees). Loss core on 300 random groups: max |A.stilde| {equals(worst_dot)}, min stilde {equals(min_v)} > 0"
        ),
        notes=(
            "Two errors: (1) eq 55's beta has a sign error; the rebalancing factor is beta = sum_P A s+ / sum_N (-A) s+ "
            "(the loss core uses this); (2) 'stilde >= eps*1 by construction' is false: scaling the larger side by "
            "alpha or beta < 1 can push a floored weight below eps. What does hold: stilde > 0 and A.stilde = 0. "
            "Step 1 (eq 52) is a no-op unless some sbar_i < eps, since sbar = exp(.) > 0 always."
        ),
    )


def check_thm_c_1() -> Claim:
    lo, hi, n = 1.0, 0.0, 0
    for adv, sbar, lengths in random_groups(300, 4):
        g = torch.zeros_like(adv, dtype=torch.long)
        for L in (None, lengths):
            phi = min_replace(sbar, g, L) / sbar
            lo, hi, n = min(lo, float(phi.min())), max(hi, float(phi.max())), n + 1
    # Symbolic: A * s_min = phi * A * s with phi = s_min / s in (0, 1].
    s, smin, A = sp.symbols("s s_min A", positive=True)
    residual = sp.simplify(A * smin - (smin / s) * A * s)
    ok = lo > 0 and hi <= 1.0 + 1e-15 and residual == 0
    return Claim(
        id="thm-C.1",
        source="App. C, Thm. C.1, eqs 59-62",
        statement="Min-Replace multiplies each trajectory's coefficient A_i s_i by phi_i = s_min/s_i in (0, 1]: no sign flip, only shrinkage.",
        conditions="Gradient of phi neglected (stop-gradient); 300 random groups with clipping active, both signs, paper and length-aware Min-Replace.",
        method="symbolic+numeric",
        verdict=HOLDS if ok else FAILS,
        evidence=f"sympy residual {residual}; loss core min_replace: phi in [{fmt(lo)}, {fmt(hi)}] over {n} groups",
        notes="The length-aware variant stilde_i = L_i min_j(sbar_j/L_j) keeps phi in (0,1]. Without the stop-gradient see tab-3-no-stopgrad.",
    )


def check_thm_k_1() -> Claim:
    seq = [math.log(1.5), math.log(0.6), math.log(1.2), math.log(0.9)]
    adv = (-0.75, -0.25, 0.25, 0.75)
    group = tabular_group(log_ratios_for(seq, (3, 4, 5, 6), 0.02))
    bad = {}
    for label, kw in (
        ("min/score", {}),
        ("min/ratio", {"stopgrad": "ratio"}),
        ("min/length_aware", {"length_aware": True}),
        ("orth_pos", {}),
        ("orth_tr", {}),
    ):
        obj = "dfpo_orth_pos" if label == "orth_pos" else "dfpo_orth_tr" if label == "orth_tr" else "dfpo_min"
        c = own_token_coefficients(obj, group, adv, **kw)  # (B, T), loss coefficient
        move = -c  # direction of log pi(y_it)
        flips = 0
        for i, a in enumerate(adv):
            row = move[i][~torch.isnan(move[i])]
            flips += int(bool(((row * a) < -ZERO_TOL).any()))
        bad[label] = flips
    # Orth-Proj (eq 18) on a group where it goes negative: a reverse update.
    g2 = tabular_group(log_ratios_for([math.log(10.0), 0.0, 0.0], (3, 3, 3), 0.0))
    c2 = -own_token_coefficients("dfpo_orth", g2, (-1 / 3, -1 / 3, 2 / 3), clip="none")
    orth_flip = bool((c2[1, 1:] * (-1 / 3) < 0).all())
    ok = all(v == 0 for v in bad.values()) and orth_flip
    return Claim(
        id="thm-K.1",
        source="App. K.2, Thm. K.1, eqs 85-89",
        statement="Under stop-gradient, Min-Replace keeps sign(A_i stilde_i) = sign(A_i sbar_i) = sign(A_i): every token's update keeps the direction its advantage asks for.",
        conditions="Softmax table, G=4, lengths (3,4,5,6), both signs, sequence ratios far outside GSPO's clip range; score and ratio stop-gradient forms, length-aware variant; also Positive Orth-Proj and truncate-and-rebalance.",
        method="numeric",
        verdict=HOLDS if ok else FAILS,
        evidence=(
            "tokens moved against their advantage (loss core, per-token coefficient on its own table row): "
            + ", ".join(f"{k}: {v} sequences" for k, v in bad.items())
            + f"; Orth-Proj (eq 18) with A=(-1/3,-1/3,2/3), s=(10,1,1): sequence 2 (A<0) pushed UP: {orth_flip}"
        ),
        notes="Sign preservation holds for Min-Replace and carries to Positive Orth-Proj and (sign-corrected) truncate-and-rebalance, whose weights are >= 0; it fails for Orth-Proj (eq 18), whose weights can go negative.",
    )


def check_tab_3_no_stopgrad() -> Claim:
    smin = sp.Function("s_min")(sp.Symbol("theta"))
    a = sp.symbols("A1:4")
    J = sum(ai * smin for ai in a).subs(a[2], -a[0] - a[1])
    dJ = sp.simplify(sp.diff(J, sp.Symbol("theta")))
    norms = {}
    seq = [math.log(1.3), math.log(0.7), math.log(1.1), 0.2]
    for obj in ("dfpo_min", "dfpo_orth", "dfpo_orth_pos", "dfpo_orth_tr"):
        group = tabular_group(log_ratios_for(seq, (3, 4, 5, 6), 0.02))
        norms[obj] = shared_gradient(obj, group, (-0.75, -0.25, 0.25, 0.75), stopgrad="none", clip="none").total_norm
    with_sg = shared_gradient("dfpo_min", tabular_group(log_ratios_for(seq, (3, 4, 5, 6), 0.02)), (-0.75, -0.25, 0.25, 0.75)).total_norm
    # The one exception: truncate-and-rebalance's kink delta = A.s+ = 0, hit exactly on-policy (every ratio 1).
    onpolicy = {
        obj: shared_gradient(
            obj, tabular_group(log_ratios_for([0.0] * 4, (3, 4, 5, 6), 0.0)), (-0.75, -0.25, 0.25, 0.75), stopgrad="none"
        ).total_norm
        for obj in ("dfpo_min", "dfpo_orth_tr", "gspo")
    }
    ok = dJ == 0 and all(v < 1e-12 for v in norms.values()) and with_sg > 1e-3
    return Claim(
        id="tab-3-no-stopgrad",
        source="sec. 6.2 Table 3 and App. K.6 ('DFPO (no stop-grad)')",
        statement="Removing the stop-gradient from the group transform 'introduces additional gradient coupling and instability'.",
        conditions="Objective eq 61 / eq 50 differentiated through the transform; zero-mean group advantages (eq 43 guarantees sum A = 0); loss core stopgrad='none'.",
        method="symbolic+numeric",
        verdict=FAILS if ok else HOLDS,
        evidence=(
            f"sympy: d/dtheta sum_i A_i s_min(theta) with sum A = 0 -> {dJ}; loss core, G=4, unequal lengths, stopgrad='none': "
            + ", ".join(f"{k} |grad| {equals(v)}" for k, v in norms.items())
            + f"; with the stop-gradient (dfpo_min) |grad| {equals(with_sg)}; on-policy (every ratio 1, delta = 0): "
            + ", ".join(f"{k} |grad| {equals(v)}" for k, v in onpolicy.items())
        ),
        notes=(
            "Without stop-gradient the DFPO objective is identically zero in theta: Min-Replace gives s_min(theta) * sum_i A_i = 0 and "
            "every exactly orthogonalising transform gives sum_i A_i stilde_i(theta) = 0 by construction. The gradient vanishes; there is "
            "no coupling to destabilise anything, the update is simply null (only the KL term or non-zero-mean advantages could move "
            "theta). Table 3's 'no stop-grad' row cannot come from eq 50/61 as written; the paper does not say what was run. "
            "One implementation artefact: at truncate-and-rebalance's kink delta = A.s+ = 0 (exactly on-policy) the loss core's "
            "autograd takes the identity branch and returns GSPO's gradient."
        ),
    )


def check_eq_23() -> Claim:
    # Identity: with sum A = 0 and d = sbar - s_min >= 0, Var(sbar A) = Var(s_min A) + Var(dA) + 2 s_min E[d A^2].
    worst_min, orth_up, n = 0.0, 0, 0
    for adv, sbar, _lengths in random_groups(400, 5):
        g = torch.zeros_like(adv, dtype=torch.long)
        base = float(torch.var(sbar * adv, unbiased=False))
        mn = float(torch.var(min_replace(sbar, g) * adv, unbiased=False))
        orth = float(torch.var(orth_projection(sbar, adv, g) * adv, unbiased=False))
        worst_min = max(worst_min, mn - base)
        orth_up += int(orth > base + 1e-12)
        n += 1
    A = [F(-1, 3), F(-1, 3), F(2, 3)]
    s = [F(1, 2), F(1), F(1, 2)]
    c = sum(a * x for a, x in zip(A, s)) / sum(a * a for a in A)
    o = [x - c * a for a, x in zip(A, s)]
    v_base, v_orth = _fvar([a * x for a, x in zip(A, s)]), _fvar([a * x for a, x in zip(A, o)])
    ok = worst_min <= 1e-12 and orth_up > 0 and v_orth > v_base
    return Claim(
        id="eq-23",
        met_by="Min-Replace (eq 50), the paper's own main transform, on any group",
        source="sec. 6.1 eq 23 and App. K.4 ('decoupling transformations significantly reduce Asym')",
        statement="The in-group transforms reduce Asym = Var_i(w_i A_i).",
        conditions="Population variance within a group (as the loss core's weights/asym); 400 random groups (G=2..8, both signs, three clip ranges); exact rationals.",
        method="symbolic+numeric",
        verdict=HOLDS_UNDER_CONDITIONS if ok else FAILS,
        evidence=(
            f"Min-Replace: max Asym(min) - Asym(gspo) over {n} groups {equals(worst_min)} (never up). Orth-Proj raised Asym in {orth_up}/{n} groups; "
            f"exact: A=(-1/3,-1/3,2/3), sbar=(1/2,1,1/2) -> stilde=({', '.join(str(x) for x in o)}), Asym {v_base} -> {v_orth}"
        ),
        notes=(
            "Holds for Min-Replace, by the identity Var(sbar A) = Var(s_min A) + Var(dA) + 2 s_min E[d A^2] (d = sbar - s_min >= 0, E[A] = 0). "
            "Fails for Orth-Proj (eq 18). Asym is a variance, while cancellation is about the mean sum_i w_i A_i: Min-Replace cancels "
            "exactly with Asym = s_min^2 Var(A) > 0, so Asym is not a measure of non-cancellation."
        ),
    )


def check_stopgrad_forms() -> Claim:
    """Eq 68 (score form) vs eqs 59-62 (ratio form): how stilde enters the gradient."""
    theta, w, A, eps = sp.symbols("theta w A epsilon", positive=True)
    s = sp.exp(theta)  # a one-token sequence: log s = theta
    score = sp.diff(w * A * theta, theta)  # sg(stilde) A log pi: d/dtheta = w A
    ratio_linear = sp.simplify(sp.diff((w / s).subs(theta, sp.Symbol("theta0")) * s * A, theta).subs(sp.Symbol("theta0"), theta))
    ratio_clipped = sp.diff((w / (1 + eps)) * (1 + eps) * A, theta)  # sbar = 1 + eps is constant once clipped
    # Loss core: G = 4, equal lengths, sequence ratios around GSPO's clip range, both forms, per-row gradients.
    g = torch.Generator().manual_seed(0)
    logp = (-1.0 + 0.1 * torch.randn(4, 5, generator=g, dtype=torch.float64)).requires_grad_()
    old = (
        logp.detach() - torch.tensor([[0.0], [2e-4], [3e-3], [-2e-3]], dtype=torch.float64)
    ).contiguous()  # log s_i = 0, 2e-4, 3e-3, -2e-3
    adv = torch.tensor([1.0, -1.0, 1.0, -1.0], dtype=torch.float64)
    mask, gid = torch.ones(4, 5, dtype=torch.bool), torch.zeros(4, dtype=torch.long)
    grads = {}
    for form in ("score", "ratio"):
        loss, _ = policy_loss("dfpo_min", logp=logp, old_logp=old, advantages=adv, mask=mask, group_ids=gid, stopgrad=form)
        grads[form] = torch.autograd.grad(loss, logp)[0]  # (4, 5)
    with torch.no_grad():
        sr = torch.exp(sequence_log_ratio(logp, old, mask))
        clipped = sign_aware_clip(sr, adv, 3e-4, 4e-4) != sr  # (4,) sequences on the clipped segment
    same_unclipped = bool(torch.allclose(grads["score"][~clipped], grads["ratio"][~clipped], atol=1e-15))
    zero_clipped = bool((grads["ratio"][clipped] == 0).all())
    score_moves_clipped = bool((grads["score"][clipped].abs().sum(-1) > 1e-6).all())
    ok = score == w * A and ratio_linear == w * A and ratio_clipped == 0 and bool(clipped.any()) and bool((~clipped).any())
    ok &= same_unclipped and zero_clipped and score_moves_clipped
    return Claim(
        id="stopgrad-forms",
        source="App. D eq 68, App. K eq 85 (score form) vs App. C eqs 59-62 (ratio form: 'the gradient terms of phi_i are neglected')",
        statement="The two stop-gradient forms the paper writes for DFPO give the same update.",
        conditions=(
            "The linear segment, where the paper derives every one of them: App. C 'We analyze in a local linear region (ignoring "
            "the piecewise points of min/clip)' (eqs 57-62), App. D.1 'Gradient Review for GSPO (Excluding Clipping Terms)' (eq 68), "
            "App. K.2 'Consider the linear segment' (eq 85). There both give stilde_i A_i grad log s_i; checked also outside it, "
            "with clipping active."
        ),
        method="symbolic+numeric",
        verdict=HOLDS if ok else FAILS,
        evidence=(
            f"sympy, one sequence with log s = theta: score form d/dtheta = {score}; ratio form on the linear segment = {ratio_linear}, "
            f"on the clipped segment (sbar = 1 + epsilon) = {ratio_clipped}. Loss core dfpo_min, G=4, log s = (0, 2e-4, 3e-3, -2e-3), "
            f"A = (1, -1, 1, -1), GSPO's range: clipped = {clipped.tolist()}; unclipped rows: score == ratio gradient {same_unclipped}; "
            f"clipped rows: ratio form gradient 0 {zero_clipped}, score form gradient non-zero {score_moves_clipped}"
        ),
        notes=(
            "Outside the linear segment the paper states, the forms part: on a clipped sequence the ratio form keeps GSPO's zero "
            "gradient (the trust region) while the score form gives it stilde_i A_i grad log s_i: no trust region there. The score "
            "form cancels shared tokens with clipping active; the ratio form (the default, as App. B, K.3 and K.5 intend: GSPO's "
            "clipping stays) cancels them only where clipping leaves the group whole."
        ),
    )


CHECKS = (check_eq_18, check_eq_51, check_eq_55, check_thm_c_1, check_thm_k_1, check_tab_3_no_stopgrad, check_eq_23, check_stopgrad_forms)


def check_tab_3_scale() -> Claim:
    """Table 3's 'DFPO (scale by 0.5)': does a global factor 0.5 on the weights give smaller updates?"""
    seq = [math.log(1.2), math.log(0.9), math.log(1.05), math.log(0.8)]
    adv = torch.tensor([-0.75, -0.25, 0.25, 0.75], dtype=torch.float64)

    def train(scale: float, optimizer: str, steps: int = 10) -> torch.Tensor:
        group = tabular_group(log_ratios_for(seq, (3, 4, 5, 6), 0.02), seed=3)
        old = group.old_logp()
        opt = torch.optim.Adam([group.table], lr=1e-2) if optimizer == "adam" else torch.optim.SGD([group.table], lr=1e-1)
        for _ in range(steps):
            loss, _ = policy_loss(
                "gspo",
                logp=group.logp(),
                old_logp=old,
                advantages=adv,
                mask=group.mask,
                group_ids=torch.zeros(4, dtype=torch.long),
                clip="none",
            )
            opt.zero_grad()
            (scale * loss).backward()
            opt.step()
        return group.table.detach().clone()

    start = tabular_group(log_ratios_for(seq, (3, 4, 5, 6), 0.02), seed=3).table.detach()
    moved = {}
    for optimizer in ("adam", "sgd"):
        full, half = train(1.0, optimizer) - start, train(0.5, optimizer) - start
        moved[optimizer] = (float(half.norm() / full.norm()), float((full - half).norm() / full.norm()))
    ok = abs(moved["adam"][0] - 1) < 1e-4 and abs(moved["sgd"][0] - 0.5) < 0.05
    return Claim(
        id="tab-3-scale",
        met_by="plain SGD on a softmax policy (the toy's default optimiser; the paper names none)",
        source="sec. 6.2 Table 3 ('DFPO (scale by 0.5)' rules out 'gains merely due to smaller updates')",
        statement="Replacing eq 50 by stilde = 0.5 sbar makes the updates smaller, so it controls for step size.",
        conditions="Stop-gradient, GSPO loss on a softmax table (G=4, unequal lengths), 10 optimiser steps with Adam (eps=1e-8) and with SGD.",
        method="numeric",
        verdict=HOLDS_UNDER_CONDITIONS if ok else FAILS,
        evidence=(
            f"parameter displacement of the 0.5-scaled run relative to the unscaled one: Adam {moved['adam'][0]:.6f} "
            f"(relative difference of the two trajectories {fmt(moved['adam'][1])}); SGD {moved['sgd'][0]:.3f}"
        ),
        notes=(
            "Only with an optimiser whose step scales with the gradient (SGD). Adam/AdamW -- the default in verl and TRL, and the "
            "optimiser the paper's App. E discusses -- normalises the gradient by its running RMS, so a constant loss factor 0.5 "
            "changes the update only through eps: 'scale by 0.5' is then GSPO with the same step size, not a smaller one. "
            "The paper does not name its optimiser (App. I)."
        ),
    )


CHECKS = CHECKS + (check_tab_3_scale,)
