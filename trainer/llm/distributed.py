"""Data parallelism over whole groups: the pieces that make N ranks compute one process's gradient.

Each rank holds whole groups (``shard_groups``): DFPO's transforms need a group in one loss call, so groups
are never split across ranks. The loss normalisation is global: a micro-batch's accumulation weight is its
``aggregation_count`` over the count of the whole mini-batch across ALL ranks (``global_accumulation_weights``,
one all-reduce), so after the gradients are summed over ranks (``all_reduce_gradients``) every aggregation
mode gives exactly the gradient one process computes on the whole batch. Without an initialised process
group every function is the single-process one.

Not wired into ``dfpo train`` yet: rank-aware logging, checkpoints and sharded sampling are still to come.
"""

from __future__ import annotations

import torch
import torch.distributed as dist

from dfpo.trainer.loss.aggregation import aggregation_count


def distributed() -> bool:
    return dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1


def shard_groups(group_ids: torch.Tensor, rank: int, world: int) -> torch.Tensor:
    """Row indices of the groups rank ``rank`` of ``world`` trains on: every world-th group, whole (B,) -> (b,)."""
    groups = torch.unique(group_ids)  # sorted
    if len(groups) % world:
        raise ValueError(
            f"{len(groups)} groups cannot be shared evenly by {world} ranks; make the groups per step a multiple of the world size"
        )
    mine = groups[rank::world]
    return torch.isin(group_ids, mine).nonzero().flatten()


def global_accumulation_weights(masks: list[torch.Tensor], aggregation: str) -> list[float]:
    """w_u = count_u / (count of the mini-batch summed over all ranks), for this rank's micro-batches."""
    counts = torch.tensor([float(aggregation_count(m, aggregation)) for m in masks], dtype=torch.float64)
    total = counts.sum()
    if distributed():
        dist.all_reduce(total, op=dist.ReduceOp.SUM)
    return [float(c / total) if total > 0 else 0.0 for c in counts]


def all_reduce_gradients(params) -> None:
    """Sum every parameter's gradient over the ranks (the weights above are already global shares)."""
    if not distributed():
        return
    for p in params:
        if p.grad is None:
            p.grad = torch.zeros_like(p)
        dist.all_reduce(p.grad, op=dist.ReduceOp.SUM)
