"""Shared-token cancellation (eq 2): GRPO (eq 9), clipping (eq 10), GSPO (eq 13), Cor. 3.3,
Group-Constant (sec. 4.4.1, eq 68-72) and symmetric clipping (Cor. H.1, eq 82).

Every check does two things:
1. the paper's algebra in sympy (exact rationals), including the case that breaks it;
2. the same situation on a real softmax table (``theory.tabular``) with autograd through
   ``dfpo.policy_loss``: the coefficient c on the shared token's score must be 0 exactly
   (|c| < 1e-12 in float64) where the claim says it cancels.

The shared-token coefficient under a per-token weight alpha_i (eq 15) is
    c = sum_i A_i * w_i * alpha_i,   alpha_i = 1 (eq 8, 80: plain token sum) or 1/L_i (eq 44/66-70),
so a normalisation that depends on the completion's length enters the cancellation condition.
"""

from __future__ import annotations

import sympy as sp
import torch

from .claim import FAILS, HOLDS, HOLDS_UNDER_CONDITIONS, Claim
from .tabular import ZERO_TOL, equals, fmt, log_ratios_for, shared_gradient, tabular_group

A3 = (-2.0 / 3, 1.0 / 3, 1.0 / 3)  # eq 30 (G = 3, both signs)
A4 = (-0.75, -0.25, 0.25, 0.75)  # G = 4


def _tokens(lengths, shared=0.0, other=0.0):
    """Token log-ratios: ``shared`` at the shared position, ``other`` elsewhere."""
    return [[shared] + [other] * (L - 1) for L in lengths]


def check_eq_9() -> Claim:
    # Symbolic: eq 8 weights (alpha = 1) cancel for any G; the 1/L_i of eq 67 does not.
    rho = sp.Symbol("rho", positive=True)
    a = sp.symbols("A1:4")
    L = sp.symbols("L1:4", positive=True)
    zero_mean = {a[2]: -a[0] - a[1]}
    plain = sp.simplify((rho * sum(a)).subs(zero_mean))
    normed = sp.factor((rho * sum(ai / li for ai, li in zip(a, L))).subs(zero_mean))
    example = normed.subs({a[0]: sp.Rational(-2, 3), a[1]: sp.Rational(1, 3), L[0]: 2, L[1]: 3, L[2]: 5, rho: 1})
    # Loss core: unclipped shared ratio, G = 3 and 4, both advantage signs.
    rows = []
    equal_ok = True
    for adv, lengths in ((A3, (3, 3, 3)), (A4, (4, 4, 4, 4))):
        for agg in ("seq_mean_token_mean", "token_mean", "constant", "seq_mean_token_sum"):
            c = shared_gradient("grpo", tabular_group(_tokens(lengths, 0.05, -0.1)), adv, aggregation=agg).coef
            equal_ok &= abs(c) < ZERO_TOL
    unequal = {}
    for agg in ("seq_mean_token_mean", "token_mean", "constant", "seq_mean_token_sum"):
        unequal[agg] = shared_gradient("grpo", tabular_group(_tokens((2, 3, 5), 0.05, -0.1)), A3, aggregation=agg).coef
    indep_ok = all(abs(unequal[k]) < ZERO_TOL for k in ("token_mean", "constant", "seq_mean_token_sum"))
    broke = abs(unequal["seq_mean_token_mean"]) > 1e-6
    rows.append(f"sympy: eq 8 coefficient rho*sum A_i with A3=-A1-A2 -> {plain}; with 1/L_i (eq 67) it stays rho*sum A_i/L_i")
    rows.append(f"exact counterexample: A=(-2/3,1/3,1/3), L=(2,3,5), rho=1 gives sum A_i/L_i = {example}")
    rows.append(
        "loss core grpo, unequal L=(2,3,5): c = "
        + ", ".join(f"{k}: {fmt(v)}" for k, v in unequal.items())
        + f"; equal lengths (G=3,4), all four aggregations: |c| < 1e-12: {equal_ok}"
    )
    ok = equal_ok and indep_ok and plain == 0 and example != 0 and broke
    return Claim(
        id="eq-9",
        met_by="equal lengths, or DAPO's token_mean / Dr. GRPO's constant normaliser: every GRPO-family run on a softmax can use them",
        source="sec. 3.4, eqs 8-9 (GRPO, token-factorised)",
        statement="In GRPO's linear segment the gradients of a context-token pair shared by the whole group cancel, because sum_i A_i = 0.",
        conditions="Linear (unclipped) segment, as the paper states; tried G=2,3,4, both advantage signs, equal and unequal lengths, the four aggregations of the loss core.",
        method="symbolic+numeric",
        verdict=HOLDS_UNDER_CONDITIONS if ok else FAILS,
        evidence="; ".join(rows),
        notes=(
            "Unstated condition: the per-token normalisation must not depend on the completion (eq 8's plain sum, "
            "token_mean, constant/Dr. GRPO, seq_mean_token_sum) or lengths must be equal. GRPO as the paper itself writes "
            "its gradient (eq 67, 1/|y_i|, TRL loss_type='grpo') does NOT cancel at unequal lengths, even on-policy."
        ),
    )


