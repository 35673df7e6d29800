"""DFPO's clip rewrite and group transforms (paper eqs 18, 47-55, Thm C.1 / K.1)."""

from __future__ import annotations

import torch
from hypothesis import given
from hypothesis import strategies as st
from reference import qp_by_active_sets

from dfpo.core.loss import (
    min_replace,
    orth_projection,
    positive_orth_projection,
    sign_aware_clip,
    truncate_rebalance,
)

floats = st.floats(min_value=-3.0, max_value=3.0, allow_nan=False)
ratios = st.floats(min_value=0.01, max_value=5.0, allow_nan=False)
eps = st.floats(min_value=0.0, max_value=0.99, allow_nan=False)


@st.composite
def group_vectors(draw, min_size=2, max_size=8, both_signs=True):
    """(sbar, A) for one group, A zero-mean like group advantages."""
    G = draw(st.integers(min_size, max_size))
    s = torch.tensor(draw(st.lists(ratios, min_size=G, max_size=G)), dtype=torch.float64)
    a = torch.tensor(draw(st.lists(floats, min_size=G, max_size=G)), dtype=torch.float64)
    a = a - a.mean()
    if both_signs and not ((a > 1e-9).any() and (a < -1e-9).any()):
        a = torch.tensor([1.0, -1.0] + [0.0] * (G - 2), dtype=torch.float64)
    return s, a


@given(ratios, floats, eps, eps)
def test_eq49_sign_aware_rewrite_equals_min_form(r, a, el, eh):
    """Eq 49: min(r A, clip(r) A) == A * sbar for every ratio, advantage and clip range."""
    rt, at = torch.tensor(r, dtype=torch.float64), torch.tensor(a, dtype=torch.float64)
    min_form = torch.minimum(rt * at, rt.clamp(1 - el, 1 + eh) * at)
    assert torch.allclose(min_form, at * sign_aware_clip(rt, at, el, eh), rtol=0, atol=1e-15)


@given(group_vectors())
def test_min_replace_never_flips_a_coefficient_sign(group):
    """Thm C.1 / K.1: A_i stilde_i = phi_i A_i sbar_i with phi_i in (0, 1]."""
    s, a = group
    ids = torch.zeros_like(a, dtype=torch.long)
    phi = min_replace(s, ids) / s
    assert bool(((phi > 0) & (phi <= 1)).all())
    assert bool((torch.sign(a * min_replace(s, ids)) == torch.sign(a * s)).all())


@given(group_vectors(), st.lists(st.integers(1, 30), min_size=8, max_size=8))
def test_length_aware_min_replace_is_below_sbar_and_cancels_per_length(group, lengths):
    """L_i * min_j(sbar_j / L_j) <= sbar_i (no sign flip) and sum_i stilde_i A_i / L_i = 0."""
    s, a = group
    L = torch.tensor(lengths[: len(s)])
    ids = torch.zeros_like(L)
    st_ = min_replace(s, ids, L)
    assert bool((st_ <= s + 1e-12).all()) and bool((st_ > 0).all())
    assert abs(float((st_ * a / L).sum())) < 1e-12 * max(1.0, float((s * a.abs()).sum()))


@given(group_vectors())
def test_orth_projection_is_orthogonal_to_advantages(group):
    """Eq 18: A . stilde = 0, and stilde - sbar is parallel to A."""
    s, a = group
    v = orth_projection(s, a, torch.zeros_like(a, dtype=torch.long))
    assert abs(float(a @ v)) < 1e-10
    diff = v - s
    assert float((diff - (diff @ a) / (a @ a) * a).abs().max()) < 1e-10


@given(group_vectors())
def test_positive_projection_meets_its_constraints_and_kkt(group):
    """Eq 51: A.v = 0, v >= 0, and the KKT point v = max(sbar - lambda A, 0)."""
    s, a = group
    v = positive_orth_projection(s, a, torch.zeros_like(a, dtype=torch.long))
    assert bool((v >= 0).all())
    assert abs(float(a @ v)) < 1e-10 * max(1.0, float(s.abs().max()))
    # KKT: on the support v_i = s_i - lambda a_i for one lambda; off it s_i - lambda a_i <= 0.
    support = v > 1e-12
    lam_candidates = (s - v)[support & (a != 0)] / a[support & (a != 0)]
    if lam_candidates.numel():
        lam = lam_candidates[0]
        # relative: with advantages ~1e-8, lambda ~1e7 and (s - v) / a carries float64 round-off of that size
        assert float((lam_candidates - lam).abs().max()) < 1e-8 * max(1.0, abs(float(lam)))
        assert bool(((s - lam * a)[~support] <= 1e-8).all())


