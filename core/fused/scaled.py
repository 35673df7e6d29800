"""Units scaled once: a completion (or a group) longer than a block runs at placeholder coefficients, its d W summed
apart, and is scaled by its factor k = c / c0 once its unit's last block is known (package doc: "Completions scaled
once"); where k does not exist the positions run again at their coefficients."""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch
from torch import Tensor

from .gradient import Into, _Sum, fused_pass
from .solve import solve
from .statistics import statistics
from .workspace import _kept

if TYPE_CHECKING:
    from .state import FusedCall, Layout


def _row_factor(c: Tensor, c0: Tensor) -> float | None:
    """k with c = k c0 to a hundred round-offs of their dtype (both (n,), one completion's coefficients), or None when
    there is none (relative to the completion's largest coefficient)."""
    rtol = 100 * torch.finfo(c.dtype).eps
    c, c0 = c.double(), c0.double()  # (n,)
    top0 = float(c0.abs().max()) if c0.numel() else 0.0
    if top0 == 0.0:
        return 0.0 if not bool(c.any()) else None
    k = float((c * c0).sum() / (c0 * c0).sum())
    tolerance = rtol * max(float(c.abs().max()), abs(k) * top0)
    return k if float((c - k * c0).abs().max()) <= tolerance else None


def _common_ratio(before: list[float], now: list[float], rtol: float) -> float | None:
    """r with now_j = r before_j for every j to ``rtol`` (1 when every before_j is 0), or None when there is none: a
    factor that was 0 must still be 0 (to ``rtol`` of the largest)."""
    largest = max((abs(k) for k in now), default=0.0)
    if any(b == 0.0 and abs(k) > rtol * largest for b, k in zip(before, now)):
        return None
    ratios = [k / b for b, k in zip(before, now) if b != 0.0]
    if not ratios:
        return 1.0
    r = ratios[0]
    return r if all(abs(q - r) <= rtol * max(abs(q), abs(r)) for q in ratios) else None


def spans(call: Layout, s: int, e: int) -> list[tuple[int, int]]:
    """The completions of positions s:e (a unit's): their (start, end) in layout order."""
    r = call.rows[s:e]
    starts = ((r[1:] != r[:-1]).nonzero().squeeze(-1) + 1 + s).tolist()
    return list(zip([s, *starts], [*starts, e]))


def path_of(call: Layout, s: int, e: int, two: bool) -> str:
    """How a unit (or a run of units) s:e runs: ``one`` pass held, ``two`` passes, or ``scaled`` block by block.
    A completion longer than a block is scaled where it would otherwise take two passes or hold more than its
    (V, H) buffer (H x V positions' worth, the size of W's gradient) and a scaled block. A group is scaled only
    instead of two passes (a Min-Replace group summed as it comes, ``group_folded``; else as many of its
    completions as ``buffered`` says, the others in two passes): held, it is one sum and no scaling (package doc)."""
    if call.scaled and e - s > call.chunk_size:
        if e - s > call.max_unit or (e - s > call.scaled_block + call.hidden_size and len(spans(call, s, e)) == 1):
            return "scaled"
    return "two" if two or not call.with_grad else "one"