def check_eq_10() -> Claim:
    # Symbolic: d/dlog r of min(rA, clip(r)A) is 0 on the clipped branch and A r otherwise.
    eps = sp.Rational(1, 5)

    def grad_coef(r, A):  # coefficient of grad log r in d/dtheta min(rA, clip(r)A)
        clipped = (A >= 0 and r > 1 + eps) or (A < 0 and r < 1 - eps)
        return 0 if clipped else A * r

    adv = [sp.Rational(-2, 3), sp.Rational(1, 3), sp.Rational(1, 3)]
    high = sum(grad_coef(sp.Rational(3, 2), A) for A in adv)
    low = sum(grad_coef(sp.Rational(1, 2), A) for A in adv)
    inside = sum(grad_coef(sp.Rational(11, 10), A) for A in adv)
    # Loss core: token_mean (length-independent) so that only clipping can break it.
    got = {}
    for name, lr in (("r=1.5", 0.405465), ("r=0.5", -0.693147), ("r=1.1", 0.0953102)):
        got[name] = shared_gradient("grpo", tabular_group(_tokens((3, 3, 3), lr, 0.0)), A3, aggregation="token_mean").coef
    dapo = shared_gradient("dapo", tabular_group(_tokens((3, 3, 3, 3), 0.3, 0.0)), A4).coef  # r=1.35 > 1.28
    ok = high != 0 and low != 0 and inside == 0 and abs(got["r=1.1"]) < ZERO_TOL
    ok &= abs(got["r=1.5"]) > 1e-6 and abs(got["r=0.5"]) > 1e-6 and abs(dapo) > 1e-6
    return Claim(
        id="eq-10",
        source="sec. 3.4, eq 10 (asymmetric piecewise clipping)",
        statement="A sign-dependent piecewise map phi_i(r) (PPO/GRPO min-clip) breaks shared-token cancellation even for token-factorised weights.",
        conditions="G=3 (eq 30 advantages) and G=4, shared ratio above and below the clip range, eps=0.2 (GRPO) and 0.2/0.28 (DAPO), token_mean aggregation.",
        method="symbolic+numeric",
        verdict=HOLDS if ok else FAILS,
        evidence=(
            f"exact gradient coefficients sum_i A_i phi_i'(r) r, eps=1/5, A=(-2/3,1/3,1/3): r=3/2 -> {high}, r=1/2 -> {low}, r=11/10 -> {inside}; "
            f"loss core grpo: c(r=1.5) {equals(got['r=1.5'])}, c(r=0.5) {equals(got['r=0.5'])}, c(r=1.1) {equals(got['r=1.1'])}; dapo G=4 r=1.35: c {equals(dapo)}"
        ),
        notes="Outside the clip range only the members on the unclipped branch keep a gradient, so the sum runs over one sign of A only.",
    )


