"""Hypothesis-driven versions of the ledger's checks: random groups, ratios, lengths and clip ranges,
exact rationals where the claim is algebra, the loss core where it is code."""

from __future__ import annotations

import math
from fractions import Fraction as Fr

import torch
from hypothesis import assume, given, settings
from hypothesis import strategies as st

from dfpo.core.loss import (
    asymmetry,
    group_advantages,
    min_replace,
    sign_aware_clip,
    truncate_rebalance,
)
from dfpo.theory.tabular import log_ratios_for, shared_gradient, tabular_group

rationals = st.fractions(min_value=Fr(1, 50), max_value=Fr(5), max_denominator=60)
signed = st.fractions(min_value=Fr(-3), max_value=Fr(3), max_denominator=30)


def _clip(x, lo, hi):
    return min(max(x, lo), hi)


@st.composite
def groups(draw, min_g=2, max_g=6):
    """Binary rewards with both signs, log sequence ratios, lengths."""
    G = draw(st.integers(min_g, max_g))
    rewards = draw(st.lists(st.integers(0, 1), min_size=G, max_size=G).filter(lambda r: 0 < sum(r) < len(r)))
    seq = draw(st.lists(st.floats(-0.8, 0.8), min_size=G, max_size=G))
    lengths = draw(st.lists(st.integers(2, 7), min_size=G, max_size=G))
    adv = group_advantages(torch.tensor(rewards, dtype=torch.float64), torch.zeros(G, dtype=torch.long)).tolist()
    return adv, seq, lengths


@settings(max_examples=60, deadline=None)
@given(r=rationals, A=signed, el=st.fractions(Fr(0), Fr(1), max_denominator=20), eh=st.fractions(Fr(0), Fr(1), max_denominator=20))
def test_eq_49_sign_aware_clip_is_exact_in_rationals(r, A, el, eh):
    c = _clip(r, 1 - el, 1 + eh)
    sbar = min(r, c) if A >= 0 else max(r, c)
    assert min(r * A, c * A) == A * sbar


@settings(max_examples=60, deadline=None)
@given(r=st.floats(0.01, 5.0), A=st.floats(-3, 3), el=st.floats(0, 1), eh=st.floats(0, 1))
def test_eq_49_loss_core_clip_times_advantage_equals_ppo_min(r, A, el, eh):
    rt, at = torch.tensor([r], dtype=torch.float64), torch.tensor([A], dtype=torch.float64)
    ppo = torch.minimum(rt * at, rt.clamp(1 - el, 1 + eh) * at)
    assert torch.equal(at * sign_aware_clip(rt, at, el, eh), ppo)


@settings(max_examples=25, deadline=None)
@given(g=groups(), objective=st.sampled_from(["dfpo_min", "dfpo_orth", "dfpo_orth_pos", "dfpo_orth_tr"]), shared=st.floats(-0.5, 0.5))
def test_dfpo_cancels_a_shared_token_at_equal_lengths(g, objective, shared):
    """Score form (eq 68): the shared token cancels at equal lengths whatever is clipped, and the rest still moves."""
    adv, seq, lengths = g
    L = lengths[0]
    res = shared_gradient(objective, tabular_group(log_ratios_for(seq, [L] * len(adv), shared)), adv, stopgrad="score")
    assert abs(res.coef) < 1e-10
    assert res.total_norm > 0


@settings(max_examples=25, deadline=None)
@given(g=groups(), objective=st.sampled_from(["dfpo_min", "dfpo_orth", "dfpo_orth_pos", "dfpo_orth_tr"]))
def test_length_aware_dfpo_cancels_at_unequal_lengths(g, objective):
    """Score form with a_i = A_i / L_i: the shared token cancels at any lengths."""
    adv, seq, lengths = g
    res = shared_gradient(objective, tabular_group(log_ratios_for(seq, lengths, 0.05)), adv, length_aware=True, stopgrad="score")
    assert abs(res.coef) < 1e-10


@settings(max_examples=25, deadline=None)
@given(g=groups(), shared=st.floats(-1.0, 1.0), agg=st.sampled_from(["token_mean", "constant", "seq_mean_token_sum"]))
def test_grpo_fix_cancels_whatever_the_clip_branch_with_a_length_free_aggregation(g, shared, agg):
    adv, seq, lengths = g
    rows = [[shared] + [0.1] * (L - 1) for L in lengths]
    assert abs(shared_gradient("grpo_fix", tabular_group(rows), adv, aggregation=agg).coef) < 1e-10


