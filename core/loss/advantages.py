"""Advantage estimators: group-relative (paper eq 43; TRL ``scale_rewards``; Dr. GRPO), RLOO, REINFORCE++ with a batch
or a group baseline, and OPO's length-weighted baseline.

Which of them sum to zero within a group (the property shared-token cancellation rests on, eq 2):
group, batch, none and rloo do (each is a group-centred reward times a factor shared by the group);
reinforce_pp does not (its baseline is the batch mean, so a group whose mean reward differs from
the batch's has sum_i A_i != 0 and a token shared by the group keeps a net gradient). The two length-weighted ones
keep it only at equal lengths: opo's baseline sum_i L_i R_i / sum_i L_i makes sum_i L_i A_i = 0, not sum_i A_i;
reinforce_pp_baseline whitens the group-centred rewards over the batch's *tokens*, whose mean is not 0 when lengths
differ, so the shift lands on every group (``tests/core/test_advantages.py``).
"""

from __future__ import annotations

import torch
from torch import Tensor

from .fields import NONNEG, Component, When, component_field
from .groups import group_amax, group_amin, group_count, group_index, group_mean, group_sum

ADVANTAGE_SCALES = ("group", "batch", "none", "rloo", "reinforce_pp", "reinforce_pp_baseline", "opo", "grpo_passk")
LENGTH_WEIGHTED = ("reinforce_pp_baseline", "opo")
"""The estimators that read each completion's length (``group_advantages(..., lengths=)``)."""


def group_advantages(
    rewards: Tensor, group_ids: Tensor, *, scale: str = "group", eps: float = 1e-4, lengths: Tensor | None = None
) -> Tensor:
    """Eq (43): A_i = (R_i - mean_group R) / (std R + eps), per completion (B,) -> (B,).

    - ``scale="group"``: std over the completion's group (torch's unbiased std, as TRL).
    - ``scale="batch"``: std over the whole batch (TRL ``scale_rewards="batch"``).
    - ``scale="none"``: mean-centred only (Dr. GRPO).
    - ``scale="rloo"``: RLOO, R_i minus the mean of the other completions of its group,
      = G/(G-1) (R_i - mean), no std (TRL RLOOTrainer with normalize_advantages=False).
    - ``scale="reinforce_pp"``: REINFORCE++ with a batch baseline, (R_i - mean_batch R) / (std_batch R + eps).
    - ``scale="reinforce_pp_baseline"``: REINFORCE++ with a group baseline (arXiv 2501.03262; verl
      core_algos.compute_reinforce_plus_plus_baseline_outcome_advantage): c_i = R_i - mean_group R, then whitened over
      the batch's real tokens as verl's masked_whiten does: (c_i - mu) / sqrt(var + 1e-8), mu and the unbiased var
      over every token (c_i repeated ``lengths[i]`` times).
    - ``scale="opo"``: OPO's optimal baseline (arXiv 2505.23585; verl compute_opo_outcome_advantage):
      R_i - sum_group L_j R_j / sum_group L_j, no std. (verl gives a single-completion group A = R; here it is 0, as
      for every estimator.) In the integrations the peer computes its own advantages: verl's ``algorithm.adv_estimator``
      'opo' and 'reinforce_plus_plus_baseline' are these two.

    - ``scale="grpo_passk"``: verl's pass@k advantage (arXiv 2503.19595; verl compute_grpo_passk_outcome_advantage
      with norm_adv_by_std_in_grpo): only the group's best completion gets (r_max - r_second_max) / (std R + eps),
      every other 0; a tie for the best gives 0 everywhere. Not zero-sum: the group's sum is the best's advantage.

    ``lengths`` (B,): each completion's number of real tokens, needed by the length-weighted scales (``LENGTH_WEIGHTED``).

    A group whose rewards are all equal, or that has a single completion, gets A = 0
    exactly (never NaN), so that sum_{i in group} A_i = 0 holds for every group.
    """
    if scale not in ADVANTAGE_SCALES:
        raise ValueError(f"scale must be one of {ADVANTAGE_SCALES}, got scale={scale!r}")
    if not (isinstance(eps, (int, float)) and eps >= 0 and eps == eps and eps != float("inf")):
        raise ValueError(f"eps must be a finite number >= 0, got eps={eps!r}")
    if rewards.ndim != 1 or group_ids.shape != rewards.shape:
        raise ValueError(
            f"rewards and group_ids must both have shape (B,), got rewards={tuple(rewards.shape)}, group_ids={tuple(group_ids.shape)}"
        )
    if group_ids.is_floating_point() or group_ids.is_complex():
        raise ValueError(f"group_ids must be an integer tensor, got dtype={group_ids.dtype}")
    rewards = rewards if rewards.is_floating_point() else rewards.float()
    if not torch.isfinite(rewards).all():
        bad = torch.nonzero(~torch.isfinite(rewards)).flatten().tolist()[:5]
        raise ValueError(f"rewards must be finite; non-finite at indices {bad}")
    if scale in LENGTH_WEIGHTED and (lengths is None or lengths.shape != rewards.shape):
        got = "none" if lengths is None else f"shape {tuple(lengths.shape)}"
        raise ValueError(f"scale={scale!r} weighs completions by their lengths: pass lengths of shape {tuple(rewards.shape)}, got {got}")
    if rewards.numel() == 0:
        return rewards.clone()
    if scale == "reinforce_pp":
        return _batch_whitened(rewards, eps)

    index, n_groups = group_index(group_ids)
    count = group_count(index, n_groups, rewards.dtype)[index]  # (B,)
    centred = rewards - group_mean(rewards, index, n_groups)[index]  # (B,)
    # A group is degenerate when it has one completion or all rewards are equal.
    degenerate = (count < 2) | (group_amax(rewards, index, n_groups) == group_amin(rewards, index, n_groups))[index]
    centred = torch.where(degenerate, torch.zeros_like(centred), centred)
    if scale == "none":
        return centred
    if scale == "grpo_passk":
        return _best_of_group(rewards, index, n_groups, count, degenerate, eps)
    if scale == "opo":
        L = lengths.to(rewards.dtype)  # (B,)
        baseline = group_sum(L * rewards, index, n_groups) / group_sum(L, index, n_groups).clamp(min=1)  # (n_groups,)
        return torch.where(degenerate, torch.zeros_like(centred), rewards - baseline[index])
    if scale == "reinforce_pp_baseline":
        return _token_whitened(centred, lengths.to(rewards.dtype))
    if scale == "rloo":  # R_i - (sum_group R - R_i) / (G - 1) = G / (G - 1) * (R_i - mean_group R)
        return centred * count / (count - 1).clamp(min=1)
    if scale == "group":
        sq = group_sum(centred**2, index, n_groups)[index]  # (B,)
        std = torch.sqrt(sq / (count - 1).clamp(min=1))  # unbiased, as torch.std
    else:
        std = rewards.std() if rewards.numel() > 1 else torch.zeros((), dtype=rewards.dtype)
        std = std.expand_as(rewards)
    return torch.where(degenerate, torch.zeros_like(centred), centred / (std + eps))


