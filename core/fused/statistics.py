"""The statistics pass: a block's logits from the LM head (matmul 1), then the target's log-prob and the entropy of
each of its positions, written into the call's (B, T) buffers (package doc: the loop's first two lines)."""

from __future__ import annotations

from typing import TYPE_CHECKING, NamedTuple

import torch
from torch import Tensor

from ..logprobs import head_logits
from .workspace import _kept

if TYPE_CHECKING:
    from .state import FusedCall


class Block(NamedTuple):
    """One block of positions s:e after ``block``."""

    h: Tensor
    """(n, H) hidden states: a view, or this chunk's rows gathered once for its three matmuls."""
    z: Tensor
    """(n, V) the logits block, overwritten by the statistics (p, log p or p log p: ``_Kernels.stats``)."""
    ent: Tensor | None
    """(n,) entropies, where kept."""
    state: object
    """What the compiled kernels hand from the statistics to the gradient (None for the eager ones)."""
    logp: Tensor | None
    """(n,) the targets' log-probs; None where a pass before took them (``known``)."""


def spare(call: FusedCall, n: int) -> Tensor | None:
    """(n, V) p beside log p, for the eager entropy kernels (also after a compiler failure); None otherwise. One
    buffer for the whole call: ``_kept`` allocates afresh off the CPU, and a block's gradient reads back the p its
    statistics wrote there."""
    if not call.keep_entropy or call.kernels.compiled:
        return None
    if not call.spare_block:
        call.spare_block.append(_kept(1, (call.longest, call.vocab), call.dtype, call.device))
    return call.spare_block[0][:n]


def block(call: FusedCall, s: int, e: int, *, known: bool = False, keep_p: bool = True) -> Block:
    """Hidden states (n, H) and logits (n, V) of positions s:e and their statistics, written into the (B, T) buffers.
    ``known``: a pass before took them, so where nothing but p is needed (no entropy) z becomes p alone and the
    log-probs are None; ``keep_p=False``: no gradient follows (``_Kernels.stats``)."""
    h = call.rows_of(s, e)  # (n, H): a view, or this chunk's rows gathered once for its three matmuls
    out = call.buf[: e - s]
    z = head_logits(h, call.weight, call.temperature, out=out, casts=call.casts_of(out))  # (n, V)
    if known and not call.keep_entropy:
        return Block(h, call.kernels.probs_(z), None, None, None)

    def logits_of(k: Tensor) -> Tensor:  # (k, V) logits of some of these rows, made again
        return head_logits(h[k], call.weight, call.temperature, out=torch.empty((len(k), call.vocab), dtype=call.dtype, device=z.device))

    y = call.flat_y[s:e]  # (n,)
    logp, ent, state = call.kernels.stats(z, y, lambda: spare(call, e - s), call.keep_entropy, logits_of, keep_p)
    call.logp_buf[call.rows[s:e], call.cols[s:e]] = logp
    if ent is not None:
        call.entropy_buf[call.rows[s:e], call.cols[s:e]] = ent
    return Block(h, z, ent, state, logp)


def statistics(call: FusedCall, start: int, end: int, step: int | None = None) -> bool:
    """The log-probs (and entropies) of positions start:end in blocks of ``step`` (None: the call's chunk size); False
    where one is not finite, read back once at the end (a pass that meets a NaN runs to its end, and no block waits for
    the device)."""
    step = call.chunk_size if step is None else step
    finite = torch.ones((), dtype=torch.bool, device=call.device)
    for s in range(start, end, step):
        *_, logp = block(call, s, min(s + step, end), keep_p=False)
        finite &= torch.isfinite(logp).all()
    return bool(finite)
