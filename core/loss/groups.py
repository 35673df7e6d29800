"""Segment operations over completion groups.

Completions of one prompt-group may sit anywhere in the batch: every group operation here
takes arbitrary integer ``group_ids`` of shape (B,) and gathers by them, so permuting the
batch (with its ids) permutes the results and nothing else.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor


def group_index(group_ids: Tensor) -> tuple[Tensor, int]:
    """Map arbitrary group labels (B,) to contiguous indices 0..n_groups-1 (B,)."""
    _, index = torch.unique(group_ids, return_inverse=True)  # (B,)
    n_groups = int(index.max().item()) + 1 if index.numel() else 0
    return index, n_groups


@dataclass(frozen=True)
class Groups:
    """Contiguous group indices (B,) and the number of groups, computed once per loss call."""

    index: Tensor  # (B,) in 0..n-1
    n: int

    @classmethod
    def of(cls, group_ids: Tensor | Groups) -> Groups:
        """Groups from arbitrary integer labels (B,), or the object itself."""
        if isinstance(group_ids, Groups):
            return group_ids
        return cls(*group_index(group_ids))


def group_sum(x: Tensor, index: Tensor, n_groups: int) -> Tensor:
    """Per-group sum of x (B,), returned per group (n_groups,)."""
    return torch.zeros(n_groups, dtype=x.dtype, device=x.device).index_add(0, index, x)


def group_count(index: Tensor, n_groups: int, dtype: torch.dtype) -> Tensor:
    """Number of completions in each group (n_groups,)."""
    return group_sum(torch.ones_like(index, dtype=dtype), index, n_groups)


def group_amin(x: Tensor, index: Tensor, n_groups: int) -> Tensor:
    """Per-group minimum of x (B,) -> (n_groups,); differentiable (gradient to the argmin)."""
    init = torch.full((n_groups,), float("inf"), dtype=x.dtype, device=x.device)
    return init.scatter_reduce(0, index, x, reduce="amin", include_self=True)


def group_amax(x: Tensor, index: Tensor, n_groups: int) -> Tensor:
    """Per-group maximum of x (B,) -> (n_groups,)."""
    init = torch.full((n_groups,), float("-inf"), dtype=x.dtype, device=x.device)
    return init.scatter_reduce(0, index, x, reduce="amax", include_self=True)


def group_mean(x: Tensor, index: Tensor, n_groups: int) -> Tensor:
    """Per-group mean of x (B,) -> (n_groups,)."""
    return group_sum(x, index, n_groups) / group_count(index, n_groups, x.dtype).clamp(min=1)


def group_dense(x: Tensor, index: Tensor, n_groups: int, fill: float = 0.0) -> tuple[Tensor, Tensor]:
    """Scatter x (B,) into a padded per-group matrix (n_groups, G_max).

    Returns the matrix and the position (B,) of each completion inside its group's row, so
    ``dense[index, position]`` recovers x.
    """
    order = torch.argsort(index, stable=True)  # (B,)
    counts = torch.bincount(index, minlength=n_groups)  # (n_groups,)
    starts = torch.cumsum(counts, 0) - counts  # (n_groups,)
    position = torch.empty_like(index)
    position[order] = torch.arange(index.numel(), device=index.device) - starts[index[order]]
    g_max = int(counts.max().item()) if counts.numel() else 0
    dense = torch.full((n_groups, g_max), fill, dtype=x.dtype, device=x.device)
    dense = dense.index_put((index, position), x)
    return dense, position
