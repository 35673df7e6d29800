"""The gradient accumulation: a block's d loss / d logits at the solved coefficients, its rows of d hidden
(matmul 2) and its share of d W (matmul 3), summed over blocks (package doc: the loop's last three lines)."""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

import torch
from torch import Tensor

from .half_precision import add_product_in_slices, for_matmuls
from .statistics import Block, block, spare

if TYPE_CHECKING:
    from .state import FusedCall

Into = Callable[[int, int], list[tuple[int, int, "_Sum"]]]
"""Where a block's d W goes: positions s:e -> (a, b, sum) triples, d W of positions a:b added to each sum."""


class _Sum:
    """A (V, H) sum of dz^T h over blocks, in ``out``; the first block's matmul writes it (no zero-fill pass)."""

    def __init__(self, out: Tensor):
        self.out, self.written = out, False

    def add(self, dz: Tensor, h: Tensor, room: Tensor | None = None) -> None:
        """out += dz^T (V, n) h (n, H). A half-precision dz's product is made in (V, H) ``room`` (a flat scratch of
        its dtype), in slices of V that fit it (no (V, H) temporary), else in a fresh (V, H)."""
        h = h.to(dz.dtype)
        if dz.dtype != self.out.dtype:
            add_product_in_slices(self.out, dz, h, room, written=self.written)
        elif self.written:
            self.out.addmm_(dz.T, h)  # accumulated inside the matmul: no (V, H) temporary
        else:
            torch.mm(dz.T, h, out=self.out)
        self.written = True

    def add_onehot_minus(self, p: Tensor, h: Tensor, targets: Tensor, c: Tensor) -> None:
        """out += (c (onehot(targets) - p))^T h (V, H) for p (n, V) of out's dtype, without that (n, V) product:
        -p^T (c h), then c h added at the rows ``targets`` (``_onehot_minus_rows_`` is d hidden's side)."""
        ch = h.to(p.dtype) * -c[:, None]  # (n, H) -c h
        self.out.addmm_(p.T, ch) if self.written else torch.mm(p.T, ch, out=self.out)
        self.out.index_add_(0, targets, ch, alpha=-1)
        self.written = True

    def add_scaled(self, other: _Sum, factor: float) -> None:
        """out += factor * other's sum (nothing when other holds none)."""
        if other.written:
            self.out.add_(other.out, alpha=factor) if self.written else torch.mul(other.out, factor, out=self.out)
            self.written = True

    def total(self) -> Tensor:
        """The sum (0 when no block was added)."""
        return self.out if self.written else self.out.zero_()


def _onehot_minus_rows_(rows: Tensor, weight: Tensor, targets: Tensor, c: Tensor) -> Tensor:
    """p W (n, H) -> c (W[targets] - p W) = (c (onehot(targets) - p)) W, in place: d hidden's rows from p, never
    writing d loss / d z = c (onehot - p) over the (n, V) block."""
    return torch.sub(weight[targets], rows, out=rows).mul_(c[:, None])


def whole(call: FusedCall, s: int, e: int) -> list[tuple[int, int, _Sum]]:
    """``backward_block``'s ``into`` for d W of positions s:e straight into the total."""
    return [(s, e, call.grad_w)] if call.need_w else []


def backward_block(call: FusedCall, s: int, e: int, done: Block, into: list[tuple[int, int, _Sum]]) -> None:
    """Gradients of positions s:e from their hidden states and logits block (after ``block``) at the coefficients
    of ``call.c_buf``: their rows of d hidden written, d W of positions a:b added to each (a, b, sum) of ``into``."""
    h, z, ent, state = done.h, done.z, done.ent, done.state
    c = call.c_buf[call.rows[s:e], call.cols[s:e]] / call.temperature  # (n,): 1/temperature of d z / d h and d z / d W folded in
    e_ = None if call.e_buf is None else call.e_buf[call.rows[s:e], call.cols[s:e]] / call.temperature
    y, kept = call.flat_y[s:e], ent if call.keep_entropy else None
    p = call.kernels.probs(z, spare(call, e - s), state, kept, e_) if call.weight.dtype == call.dtype else None  # (n, V)
    if p is not None:  # d z = c (onehot - p): c goes on the (n, H) side, so no pass over the block writes d z
        if call.need_h:
            call.rows_of.write(call.grad_h, s, e, p, call.weight, lambda r: _onehot_minus_rows_(r, call.weight, y, c))  # (n, H)
        for a, b, total in into:
            total.add_onehot_minus(p[a - s : b - s], h[a - s : b - s], y[a - s : b - s], c[a - s : b - s])  # (V, H)
        return
    dz = call.kernels.grad(z, y, spare(call, e - s), state, kept, c, e_)  # (n, V) float32
    dz, room = for_matmuls(dz, call.casts_of, call.weight.dtype)  # (n, V) in the weight's dtype; room: (n V,) or None
    if call.need_h:
        call.rows_of.write(call.grad_h, s, e, dz, call.weight)  # (n, H) rows of d hidden
    for a, b, total in into:
        total.add(dz[a - s : b - s], h[a - s : b - s], room)  # (V, H), h unscaled: 1/temperature is in dz


def fused_pass(call: FusedCall, start: int, end: int, into: Into | None = None, step: int | None = None, *, checked: bool = False) -> bool:
    """The fused pass over positions start:end in blocks of ``step`` (None: the call's chunk size), at the coefficients
    of ``call.c_buf``, d W of each block's positions added where ``into(s, e)`` says (None: ``whole``); False at a
    non-finite log-prob (the pass stops there). ``checked``: a ``statistics`` pass has just found these log-probs
    finite, so no block reads them back again."""
    step = call.chunk_size if step is None else step
    for s in range(start, end, step):
        e = min(s + step, end)
        done = block(call, s, e, known=checked)
        if not checked and not bool(torch.isfinite(done.logp).all()):
            return False
        backward_block(call, s, e, done, whole(call, s, e) if into is None else into(s, e))
    return True