@settings(max_examples=25, deadline=None)
@given(g=groups(min_g=2, max_g=5))
def test_min_replace_at_unequal_lengths_leaves_exactly_the_eq_72_coefficient(g):
    adv, seq, lengths = g
    assume(len(set(lengths)) > 1)
    group = tabular_group(log_ratios_for(seq, lengths, 0.0))
    res = shared_gradient("dfpo_min", group, adv, clip="none")
    smin = math.exp(min(seq))
    expected = -smin * sum(a / L for a, L in zip(adv, lengths)) / len(adv)  # loss = -(1/G) sum_i stilde A_i / L_i per shared score
    assert math.isclose(res.coef, expected, rel_tol=1e-9, abs_tol=1e-12)


@settings(max_examples=60, deadline=None)
@given(
    pos=st.lists(st.tuples(st.fractions(Fr(1, 10), Fr(3), max_denominator=30), rationals), min_size=1, max_size=4),
    neg=st.lists(st.tuples(st.fractions(Fr(1, 10), Fr(3), max_denominator=30), rationals), min_size=1, max_size=4),
)
def test_eq_55_printed_beta_misses_orthogonality_by_exactly_2P(pos, neg):
    """(|A_i|, s+_i) pairs on each side; whichever side is heavier, the printed beta branch is taken when N > P."""
    A = [a for a, _ in pos] + [-a for a, _ in neg]
    s = [x for _, x in pos] + [x for _, x in neg]
    P = sum(a * x for a, x in zip(A, s) if a > 0)
    N = sum(-a * x for a, x in zip(A, s) if a < 0)
    if P >= N:  # delta >= 0: mirror the groups so that the beta branch (delta < 0) is the one exercised
        A = [-a for a in A]
        P, N = N, P
    if P == N:
        return
    beta_printed = -P / N
    st_ = [beta_printed * x if a < 0 else x for a, x in zip(A, s)]
    assert beta_printed < 0
    assert sum(a * x for a, x in zip(A, st_)) == 2 * P


@settings(max_examples=40, deadline=None)
@given(g=groups(max_g=8), floor=st.sampled_from([1e-6, 1e-2, 0.5]))
def test_truncate_rebalance_in_the_loss_core_is_orthogonal_and_positive(g, floor):
    adv, seq, lengths = g
    a = torch.tensor(adv, dtype=torch.float64)
    v = truncate_rebalance(torch.exp(torch.tensor(seq, dtype=torch.float64)), a, torch.zeros(len(adv), dtype=torch.long), floor=floor)
    assert abs(float((a * v).sum())) < 1e-12
    assert bool((v > 0).all())


@settings(max_examples=40, deadline=None)
@given(g=groups(max_g=8), el=st.floats(0.0, 0.5), eh=st.floats(0.0, 0.5))
def test_min_replace_never_raises_asym(g, el, eh):
    adv, seq, lengths = g
    a = torch.tensor(adv, dtype=torch.float64)
    gid = torch.zeros(len(adv), dtype=torch.long)
    sbar = sign_aware_clip(torch.exp(torch.tensor(seq, dtype=torch.float64)), a, el, eh)
    valid = torch.ones(len(adv), dtype=torch.bool)
    assert float(asymmetry(min_replace(sbar, gid), a, gid, valid)) <= float(asymmetry(sbar, a, gid, valid)) + 1e-12


@settings(max_examples=40, deadline=None)
@given(z=st.lists(st.floats(-4, 4), min_size=3, max_size=7), kappa=st.lists(st.floats(-2, 2), min_size=7, max_size=7))
def test_cor_3_2_first_order_drift_on_a_softmax(z, kappa):
    V = len(z)
    k = torch.tensor(kappa[:V], dtype=torch.float64)
    zt = torch.tensor(z, dtype=torch.float64)
    p = torch.softmax(zt, -1)
    dz = (k[:, None] * (torch.eye(V, dtype=torch.float64) - p[None, :])).sum(0)  # sum_y kappa_y (e_y - p)
    logit = torch.tensor(z, dtype=torch.float64, requires_grad=True)
    ls = torch.log_softmax(logit, -1)
    (g,) = torch.autograd.grad(ls[0] - ls[1], logit)
    drift = float(g @ dz)
    assert math.isclose(drift, float(k[0] - k[1] - (p[0] - p[1]) * k.sum()), rel_tol=1e-9, abs_tol=1e-12)