@given(group_vectors(max_size=7))
def test_positive_projection_equals_active_set_enumeration(group):
    """The breakpoint solver is exact: it matches brute-force enumeration of every active set."""
    s, a = group
    v = positive_orth_projection(s, a, torch.zeros_like(a, dtype=torch.long))
    ref = torch.tensor(qp_by_active_sets(s.tolist(), a.tolist()), dtype=torch.float64)
    torch.testing.assert_close(v, ref, rtol=1e-8, atol=1e-10)


@given(group_vectors(), st.data())
def test_positive_projection_beats_every_sampled_feasible_point(group, data):
    """No feasible point (u >= 0, A.u = 0) is closer to sbar than the QP solution."""
    s, a = group
    v = positive_orth_projection(s, a, torch.zeros_like(a, dtype=torch.long))
    best = float(((v - s) ** 2).sum())
    pos, neg = a > 0, a < 0
    for _ in range(20):
        u = torch.tensor(data.draw(st.lists(ratios, min_size=len(s), max_size=len(s))), dtype=torch.float64)
        # rescale the negative side so that A.u = 0 exactly (stays non-negative)
        u = torch.where(neg, u * (a[pos] @ u[pos]) / (-(a[neg] @ u[neg])), u)
        assert abs(float(a @ u)) < 1e-9
        assert float(((u - s) ** 2).sum()) >= best - 1e-9


@given(group_vectors(), st.sampled_from([1e-6, 1e-3, 0.1]))
def test_truncate_rebalance_properties(group, floor):
    """Eqs 52-55: stilde >= 0, A.stilde = 0, only one side is rescaled and by a factor in (0, 1]."""
    s, a = group
    v = truncate_rebalance(s, a, torch.zeros_like(a, dtype=torch.long), floor=floor)
    s_plus = s.clamp(min=floor)
    assert bool((v >= 0).all())
    assert abs(float(a @ v)) < 1e-10 * max(1.0, float(s_plus.max()))
    factor = v / s_plus
    assert bool(((factor > 0) & (factor <= 1 + 1e-12)).all())
    scaled = (factor - 1).abs() > 1e-12
    assert not (bool((scaled & (a > 0)).any()) and bool((scaled & (a < 0)).any()))


def test_eq55_beta_as_printed_is_negative():
    """The paper's beta = -sum_P A s+ / sum_N (-A) s+ is < 0; our rebalancing factor is its negation."""
    s = torch.tensor([1.0, 1.0, 2.0], dtype=torch.float64)
    a = torch.tensor([1.0, -0.5, -0.5], dtype=torch.float64)  # delta = 1 - 1.5 < 0: scale negatives
    pos_mass = float(a[a > 0] @ s[a > 0])
    neg_mass = float(-a[a < 0] @ s[a < 0])
    beta_printed = -pos_mass / neg_mass
    assert beta_printed < 0
    v = truncate_rebalance(s, a, torch.zeros(3, dtype=torch.long))
    assert torch.allclose(v[a < 0] / s[a < 0], torch.full((2,), -beta_printed, dtype=torch.float64))


@given(group_vectors(min_size=2, max_size=5), group_vectors(min_size=2, max_size=5), st.randoms())
def test_transforms_act_per_group_wherever_groups_sit(g1, g2, rnd):
    """Two groups interleaved anywhere in one batch get the same weights as each group alone."""
    (s1, a1), (s2, a2) = g1, g2
    s, a = torch.cat([s1, s2]), torch.cat([a1, a2])
    ids = torch.tensor([5] * len(s1) + [-2] * len(s2))
    perm = list(range(len(s)))
    rnd.shuffle(perm)
    perm = torch.tensor(perm)
    transforms = {
        "min": lambda x, adv, i: min_replace(x, i),
        "orth": orth_projection,
        "orth_pos": positive_orth_projection,
        "orth_tr": truncate_rebalance,
    }
    for fn in transforms.values():
        mixed = fn(s[perm], a[perm], ids[perm])
        unpermuted = torch.empty_like(mixed)
        unpermuted[perm] = mixed
        alone = torch.cat([fn(s1, a1, torch.zeros(len(s1), dtype=torch.long)), fn(s2, a2, torch.zeros(len(s2), dtype=torch.long))])
        torch.testing.assert_close(unpermuted, alone, rtol=1e-10, atol=1e-12)


