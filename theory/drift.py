"""Drift claims: Prop. 3.1 (KL drift of a non-cancelled update), Cor. 3.2 (log-odds drift between
equivalent outputs), Cor. 3.4 / eq 74 (orthogonality does not zero the gradient) and Cor. G.1
(covariance => non-zero expected drift).

The policy is a real softmax: pi = softmax(z). Its score is d log pi(y)/dz = e_y - pi, its
Fisher matrix F = diag(pi) - pi pi^T, and the first-order change of log pi(y) under an update
dz is (e_y - pi) . dz. These closed forms are what the paper's abstract vectors become.
"""

from __future__ import annotations

import math
from fractions import Fraction as F

import sympy as sp
import torch

from ..core.loss import group_transform, policy_loss, sequence_log_ratio, sign_aware_clip
from .claim import FAILS, HOLDS, HOLDS_UNDER_CONDITIONS, Claim
from .tabular import ZERO_TOL, equals, fmt, log_ratios_for, shared_gradient, tabular_group


def check_prop_3_1() -> Claim:
    # Symbolic: KL(softmax(z + eta g) || softmax(z)) = 1/2 eta^2 g^T F g + O(eta^3), V = 3.
    eta = sp.Symbol("eta")
    p1, p2 = sp.symbols("p1 p2", positive=True)
    g = sp.symbols("g1:4", real=True)
    p = [p1, p2, 1 - p1 - p2]
    Z = sum(pk * sp.exp(eta * gk) for pk, gk in zip(p, g))
    q = [pk * sp.exp(eta * gk) / Z for pk, gk in zip(p, g)]
    kl = sum(qk * (eta * gk - sp.log(Z)) for qk, gk in zip(q, g))
    d1 = sp.simplify(sp.diff(kl, eta).subs(eta, 0))
    d2 = sp.diff(kl, eta, 2).subs(eta, 0)
    fisher = sum(pk * gk**2 for pk, gk in zip(p, g)) - sum(pk * gk for pk, gk in zip(p, g)) ** 2
    residual = sp.simplify(sp.expand(d2 - fisher))
    # Loss core: g_t* = the gradient that the shared token receives from gspo (off-policy, G=3).
    seq = [math.log(1.3), math.log(0.8), math.log(1.1)]
    group = tabular_group(log_ratios_for(seq, (3, 3, 3), 0.05))
    adv = torch.tensor([-2 / 3, 1 / 3, 1 / 3], dtype=torch.float64)
    loss, _ = policy_loss(
        "gspo",
        logp=group.logp(),
        old_logp=group.old_logp(),
        advantages=adv,
        mask=group.mask,
        group_ids=torch.zeros(3, dtype=torch.long),
        clip="none",
    )
    (grad,) = torch.autograd.grad(loss, group.table)
    gt = -grad[0]  # ascent direction on row h*
    z = group.table.detach()[0]
    pz = torch.softmax(z, -1)
    quad = float(gt @ (torch.diag(pz) - torch.outer(pz, pz)) @ gt)
    rows = []
    worst = 0.0
    for e in (1e-1, 1e-2, 1e-3):
        q_ = torch.softmax(z + e * gt, -1)
        kl_v = float((q_ * (q_.log() - pz.log())).sum())
        pred = 0.5 * e * e * quad
        rows.append(f"eta={e:g}: KL={kl_v:.4g}, 1/2 eta^2 gFg={pred:.4g}")
        worst = max(worst, abs(kl_v - pred) / e**3)
    ok = d1 == 0 and residual == 0 and quad > 0 and worst < 10 * float(gt.norm()) ** 3
    return Claim(
        id="prop-3.1",
        source="sec. 3.3, Prop. 3.1, eqs 3-4",
        statement="A non-cancelled shared-token gradient g moves pi(.|h*) by KL = 1/2 eta^2 g^T F g + O(eta^3) > 0 for small eta.",
        conditions="Softmax over V=3 (symbolic, any logits and direction); loss-core GSPO gradient on a softmax table, G=3, off-policy.",
        method="symbolic+numeric",
        verdict=HOLDS if ok else FAILS,
        evidence=(
            f"sympy: dKL/deta at 0 = {d1}; d2KL/deta2 at 0 - g^T F g = {residual}; loss core: g^T F g = {quad:.4g} > 0; "
            + "; ".join(rows)
            + f"; max |KL - 1/2 eta^2 gFg| / eta^3 {equals(worst)} (bounded)"
        ),
        notes="On a softmax F = diag(pi) - pi pi^T is degenerate only along the constant direction, which does not change pi; so g^T F g > 0 exactly when the update moves pi(.|h*). KL is then > 0 for every eta > 0, not only small ones.",
    )


