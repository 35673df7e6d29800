"""What one ``fused_head_loss`` call holds while it runs, as named fields passed to every pass (the statistics, the
solve, the gradient, the scaled units) instead of a closure's shared variables: ``Layout``, fixed before any logits
are made, and ``FusedCall``, the layout with the buffers the passes write and the latest solve."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import torch
from torch import Tensor

if TYPE_CHECKING:
    from ..cast_in_place import CastsOf
    from .gradient import _Sum
    from .kernels import _Kernels
    from .rows import _RowsOf
    from .solve import _Inputs


@dataclass(eq=False)
class Layout:
    """Where the real positions lie and what is asked of them: fixed before the LM head runs."""

    rows: Tensor
    """(N,) the real positions' rows, laid out unit after unit (``positions``)."""
    cols: Tensor
    """(N,) their columns."""
    flat_y: Tensor
    """(N,) their targets."""
    vocab: int
    """V."""
    hidden_size: int
    """H."""
    temperature: float
    dtype: torch.dtype
    """The compute dtype: float32, or float64 for a float64 head."""
    device: torch.device
    """hidden's device, where every buffer lives."""
    chunk_size: int
    """Positions per logits block."""
    scaled_block: int
    """Positions per logits block of a scaled unit (``scaled_block_size``)."""
    max_unit: int
    """The most positions whose float32 logits fit ``max_logits_mib``."""
    need_h: bool
    """Whether hidden's gradient is asked for."""
    need_w: bool
    """Whether the weight's gradient is asked for."""
    scaled: bool
    """A gradient is asked for and the objective is ``row_scaled``."""
    folded: bool
    """A scaled group's d W is one running sum (``group_folded``)."""
    keep_entropy: bool
    """Entropies are computed (the objective reads them, or ``with_entropy``)."""
    needs_entropy: bool
    """The objective reads them."""

    @property
    def with_grad(self) -> bool:
        """Whether any gradient is asked for."""
        return self.need_h or self.need_w


@dataclass(eq=False)
class FusedCall(Layout):
    """A ``Layout`` with the buffers the passes write and the latest solve."""

    x: _Inputs
    """The (B, T) loss inputs (``solve``)."""
    weight: Tensor
    """(V, H) the LM head's weight, detached."""
    longest: int
    """The most positions any block of this call holds (the rows of ``buf``)."""
    buf: Tensor
    """(longest, V) the one logits block, reused."""
    kernels: _Kernels
    """The elementwise work of a block."""
    casts_of: CastsOf
    """A half-precision head's casts in place, of ``buf``'s and the spare block's blocks."""
    rows_of: _RowsOf
    """A chunk's hidden rows, and where its rows of d hidden go."""
    logp_buf: Tensor
    """(B, T) the log-probs known so far, placeholders elsewhere."""
    entropy_buf: Tensor | None
    """(B, T) the entropies known so far (0 elsewhere), where ``keep_entropy``."""
    grad_h: Tensor | None
    """(B * T, H) hidden's gradient, written chunk by chunk (zero only at padding)."""
    grad_w: _Sum | None
    """(V, H) the weight's gradient, summed block by block."""
    c_buf: Tensor | None = None
    """(B, T) d loss / d logp at the latest solve."""
    e_buf: Tensor | None = None
    """(B, T) d loss / d entropy at the latest solve, where the objective reads entropies."""
    loss: Tensor | None = None
    """The latest solve's loss."""
    metrics: dict[str, Tensor] | None = None
    """The latest solve's metrics."""
    spare_block: list[Tensor] = field(default_factory=list)
    """The eager entropy kernels' second block, made at its first use and kept (``spare``)."""
