"""The buffers a fused call keeps on the CPU between calls, per thread (``_kept``), and how to free them."""

from __future__ import annotations

import threading

import torch
from torch import Tensor

_WORKSPACE = threading.local()
"""This thread's kept CPU buffers (``_kept``): ``slots``, a dict of flat tensors by slot."""


def _kept(slot: int, shape: tuple[int, int], dtype: torch.dtype, device: torch.device) -> Tensor:
    """An uninitialised buffer of ``shape``: slot 0 the logits block, 1 the eager entropy kernels' p (both (rows, V)),
    2 + i the (V, H) d W sum of a scaled unit's i-th completion (``row_scaled``).

    On CPU the buffer is kept per thread and reused by the next call: a fresh allocation is a fresh mapping of memory
    whose first write faults every page in, which took more than the softmax over a block of that size
    (docs/throughput.md, "The LM head and the loss in one pass"). CUDA's caching allocator already reuses its blocks,
    so other devices allocate. What stays held between calls: the largest buffer each slot was asked for
    (``release_workspace`` frees them).
    """
    if device.type != "cpu":
        return torch.empty(shape, dtype=dtype, device=device)
    slots = getattr(_WORKSPACE, "slots", None) or {}
    held, size = slots.get(slot), shape[0] * shape[1]
    if held is None or held.dtype != dtype or held.numel() < size:
        slots.pop(slot, None)  # the old buffer goes before the new one is allocated
        held = slots[slot] = torch.empty(size, dtype=dtype)
    _WORKSPACE.slots = slots
    return held[:size].view(shape)


def release_workspace() -> None:
    """Free this thread's kept CPU buffers (``_kept``); the next fused call allocates them again."""
    _WORKSPACE.slots = None