def softmax_logodds_drift(p, kappa, a: int = 0, b: int = 1):
    """First-order change of log(pi_a / pi_b) per unit step on a softmax, eq 5's quantity:
    kappa_a - kappa_b - (p_a - p_b) sum_j kappa_j, for the update dz = sum_y kappa_y (e_y - p).

    Works on numbers, Fractions and sympy symbols alike (the ledger checks it against sympy's derivative).
    """
    return kappa[a] - kappa[b] - (p[a] - p[b]) * sum(kappa)


def check_cor_3_2() -> Claim:
    # Symbolic: a single softmax (the 'bandit' over whole outputs), update dz = eta * sum_y kappa_y (e_y - p).
    V = 4
    ps = sp.symbols(f"p1:{V + 1}", positive=True)
    ks = sp.symbols(f"k1:{V + 1}", real=True)
    e = lambda y: [1 if j == y else 0 for j in range(V)]  # noqa: E731
    score = lambda y: [e(y)[j] - ps[j] for j in range(V)]  # noqa: E731
    dz = [sum(ks[y] * score(y)[j] for y in range(V)) for j in range(V)]
    drift = sum((score(0)[j] - score(1)[j]) * dz[j] for j in range(V))  # first-order change of log(pi_a/pi_b) / eta
    formula = softmax_logodds_drift(ps, ks)
    residual = sp.simplify(sp.expand(drift - formula))
    # The three-answer example: p = (0.6, 0.3, 0.1), kappa = (1/2, 1/2, 0): eq 5 says 0 (kappa_a = kappa_b).
    three = softmax_logodds_drift((F(3, 5), F(3, 10), F(1, 10)), (F(1, 2), F(1, 2), F(0)))
    # Exact counterexample inside the paper's premise (kappa >= 0): p=(1/2,1/4,1/8,1/8), kappa_a=11/10 > kappa_b=1.
    ce = softmax_logodds_drift((F(1, 2), F(1, 4), F(1, 8), F(1, 8)), (F(11, 10), F(1), F(0), F(0)))
    # The condition under which eq 5 would hold (scores orthogonal with one norm) on a softmax: the scores are tied by
    # sum_y p_y (e_y - p) = 0, so score_a . (that sum) = p_a |score_a|^2 + sum_{y != a} p_y score_a . score_y = 0, which
    # orthogonal scores of norm^2 c > 0 would make p_a c = 0: impossible for p_a > 0.
    tie = [sp.simplify(sum(ps[y] * score(y)[j] for y in range(V)).subs(ps[V - 1], 1 - sum(ps[: V - 1]))) for j in range(V)]
    never_met = all(t == 0 for t in tie)
    # And eq 5 holds for every kappa only where its extra term vanishes for every kappa: p_a = p_b.
    exact_iff = sp.solve(sp.diff(formula, ks[2]), ps[0])
    # Loss core: a 3-completion group of one-token outputs at one context, GSPO off-policy, clip off.
    z = torch.tensor([0.7, 0.1, -0.3, 0.2], dtype=torch.float64, requires_grad=True)
    tokens = torch.tensor([0, 1, 2])
    s = torch.tensor([1.0, 1.0, 1.5], dtype=torch.float64)  # y_a, y_b correct (equal weights), y_c wrong
    adv = torch.tensor([1 / 3, 1 / 3, -2 / 3], dtype=torch.float64)
    logp = torch.log_softmax(z, -1)[tokens][:, None]  # (3, 1)
    loss, _ = policy_loss(
        "gspo",
        logp=logp,
        old_logp=(logp - torch.log(s)[:, None]).detach(),
        advantages=adv,
        mask=torch.ones(3, 1, dtype=torch.bool),
        group_ids=torch.zeros(3, dtype=torch.long),
        clip="none",
    )
    (gz,) = torch.autograd.grad(loss, z)
    step = -gz  # ascent direction
    p = torch.softmax(z.detach(), -1)
    observed = float(step[0] - step[1])  # (e_a - e_b) . dz
    kappa = (adv * s / 3).tolist()
    predicted = softmax_logodds_drift(p.tolist(), kappa)
    ok_formula = residual == 0 and abs(observed - predicted) < 1e-12
    breaks = three == F(-3, 10) and ce < 0 and abs(observed) > 1e-6 and abs(kappa[0] - kappa[1]) < 1e-15
    return Claim(
        id="cor-3.2",
        source="sec. 3.3, Cor. 3.2, eq 5",
        statement="For equivalent outputs y_a, y_b and updates eta*kappa(y)*g(y) with kappa >= 0, Delta log(pi(y_a)/pi(y_b)) = eta c(x) (kappa_a - kappa_b) + O(eta^2) with one constant c(x) > 0.",
        conditions="Policy = one softmax over outputs (V=4, the paper's model class: every LLM and tabular policy is a softmax at each context), updates summed over the sampled outputs; symbolic p and kappa; loss-core GSPO group of three one-token outputs.",
        method="symbolic+numeric",
        verdict=FAILS if (ok_formula and breaks and never_met) else HOLDS_UNDER_CONDITIONS,
        evidence=(
            f"sympy: on a softmax the exact first-order drift is eta*[kappa_a - kappa_b - (p_a - p_b) sum_j kappa_j] (residual {residual}). "
            f"Three answers, p=(0.6,0.3,0.1), kappa=(1/2,1/2,0): drift/eta = {three} where eq 5 says 0 (kappa_a = kappa_b). "
            f"Exact counterexample with kappa >= 0: p=(1/2,1/4,1/8,1/8), kappa=(11/10,1,0,0) gives drift/eta = {ce} < 0 although kappa_a > kappa_b "
            f"(no c > 0 fits). Loss core gspo, s=(1,1,1.5), A=(1/3,1/3,-2/3): kappa_a = kappa_b yet drift/eta {equals(observed)} "
            f"(formula: {fmt(predicted)}). The scores are tied: sum_y p_y grad log pi(y) = {tie} (sympy), so they are never orthogonal "
            f"with one norm; eq 5 holds for every kappa only at p_a = {exact_iff[0] if exact_iff else '?'}"
        ),
        notes=(
            "Eq 5 is what one gets when the scores of the updated outputs are orthogonal with one norm "
            "(grad log pi(y)^T grad log pi(y') = c delta_{y y'}). No softmax has such scores: sum_y p_y grad log pi(y) = 0 ties them, "
            "and that is the paper's own model class (a tabular policy and an LLM are softmaxes at every context), so the condition "
            "is never met there and the verdict is 'fails' rather than 'holds-under-conditions'. On a softmax the shared normaliser "
            "adds -(p_a - p_b) sum_j kappa_j, which vanishes for every kappa only at p_a = p_b, and otherwise only when "
            "sum_j kappa_j = 0 -- exactly when the group's coefficients cancel. So the drift between equivalent answers is not "
            "fixed by kappa_a - kappa_b alone: with equal coefficients the likelier answer still gains when sum_j kappa_j < 0 and "
            "loses when it is > 0."
        ),
    )


