"""A float32 block of logits cast to or from half precision inside its own bytes: no second (n, V) block.

A half-precision LM head's logits leave its matmul in half precision and are worked on in float32 (``head_logits``);
their gradient d loss / d logits goes back into two half-precision matmuls (``fused_head_loss``). Cast with ``.to``,
each direction allocates an (n, V) half-precision block beside the float32 one, half again its memory, and the
weight's gradient (V, H) comes out of its matmul in half precision before it is added to its float32 sum. Here the
half-precision values live in one half of the float32 block's bytes (``half_rows``) and each cast runs in place, as a
few copies of row ranges whose bytes read and written never overlap; the rows that cannot be placed so (the first
rows narrowed, the last rows widened) go through a copy of at most 1/16 of the block (``TAIL``). The other half of
a narrowed block is free for the weight gradient's matmul (``free_half``).

Byte layout of an (n, V) float32 block, 4nV bytes; a half-precision (n, V) array takes 2nV of them:
    narrow_: half rows in the lower half   [0, 2nV)    float32 row r read from [4rV, 4(r+1)V)
    widen_:  half rows in the upper half   [2nV, 4nV)  float32 row r written to [4rV, 4(r+1)V)
"""

from __future__ import annotations

import math

import torch
from torch import Tensor

TAIL = 16
"""The rows cast through a separate copy are at most 1/TAIL of a block (at least one row): the rest takes about
log2(TAIL) + 1 in-place copies."""


def castable_in_place(block: Tensor, dtype: torch.dtype) -> bool:
    """Whether ``block`` (n, V) can hold ``dtype`` values in half of its bytes: float32, contiguous, ``dtype`` 2 bytes."""
    return block.dtype == torch.float32 and dtype.itemsize == 2 and block.dim() == 2 and block.is_contiguous()


def half_rows(block: Tensor, dtype: torch.dtype, *, upper: bool) -> Tensor:
    """(n, V) view of ``dtype`` over the lower (``upper=False``) or upper half of float32 ``block``'s (n, V) bytes."""
    n, V = block.shape
    halves = block.view(-1).view(dtype)  # (2 n V,) the same bytes
    return (halves[n * V :] if upper else halves[: n * V]).view(n, V)


def free_half(block: Tensor, dtype: torch.dtype) -> Tensor:
    """(n V,) ``dtype`` scratch over the upper half of ``block``'s bytes, free once ``narrow_`` has run."""
    return half_rows(block, dtype, upper=True).view(-1)


def _block_key(block: Tensor) -> tuple[int, tuple[int, ...]]:
    """What tells blocks of one reused buffer apart: their first byte and their shape."""
    return block.data_ptr(), tuple(block.shape)


def _tail(n: int) -> int:
    return max(1, math.ceil(n / TAIL))


def _widen_ranges(n: int) -> list[tuple[int, int]]:
    """The row ranges a:b that ``widen_`` copies in place, in order: float32 rows a:b write bytes [4aV, 4bV), below
    the half rows not yet read (from 2nV + 2aV) while b <= (n + a) / 2, so each takes that many rows; the last
    ``_tail(n)`` rows (whose float32 bytes cover their own half ones) are left to a copy."""
    last, a, ranges = n - _tail(n), 0, []
    while a < last:
        b = min((n + a) // 2, last)
        ranges.append((a, b))
        a = b
    return ranges


def _narrow_ranges(n: int) -> list[tuple[int, int]]:
    """The row ranges a:b that ``narrow_`` copies in place, in order, after its first ``_tail(n)`` rows went through a
    copy: half rows a:b write bytes [2aV, 2bV), at or below the float32 rows not yet read (from 4aV) while b <= 2a,
    so each doubles the rows done."""
    a, ranges = min(_tail(n), n), []
    while a < n:
        b = min(2 * a, n)
        ranges.append((a, b))
        a = b
    return ranges


class InPlaceCasts:
    """``widen_`` and ``narrow_`` of one float32 block (n, V) and one half-precision dtype, their row-range views made
    once.

    A cast made afresh also slices and views the block about 20 times (``half_rows`` and both sides of each range),
    host work that a GPU waits on between a block's few kernels; made once, a cast is its copies alone (about 6
    calls). ``CastsOf`` keeps one per block of a reused buffer.
    """

    def __init__(self, block: Tensor, dtype: torch.dtype):
        n = block.shape[0]
        self.block = block  # (n, V) float32
        self.upper = half_rows(block, dtype, upper=True)  # (n, V) dtype: where a matmul writes what widen_ casts
        self.lower = half_rows(block, dtype, upper=False)  # (n, V) dtype: what narrow_ writes
        self.free = free_half(block, dtype)  # (n V,) dtype: scratch once narrow_ has run
        last, first = n - _tail(n), min(_tail(n), n)
        self._widen = [(block[a:b], self.upper[a:b]) for a, b in _widen_ranges(n)]
        self._widen_tail = block[last:], self.upper[last:]  # (tail, V) each
        self._narrow_head = self.lower[:first], block[:first]  # (tail, V) each
        self._narrow = [(self.lower[a:b], block[a:b]) for a, b in _narrow_ranges(n)]

    def made_for(self, block: Tensor, dtype: torch.dtype) -> bool:
        """Whether these casts are ``block``'s and ``dtype``'s: the same first byte, shape and half-precision dtype."""
        return _block_key(block) == _block_key(self.block) and dtype == self.upper.dtype

    def widen_(self) -> Tensor:
        """Cast the half-precision values in ``upper`` to float32 over the whole block, in place; returns the block."""
        for dst, src in self._widen:
            dst.copy_(src)
        dst, src = self._widen_tail
        dst.copy_(src.clone())  # a copy of the tail's half rows, then cast over them
        return self.block

    def narrow_(self) -> Tensor:
        """Cast the float32 block to half precision in place, into ``lower``; returns ``lower`` (n, V)."""
        dst, src = self._narrow_head
        dst.copy_(src.to(dst.dtype))  # cast apart, then written over the float32 rows it came from
        for dst, src in self._narrow:
            dst.copy_(src)
        return self.lower


class CastsOf:
    """The ``InPlaceCasts`` of blocks of a few reused buffers, made at a block's first cast and kept for the next.

    A block is known by its first byte and its shape, so each must be a view of a buffer that outlives this object
    (the fused path's logits block and its entropy kernels' p block): the kept views hold those buffers alive, and
    no other tensor can take their bytes meanwhile. None for a block that cannot be cast in place.
    """

    def __init__(self, dtype: torch.dtype):
        self.dtype = dtype
        self._made: dict[tuple[int, tuple[int, ...]], InPlaceCasts] = {}

    def __call__(self, block: Tensor) -> InPlaceCasts | None:
        if not castable_in_place(block, self.dtype):
            return None
        key = _block_key(block)
        if key not in self._made:
            self._made[key] = InPlaceCasts(block, self.dtype)
        return self._made[key]


def widen_(block: Tensor, dtype: torch.dtype) -> Tensor:
    """Cast the (n, V) ``dtype`` values in the upper half of float32 ``block``'s bytes (``half_rows(upper=True)``) to
    float32 over the whole block, in place; returns ``block`` (``_widen_ranges``, then a copy of the last rows)."""
    return InPlaceCasts(block, dtype).widen_()


def narrow_(block: Tensor, dtype: torch.dtype) -> Tensor:
    """Cast float32 ``block`` (n, V) to ``dtype`` in place, into the lower half of its bytes; returns that (n, V) view
    (a copy of the first rows, then ``_narrow_ranges``)."""
    return InPlaceCasts(block, dtype).narrow_()
