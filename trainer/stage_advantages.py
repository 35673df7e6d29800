"""The advantage stage: one scalar per completion from its group's rewards.

``group_advantages`` (the loss core) computes A_i = (R_i - mean_group R) / (std R + eps) (eq 43) with the scale
the objective names (``spec.adv_scale``: group, batch, none for Dr. GRPO, rloo, reinforce_pp, reinforce_pp_baseline, opo,
grpo_passk), so the objective,
not the trainer, decides it. With ``rollout.mask_truncated`` a completion that hit ``max_new_tokens`` without
EOS keeps its reward in the group statistics but leaves the loss (overlong filtering, DAPO arXiv 2503.14476
sec. 3.4): its tokens are taken out of the batch's mask, which every later stage reads.
"""

from __future__ import annotations

import torch

from ..core.loss import ObjectiveSpec, group_advantages
from .stage_rollout import Rollout


def advantages(rollout: Rollout, spec: ObjectiveSpec, *, mask_truncated: bool) -> torch.Tensor:
    """A_i (B,) of every completion of ``rollout``; with ``mask_truncated`` the truncated ones are masked out of
    ``rollout.batch.mask`` (in place: the old-log-prob pass, the update and the metrics see the same mask)."""
    batch = rollout.batch
    lengths = batch.mask.sum(-1)  # (B,) each completion's tokens (OPO's and REINFORCE++-baseline's weights)
    adv = group_advantages(rollout.reward_tensor(), batch.group_ids, scale=spec.adv_scale, eps=spec.adv_eps, lengths=lengths)  # (B,)
    if mask_truncated:
        batch.mask &= ~batch.truncated[:, None]  # (B, T)
    return adv