@settings(max_examples=60, deadline=None)
@given(z=st.lists(st.floats(-6, 6), min_size=2, max_size=30), w=st.floats(-3, 3), y=st.integers(0, 29))
def test_stapo_identity_and_bounds(z, w, y):
    y = y % len(z)
    V = len(z)
    logits = torch.tensor(z, dtype=torch.float64, requires_grad=True)
    (g,) = torch.autograd.grad(w * torch.log_softmax(logits, -1)[y], logits)
    p = torch.softmax(logits.detach(), -1)
    coll = float((p * p).sum())
    H = float(-(p * p.clamp_min(1e-300).log()).sum())
    norm2 = float((g * g).sum())
    assert math.isclose(norm2, w * w * (1 - 2 * float(p[y]) + coll), rel_tol=1e-9, abs_tol=1e-12)
    C = (V - 1) / (V * math.log(V) ** 2)
    assert w * w * (1 - 2 * float(p[y]) + math.exp(-H)) <= norm2 + 1e-12
    assert norm2 <= w * w * (2 - 2 * float(p[y]) - C * H * H) + 1e-12


@settings(max_examples=60, deadline=None)
@given(r=st.fractions(Fr(0), Fr(4), max_denominator=40), A=signed, eps=st.fractions(Fr(1, 100), Fr(1, 2), max_denominator=100))
def test_symmetric_clip_surrogate_is_never_below_ppo(r, A, eps):
    ppo = min(r * A, _clip(r, 1 - eps, 1 + eps) * A)
    sym = A * _clip(r, Fr(0), 1 + eps)
    assert sym >= ppo


@settings(max_examples=25, deadline=None)
@given(g=groups(min_g=3, max_g=6), L=st.integers(2, 6))
def test_cor_3_3_gspo_cancels_anywhere_on_the_hyperplane_not_only_the_diagonal(g, L):
    adv, seq, _ = g
    a = torch.tensor(adv, dtype=torch.float64)
    s = torch.exp(torch.tensor(seq, dtype=torch.float64))
    s = s - (a @ s) / (a @ a) * a  # onto sum_i A_i s_i = 0
    assume(bool((s > 0.05).all()) and float(s.max() - s.min()) > 1e-3)
    res = shared_gradient("gspo", tabular_group(log_ratios_for(torch.log(s).tolist(), [L] * len(adv), 0.0)), adv, clip="none")
    assert abs(res.coef) < 1e-10


@settings(max_examples=20, deadline=None)
@given(g=groups(max_g=6), objective=st.sampled_from(["dfpo_min", "dfpo_orth", "dfpo_orth_pos", "dfpo_orth_tr"]))
def test_without_stop_gradient_dfpo_has_no_gradient_at_all(g, objective):
    """Without the stop-gradient sum_i A_i stilde_i(theta) = 0 identically, so the gradient is 0 everywhere.

    Truncate-and-rebalance has a true kink at delta = A.s = 0 (the side it rescales switches), where autograd
    takes the identity branch; that point is left out. The positive projection has no kink at equal ratios:
    its derivative there must be (and is) the exact one, also when breakpoints s_i / A_i tie."""
    adv, seq, lengths = g
    if objective == "dfpo_orth_tr":
        assume(abs(sum(a * math.exp(x) for a, x in zip(adv, seq))) > 1e-6)
    res = shared_gradient(objective, tabular_group(log_ratios_for(seq, lengths, 0.02)), adv, stopgrad="none")
    assert res.total_norm < 1e-12


def test_positive_projection_has_no_gradient_without_stop_gradient_at_tied_breakpoints():
    """On-policy (every ratio 1) with two equal advantages: the case a fixed Hypothesis seed once hid."""
    adv = [-0.5772502865071343, -0.5772502865071343, 1.1545005730142688]
    res = shared_gradient("dfpo_orth_pos", tabular_group(log_ratios_for([0.0, 0.0, 0.0], [2, 2, 2], 0.02)), adv, stopgrad="none")
    assert res.total_norm < 1e-12