def _best_of_group(rewards: Tensor, index: Tensor, n_groups: int, count: Tensor, degenerate: Tensor, eps: float) -> Tensor:
    """(r_max - r_second_max) / (std + eps) at each group's unique best completion, 0 elsewhere (B,)."""
    best = group_amax(rewards, index, n_groups)[index]  # (B,)
    is_best = rewards == best  # (B,)
    n_best = group_sum(is_best.to(rewards.dtype), index, n_groups)[index]  # (B,)
    second = group_amax(torch.where(is_best, torch.full_like(rewards, float("-inf")), rewards), index, n_groups)[index]  # (B,)
    centred = rewards - group_mean(rewards, index, n_groups)[index]
    std = torch.sqrt(group_sum(centred**2, index, n_groups)[index] / (count - 1).clamp(min=1))  # (B,) unbiased, as torch.std
    gap = torch.where(is_best & (n_best == 1) & ~degenerate, best - second, torch.zeros_like(rewards))
    return gap / (std + eps)


def _token_whitened(values: Tensor, lengths: Tensor) -> Tensor:
    """verl's masked_whiten of per-completion values repeated over their tokens: (v_i - mu) / sqrt(var + 1e-8), with mu
    and the unbiased variance over the N = sum_i L_i real tokens (B,); 0 for a batch with fewer than two tokens."""
    n = lengths.sum()
    if n < 2:
        return torch.zeros_like(values)
    mu = (lengths * values).sum() / n
    var = (lengths * (values - mu) ** 2).sum() / (n - 1)
    return (values - mu) * torch.rsqrt(var + 1e-8)


def _batch_whitened(rewards: Tensor, eps: float) -> Tensor:
    """REINFORCE++ (batch baseline): (R - mean R) / (std R + eps) over the whole batch (B,); 0 when B < 2 or R constant."""
    if rewards.numel() < 2 or bool(rewards.max() == rewards.min()):
        return torch.zeros_like(rewards)
    return (rewards - rewards.mean()) / (rewards.std() + eps)


# ----------------------------------------------------------------------------- the advantage component's settings

ADV_SCALE = component_field(
    "group",
    "advantage",
    "choice",
    "group mean and std (paper eq 43; TRL scale_rewards='group')",
    True,
    choices=ADVANTAGE_SCALES,
    doc="Advantage estimator the trainer passes to ``group_advantages``: group / batch / none / rloo / reinforce_pp / "
    "reinforce_pp_baseline / opo (these two weigh completions by their lengths) / grpo_passk.",
)

ADV_EPS = component_field(
    1e-4,
    "advantage",
    "number",
    "DeepSeekMath eq 3 / TRL: (R - mean) / (std + 1e-4)",
    True,
    bounds=NONNEG,
    active_when=When("adv_scale", ("group", "batch", "reinforce_pp", "grpo_passk")),
    doc="Epsilon added to the std of the rewards in the advantage scales that divide by it (group, batch, reinforce_pp, "
    "grpo_passk; verl's grpo_passk uses 1e-6).",
)
ADVANTAGE_COMPONENT = Component("advantage")
