"""Random batches of grouped completions for the loss-core tests (float64 throughout)."""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor

from dfpo import group_advantages


@dataclass
class Batch:
    logp: Tensor  # (B, T) leaf, requires grad
    old_logp: Tensor  # (B, T)
    mask: Tensor  # (B, T) bool
    group_ids: Tensor  # (B,)
    advantages: Tensor  # (B,)
    entropy: Tensor  # (B, T)
    ref_logp: Tensor  # (B, T)
    rollout_logp: Tensor  # (B, T) the sampler's log-probs, some rho = pi_old / pi_rollout far from 1

    def kwargs(self, logp: Tensor | None = None) -> dict:
        return dict(
            logp=self.logp if logp is None else logp,
            old_logp=self.old_logp,
            advantages=self.advantages,
            mask=self.mask,
            group_ids=self.group_ids,
            entropy=self.entropy,
            ref_logp=self.ref_logp,
            rollout_logp=self.rollout_logp,
        )


def random_batch(
    seed: int,
    *,
    n_groups: int = 3,
    group_size: int = 4,
    max_len: int = 7,
    ratio_scale: float = 0.3,
    shuffle: bool = True,
    empty_row: bool = False,
) -> Batch:
    """Groups of completions of random lengths, ratios away from 1, groups interleaved."""
    gen = torch.Generator().manual_seed(seed)
    B, T = n_groups * group_size, max_len
    lengths = torch.randint(1, T + 1, (B,), generator=gen)
    if empty_row:
        lengths[0] = 0
    mask = torch.arange(T)[None, :] < lengths[:, None]  # (B, T)
    logp = -0.05 - 3.0 * torch.rand(B, T, generator=gen, dtype=torch.float64)
    old_logp = logp + ratio_scale * torch.randn(B, T, generator=gen, dtype=torch.float64)
    group_ids = torch.arange(n_groups).repeat_interleave(group_size) * 7 + 3  # arbitrary labels
    rewards = torch.randint(0, 2, (B,), generator=gen).to(torch.float64)
    rewards[::group_size] = 1.0
    rewards[1::group_size] = 0.0  # every group holds both signs
    if shuffle:
        perm = torch.randperm(B, generator=gen)
        mask, logp, old_logp, group_ids, rewards = mask[perm], logp[perm], old_logp[perm], group_ids[perm], rewards[perm]
    advantages = group_advantages(rewards, group_ids)
    entropy = 2.0 * torch.rand(B, T, generator=gen, dtype=torch.float64)
    ref_logp = logp + 0.1 * torch.randn(B, T, generator=gen, dtype=torch.float64)
    rollout_logp = old_logp + 0.4 * torch.randn(B, T, generator=gen, dtype=torch.float64)
    return Batch(logp.clone().requires_grad_(), old_logp, mask, group_ids, advantages, entropy, ref_logp, rollout_logp)
