"""Covariance-based token controls of Cui et al. 2025, "The Entropy Mechanism of RL for Reasoning LMs"
(arXiv 2505.22617; verl policy losses ``clip_cov`` and ``kl_cov``).

The per-token covariance between advantage and log-prob, over the real tokens of the batch,

    cov_t = (A_t - mean A) (log pi(y_t) - mean log pi),

is large for tokens whose probability rises with a positive advantage (entropy collapse comes from them).
Clip-Cov drops a few such tokens from the policy gradient; KL-Cov puts a |log r| penalty on the top ones.

Departure from verl: Clip-Cov picks its tokens at random among those with cov in (low, high); here the ones
with the largest covariance in that band are taken, so the loss stays a function of its inputs.
"""

from __future__ import annotations

import torch
from torch import Tensor


def token_covariance(logp: Tensor, adv: Tensor, mask: Tensor) -> Tensor:
    """cov_t = (A_t - mean A)(log pi_t - mean log pi) over the real tokens (B, T), detached; -inf elsewhere."""
    n = mask.sum().clamp(min=1)
    a = adv[:, None].expand_as(logp).detach()  # (B, T)
    lp = logp.detach()
    a_mean = torch.where(mask, a, 0.0).sum() / n
    lp_mean = torch.where(mask, lp, 0.0).sum() / n
    return torch.where(mask, (a - a_mean) * (lp - lp_mean), float("-inf"))  # (B, T)


def _top_tokens(score: Tensor, eligible: Tensor, count: int) -> Tensor:
    """The ``count`` eligible positions with the largest score (B, T) bool."""
    k = min(count, int(eligible.sum()))
    chosen = torch.zeros_like(eligible)
    if k == 0:
        return chosen
    flat = torch.where(eligible, score, float("-inf")).flatten()
    chosen.view(-1)[torch.topk(flat, k).indices] = True
    return chosen


def clip_cov_tokens(logp: Tensor, adv: Tensor, mask: Tensor, clipped: Tensor, *, ratio: float, low: float, high: float) -> Tensor:
    """Clip-Cov: up to max(1, int(ratio * N)) unclipped real tokens with low < cov < high, largest first (B, T) bool."""
    cov = token_covariance(logp, adv, mask)
    eligible = mask & ~clipped & (cov > low) & (cov < high)
    return _top_tokens(cov, eligible, max(int(ratio * int(mask.sum())), 1))


def kl_cov_tokens(logp: Tensor, adv: Tensor, mask: Tensor, *, ratio: float) -> Tensor:
    """KL-Cov: the max(1, int(ratio * N)) real tokens with the largest covariance (B, T) bool."""
    return _top_tokens(token_covariance(logp, adv, mask), mask, max(int(ratio * int(mask.sum())), 1))
