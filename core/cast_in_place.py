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


def _tail(n: int) -> int:
    return max(1, math.ceil(n / TAIL))


def widen_(block: Tensor, dtype: torch.dtype) -> Tensor:
    """Cast the (n, V) ``dtype`` values in the upper half of float32 ``block``'s bytes (``half_rows(upper=True)``) to
    float32 over the whole block, in place; returns ``block``.

    Float32 rows a:b write bytes [4aV, 4bV), below the half rows not yet read (from 2nV + 2aV) while b <= (n + a) / 2:
    each copy takes that many rows, and the last ``_tail(n)`` rows (whose float32 bytes cover their own half ones)
    go through a copy.
    """
    n = block.shape[0]
    src = half_rows(block, dtype, upper=True)  # (n, V)
    last = n - _tail(n)  # rows last: go through a copy
    a = 0
    while a < last:
        b = min((n + a) // 2, last)
        block[a:b].copy_(src[a:b])
        a = b
    block[last:].copy_(src[last:].clone())  # (tail, V) a copy of the half rows, then cast over them
    return block


def narrow_(block: Tensor, dtype: torch.dtype) -> Tensor:
    """Cast float32 ``block`` (n, V) to ``dtype`` in place, into the lower half of its bytes; returns that (n, V) view.

    Half rows a:b write bytes [2aV, 2bV), at or below the float32 rows not yet read (from 4aV) while b <= 2a: each
    copy doubles the rows done, after the first ``_tail(n)`` rows (whose half bytes cover their own float32 ones)
    went through a copy.
    """
    n = block.shape[0]
    dst = half_rows(block, dtype, upper=False)  # (n, V)
    a = min(_tail(n), n)
    dst[:a].copy_(block[:a].to(dtype))  # (tail, V) cast apart, then written over the float32 rows it came from
    while a < n:
        b = min(2 * a, n)
        dst[a:b].copy_(block[a:b])
        a = b
    return dst