def check_eq_13() -> Claim:
    # Product ratio (eq 11): d/d log rho of (1/2) sum A_i rho u_i.
    A, rho, u1, u2 = sp.symbols("A rho u1 u2", positive=True)
    J = sp.Rational(1, 2) * (-A * rho * u1 + A * rho * u2)
    coef = sp.diff(J, rho) * rho  # derivative w.r.t. log rho
    residual = sp.simplify(coef - A * rho / 2 * (u2 - u1))

    # Tabular product ratio through autograd (not a loss-core preset: the core uses eq 44).
    def product_coef(rows, adv):
        g = tabular_group(rows)
        logp = g.logp()
        s = torch.exp(torch.where(g.mask, g.log_ratio + logp - logp.detach(), torch.zeros_like(logp)).sum(-1))  # (B,) eq 11
        J = (torch.tensor(adv, dtype=torch.float64) * s).mean()
        (grad,) = torch.autograd.grad(J, g.table)
        d = g.shared_score()
        return float(grad[0] @ d / (d @ d))

    prod_equal_u = product_coef([[0.1, 0.2, -0.3], [0.1, -0.3, 0.2]], (-1.0, 1.0))  # u1 = u2
    prod_diff_u = product_coef([[0.1, 0.2, 0.3], [0.1, -0.3, 0.2]], (-1.0, 1.0))
    # Geometric mean (eq 44) through the loss core, clip off to stay in the linear segment.
    geo_equal_L = shared_gradient("gspo", tabular_group([[0.1, 0.2, 0.3], [0.1, -0.3, 0.2]]), (-1.0, 1.0), clip="none").coef
    geo_unequal_same_u = shared_gradient("gspo", tabular_group([[0.0, 0.0], [0.0, 0.0, 0.0]]), (-1.0, 1.0), clip="none").coef
    ok = residual == 0 and abs(prod_equal_u) < ZERO_TOL and abs(prod_diff_u) > 1e-6 and abs(geo_equal_L) > 1e-6
    return Claim(
        id="eq-13",
        source="sec. 3.4, eqs 11-13 (GSPO, product ratio)",
        statement="With the product sequence ratio s_i = prod_t r_it, the shared-token coefficient is (A rho / 2)(u2 - u1): non-zero unless u1 = u2.",
        conditions="G=2, A1=-A2; product ratio eq 11 (as stated); also tried GSPO's geometric mean eq 44 through the loss core.",
        method="symbolic+numeric",
        verdict=HOLDS if ok else FAILS,
        evidence=(
            f"sympy residual of eq 13: {residual}; tabular product ratio: c(u1=u2) {equals(prod_equal_u)}, c(u1!=u2) {equals(prod_diff_u)}; "
            f"loss core gspo (eq 44), equal lengths, u1!=u2: c {equals(geo_equal_L)}; unequal lengths L=(2,3) on-policy (u1=u2=1): c {equals(geo_unequal_same_u)}"
        ),
        notes=(
            "Under eq 44 (what GSPO and DFPO use) the coefficient is (1/G) sum_i A_i s_i / L_i, so the degenerate set is "
            "sum_i A_i s_i/L_i = 0, not u1 = u2: at unequal lengths GSPO fails to cancel even on-policy (all ratios 1), "
            "and it cancels at s1/L1 = s2/L2 with u1 != u2. The conclusion (non-cancellation is the norm) carries over."
        ),
    )


def check_cor_3_3() -> Claim:
    a = [sp.Rational(-2, 3), sp.Rational(1, 3), sp.Rational(1, 3)]
    u = [sp.Integer(1), sp.Rational(1, 2), sp.Rational(3, 2)]
    dot = sum(x * y for x, y in zip(a, u))
    # Dimension of the cancellation set {u : A.u = 0} vs the diagonal {u1 = ... = uG}.
    us = sp.symbols("u1:4")
    sol = sp.solve(sum(x * y for x, y in zip(a, us)), us[0], dict=True)
    # G = 2: A.u = 0 <=> u1 = u2.
    A2 = sp.Symbol("A", positive=True)
    g2 = sp.solve(-A2 * us[0] + A2 * us[1], us[0])
    # Loss core (eq 44, equal lengths): sequence ratios (1, 1/2, 3/2) cancel although unequal.
    import math

    rows = log_ratios_for([math.log(1.0), math.log(0.5), math.log(1.5)], (3, 3, 3), shared=0.05)
    c_unequal_u = shared_gradient("gspo", tabular_group(rows), A3, clip="none").coef
    rows2 = log_ratios_for([math.log(1.0), math.log(0.6), math.log(1.5)], (3, 3, 3), shared=0.05)
    c_generic = shared_gradient("gspo", tabular_group(rows2), A3, clip="none").coef
    ok_g2 = g2 == [us[1]]
    broke_g3 = dot == 0 and len(set(u)) == 3 and abs(c_unequal_u) < ZERO_TOL and abs(c_generic) > 1e-6
    return Claim(
        id="cor-3.3",
        met_by="groups of G = 2 (the paper's Table 4 trains at G = 2)",
        source="Cor. 3.3 (sequence coupling: cancellation only on a measure-zero set)",
        statement="Under multiplicative coupling omega_it* = r_it* u_i, shared-token cancellation requires u_1 = ... = u_G (a measure-zero set of theta).",
        conditions="Tried G=2 and G=3 with both advantage signs, exact rationals; loss core GSPO (eq 44) with equal lengths and clipping off.",
        method="symbolic+numeric",
        verdict=HOLDS_UNDER_CONDITIONS if (ok_g2 and broke_g3) else FAILS,
        evidence=(
            f"G=2: A.u=0 <=> u1 = {g2[0]}; G=3: A.u=0 <=> {sol[0]} (a plane, not the diagonal); "
            f"exact counterexample A=(-2/3,1/3,1/3), u=(1,1/2,3/2): A.u = {dot} with unequal u; "
            f"loss core gspo with s=(1,0.5,1.5): c {equals(c_unequal_u)}; s=(1,0.6,1.5): c {equals(c_generic)}"
        ),
        notes=(
            "'Requires u_1=...=u_G' is right for G=2 only. For G>=3 the cancellation set is the hyperplane sum_i A_i u_i = 0 "
            "(dimension G-1), which strictly contains the diagonal; it is still measure zero in theta, so the conclusion "
            "(non-cancellation is the structural norm) stands. DFPO's Orth-Proj (eq 18) lands exactly on that hyperplane."
        ),
    )