def check_cor_3_4() -> Claim:
    seq = [math.log(1.3), math.log(0.8), math.log(1.1)]
    adv = (-2 / 3, 1 / 3, 1 / 3)
    rows = []
    ok, ratio_cancels_partly_clipped = True, True
    for obj, kind in (("dfpo_orth", "orth"), ("dfpo_min", "min"), ("dfpo_orth_pos", "orth_pos"), ("dfpo_orth_tr", "orth_tr")):
        group = tabular_group(log_ratios_for(seq, (3, 3, 3), 0.05))
        score = shared_gradient(obj, group, adv, stopgrad="score")  # eq 68: clipped sequences keep stilde_i
        ratio = shared_gradient(obj, group, adv)  # eqs 59-62 (default): clipped sequences get GSPO's zero gradient
        unclipped = shared_gradient(obj, group, adv, clip="none")  # ratio form where nothing is clipped
        with torch.no_grad():
            s = torch.exp(sequence_log_ratio(group.logp(), group.old_logp(), group.mask))
            a = torch.tensor(adv, dtype=torch.float64)
            sbar = sign_aware_clip(s, a, 3e-4, 4e-4)
            st = group_transform(kind, sbar, a, torch.zeros(3, dtype=torch.long))
        dot = float((a * st).sum())
        rows.append(
            f"{obj}: A.stilde {equals(dot)}; score form: shared c {equals(score.coef)}, |grad| {equals(score.total_norm)}; "
            f"ratio form, partly clipped: c {equals(ratio.coef)}; ratio form, unclipped: c {equals(unclipped.coef)}, |grad| {equals(unclipped.total_norm)}"
        )
        ok &= abs(dot) < 1e-12 and abs(score.coef) < ZERO_TOL and score.total_norm > 1e-3
        ok &= abs(unclipped.coef) < ZERO_TOL and unclipped.total_norm > 1e-3
        ratio_cancels_partly_clipped &= abs(ratio.coef) < ZERO_TOL
    return Claim(
        id="cor-3.4",
        source="sec. 3.3, Cor. 3.4; App. D",
        statement="Weights with sum_i stilde_i A_i = 0 (stop-gradient) cancel the shared-token subspace but do not force the overall policy gradient to zero.",
        conditions=(
            "The construction the corollary states: stilde treated 'as a constant coefficient' during backpropagation (the score "
            "form, eq 68), a cancellation it calls 'restores (or approximates)' with the length condition of App. D.3 ('If the "
            "length normalization factors are consistent (or nearly so)'). Checked there: softmax table, G=3, equal lengths, the "
            "four DFPO transforms of the loss core, clipping active; and outside it: the ratio form (eqs 59-62, the default) with "
            "part of the group clipped."
        ),
        method="numeric",
        verdict=HOLDS if ok else FAILS,
        evidence="; ".join(rows),
        notes=(
            "The 'not zero overall' half holds without conditions. Outside the stated construction the shared subspace does not "
            "cancel: at unequal lengths under 1/|y_i| (see sec-4.4.1), and in the ratio form once clipping splits the group: a "
            "clipped sequence keeps GSPO's zero gradient, so its share of sum_i stilde_i A_i = 0 is missing from the gradient (see "
            "stopgrad-forms); "
            + (
                "the ratio form cancelled here even with part of the group clipped."
                if ratio_cancels_partly_clipped
                else "it did not cancel here."
            )
        ),
    )


