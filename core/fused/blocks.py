"""How many positions a logits block holds, and how a batch's coupling units are packed into chunks (package doc:
"One pass or two"). The sizes were chosen from measured runs; those figures live in docs/throughput.md ("Figures
behind the fused path's rules"), not here."""

from __future__ import annotations

from torch import Tensor

CHUNK_BOUNDS = (256, 1024)
"""The least and the most positions per logits block that ``default_chunk_size`` picks."""


HALF_PRECISION_BLOCK_SHARE = 0.75
"""Off the CPU, a half-precision head's default block is at most this share of H positions (``default_chunk_size``)."""


def default_chunk_size(hidden_size: int, *, half_precision_off_cpu: bool = False) -> int:
    """Positions per logits block when ``chunk_size`` is None: the hidden size H, held within ``CHUNK_BOUNDS``.

    A block of H positions holds as many floats as the weight's gradient (n V = H V), so for H from 256 to 1024 a pass
    holds the weight's gradient and one block of its size, whatever the vocabulary. From 1024 hidden units up
    (Qwen3-0.6B and larger) blocks are 1024 positions; below 256 the per-block costs (a coefficient call, thinner
    matmuls) would show, so smaller models get 256.

    A half-precision head off the CPU (``half_precision_off_cpu``) takes at most ``HALF_PRECISION_BLOCK_SHARE`` of H
    positions (not below 256). There a float32 block of H positions and the weight's float32 gradient are together
    four times the half-precision weight, about what Liger's compiled bf16 step holds. The share was chosen from runs
    on an H100 at H = 512 (blocks of 256, 384 and 512 against Liger; docs/throughput.md), not derived; for larger H
    the same arithmetic holds, but no GPU has run it.
    """
    low, high = CHUNK_BOUNDS
    block = min(high, max(low, int(hidden_size)))
    if half_precision_off_cpu:
        block = max(low, min(block, int(hidden_size * HALF_PRECISION_BLOCK_SHARE)))
    return block


def _half_precision_off_cpu(lm_head_weight: object, matmul_dtype: object = None) -> bool:
    """Whether the head's matmuls run in half precision off the CPU (``default_chunk_size``'s second case):
    ``lm_head_weight`` a tensor off the CPU, and ``matmul_dtype`` (None: the weight's own dtype) 2 bytes."""
    if not isinstance(lm_head_weight, Tensor) or lm_head_weight.device.type == "cpu":
        return False
    dtype = lm_head_weight.dtype if matmul_dtype is None else matmul_dtype
    return getattr(dtype, "itemsize", 0) == 2


HALVED_BLOCK_MIB = 128.0
"""A scaled unit's logits block is halved where a whole one would hold more float32 logits than this (MiB)."""


def scaled_block_size(chunk_size: int, vocab_size: int, itemsize: int) -> int:
    """Positions per logits block of a scaled unit: ``chunk_size``, halved where that block's logits (``itemsize``
    bytes each) exceed ``HALVED_BLOCK_MIB``.

    A scaled pass holds W's gradient, the completion's (V, H) buffer and one block, at the default block of H positions
    each as large as the others. Where they are large (V = 152k, H = 512: 297 MiB) half a block takes the pass from
    three W-sized tensors to two and a half; where they are small (V = 32k: 64 MiB) halving saves 32 MiB and the
    thinner matmuls cost time. 128 MiB lies between the two measured vocabularies (GSPO at 8 x 2048 on the CPU,
    docs/throughput.md): chosen from them, not derived.
    """
    whole_mib = chunk_size * vocab_size * itemsize / 2**20
    return max(1, chunk_size // 2) if whole_mib > HALVED_BLOCK_MIB else chunk_size


def chunk_plan(unit_sizes: list[int], chunk_size: int, max_unit: int) -> list[tuple[int, int, bool]]:
    """Ranges (start, end, two_pass) over positions laid out unit after unit, in order.

    Consecutive units are packed into chunks of at most ``chunk_size`` positions; a unit longer than
    ``chunk_size`` is a range of its own, one pass when it holds at most ``max_unit`` positions, else two
    passes (its ranges are cut into chunks of ``chunk_size`` when they run).
    """
    plan: list[tuple[int, int, bool]] = []
    pos, start = 0, 0
    for size in unit_sizes:
        if size > chunk_size:
            if pos > start:
                plan.append((start, pos, False))
            plan.append((pos, pos + size, size > max_unit))
            start = pos = pos + size
            continue
        if pos + size - start > chunk_size:
            plan.append((start, pos, False))
            start = pos
        pos += size
    if pos > start:
        plan.append((start, pos, False))
    return plan
