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

Departures:
1. Energy uses the gradient w.r.t. the logits (the output layer), not all parameters; the
   paper's eq 24 uses grad_theta. The closed form is what makes it free.
2. Frequency buckets come from the token counts of the current rollout batch: tokens sorted
   by count, the most frequent ones covering the first ``shares[0]`` of occurrences form
   bucket 0 ("frequent"), and so on; the last bucket holds the rare tokens.
"""

from __future__ import annotations

import math

import torch
from torch import Tensor


def logit_grad_norm(coef: Tensor, prob: Tensor, collision: Tensor) -> Tensor:
    """|coef| * sqrt(1 - 2 pi(y) + sum pi^2) (B, T): norm of the logit gradient of coef * log pi(y)."""
    return coef.abs() * (1 - 2 * prob + collision).clamp(min=0).sqrt()  # (B, T)


def frequency_buckets(token_ids: Tensor, mask: Tensor, shares: list[float], vocab_size: int) -> Tensor:
    """Bucket index (vocab_size,) of every token id by its count among the real tokens.

    Bucket k holds the tokens (most frequent first) whose cumulative occurrence share, before
    the token, is in [shares[k-1], shares[k]); unseen tokens fall in the last bucket.
    """
    counts = torch.bincount(token_ids[mask].flatten().cpu(), minlength=vocab_size).double()  # (V,)
    order = torch.argsort(counts, descending=True, stable=True)
    before = (counts[order].cumsum(0) - counts[order]) / counts.sum().clamp(min=1)  # share before each token
    bucket_sorted = torch.bucketize(before, torch.tensor(shares, dtype=torch.double), right=True)
    buckets = torch.full((vocab_size,), len(shares), dtype=torch.long)
    buckets[order] = torch.where(counts[order] > 0, bucket_sorted, torch.full_like(bucket_sorted, len(shares)))
    return buckets


def energy_sums(norm: Tensor, token_ids: Tensor, mask: Tensor, buckets: Tensor) -> Tensor:
    """Sum of the per-token norm on each bucket (n_buckets,); Energy = this / its total (eq 24)."""
    n = int(buckets.max()) + 1
    b = buckets.to(token_ids.device)[token_ids]  # (B, T)
    vals = torch.where(mask, norm, torch.zeros_like(norm))  # (B, T)
    return torch.zeros(n, dtype=torch.float64, device=norm.device).index_add_(0, b.flatten(), vals.flatten().double())


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


def jitter2(curve: list[float]) -> float | None:
    """Eq (20): mean |m_{t+2} - 2 m_{t+1} + m_t|; None for fewer than 3 points."""
    if len(curve) < 3:
        return None
    return sum(abs(curve[t + 2] - 2 * curve[t + 1] + curve[t]) for t in range(len(curve) - 2)) / (len(curve) - 2)


def steps_to_threshold(steps: list[int], curve: list[float], kappa: float) -> int | None:
    """Eq (19): the first step whose metric is >= kappa; None when never reached."""
    for s, m in zip(steps, curve):
        if m is not None and math.isfinite(m) and m >= kappa:
            return s
    return None


def trailing_mean(curve: list[float], window: int) -> list[float]:
    """Mean of the last ``window`` points at each step (fewer at the start)."""
    out, acc = [], 0.0
    for t, m in enumerate(curve):
        acc += m
        if t >= window:
            acc -= curve[t - window]
        out.append(acc / min(t + 1, window))
    return out