def test_positive_projection_scales_to_large_groups():
    """O(G log G) memory: a group of 20 000 completions (the toy's exact mode) meets constraints and KKT."""
    gen = torch.Generator().manual_seed(0)
    G = 20_000
    s = 2.0 * torch.rand(G, generator=gen, dtype=torch.float64)
    a = torch.randn(G, generator=gen, dtype=torch.float64)
    a = a - a.mean()
    v = positive_orth_projection(s, a, torch.zeros(G, dtype=torch.long))
    assert bool((v >= 0).all()) and abs(float(a @ v)) < 1e-8 * float(a.abs() @ s)
    support = v > 0
    lam = ((s - v)[support] / a[support]).median()
    torch.testing.assert_close(v[support], (s - lam * a)[support], rtol=1e-9, atol=1e-9)
    assert bool(((s - lam * a)[~support] <= 1e-9).all())


@st.composite
def spread_groups(draw, decades: int):
    """(sbar, A) for one group with |A| = 10^k, k in [-decades, decades] (both signs present): A spans up to 2 * decades
    orders of magnitude."""
    G = draw(st.integers(2, 6))
    s = torch.tensor(draw(st.lists(ratios, min_size=G, max_size=G)), dtype=torch.float64)
    exponents = draw(st.lists(st.integers(-decades, decades), min_size=G, max_size=G))
    signs = [1.0, -1.0] + draw(st.lists(st.sampled_from([1.0, -1.0]), min_size=G - 2, max_size=G - 2))
    a = torch.tensor([sign * 10.0**k for sign, k in zip(signs, exponents)], dtype=torch.float64)
    return s, a


def _project(s: torch.Tensor, a: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    return positive_orth_projection(s.to(dtype), a.to(dtype), torch.zeros(len(s), dtype=torch.long)).double()


@given(spread_groups(decades=3), st.sampled_from([1e-20, 1.0, 1e20]), st.sampled_from([torch.float32, torch.float64]))
def test_positive_projection_is_exact_at_any_scale_of_the_advantages(group, scale, dtype):
    """Eq 51 is invariant to scaling A: |A| spread over 6 orders of magnitude, at any overall scale up to the 1e20
    bound, gives the enumeration of every active set to the dtype's precision (float32 misplaced the root at 1e4 apart)."""
    s, a = group
    v = _project(s, scale * a, dtype)
    ref = torch.tensor(qp_by_active_sets(s.tolist(), (a / a.abs().max()).tolist()), dtype=torch.float64)
    tol = 1e-5 if dtype == torch.float32 else 1e-9
    torch.testing.assert_close(v, ref, rtol=0, atol=tol * float(s.max()))


@given(spread_groups(decades=20))
def test_positive_projection_stays_finite_and_feasible_whatever_the_spread(group):
    """|A| from 1e-20 to 1e20 in one group (breakpoint interpolation gave weights of 1e20 or inf there): v is finite,
    non-negative, orthogonal to A up to round-off, and float32 agrees with float64."""
    s, a = group
    v32, v64 = _project(s, a, torch.float32), _project(s, a, torch.float64)
    scaled = a / a.abs().max()
    assert bool(torch.isfinite(v32).all()) and bool((v32 >= 0).all()) and bool((v64 >= 0).all())
    assert abs(float(scaled @ v64)) <= 1e-12 * float(scaled.abs().sum() * s.max())
    torch.testing.assert_close(v32, v64, rtol=0, atol=1e-5 * float(s.max()))


def test_positive_projection_of_the_reported_group_keeps_its_weights_finite():
    """The report's case: one advantage of 1e20 (or 1e30) beside -1 in a group of two, in float32."""
    s = torch.tensor([1.0001, 0.9999])
    for big in (1e20, 1e30):
        v = positive_orth_projection(s, torch.tensor([big, -1.0]), torch.zeros(2, dtype=torch.long))
        torch.testing.assert_close(v, torch.tensor([0.0, 0.9999]), rtol=0, atol=1e-6)
