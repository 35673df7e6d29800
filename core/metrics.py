"""The paper's run-level and mechanism metrics, one definition each, for the toy lab and the LLM trainer.

    Steps(m >= kappa)   eq 19   ``steps_to`` (arrays over seeds) / ``steps_to_threshold`` (one logged curve)
    Jitter2(m)          eq 20   ``jitter2``
    Asym                eq 23   ``asymmetry`` (computed by the loss core, re-exported here)
    Energy(B)           eq 24   ``frequency_buckets`` + ``energy_sums`` (+ ``frequent_energy``)
    |d l_t / d logits|          ``logit_grad_norm`` (STAPO's closed form)
    shared residual     eq 2    ``shared_mask`` + ``shared_residual`` (pairs a whole group holds);
                                ``shared_events`` + ``event_residual`` (pairs two or more members hold)
    its length part     eq 67   ``sequence_weights`` + ``equal_weight_coef`` (the 1/|y_i| of the aggregation)

Definitions where the paper leaves a choice:
1. Jitter2 divides by T - 2 (eq 20): it is undefined for fewer than 3 points, and ``jitter2`` returns
   None there (never 0, which would read as "perfectly smooth").
2. Energy's buckets (eq 24: "the token set bucketed by frequency"): token types sorted by their
   number of occurrences among the real tokens of the batch, most frequent first; bucket k holds the
   types whose cumulative share of occurrences, counted before the type, lies in [shares[k-1], shares[k]).
   With shares = (0.5,) the "frequent" bucket is the most frequent types that together make up the
   first half of all token occurrences (the template tokens, typically). Unseen types fall in the last bucket.
3. Energy measures the gradient with respect to the output logits (STAPO's identity makes it exact and
   free: |d(c log pi(y))/dz| = |c| sqrt(1 - 2 pi(y) + sum_v pi_v^2)); eq 24 uses grad_theta. For a
   tabular policy (the toy) the logits ARE the parameters, so the two agree there.
4. The shared residual (eq 2, sec 3) is read on the coefficient c_it = d L / d log pi_it, the factor
   that multiplies grad log pi(v | h*) in the loss gradient (its aggregation normaliser, clipping and
   sequence or score weights included), NOT on the logit-gradient norm |c_it| |e_y - pi|: the norm's
   second factor is the same for every member at a shared pair, so it cannot decide cancellation, and
   leaving it out keeps the quantity the paper's. "Shared" is given as a mask; ``shared_mask`` builds
   it by prefix agreement (a sequence model: the context is the prefix) or by agreement at t alone
   (the tabular toy, whose key at t is the state row and the token: the row IS the context).
5. Eq 2 sums over every shared context-token pair (h*, v), not only those a whole group holds: an "event" is
   one (group, t, h*, v) that a subset S of two or more members holds (``shared_events``: identical keys at
   0..t with ``prefix``), and its residual is |sum_{i in S} c_it| against sum_{i in S} |c_it|. The events a
   whole group holds are ``shared_mask``'s positions (a property test pins the two equal). Under GRPO a partial
   event does not cancel even on-policy (sum_{i in S} A_i != 0 in general): that residual is eq 2's too.
6. The length part of the residual (eq 67's 1/|y_i| factor, the aggregation's per-sequence weight w_i):
   c'_it = c_it * wbar_g / w_i, the same coefficients with each member's weight replaced by the mean weight of
   its group (``equal_weight_coef``), and length part = sum_e |sum_S c_it| - sum_e |sum_S c'_it|, over the same
   normaliser sum_e sum_S |c_it|. It is 0 exactly at equal lengths (c' = c) and for aggregations whose weight is
   the same for every sequence (token_mean, constant, seq_mean_token_sum); the rest, residual - length part,
   is the residual the coefficients leave once every member weighs alike. It can be negative (unequal weights
   that happen to shrink a residual).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import torch
from torch import Tensor

from .loss.cancel import shared_mask
from .loss.core import asymmetry

__all__ = [
    "asymmetry",
    "energy_sums",
    "frequency_buckets",
    "frequent_energy",
    "jitter2",
    "logit_grad_norm",
    "SharedEvents",
    "SharedResidual",
    "equal_weight_coef",
    "event_residual",
    "sequence_weights",
    "shared_events",
    "score_norm",
    "shared_mask",
    "shared_residual",
    "steps_to",
    "steps_to_threshold",
    "trailing_mean",
]

FREQUENT_SHARE = 0.5
"""The "frequent" bucket of Energy: the most frequent token types covering this share of occurrences."""


def score_norm(prob: Tensor, collision: Tensor) -> Tensor:
    """|e_y - pi|_2 = sqrt(1 - 2 pi(y) + sum_v pi_v^2) per token (STAPO's identity); any shape, elementwise."""
    return (1 - 2 * prob + collision).clamp(min=0).sqrt()


def logit_grad_norm(coef: Tensor, prob: Tensor, collision: Tensor) -> Tensor:
    """|d(coef * log pi(y)) / d logits| = |coef| * |e_y - pi| per token; any shape, elementwise."""
    return coef.abs() * score_norm(prob, collision)


def frequency_buckets(token_ids: Tensor, mask: Tensor, shares: Sequence[float], vocab_size: int) -> Tensor:
    """Bucket index (vocab_size,) of every token type by its count among the real tokens (definition 2 above)."""
    counts = torch.bincount(token_ids[mask].flatten().cpu(), minlength=vocab_size).double()  # (V,)
    order = torch.argsort(counts, descending=True, stable=True)
    before = (counts[order].cumsum(0) - counts[order]) / counts.sum().clamp(min=1)  # (V,) share before each type
    bucket_sorted = torch.bucketize(before, torch.tensor(list(shares), dtype=torch.double), right=True)
    buckets = torch.full((vocab_size,), len(shares), dtype=torch.long)
    buckets[order] = torch.where(counts[order] > 0, bucket_sorted, torch.full_like(bucket_sorted, len(shares)))
    return buckets


def energy_sums(norm: Tensor, token_ids: Tensor, mask: Tensor, buckets: Tensor) -> Tensor:
    """Sum of the per-token gradient norm on each bucket (n_buckets,) float64; Energy(B) = this / its total (eq 24)."""
    n = int(buckets.max()) + 1
    bucket_of = buckets.to(token_ids.device)[token_ids]  # (..., T)
    values = torch.where(mask, norm, torch.zeros_like(norm))  # (..., T)
    return torch.zeros(n, dtype=torch.float64, device=norm.device).index_add_(0, bucket_of.flatten(), values.flatten().double())


def frequent_energy(norm: Tensor, token_ids: Tensor, mask: Tensor, vocab_size: int, share: float = FREQUENT_SHARE) -> Tensor:
    """Energy(frequent) (eq 24) of one batch: the share of the gradient norm on the frequent bucket (0-d); 0 without gradient."""
    sums = energy_sums(norm, token_ids, mask, frequency_buckets(token_ids, mask, [share], vocab_size))  # (2,)
    total = sums.sum()
    return torch.where(total > 0, sums[0] / total.clamp(min=1e-300), torch.zeros_like(total))


@dataclass(frozen=True)
class SharedResidual:
    """Eq 2's residual on a batch's shared context-token pairs, per group (order of ``groups``), float64."""

    groups: Tensor
    """(n,) the group ids, sorted."""
    net: Tensor
    """(n,) sum over the group's shared positions t of |sum_i c_it|: the residual, 0 when the objective cancels."""
    gross: Tensor
    """(n,) sum over the same positions of sum_i |c_it|: the normaliser (net / gross in [0, 1])."""
    positions: Tensor
    """(n,) number of shared positions of the group (long)."""


def shared_residual(coef: Tensor, shared: Tensor, group_ids: Tensor) -> SharedResidual:
    """The residual of eq 2 (sec 3) on the shared context-token pairs (h*, v) of each group.

    coef (B, T): c_it = d L / d log pi_it, the per-token coefficient of the loss gradient (read off autograd:
    it carries the aggregation normaliser, clipping and any sequence or score weight); shared (B, T): the
    pairs every member of the group holds (``shared_mask``); group_ids (B,). A shared pair's gradient is
    (sum_i c_it) grad log pi(v | h*), so its residual is |sum_i c_it|, zero exactly when the objective
    cancels there. A position counts only where every member of its group is marked shared.

    Normalisers (definition 4 above): ``net / gross`` = sum_t |sum_i c_it| / sum_t sum_i |c_it| is the
    relative residual (0: exact cancellation, 1: all coefficients of each pair have one sign), and
    ``net / positions`` the mean absolute residual per shared pair. Sums are in float64, so an exact
    cancellation reads at the coefficients' rounding error.
    """
    shared = shared.bool()
    B, T = coef.shape
    groups, inverse, counts = torch.unique(group_ids, return_inverse=True, return_counts=True)
    n = counts.numel()
    marked = torch.zeros(n, T, dtype=torch.long, device=coef.device).index_add_(0, inverse, shared.long())
    whole = marked == counts[:, None]  # (n, T) every member marked
    c = torch.where(whole.index_select(0, inverse), coef.double(), torch.zeros((), dtype=torch.float64, device=coef.device))  # (B, T)
    net = torch.zeros(n, T, dtype=torch.float64, device=coef.device).index_add_(0, inverse, c)
    gross = torch.zeros(n, T, dtype=torch.float64, device=coef.device).index_add_(0, inverse, c.abs())
    return SharedResidual(groups, net.abs().sum(-1), gross.sum(-1), whole.sum(-1))


@dataclass(frozen=True)
class SharedEvents:
    """Eq 2's shared context-token pairs of a batch: every (group, t, h*, v) that two or more members hold."""

    ids: Tensor
    """(B, T) long: the event each row holds at t, in [0, E); -1 where it holds none (alone, or not a real token)."""
    groups: Tensor
    """(E,) the group id of each event."""
    positions: Tensor
    """(E,) its position t (long)."""
    sizes: Tensor
    """(E,) how many members hold it (>= 2, long)."""
    group_sizes: Tensor
    """(E,) how many members its group has in the batch: an event the whole group holds has size == group size."""

    @property
    def whole(self) -> Tensor:
        """(E,) bool: the events every member of their group holds (``shared_mask``'s positions)."""
        return self.sizes == self.group_sizes


def shared_events(keys: Tensor, mask: Tensor, group_ids: Tensor, *, prefix: bool = True) -> SharedEvents:
    """The shared context-token events of eq 2 (definition 5 above): every subset of two or more members of a group
    that holds the same key at t and, with ``prefix`` (a sequence model), the same keys at 0..t as well (the same
    context h*, the group's common prompt followed by the same completion prefix, and the same token v).

    keys (B, T): what must agree (token ids; in the tabular toy, row * V + token); mask (B, T): real tokens;
    group_ids (B,). Exact (no hashing): position by position, each row's class is the unique pair (its class at
    t - 1, its key at t) among the rows of its group (``torch.unique`` over B pairs per position); a row that is
    alone in its class, or not real at t, holds no event at t and (with ``prefix``) none after.
    """
    mask = mask.bool()
    B, T = keys.shape
    dev = keys.device
    group_list, g, g_count = torch.unique(group_ids, return_inverse=True, return_counts=True)  # g (B,)
    rows = torch.arange(B, device=dev)
    cls, alive = g, torch.ones(B, dtype=torch.bool, device=dev)  # the context before t = 0: the group's prompt
    held_cls = torch.full((B, T), -1, dtype=torch.long, device=dev)  # (B, T) class at t, in [0, B), where held
    for t in range(T):
        real = mask[:, t] & alive if prefix else mask[:, t]  # (B,)
        base = cls if prefix else g
        _, new = torch.unique(torch.stack([base, keys[:, t].long()], 1), dim=0, return_inverse=True)  # (B,) in [0, B)
        new = torch.where(real, new, B + rows)  # a row that is not real at t is alone in its class
        counts = torch.bincount(new, minlength=2 * B)  # (2B,)
        held = real & (counts.index_select(0, new) >= 2)  # (B,)
        held_cls[:, t] = torch.where(held, new, torch.full_like(new, -1))
        if prefix:
            cls, alive = new, held  # a prefix no other member holds is never shared at a later position
            if not bool(alive.any()):
                break
    sel = held_cls >= 0  # (B, T)
    t_idx = torch.arange(T, device=dev).expand(B, T)  # (B, T)
    key = t_idx[sel] * (2 * B) + held_cls[sel]  # (N,) one value per (t, class)
    uniq, inverse = torch.unique(key, return_inverse=True)  # (E,), (N,)
    ids = torch.full((B, T), -1, dtype=torch.long, device=dev)
    ids[sel] = inverse
    E = uniq.numel()
    sizes = torch.bincount(inverse, minlength=E)  # (E,)
    event_g = torch.zeros(E, dtype=torch.long, device=dev).scatter_(0, inverse, g[:, None].expand(B, T)[sel])  # (E,)
    return SharedEvents(ids, group_list.index_select(0, event_g), uniq // (2 * B), sizes, g_count.index_select(0, event_g))


def event_residual(coef: Tensor, events: SharedEvents) -> tuple[Tensor, Tensor]:
    """Eq 2's residual of each shared event (definition 5): (net, gross), (E,) float64 each.

    coef (B, T): c_it = d L / d log pi_it. An event's gradient is (sum_{i in S} c_it) grad log pi(v | h*), so
    net = |sum_{i in S} c_it| (0 exactly when the objective cancels there) and gross = sum_{i in S} |c_it|.
    """
    sel = events.ids >= 0  # (B, T)
    E = events.sizes.numel()
    idx, c = events.ids[sel], coef[sel].double()  # (N,) each
    net = torch.zeros(E, dtype=torch.float64, device=coef.device).index_add_(0, idx, c).abs()
    gross = torch.zeros(E, dtype=torch.float64, device=coef.device).index_add_(0, idx, c.abs())
    return net, gross


def sequence_weights(mask: Tensor, aggregation: str) -> Tensor:
    """(B,) float64: the aggregation's per-sequence weight w_i (eq 67's 1/|y_i|): 1 / (number of real tokens) under
    ``seq_mean_token_mean``, 1 under every other aggregation (their weight is the same for every sequence)."""
    if aggregation == "seq_mean_token_mean":
        return 1.0 / mask.bool().sum(-1).clamp(min=1).double()
    return torch.ones(mask.shape[0], dtype=torch.float64, device=mask.device)


def equal_weight_coef(coef: Tensor, weights: Tensor, group_ids: Tensor) -> Tensor:
    """(B, T) float64: c'_it = c_it * wbar_g / w_i, the coefficients with each member's sequence weight w_i (B,)
    replaced by the mean weight of its group (definition 6); equal to c where the group's weights are equal."""
    _, inverse, counts = torch.unique(group_ids, return_inverse=True, return_counts=True)
    w, n = weights.double(), counts.numel()
    mean = torch.zeros(n, dtype=torch.float64, device=w.device).index_add_(0, inverse, w) / counts  # (n,)
    lo = torch.full((n,), math.inf, dtype=torch.float64, device=w.device).scatter_reduce(0, inverse, w, reduce="amin")  # (n,)
    hi = torch.full((n,), -math.inf, dtype=torch.float64, device=w.device).scatter_reduce(0, inverse, w, reduce="amax")  # (n,)
    ratio = torch.where(
        (lo == hi).index_select(0, inverse), torch.ones_like(w), mean.index_select(0, inverse) / w
    )  # (B,) exactly 1 when equal
    return coef.double() * ratio[:, None]


def jitter2(curve) -> np.ndarray | None:
    """Eq (20), Jitter2(m) = (1 / (T-2)) sum_t |m_{t+2} - 2 m_{t+1} + m_t| along the last axis; None when T < 3."""
    curve = np.asarray(curve, dtype=float)
    if curve.shape[-1] < 3:
        return None
    return np.abs(curve[..., 2:] - 2 * curve[..., 1:-1] + curve[..., :-2]).mean(-1)


def steps_to(curve, kappa: float) -> tuple[np.ndarray, np.ndarray]:
    """Eq (19), Steps(m >= kappa) of curves sampled at steps 1..T (last axis): (first step, reached).

    A curve that never reaches kappa is censored at T + 1.
    """
    curve = np.asarray(curve, dtype=float)
    hit = curve >= kappa
    reached = hit.any(-1)
    first = np.where(reached, hit.argmax(-1) + 1, curve.shape[-1] + 1)
    return first.astype(float), reached


def steps_to_threshold(steps: Sequence[int], curve: Sequence[float | None], kappa: float) -> int | None:
    """Eq (19) on a logged curve with its own step numbers: the first step whose value is >= kappa; None if never."""
    for step, value in zip(steps, curve, strict=True):
        if value is not None and math.isfinite(value) and value >= kappa:
            return step
    return None


def trailing_mean(curve: Sequence[float], window: int) -> list[float]:
    """Mean of the last ``window`` points at each step (fewer at the start)."""
    out, acc = [], 0.0
    for t, value in enumerate(curve):
        acc += value
        if t >= window:
            acc -= curve[t - window]
        out.append(acc / min(t + 1, window))
    return out
