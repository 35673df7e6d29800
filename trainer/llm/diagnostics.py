"""Diagnostics of a training run: the paper's mechanism metrics, computed from the trainer's tensors.

Per optimiser step (from ``coef = d loss / d logp``, read off ``logp.grad`` after the
backward pass, so no objective formula is repeated here):

- per-token logit-gradient norm, closed form (STAPO's identity): for logits z at a position
  and sampled token y, |d(coef * log pi(y))/dz| = |coef| * sqrt(1 - 2 pi(y) + sum_n pi_n^2).
- Energy(B) (eq 24): share of that norm on a token-frequency bucket B.
- shared-prefix cancellation residual: at positions where every completion of a group has
  the same context and token, the group's logit gradients are coef_it * (same vector), so
  they cancel exactly when sum_i coef_it = 0. Residual = sum |sum_i coef_it| g_t /
  sum sum_i |coef_it| g_t over those positions (0 = full cancellation, 1 = none).

Per rollout batch: fraction of groups with zero reward variance. Per run: Jitter2 (eq 20)
and Steps(metric >= kappa) (eq 19).

The norm, Energy's frequency buckets, Jitter2 and Steps are ``dfpo.trainer.metrics``'s (the toy lab
uses the same functions); its docstring states each definition. What is here is specific to the
trainer's batches: the shared-prefix residual and the zero-variance share.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor

from dfpo.trainer.metrics import energy_sums, logit_grad_norm, score_norm


def shared_prefix_sums(coef: Tensor, factor: Tensor, token_ids: Tensor, mask: Tensor, group_ids: Tensor) -> tuple[float, float, int]:
    """(sum |sum_i coef| g, sum sum_i |coef| g, n_positions) over a batch's shared-prefix positions.

    coef, factor (= sqrt(1 - 2 pi + sum pi^2)), token_ids, mask: (B, T); group_ids: (B,).
    A position t of a group is shared when all its completions are real there and agree on
    tokens 0..t (so they also share the context and therefore the logits).
    """
    num, den, count = 0.0, 0.0, 0
    for g in torch.unique(group_ids).tolist():
        rows = (group_ids == g).nonzero().flatten()
        if rows.numel() < 2:
            continue
        ids, m = token_ids[rows], mask[rows]  # (G, T)
        same = (ids == ids[:1]).all(0) & m.all(0)  # (T,)
        shared = same.long().cumprod(0).bool()  # (T,) prefix of agreement
        if not bool(shared.any()):
            continue
        c = coef[rows][:, shared]  # (G, S)
        f = factor[rows[0], shared]  # (S,)
        num += float((c.sum(0).abs() * f).sum())
        den += float((c.abs().sum(0) * f).sum())
        count += int(shared.sum())
    return num, den, count


def zero_variance_fraction(rewards: Tensor, group_ids: Tensor) -> float:
    """Share of groups whose rewards are all equal (they carry no group-relative signal)."""
    groups = torch.unique(group_ids)
    zero = sum(bool((rewards[group_ids == g] == rewards[group_ids == g][0]).all()) for g in groups.tolist())
    return zero / max(1, len(groups))


@dataclass
class StepDiagnostics:
    """Running sums of one training step's diagnostics over its optimiser steps (and, once reduced, its processes)."""

    energy: Tensor | None = None
    shared_num: float = 0.0
    shared_den: float = 0.0
    shared_positions: int = 0

    def add_energy(self, sums: Tensor) -> None:
        self.energy = sums.cpu() if self.energy is None else self.energy + sums.cpu()

    def add(
        self, coef: Tensor, prob: Tensor, coll: Tensor, targets: Tensor, mask: Tensor, group_ids: Tensor, buckets: Tensor | None
    ) -> None:
        """Add one micro-batch: ``coef`` (b, T) = d loss / d logp (its accumulation weight included), pi(y_t) and
        sum_v pi_v^2 (b, T) from ``vocab_stats``; Energy's bucket sums (eq 24) when ``buckets`` is given, and the
        shared-prefix residual's sums."""
        if buckets is not None:
            norm = logit_grad_norm(coef, prob, coll)  # (b, T) closed-form logit-gradient norm
            self.add_energy(energy_sums(norm, targets, mask, buckets))
        num, den, n = shared_prefix_sums(coef, score_norm(prob, coll), targets, mask, group_ids)
        self.shared_num += num
        self.shared_den += den
        self.shared_positions += n
