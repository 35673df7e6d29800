"""The mini-batch plan of one rollout batch: whole groups, shuffled, split into loss calls.

A rollout batch of ``prompts_per_step`` groups is trained in ``epochs`` passes; each pass draws a seeded random
order of the groups and cuts it into mini-batches of ``minibatch_groups`` whole groups (one optimiser step
each, K = epochs * prompts_per_step / minibatch_groups steps: PPO's epochs over mini-batches, as GRPO and DAPO
train). A mini-batch is split into micro-batches (loss calls) of ``microbatch_groups`` whole groups or of a token
budget; groups are never split, because the group transforms of the objectives need a whole group in one call.
Each micro-batch's loss is weighted by ``accumulation_weights`` so that the summed gradient is the mini-batch
loss's gradient exactly (for objectives that are not batch-coupled).

Everything here is a pure function of tensors: the trainer's update stage and the parallel strategies call it.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch

from ..core.loss import aggregation_count
from .config import Config
from .sampler import RolloutBatch


def group_minibatches(group_ids: torch.Tensor, groups_per_batch: int, generator: torch.Generator) -> list[torch.Tensor]:
    """Row indices of mini-batches that each hold ``groups_per_batch`` whole groups, in random group order."""
    groups = torch.unique(group_ids)  # sorted
    order = groups[torch.randperm(len(groups), generator=generator)]
    out = []
    for s in range(0, len(order), groups_per_batch):
        chosen = order[s : s + groups_per_batch]
        out.append(torch.isin(group_ids, chosen).nonzero().flatten())
    return out


def split_groups(rows: torch.Tensor, group_ids: torch.Tensor, groups_per_micro: int) -> list[torch.Tensor]:
    """Split the rows of a mini-batch into micro-batches of ``groups_per_micro`` whole groups (0: one micro)."""
    if groups_per_micro <= 0:
        return [rows]
    groups = []
    for g in group_ids[rows].tolist():
        if g not in groups:
            groups.append(g)
    out = []
    for s in range(0, len(groups), groups_per_micro):
        chosen = torch.tensor(groups[s : s + groups_per_micro])
        out.append(rows[torch.isin(group_ids[rows], chosen)])
    return out


def split_groups_by_tokens(rows: torch.Tensor, group_ids: torch.Tensor, tokens_per_row: torch.Tensor, budget: int) -> list[torch.Tensor]:
    """Split a mini-batch's rows into micro-batches of whole groups whose padded size fits ``budget`` tokens.

    A micro-batch is trimmed to its longest row, so its cost is (rows) x (longest row): groups are added in
    order while that product stays within the budget; a group larger than the budget alone is a micro-batch
    of its own (groups are never split). ``tokens_per_row`` (B,): prompt plus completion tokens of each row.
    """
    order: list[int] = []
    for g in group_ids[rows].tolist():
        if g not in order:
            order.append(g)
    out, current, longest, n_rows = [], [], 0, 0
    for g in order:
        members = rows[group_ids[rows] == g]
        g_longest = int(tokens_per_row[members].max())
        fits = (n_rows + len(members)) * max(longest, g_longest) <= budget
        if current and not fits:
            out.append(torch.cat(current))
            current, longest, n_rows = [], 0, 0
        current.append(members)
        longest, n_rows = max(longest, g_longest), n_rows + len(members)
    if current:
        out.append(torch.cat(current))
    return out


def optimiser_step_plan(batch: RolloutBatch, optim, *, seed: int, step: int, share_of: Callable) -> list[list[torch.Tensor]]:
    """The row indices of every optimiser step's micro-batches: ``optim.epochs`` passes over seeded mini-batches
    of whole groups, each split by a group count or a token budget (groups stay whole). The mini-batches are
    drawn from the whole batch's group ids, the same on every process; ``share_of(rows, group_ids)`` keeps this
    process's share of each (all of it on one process), so every process takes the same optimiser steps."""
    tokens_per_row = batch.attention_mask.sum(-1)  # (B,) prompt + completion tokens
    plan = []
    for epoch in range(optim.epochs):
        gen = torch.Generator().manual_seed(seed * 1_000_003 + step * 101 + epoch)
        for rows in group_minibatches(batch.group_ids, optim.minibatch_groups, gen):
            rows = share_of(rows, batch.group_ids)  # this process's groups of it
            if optim.max_tokens_per_microbatch:
                plan.append(split_groups_by_tokens(rows, batch.group_ids, tokens_per_row, optim.max_tokens_per_microbatch))
            else:
                plan.append(split_groups(rows, batch.group_ids, optim.microbatch_groups))
    return plan


def rows_in(plan: list[list[torch.Tensor]], n_rows: int) -> torch.Tensor:
    """(B,) bool: the rows some micro-batch of ``plan`` holds."""
    out = torch.zeros(n_rows, dtype=torch.bool)
    for micro_rows in plan:
        for rows in micro_rows:
            out[rows] = True
    return out


def split_settings(cfg: Config, world: int) -> list[str]:
    """The settings that split a mini-batch over several loss calls (micro-batches, a token budget, processes)."""
    out = []
    if cfg.optim.microbatch_groups and cfg.optim.microbatch_groups < cfg.optim.minibatch_groups:
        out.append(f"optim.microbatch_groups={cfg.optim.microbatch_groups}")
    if cfg.optim.max_tokens_per_microbatch:
        out.append(f"optim.max_tokens_per_microbatch={cfg.optim.max_tokens_per_microbatch}")
    if world > 1:
        out.append(f"training on {world} processes")
    return out


def accumulation_weights(masks: list[torch.Tensor], aggregation: str) -> list[float]:
    """Weights w_u with sum_u w_u * loss(micro u) == loss(whole mini-batch) for an aggregation:
    each micro-batch's ``aggregation_count`` over the mini-batch's."""
    counts = [float(aggregation_count(m, aggregation)) for m in masks]
    total = sum(counts)
    return [c / total if total > 0 else 0.0 for c in counts]


@dataclass
class MicroBatch:
    """Rows of one loss call, trimmed to their longest prompt and completion, with their accumulation weight."""

    batch: RolloutBatch
    old_logp: torch.Tensor | None  # (b, T); None: the policy has not moved yet, its own log-probs are the old ones
    ref_logp: torch.Tensor | None  # (b, T)
    advantages: torch.Tensor  # (b,), or (b, T) one per token
    weight: float
    rows: torch.Tensor | None = None  # (b,) indices into the rollout batch
    rollout_logp: torch.Tensor | None = None  # (b, T) the sampler's log-probs (read by a rollout correction)


def micro_batch(
    batch: RolloutBatch, rows: torch.Tensor, old_logp, ref_logp, adv: torch.Tensor, weight: float, rollout_logp=None
) -> MicroBatch:
    """The rows of ``batch`` as a micro-batch, padding trimmed away (old/ref/rollout log-probs cut to the same width)."""
    part, width = batch.rows(rows).trimmed()
    cut = lambda x: None if x is None else x[rows, :width]  # noqa: E731
    adv_rows = cut(adv) if adv.ndim == 2 else adv[rows]  # (b, T) per token or (b,)
    return MicroBatch(part, cut(old_logp), cut(ref_logp), adv_rows, weight, rows, cut(rollout_logp))