def check_sec_4_4_1() -> Claim:
    # Symbolic: eq 70/72 coefficient under Group-Constant: s_min * sum A_i / L_i.
    smin = sp.Symbol("s_min", positive=True)
    a = [sp.Integer(-1), sp.Integer(1)]
    L = [2, 3]
    coef = sp.nsimplify(smin * sum(x / y for x, y in zip(a, L)))
    coef_eq = sp.simplify(smin * sum(x / 3 for x in a))
    # Loss core dfpo_min: clipping active on both sides (sequence ratios far outside +-3e-4).
    import math

    seq = [math.log(1.4), math.log(0.7), math.log(1.1)]
    results = {}
    results["equal L, score"] = shared_gradient("dfpo_min", tabular_group(log_ratios_for(seq, (3, 3, 3), 0.05)), A3, stopgrad="score").coef
    results["equal L, G=4"] = shared_gradient(
        "dfpo_min", tabular_group(log_ratios_for(seq + [0.2], (4, 4, 4, 4), 0.05)), A4, stopgrad="score"
    ).coef
    unequal = tabular_group(log_ratios_for(seq, (2, 3, 5), 0.05))
    results["unequal L, score"] = shared_gradient("dfpo_min", unequal, A3, stopgrad="score").coef
    results["unequal L, length_aware"] = shared_gradient("dfpo_min", unequal, A3, length_aware=True, stopgrad="score").coef
    results["unequal L, token_mean"] = shared_gradient("dfpo_min", unequal, A3, aggregation="token_mean", stopgrad="score").coef
    results["equal L, stopgrad=ratio, clipped"] = shared_gradient(
        "dfpo_min", tabular_group(log_ratios_for(seq, (3, 3, 3), 0.05)), A3, stopgrad="ratio"
    ).coef
    results["equal L, stopgrad=ratio, unclipped"] = shared_gradient(
        "dfpo_min", tabular_group(log_ratios_for(seq, (3, 3, 3), 0.05)), A3, stopgrad="ratio", clip="none"
    ).coef
    zero = ("equal L, score", "equal L, G=4", "unequal L, length_aware", "unequal L, token_mean", "equal L, stopgrad=ratio, unclipped")
    nonzero = ("unequal L, score", "equal L, stopgrad=ratio, clipped")
    ok = all(abs(results[k]) < ZERO_TOL for k in zero) and all(abs(results[k]) > 1e-6 for k in nonzero)
    ok &= coef != 0 and coef_eq == 0
    return Claim(
        id="sec-4.4.1",
        source="sec. 4.4.1 eq 17 (Group-Constant / Min-Replace eq 50), App. D eqs 68-72",
        statement="Giving every member of a group the same weight w_min restores exact cancellation of a shared token's gradient.",
        conditions=(
            "The conditions the paper states: the shared event covers the whole group (Prop. 3.1: 'all trajectories in the group "
            "share the same context-token pair'); the weight is a constant coefficient (App. D.2: 'treat stilde_i as a constant "
            "coefficient during gradient calculation', eq 68, the score form) on the segment without clipping terms (D.1 'Excluding "
            "Clipping Terms'); equal lengths (D.3: 'If the length normalization factors are consistent (or nearly so) within this "
            "shared event, such as |y_i| being the same'; sec. 4.4.1 claims 'cancellation recovery (or approximation)'). Checked "
            "there with G=3,4, both advantage signs, clipping active on both sides; and outside them: unequal lengths, the ratio form."
        ),
        method="symbolic+numeric",
        verdict=HOLDS if ok else FAILS,
        evidence=(
            f"exact: eq 72 coefficient s_min*sum A_i/|y_i| with A=(-1,1), |y|=(2,3): {coef}; equal lengths: {coef_eq}; loss core dfpo_min: "
            + ", ".join(f"{k}: c {equals(v)}" for k, v in results.items())
        ),
        notes=(
            "Outside the stated conditions: (1) at unequal lengths the 1/|y_i| normalisation leaves s_min sum_i A_i/|y_i| (App. D's "
            "'approximately'); a per-token normalisation that does not depend on the completion (token_mean / constant) or the "
            "length-aware variant stilde_i = L_i min_j(sbar_j/L_j) cancels exactly; (2) in the ratio form (eqs 59-62, the loss "
            "core's default) a clipped sequence has GSPO's zero gradient and drops out of the sum, so a partly clipped group does "
            "not cancel."
        ),
    )


