"""Where a chunk of positions reads its hidden rows (a view where they are consecutive) and writes its rows of
d hidden."""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import Tensor


class _RowsOf:
    """The hidden rows of a chunk of positions, and where its rows of d hidden go.

    ``rows``, ``cols`` (N,) name the positions, unit after unit; ``flat`` = rows * T + cols indexes them in (B * T)
    order. A chunk whose positions are consecutive there is read as a view of hidden: always when hidden is
    contiguous, and within one completion when it is not (the trainer's hidden states are a (B, T, H) slice of the
    decoder's (B, L, H) output). Any other chunk gathers its own rows. d hidden is a fresh contiguous (B * T, H)
    tensor whose consecutive rows the matmul writes directly. So neither an (N, H) copy of the hidden states nor an
    (N, H) gradient beside hidden's own is held.
    """

    def __init__(self, hidden: Tensor, rows: Tensor, cols: Tensor):
        self.hidden = hidden  # (B, T, H), detached
        self.rows, self.cols = rows, cols  # (N,)
        self.flat = rows * hidden.shape[1] + cols  # (N,)
        self._runs: tuple[list[int], list[int]] | None = None

    def _start(self, s: int, e: int) -> int | None:
        """The first flat index of positions s:e when they are consecutive there, else None. Read off Python lists
        made once per call (one read-back from the device, not one per chunk)."""
        if self._runs is None:
            host = self.flat.cpu()  # (N,)
            breaks = torch.ones_like(host)
            breaks[1:] = host[1:] - host[:-1] != 1
            self._runs = host.tolist(), breaks.cumsum(0).tolist()  # flat index, and which run of +1 steps it is in
        first, run = self._runs
        return first[s] if e > s and run[e - 1] == run[s] else None

    def __call__(self, s: int, e: int) -> Tensor:
        """Hidden states (n, H) of positions s:e (detached)."""
        a, n, T = self._start(s, e), e - s, self.hidden.shape[1]
        if a is not None and self.hidden.is_contiguous():
            return self.hidden.view(-1, self.hidden.shape[-1])[a : a + n]
        if a is not None and a // T == (a + n - 1) // T:  # one completion's run of a strided hidden
            return self.hidden[a // T, a % T : a % T + n]
        return self.hidden[self.rows[s:e], self.cols[s:e]]

    def gradient(self, dtype: torch.dtype, *, full: bool) -> Tensor:
        """d hidden as (B * T, H) of ``dtype``: uninitialised when every position is real (the chunks write every row),
        else zeros (padding's rows stay 0)."""
        B, T, H = self.hidden.shape
        make = torch.empty if full else torch.zeros
        return make((B * T, H), dtype=dtype, device=self.hidden.device)

    def write(self, grad: Tensor, s: int, e: int, dz: Tensor, weight: Tensor, finish: Callable[[Tensor], object] | None = None) -> None:
        """grad's rows of positions s:e = dz (n, V) @ weight (V, H), then ``finish`` (in place on those (n, H) rows)."""
        a = self._start(s, e)
        direct = a is not None and dz.dtype == grad.dtype
        rows = torch.mm(dz, weight, out=grad[a : a + e - s]) if direct else dz @ weight  # (n, H)
        if finish is not None:
            finish(rows)
        if not direct:
            grad[self.flat[s:e] if a is None else slice(a, a + e - s)] = rows.to(grad.dtype)

    def scale(self, grad: Tensor, s: int, e: int, factor: float) -> None:
        """grad's rows of positions s:e *= factor."""
        a = self._start(s, e)
        if a is not None:
            grad[a : a + e - s].mul_(factor)
        else:
            grad[self.flat[s:e]] *= factor