def check_eq_74() -> Claim:
    # Exact: two trajectories, stilde*A = (-1, 1) (sum 0), one token each with different scores on a softmax.
    p = [F(1, 2), F(1, 4), F(1, 4)]
    g1 = [1 - p[0], -p[1], -p[2]]  # e_0 - p
    g2 = [-p[0], 1 - p[1], -p[2]]  # e_1 - p
    coef = [F(-1), F(1)]
    total = [coef[0] * x + coef[1] * y for x, y in zip(g1, g2)]
    # Loss core, random groups: A.stilde = 0 never zeroes the table gradient.
    smallest = float("inf")
    for seed in range(10):
        g = tabular_group(log_ratios_for([0.3, -0.2, 0.1, 0.05], (3, 4, 5, 6), 0.0), seed=seed)
        smallest = min(smallest, shared_gradient("dfpo_orth", g, (-0.75, -0.25, 0.25, 0.75)).total_norm)
    ok = sum(coef) == 0 and any(x != 0 for x in total) and smallest > 1e-3
    return Claim(
        id="eq-74",
        source="App. D.3, eq 74",
        statement="sum_i stilde_i A_i = 0 does not imply sum_{i,t} (stilde_i A_i / |y_i|) g_it = 0 unless all g_it are collinear with matching coefficients.",
        conditions="Exact softmax scores; loss-core Orth-Proj on 10 random tables, G=4, unequal lengths.",
        method="symbolic+numeric",
        verdict=HOLDS if ok else FAILS,
        evidence=(
            f"exact: p=(1/2,1/4,1/4), coefficients (-1, 1) on scores e_0-p and e_1-p: sum of coefficients 0, gradient {tuple(str(x) for x in total)}; "
            f"loss core dfpo_orth: smallest |grad| over 10 tables {equals(smallest)}"
        ),
    )


def check_cor_g_1() -> Claim:
    # E[A X] = Cov(A, X) + E[A] E[X]: exact discrete distributions.
    def stats(dist):
        EA = sum(p * a for p, a, _ in dist)
        EX = sum(p * x for p, _, x in dist)
        EAX = sum(p * a * x for p, a, x in dist)
        return EAX, EAX - EA * EX, EA

    exact_zero_mean = [(F(1, 2), F(1), F(2)), (F(1, 2), F(-1), F(1))]
    eax0, cov0, ea0 = stats(exact_zero_mean)
    approx_zero_mean = [(F(1, 3), F(1), F(0)), (F(1, 3), F(0), F(1)), (F(1, 3), F(-9, 10), F(0))]
    eax1, cov1, ea1 = stats(approx_zero_mean)
    ok = ea0 == 0 and cov0 != 0 and eax0 == cov0 and eax1 == 0 and cov1 != 0 and ea1 != 0
    return Claim(
        id="cor-G.1",
        met_by="C = the whole group's completions at a shared context: group-relative advantages make E[A | C] = 0 exactly",
        source="App. G, Cor. G.1",
        statement="If E[A | y in C] ~ 0 but Cov(A, grad omega | y in C) != 0, the expected group gradient on the token class C is non-zero.",
        conditions="Exact discrete joint distributions of (A, grad omega) (one coordinate).",
        method="symbolic+exhaustive",
        verdict=HOLDS_UNDER_CONDITIONS if ok else FAILS,
        evidence=(
            f"E[A X] = Cov(A,X) + E[A]E[X]. With E[A|C] = 0 exactly: E[A X] = Cov = {cov0} != 0. With E[A|C] = {ea1} "
            f"(small, not 0): Cov = {cov1} != 0 yet E[A X] = {eax1}: the expected drift vanishes"
        ),
        notes="Needs E[A | y in C] = 0 exactly (or |Cov| > |E[A|C] E[grad omega|C]|); the premise as printed ('~ 0') is not enough. Group-relative advantages are zero-mean per group, but conditioning on a token class C generally makes E[A | C] != 0.",
    )


CHECKS = (check_prop_3_1, check_cor_3_2, check_cor_3_4, check_eq_74, check_cor_g_1)