def check_cor_h_1() -> Claim:
    # Symbolic: gradient coefficient of A*phi(r) is A*phi'(r)*r, the same for every member: sum = 0.
    eps = sp.Rational(1, 5)
    results = []
    for rv in (sp.Rational(1, 2), sp.Rational(1), sp.Rational(3, 2)):
        dphi = 1 if rv < 1 + eps else 0
        results.append(sum(A * dphi * rv for A in (sp.Rational(-2, 3), sp.Rational(1, 3), sp.Rational(1, 3))))
    ok_sym = all(x == 0 for x in results)
    got = {}
    for label, lr in (("r=0.5", -0.693147), ("r=1.5", 0.405465), ("r=1.05", 0.04879)):
        for lengths in ((3, 3, 3), (2, 3, 5)):
            for agg in ("token_mean", "seq_mean_token_sum", "constant"):
                got[(label, lengths, agg)] = shared_gradient("grpo_fix", tabular_group(_tokens(lengths, lr, 0.1)), A3, aggregation=agg).coef
    eq80_ok = all(abs(v) < ZERO_TOL for v in got.values())
    preset_unequal = shared_gradient("grpo_fix", tabular_group(_tokens((2, 3, 5), 0.04879, 0.1)), A3).coef
    grpo_mean_unequal = shared_gradient(
        "grpo_fix", tabular_group(_tokens((2, 3, 5), 0.04879, 0.1)), A3, aggregation="seq_mean_token_mean"
    ).coef
    ok = ok_sym and eq80_ok and abs(preset_unequal) < ZERO_TOL
    return Claim(
        id="cor-H.1",
        source="App. H, Cor. H.1, eqs 79-82 (GRPO-fix, symmetric clipping)",
        statement="With the sign-independent weight phi(r)=clip(r,0,1+eps) (eq 80), a context-token pair shared by the whole group cancels exactly.",
        conditions="Objective eq 80 (plain token sum, no 1/|y_i|); tried shared ratio below, inside and above the clip range, G=3 both signs, equal and unequal lengths, three length-independent aggregations.",
        method="symbolic+numeric",
        verdict=HOLDS if ok else FAILS,
        evidence=(
            f"exact sum_i A_i phi'(r) r for r=1/2,1,3/2: {results}; loss core grpo_fix with a length-independent aggregation: "
            f"max |c| over 18 cases {equals(max(abs(v) for v in got.values()))}; preset grpo_fix (eq 80, seq_mean_token_sum) "
            f"at lengths (2,3,5): c {equals(preset_unequal)}; with GRPO's per-sequence mean instead: c {equals(grpo_mean_unequal)}"
        ),
        notes=(
            "Holds for eq 80 as printed, which the loss core's grpo_fix preset follows (seq_mean_token_sum). With GRPO's "
            "per-sequence token mean (1/|y_i|, aggregation='seq_mean_token_mean') the shared token does NOT cancel at "
            "unequal lengths (c above). Eq 81's gradient formula is checked separately (eq-81)."
        ),
    )


CHECKS = (check_eq_9, check_eq_10, check_eq_13, check_cor_3_3, check_sec_4_4_1, check_cor_h_1)
