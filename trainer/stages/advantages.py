"""The advantage stage: one scalar per completion from its group's rewards (one per token for the optimal token baseline).

``group_advantages`` (the loss core) computes A_i = (R_i - mean_group R) / (std R + eps) (eq 43) with the scale
the objective names (``spec.adv_scale``: group, batch, none for Dr. GRPO, rloo, reinforce_pp, reinforce_pp_baseline, opo,
grpo_passk, gdpo, remax), so the objective, not the trainer, decides it. What each estimator reads besides the total reward:

- opo and reinforce_pp_baseline: each completion's token count (before overlong masking);
- gdpo: every reward function's value apart (``rewards.reward_matrix``: correctness, format and each of
  ``reward.functions``, one column each) and their weights (1, ``reward.format_weight``, ``reward.weights``: the weighted
  sum is the total reward);
- remax: the reward of each prompt's greedy completion, which the rollout stage generated and scored
  (``Rollout.greedy_rewards``; it is not trained on);
- otb: pi_old's log-prob and sum_v pi_v^2 at every token (``OldLogpStage.token_baseline_inputs``), which
  ``optimal_token_baseline`` turns into one advantage per token (B, T). As verl's ray trainer calls it: no
  ``handle_zero_tail``, epsilon 1e-8; a rollout correction's importance weights are not folded into its w_t
  (verl's ``rollout_is_weights`` argument): the baseline reads pi_old alone.

With ``rollout.mask_truncated`` a completion that hit ``max_new_tokens`` without
EOS keeps its reward in the group statistics but leaves the loss (overlong filtering, DAPO arXiv 2503.14476
sec. 3.4): its tokens are taken out of the batch's mask, which every later stage reads.
"""

from __future__ import annotations

import torch

from ...core.loss import ObjectiveSpec, group_advantages
from ...core.loss.advantages import GREEDY_BASELINE, MULTI_REWARD, TOKEN_LEVEL, optimal_token_baseline
from ..rewards.compute import reward_matrix, reward_weights
from .rollout import Rollout


def advantages(
    rollout: Rollout,
    spec: ObjectiveSpec,
    *,
    mask_truncated: bool,
    format_weight: float = 0.0,
    function_weights: tuple[float, ...] = (),
    token_baseline_inputs: tuple[torch.Tensor, torch.Tensor] | None = None,
) -> torch.Tensor:
    """A_i (B,) of every completion of ``rollout`` (A_it (B, T) for a per-token estimator); with ``mask_truncated`` the
    truncated ones are masked out of ``rollout.batch.mask`` (in place: the old-log-prob pass, the update and the metrics
    see the same mask) after their rewards entered the baselines. ``format_weight`` and ``function_weights``: the format
    reward's and each of ``reward.functions``' weight in the total, gdpo's column weights after correctness's 1.
    ``token_baseline_inputs``: pi_old's log-probs and sum pi^2 (B, T), which otb reads."""
    batch = rollout.batch
    if spec.adv_scale in TOKEN_LEVEL:
        if token_baseline_inputs is None:
            raise ValueError(f"adv_scale={spec.adv_scale!r} reads pi_old's log-probs and sum pi^2: pass token_baseline_inputs")
        old_logp, pi_squared = token_baseline_inputs
        adv = optimal_token_baseline(rollout.reward_tensor(), batch.group_ids, batch.mask, old_logp, pi_squared)  # (B, T)
        if mask_truncated:
            batch.mask &= ~batch.truncated[:, None]  # (B, T)
        return adv
    lengths = batch.mask.sum(-1)  # (B,) each completion's tokens (OPO's and REINFORCE++-baseline's weights)
    extra: dict = {"lengths": lengths}
    rewards = rollout.reward_tensor()  # (B,)
    if spec.adv_scale in MULTI_REWARD:
        rewards = reward_matrix(rollout.rewards)  # (B, K) correctness, format, reward.functions
        extra["reward_weights"] = reward_weights(format_weight, function_weights)  # (K,)
    if spec.adv_scale in GREEDY_BASELINE:
        extra["baselines"] = rollout.greedy_reward_tensor()  # (B,)
    adv = group_advantages(rewards, batch.group_ids, scale=spec.adv_scale, eps=spec.adv_eps, **extra)  # (B,)
    if mask_truncated:
        batch.mask &= ~batch.truncated[:, None]  # (B, T)
    return adv
