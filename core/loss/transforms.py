"""DFPO's in-group transforms of the post-clip weight vector (paper App. B, eqs 18, 50-55), and how the
transformed weight enters the gradient (the stop-gradient forms, eqs 59-62, 68/85): the transform component.

Each transform maps a group's post-clip weights sbar (eq 47) and advantages A to new weights
stilde. All of them take flat (B,) tensors and arbitrary ``group_ids`` (B,) (or a precomputed ``Groups``).
``sequence_surrogate`` turns a ratio shape's sequence weights into the per-token surrogate through the
spec's transform and stop-gradient form.

Where this departs from the paper:
1. Eq (55) prints beta = -sum_P A s+ / sum_N (-A) s+, which is negative; the factor that makes
   A . stilde = 0 is beta = sum_P A s+ / sum_N (-A) s+ in (0, 1]. We use the latter.
2. ``lengths`` (optional) makes a transform length-aware (this project's extension): the
   constraint becomes sum_i stilde_i A_i / L_i = 0, which is what cancels a shared token
   under the 1/|y_i| normalisation of eq (70) when completion lengths differ.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

import torch
from torch import Tensor

from .batch import LossBatch
from .fields import POSITIVE, Component, When, component_field
from .groups import Groups, group_amax, group_amin, group_dense, group_sum

if TYPE_CHECKING:  # spec imports this module
    from .spec import ObjectiveSpec


def _effective_adv(adv: Tensor, lengths: Tensor | None, groups: Groups) -> Tensor:
    """a_i = A_i (paper) or A_i / L_i (length-aware), divided by the largest |a_j| of i's group (B,).

    The projections and truncate-and-rebalance are invariant to scaling a within a group (a.v = 0
    and the rebalancing ratios do not change), and the scaling keeps a . a finite for any finite
    advantages (1e20 squared overflows float32).
    """
    a = adv if lengths is None else adv / lengths.to(adv.dtype).clamp(min=1)
    scale = group_amax(a.abs(), groups.index, groups.n)[groups.index]  # (B,) group max |a|
    return torch.where(scale > 0, a / torch.where(scale > 0, scale, 1.0), 0.0)


def min_replace(sbar: Tensor, group_ids: Tensor | Groups, lengths: Tensor | None = None) -> Tensor:
    """Eq (50), Min-Replace: stilde_i = min_j sbar_j over i's group (B,).

    Length-aware: stilde_i = L_i * min_j (sbar_j / L_j), still <= sbar_i (no sign flip).
    """
    groups = Groups.of(group_ids)
    index, n = groups.index, groups.n
    if lengths is None:
        return group_amin(sbar, index, n)[index]
    L = lengths.to(sbar.dtype).clamp(min=1)  # (B,)
    return L * group_amin(sbar / L, index, n)[index]


def orth_projection(sbar: Tensor, adv: Tensor, group_ids: Tensor | Groups, lengths: Tensor | None = None) -> Tensor:
    """Eq (18), Adv-Orthogonal reweighting: stilde = sbar - (a.sbar / |a|^2) a, per group (B,).

    May go negative. A group with a = 0 is left unchanged.
    """
    groups = Groups.of(group_ids)
    index, n = groups.index, groups.n
    a = _effective_adv(adv, lengths, groups)
    dot = group_sum(a * sbar, index, n)  # (n,)
    norm2 = group_sum(a * a, index, n)  # (n,)
    coef = torch.where(norm2 > 0, dot / torch.where(norm2 > 0, norm2, torch.ones_like(norm2)), torch.zeros_like(dot))
    return sbar - coef[index] * a


def _before(x: Tensor) -> Tensor:
    """Exclusive prefix sums along the last axis: out[..., k] = sum_{i < k} x[..., i]."""
    return torch.cat([torch.zeros_like(x[..., :1]), x.cumsum(-1)[..., :-1]], dim=-1)


def _after(x: Tensor) -> Tensor:
    """Exclusive suffix sums along the last axis: out[..., k] = sum_{i > k} x[..., i]. Summed from the end, so a large
    term before k never enters (``total - cumsum`` lost the small terms behind it)."""
    return torch.cat([x.flip(-1).cumsum(-1).flip(-1)[..., 1:], torch.zeros_like(x[..., :1])], dim=-1)


def _qp_multiplier(s: Tensor, a: Tensor) -> tuple[Tensor, Tensor]:
    """The exact root lambda of g(lambda) = sum_i a_i max(s_i - lambda a_i, 0), per row, and its active set.

    s, a: (n, G) padded with a = 0 (padding adds nothing to g). Rows must hold both signs of
    a. g is piecewise linear and non-increasing with breakpoints b_i = s_i / a_i. With the
    breakpoints sorted, g at each of them is a pair of prefix/suffix sums (O(G log G) time,
    O(G) memory): at lambda = b_k the active terms are a_i > 0 with b_i > b_k and a_i < 0
    with b_i < b_k (a term at its own breakpoint is 0). The root is bracketed between the
    largest breakpoint b_a with g >= 0 and the smallest b_b with g <= 0. Inside the bracket the
    active set is fixed (a_i > 0 with b_i >= b_b, a_i < 0 with b_i <= b_a), so the root is
    sum_active a s / sum_active a^2 exactly; interpolating g between the breakpoints instead
    loses every digit when they lie far apart (advantages 1e20 apart gave inf). Beyond the
    outermost breakpoints g is linear with a known active set too.
    Returns lambda (n,) and the active set (n, G) bool in the input's order: lambda equals
    sum_active a s / sum_active a^2 on every row that has an active term. Searched in float64 with
    prefix and suffix sums that never subtract (``_before``, ``_after``), for any input dtype.
    """
    dtype, s, a = s.dtype, s.double(), a.double()  # the search in float64 (float32 misplaced the root at |A| 1e4 apart)
    nonzero = a != 0
    inf = torch.tensor(float("inf"), dtype=s.dtype, device=s.device)
    bp = torch.where(nonzero, s / torch.where(nonzero, a, torch.ones_like(a)), inf)  # (n, G)
    bp, order = torch.sort(bp, dim=-1)  # padding and a = 0 sort last
    a_sorted, s_sorted = a.gather(-1, order), s.gather(-1, order)  # (n, G)
    valid = torch.isfinite(bp)
    pos, neg = a_sorted > 0, a_sorted < 0
    zero = torch.zeros_like(s_sorted)
    p_as, p_a2 = torch.where(pos, a_sorted * s_sorted, zero), torch.where(pos, a_sorted**2, zero)  # (n, G)
    n_as, n_a2 = torch.where(neg, a_sorted * s_sorted, zero), torch.where(neg, a_sorted**2, zero)
    bk = torch.where(valid, bp, zero)
    # positives after k (suffix, exclusive) + negatives before k (prefix, exclusive)
    g = _after(p_as) - bk * _after(p_a2) + _before(n_as) - bk * _before(n_a2)  # (n, G): g(b_k)
    lam_a = torch.where(valid & (g >= 0), bp, -inf).amax(-1)  # (n,)
    lam_b = torch.where(valid & (g <= 0), bp, inf).amin(-1)  # (n,)
    both = torch.isfinite(lam_a) & torch.isfinite(lam_b)
    active = valid & ((pos & (bp >= lam_b[:, None])) | (neg & (bp <= lam_a[:, None])))  # (n, G): the bracket's active set
    a_s = torch.where(active, a_sorted * s_sorted, zero).sum(-1)  # (n,)
    a_2 = torch.where(active, a_sorted**2, zero).sum(-1)  # (n,)
    tiny = torch.finfo(s.dtype).tiny
    inner = torch.where(a_2 > 0, a_s / a_2.clamp(min=tiny), lam_a)
    # Left of every breakpoint only a_i > 0 are active; right of every breakpoint only a_i < 0.
    left = p_as.sum(-1) / p_a2.sum(-1).clamp(min=tiny)
    right = n_as.sum(-1) / n_a2.sum(-1).clamp(min=tiny)
    lam = torch.where(both, inner, torch.where(torch.isfinite(lam_b), left, right))
    active = torch.where(both[:, None], active, torch.where(torch.isfinite(lam_b)[:, None], pos, neg))
    return lam.to(dtype), torch.zeros_like(active).scatter(-1, order, active)  # active back in the input's order


def positive_orth_projection(sbar: Tensor, adv: Tensor, group_ids: Tensor | Groups, lengths: Tensor | None = None) -> Tensor:
    """Eq (51), Positive Orth-Proj, solved exactly: argmin_v 1/2|v - sbar|^2 s.t. a.v = 0, v >= 0 (B,).

    KKT: v = max(sbar - lambda a, 0) with lambda the root of a piecewise-linear monotone
    function (see ``_qp_multiplier``). Degenerate groups: a = 0 leaves sbar unchanged; if a
    has one sign only, the only feasible points zero every v_i with a_i != 0, and the
    projection keeps the rest.
    """
    if sbar.numel() == 0:  # an empty batch: nothing to project (shape metadata, no device sync)
        return sbar.clone()
    groups = Groups.of(group_ids)
    index, n = groups.index, groups.n
    a = _effective_adv(adv, lengths, groups)
    s_dense, position = group_dense(sbar, index, n)  # (n, G)
    a_dense, _ = group_dense(a, index, n)  # (n, G)
    has_pos = (a_dense > 0).any(-1)  # (n,)
    has_neg = (a_dense < 0).any(-1)
    lam, active = _qp_multiplier(s_dense.detach(), a_dense)  # (n,), (n, G)
    # The same root in closed form on its active set: lambda = sum_active a s / sum_active a^2. Equal in value;
    # its gradient is the exact derivative of the projection wherever the active set is locally constant,
    # which the breakpoint search's selection does not give when breakpoints tie (e.g. every ratio 1).
    # The active set comes from the search's bracket: re-reading it off s - lambda a > 0 drops a term that sits
    # at the root within rounding (advantages 1e20 apart then gave a weight of 1e20).
    # In float64: a^2 of a normalised advantage 1e-22 is a float32 subnormal with three significant bits.
    a64, s64 = a_dense.double(), s_dense.double()  # (n, G)
    num = torch.where(active, a64 * s64, 0.0).sum(-1)  # (n,)
    den = torch.where(active, a64**2, 0.0).sum(-1)  # (n,)
    lam = torch.where(den > 0, num / torch.where(den > 0, den, 1.0), lam.double())
    inf = torch.tensor(float("inf"), dtype=lam.dtype, device=sbar.device)
    # One-sided groups: lambda -> +inf (only positive a) or -inf (only negative a); none: 0.
    lam = torch.where(has_pos & has_neg, lam, torch.where(has_pos, inf, torch.where(has_neg, -inf, torch.zeros_like(lam))))
    lam_i = lam[index]  # (B,)
    shift = torch.where(a == 0, 0.0, lam_i * a.double())  # (B,) float64; avoid inf * 0
    return torch.relu(sbar - shift).to(sbar.dtype)


def truncate_rebalance(sbar: Tensor, adv: Tensor, group_ids: Tensor | Groups, lengths: Tensor | None = None, floor: float = 1e-6) -> Tensor:
    """Eqs (52)-(55), truncate-and-rebalance: floor at ``floor``, then scale one side so a.stilde = 0 (B,).

    s+ = max(sbar, floor); delta = a.s+; if delta > 0 the positive-advantage side is scaled by
    alpha = sum_N (-a) s+ / sum_P a s+; if delta < 0 the negative side by
    beta = sum_P a s+ / sum_N (-a) s+ (the paper's eq 55 prints beta with a wrong sign).
    """
    groups = Groups.of(group_ids)
    index, n = groups.index, groups.n
    a = _effective_adv(adv, lengths, groups)
    s_plus = sbar.clamp(min=floor)  # (B,)
    pos_mass = group_sum(torch.where(a > 0, a * s_plus, 0), index, n)  # (n,)
    neg_mass = group_sum(torch.where(a < 0, -a * s_plus, 0), index, n)  # (n,)
    delta = pos_mass - neg_mass
    alpha = neg_mass / torch.where(pos_mass > 0, pos_mass, torch.ones_like(pos_mass))
    beta = pos_mass / torch.where(neg_mass > 0, neg_mass, torch.ones_like(neg_mass))
    scale_pos = torch.where(delta > 0, alpha, torch.ones_like(alpha))[index]
    scale_neg = torch.where(delta < 0, beta, torch.ones_like(beta))[index]
    return torch.where(a > 0, scale_pos * s_plus, torch.where(a < 0, scale_neg * s_plus, s_plus))


TransformFn = Callable[[Tensor, Tensor, Groups, "Tensor | None", float], Tensor]
"""(sbar, adv, groups, lengths or None, floor) -> stilde, all (B,)."""

TRANSFORM_FUNCTIONS: dict[str, TransformFn] = {
    "none": lambda sbar, adv, groups, lengths, floor: sbar,
    "min": lambda sbar, adv, groups, lengths, floor: min_replace(sbar, groups, lengths),
    "orth": lambda sbar, adv, groups, lengths, floor: orth_projection(sbar, adv, groups, lengths),
    "orth_pos": lambda sbar, adv, groups, lengths, floor: positive_orth_projection(sbar, adv, groups, lengths),
    "orth_tr": lambda sbar, adv, groups, lengths, floor: truncate_rebalance(sbar, adv, groups, lengths, floor),
}
"""Every in-group transform, keyed by the ``transform`` component; a new one is one entry here."""
TRANSFORMS = tuple(TRANSFORM_FUNCTIONS)


def group_transform(
    kind: str,
    sbar: Tensor,
    adv: Tensor,
    group_ids: Tensor | Groups,
    lengths: Tensor | None = None,
    floor: float = 1e-6,
) -> Tensor:
    """Apply the registered DFPO transform ``kind`` to the post-clip weights (B,) -> (B,)."""
    if kind not in TRANSFORM_FUNCTIONS:
        raise ValueError(f"transform must be one of {TRANSFORMS}, got transform={kind!r}")
    return TRANSFORM_FUNCTIONS[kind](sbar, adv, Groups.of(group_ids), lengths, floor)


# ----------------------------------------------------------------------------- stop-gradient forms


def _transform_in_graph(sbar: Tensor, stilde: Tensor, x: LossBatch) -> tuple[Tensor, Tensor]:
    """``stopgrad="none"`` (Table 3 ablation): the transform stays in the graph; surrogate A_i stilde_i."""
    return (x.adv * stilde)[:, None].expand_as(x.logp), stilde.detach()


def _ratio_form(sbar: Tensor, stilde: Tensor, x: LossBatch) -> tuple[Tensor, Tensor]:
    """Eqs 59-62: sg(stilde / sbar) * sbar(theta), so a sequence the clip holds gets no gradient."""
    positive = sbar.detach() > 0
    factor = torch.where(positive, stilde / torch.where(positive, sbar.detach(), 1.0), 0.0)  # (B,)
    return (x.adv * factor * sbar)[:, None].expand_as(x.logp), stilde


def _score_form(sbar: Tensor, stilde: Tensor, x: LossBatch) -> tuple[Tensor, Tensor]:
    """Eq 68/85: value stilde_i A_i, gradient stilde_i A_i grad log pi(y_it) at every token (no trust region)."""
    score = torch.exp(x.logp - x.logp.detach())  # (B, T), value 1
    return (x.adv * stilde)[:, None] * score, stilde


STOPGRAD_FUNCTIONS = {"ratio": _ratio_form, "score": _score_form, "none": _transform_in_graph}
"""How the transformed weight stilde enters the gradient, keyed by the ``stopgrad`` component:
(sbar (B,) with its graph, stilde (B,), batch) -> (per-token surrogate (B, T), detached weight (B,))."""
STOPGRAD_FORMS = tuple(STOPGRAD_FUNCTIONS)
IN_GRAPH_FORMS = ("none",)
"""The stop-gradient forms that differentiate through the transform; the others compute stilde without a graph."""


def sequence_surrogate(spec: ObjectiveSpec, sbar: Tensor, x: LossBatch) -> tuple[Tensor, Tensor]:
    """Per-token surrogate (B, T) and detached weight (B,) from post-clip sequence weights sbar (B,).

    Without a transform: A_i sbar_i at every token (eq 49). With one: DFPO's group transform
    (eqs 18, 50-55) of sbar, then the spec's stop-gradient form. Empty rows take no part in a group
    transform: each is a group of its own.
    """
    if spec.transform == "none":
        return (x.adv * sbar)[:, None].expand_as(x.logp), sbar.detach()
    groups, empty = x.groups, x.lengths == 0
    if bool(empty.any()):
        solo = groups.n + torch.arange(x.lengths.numel(), device=x.lengths.device)
        groups = Groups(torch.where(empty, solo, groups.index), groups.n + x.lengths.numel())
    lengths = x.lengths if spec.length_aware else None
    transform = TRANSFORM_FUNCTIONS[spec.transform]
    if spec.stopgrad in IN_GRAPH_FORMS:
        stilde = transform(sbar, x.adv, groups, lengths, spec.tr_floor)  # (B,)
    else:
        with torch.no_grad():
            stilde = transform(sbar.detach(), x.adv, groups, lengths, spec.tr_floor)  # (B,)
    return STOPGRAD_FUNCTIONS[spec.stopgrad](sbar, stilde, x)


# ----------------------------------------------------------------------------- the transform component's settings

TRANSFORM = component_field(
    "none",
    "transform",
    "choice",
    "none: no in-group transform (the baselines)",
    trust_region=False,
    choices=TRANSFORM_FUNCTIONS,
    doc="DFPO in-group transform of the post-clip sequence weights: none/min/orth/orth_pos/orth_tr.",
)
TR_FLOOR = component_field(
    1e-6,
    "transform",
    "number",
    "paper eq 52 names a small floor without a value; 1e-6 chosen here",
    trust_region=False,
    bounds=POSITIVE,
    active_when=When("transform", ("orth_tr",)),
    doc="Truncation floor of truncate-and-rebalance (eq 52).",
)
STOPGRAD = component_field(
    "ratio",
    "transform",
    "choice",
    "ratio form (paper eqs 59-62: only the factor stilde/sbar is detached, so GSPO's clipping stays, App. B, K.3, K.5); "
    "only read when a transform is set",
    trust_region=False,
    choices=STOPGRAD_FUNCTIONS,
    active_when=When("transform", ("none",), negate=True),
    doc="How stilde enters the gradient: ``ratio`` (eq 59-62, keeps GSPO's trust region), ``score`` (eq 68/85: no trust region on clipped sequences), ``none`` (Table 3 ablation).",
)
LENGTH_AWARE = component_field(
    False,
    "transform",
    "bool",
    "False: the paper's transforms (length-aware is this project's extension)",
    trust_region=False,
    active_when=When("transform", ("none",), negate=True),
    doc="Use a_i = A_i / L_i in the transforms so shared tokens cancel at unequal lengths (this project's extension).",
)

TRANSFORM_COMPONENT = Component("transform")