def buffered(call: Layout, n_rows: int) -> int:
    """How many completions of a scaled unit get a (V, H) d W buffer: all where W has no gradient to sum, else as
    many as ``max_logits_mib`` holds (H x V positions' worth each), at least one (the size of W's own gradient)."""
    return n_rows if not call.need_w else max(1, min(n_rows, call.max_unit // call.hidden_size))


def _own_sum(call: FusedCall, sums: list[_Sum], i: int) -> Into:
    """``fused_pass``'s ``into`` for completion i: d W of its positions to its own sum (none without W's gradient)."""
    return lambda s, e: [(s, e, sums[i])] if call.need_w else []


def scaled_pass(call: FusedCall, start: int, end: int) -> int | None:
    """A unit's completions block by block: the first ``buffered`` at their placeholder coefficients c0, each one's
    d W summed apart, the others' log-probs only. Then each buffered completion is scaled by its k where its
    coefficients are c = k c0 (``row_scaled``); the others, and any whose c is not k c0 (c0 = 0 where a transform
    truncates a weight at ratio 1, say), run again at c. The positions run again, or None at a non-finite log-prob."""
    if call.c_buf is None:
        solve(call)  # this unit's positions hold placeholders
    completions = spans(call, start, end)
    if call.folded and len(completions) > 1 and (not call.grad_w.written or buffered(call, 2) == 2):
        return folded_pass(call, start, end, completions)
    c0 = call.c_buf[call.rows[start:end], call.cols[start:end]]  # (n,)
    n_sums = buffered(call, len(completions))
    shape = tuple(call.weight.shape)
    sums = [_Sum(_kept(2 + i, shape, call.dtype, call.device)) for i in range(n_sums)] if call.need_w else []
    for i, (a, b) in enumerate(completions):
        if i < n_sums:
            done = fused_pass(call, a, b, _own_sum(call, sums, i), call.scaled_block)
        else:  # its log-probs only: its gradient once the unit's last block is known
            done = statistics(call, a, b, call.scaled_block)
        if not done:
            return None
    solve(call)
    c = call.c_buf[call.rows[start:end], call.cols[start:end]]  # (n,)
    again = 0
    for i, (a, b) in enumerate(completions):
        k = _row_factor(c[a - start : b - start], c0[a - start : b - start]) if i < n_sums else None
        if k is None:  # its rows of d hidden are written (again), its d W added at c
            fused_pass(call, a, b, step=call.scaled_block)
            again += b - a
            continue
        if call.need_h:
            call.rows_of.scale(call.grad_h, a, b, k)
        if call.need_w:
            call.grad_w.add_scaled(sums[i], k)
    return again


def folded_pass(call: FusedCall, start: int, end: int, completions: list[tuple[int, int]]) -> int | None:
    """A ``group_folded`` unit's completions one by one, each one's d W summed in one buffer at the coefficients it
    ran at (those before it known, itself at placeholders), then added at its factor k to the group's sum, after
    the sum's scale (a float) is multiplied by the r every earlier factor changed by. The group's sum is W's gradient
    itself while that is empty, else a second buffer. Once the last completion is known each one's rows of d hidden
    are scaled by its k. Where the factors do not change by one r (or a completion's c is not k times its run), the
    group runs again (``_run_again``). The positions run again, or None at a non-finite log-prob."""
    grad_w, shape = call.grad_w, tuple(call.weight.shape)
    own = _Sum(_kept(2, shape, call.dtype, call.device))  # (V, H) one completion's d W
    group = grad_w if not grad_w.written else _Sum(_kept(3, shape, call.dtype, call.device))
    rtol = 100 * torch.finfo(call.dtype).eps
    ran: list[Tensor] = []  # each done completion's coefficients in its pass, (n_i,)
    factors: list[float] = []  # their k at the last solve
    scale = 1.0  # the group's sum is scale x group.out: a change of r is one multiplication of a float, not of (V, H)
    for i, (a, b) in enumerate(completions):
        ran.append(call.c_buf[call.rows[a:b], call.cols[a:b]])
        own.written = False
        if not fused_pass(call, a, b, lambda s, e: [(s, e, own)], call.scaled_block):
            return None
        solve(call)
        now = [_row_factor(call.c_buf[call.rows[a_:b_], call.cols[a_:b_]], c) for (a_, b_), c in zip(completions, ran)]
        r = None if None in now else _common_ratio(factors, now[:-1], rtol)
        if not r:  # None, or 0: every earlier factor fell to 0 (no scale comes back from it)
            if group is grad_w:
                grad_w.written = False  # the partial sum is dropped: the group's d W is made again below
            return _run_again(call, start, end, completions, i)
        scale *= r
        group.add_scaled(own, now[-1] / scale)
        factors = now
    if call.need_h:
        for (a_, b_), k in zip(completions, factors):
            call.rows_of.scale(call.grad_h, a_, b_, k)
    if group is not grad_w:
        grad_w.add_scaled(group, scale)
    elif scale != 1.0:
        grad_w.out.mul_(scale)
    return 0


def _run_again(call: FusedCall, start: int, end: int, completions: list[tuple[int, int]], i: int) -> int | None:
    """A folded group whose factors broke at completion i: the rest's log-probs, then every completion at its
    coefficients. The positions run again (all of them), or None at a non-finite log-prob."""
    if not all(statistics(call, a_, b_, call.scaled_block) for a_, b_ in completions[i + 1 :]):
        return None
    solve(call)
    for a_, b_ in completions:
        fused_pass(call, a_, b_, step=call.scaled_block)
    return end - start
