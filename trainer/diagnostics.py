"""Diagnostics of a training run: the paper's mechanism metrics, computed from the trainer's tensors.

Per optimiser step (from ``coef = d loss / d logp``, read off ``logp.grad`` after the
backward pass, so no objective formula is repeated here):

- per-token logit-gradient norm, closed form (STAPO's identity): for logits z at a position
  and sampled token y, |d(coef * log pi(y))/dz| = |coef| * sqrt(1 - 2 pi(y) + sum_n pi_n^2).
- Energy(B) (eq 24): share of that norm on a token-frequency bucket B.
- shared-prefix cancellation residual (eq 2): at positions where every completion of a group has
  the same prefix and token, the group's gradient there is (sum_i coef_it) grad log pi(y_t | h_t),
  zero exactly when sum_i coef_it = 0. Residual = sum |sum_i coef_it| / sum sum_i |coef_it| over
  those positions (0 = full cancellation, 1 = none).

Per rollout batch: fraction of groups with zero reward variance. Per run: Jitter2 (eq 20)
and Steps(metric >= kappa) (eq 19).

The norm, Energy's frequency buckets, the shared residual, Jitter2 and Steps are
``dfpo.core.metrics``'s (the toy lab uses the same functions); its docstring states each
definition. What is here is specific to the trainer's batches: the running sums of a step and the
zero-variance share.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor

from ..core.metrics import energy_sums, logit_grad_norm, shared_mask, shared_residual


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
        res = shared_residual(coef, shared_mask(targets, mask, group_ids, prefix=True), group_ids)
        self.shared_num += float(res.net.sum())
        self.shared_den += float(res.gross.sum())
        self.shared_positions += int(res.positions.sum())
