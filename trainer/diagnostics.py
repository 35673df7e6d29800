"""Diagnostics of a training run: the paper's mechanism metrics, computed from the trainer's tensors.

Per optimiser step (from ``coef = d loss / d logp``, read off ``logp.grad`` after the
backward pass, so no objective formula is repeated here):

- per-token logit-gradient norm, closed form (STAPO's identity): for logits z at a position
  and sampled token y, |d(coef * log pi(y))/dz| = |coef| * sqrt(1 - 2 pi(y) + sum_n pi_n^2).
- Energy(B) (eq 24): share of that norm on a token-frequency bucket B.
- shared-token cancellation residual (eq 2): at every shared event, a position t where a subset S of
  two or more completions of a group have the same prefix and token, the subset's gradient there is
  (sum_{i in S} coef_it) grad log pi(y_t | h_t), zero exactly when that sum is 0. Residual =
  sum |sum_S coef_it| / sum sum_S |coef_it| over the events (0 = full cancellation, 1 = none); the
  events a whole group shares are kept apart too (today's ``shared_positions`` / ``shared_num``).
- its length part (eq 67's 1/|y_i|): the same sums with each member's aggregation weight replaced by
  its group's mean (``dfpo.core.metrics.equal_weight_coef``), subtracted from the residual's numerator.

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

from ..core.metrics import energy_sums, equal_weight_coef, event_residual, logit_grad_norm, sequence_weights, shared_events


def zero_variance_fraction(rewards: Tensor, group_ids: Tensor) -> float:
    """Share of groups whose rewards are all equal (they carry no group-relative signal)."""
    groups = torch.unique(group_ids)
    zero = sum(bool((rewards[group_ids == g] == rewards[group_ids == g][0]).all()) for g in groups.tolist())
    return zero / max(1, len(groups))


@dataclass
class StepDiagnostics:
    """Running sums of one training step's diagnostics over its optimiser steps (and, once reduced, its processes).

    ``shared_*``: the events a whole group holds (eq 2 at the positions every member shares); ``event_*``: every
    shared event, a whole group's or a part's (definition 5 of ``dfpo.core.metrics``); ``length_num``: the part of
    ``event_num`` due to the aggregation's per-sequence weights (definition 6; 0 when ``add`` was not told the
    aggregation)."""

    energy: Tensor | None = None
    shared_num: float = 0.0
    shared_den: float = 0.0
    shared_positions: int = 0
    event_num: float = 0.0
    event_den: float = 0.0
    events: int = 0
    length_num: float = 0.0

    def add_energy(self, sums: Tensor) -> None:
        self.energy = sums.cpu() if self.energy is None else self.energy + sums.cpu()

    def merge(self, other: StepDiagnostics) -> None:
        """Add another process's (or micro-batch's) sums to these."""
        if other.energy is not None:
            self.add_energy(other.energy)
        for name in ("shared_num", "shared_den", "shared_positions", "event_num", "event_den", "events", "length_num"):
            setattr(self, name, getattr(self, name) + getattr(other, name))

    def add(
        self,
        coef: Tensor,
        prob: Tensor,
        coll: Tensor,
        targets: Tensor,
        mask: Tensor,
        group_ids: Tensor,
        buckets: Tensor | None,
        aggregation: str | None = None,
    ) -> None:
        """Add one micro-batch: ``coef`` (b, T) = d loss / d logp (its accumulation weight included), pi(y_t) and
        sum_v pi_v^2 (b, T) from ``vocab_stats``; Energy's bucket sums (eq 24) when ``buckets`` is given, and the
        shared-token residual's sums over the micro-batch's shared events; with ``aggregation`` (the objective's),
        the residual's length part."""
        if buckets is not None:
            norm = logit_grad_norm(coef, prob, coll)  # (b, T) closed-form logit-gradient norm
            self.add_energy(energy_sums(norm, targets, mask, buckets))
        events = shared_events(targets, mask, group_ids, prefix=True)
        net, gross = event_residual(coef, events)  # (E,) each
        whole = events.whole  # (E,)
        self.shared_num += float(net[whole].sum())
        self.shared_den += float(gross[whole].sum())
        self.shared_positions += int(whole.sum())
        self.event_num += float(net.sum())
        self.event_den += float(gross.sum())
        self.events += int(net.numel())
        if aggregation is not None:
            equal, _ = event_residual(equal_weight_coef(coef, sequence_weights(mask, aggregation), group_ids), events)  # (E,)
            self.length_num += float(net.sum() - equal.sum())
