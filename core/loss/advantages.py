"""Advantage estimators: group-relative (paper eq 43; TRL ``scale_rewards``; Dr. GRPO), RLOO, REINFORCE++ with a batch
or a group baseline, OPO's length-weighted baseline, verl's pass@k, GDPO's per-reward-function normalisation, ReMax's
greedy baseline (``group_advantages``, one advantage per completion), and verl's optimal token baseline
(``optimal_token_baseline``, one per token). ``ESTIMATOR_SOURCES`` names where each comes from and ``estimator_rows``
computes, for the docs and ``dfpo objectives``, which of them keep a group's advantages summing to zero.

Which of them sum to zero within a group (the property shared-token cancellation rests on, eq 2):
group, batch, none and rloo do (each is a group-centred reward times a factor shared by the group);
reinforce_pp does not (its baseline is the batch mean, so a group whose mean reward differs from
the batch's has sum_i A_i != 0 and a token shared by the group keeps a net gradient). The two length-weighted ones
keep it only at equal lengths: opo's baseline sum_i L_i R_i / sum_i L_i makes sum_i L_i A_i = 0, not sum_i A_i;
reinforce_pp_baseline whitens the group-centred rewards over the batch's *tokens*, whose mean is not 0 when lengths
differ, so the shift lands on every group (``tests/core/test_advantages.py``).
gdpo does: each reward function's group-normalised values sum to zero in every group, so their weighted sum does and
the batch mean it subtracts is zero. remax does not: its baseline is the greedy completion's reward, not the group's
mean, so sum_i A_i = G (mean R - R_greedy) and a shared token keeps a gradient unless the greedy reward is the mean.
otb's per-token baseline weighs the rewards by each path's realized energy up to the token: on a shared prefix the
energies are equal, so the advantages at a shared position sum to zero (up to its 1e-8); past it they need not.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch
from torch import Tensor

from .fields import NONNEG, Component, When, component_field
from .groups import group_amax, group_amin, group_count, group_index, group_mean, group_sum

if TYPE_CHECKING:  # spec imports this module
    from .spec import ObjectiveSpec

ADVANTAGE_SCALES = (
    "group",
    "batch",
    "none",
    "rloo",
    "reinforce_pp",
    "reinforce_pp_baseline",
    "opo",
    "grpo_passk",
    "gdpo",
    "remax",
    "otb",
)
LENGTH_WEIGHTED = ("reinforce_pp_baseline", "opo")
"""The estimators that read each completion's length (``group_advantages(..., lengths=)``)."""
MULTI_REWARD = ("gdpo",)
"""The estimators that take a (B, K) matrix of K reward functions' values (``group_advantages(..., reward_weights=)``);
every other one takes one combined reward per completion (B,)."""
TOKEN_LEVEL = ("otb",)
"""The estimators that give one advantage per token (B, T) (``optimal_token_baseline``, not ``group_advantages``, which
gives one per completion): ``policy_loss`` takes them for a spec whose components all read advantages token by token
(``ObjectiveSpec.takes_token_advantages``); a spec that reads one per completion refuses the estimator when it is built."""
GREEDY_BASELINE = ("remax",)
"""The estimators whose baseline is the reward of a greedy completion of the prompt (``group_advantages(..., baselines=)``)."""

ESTIMATOR_SOURCES = {
    "group": "paper eq 43; DeepSeekMath (arXiv 2402.03300) eq 3; TRL GRPOConfig scale_rewards='group'",
    "batch": "TRL GRPOConfig scale_rewards='batch' (Understanding R1-Zero-like training, arXiv 2503.20783)",
    "none": "Dr. GRPO (arXiv 2503.20783): mean-centred, no std; TRL scale_rewards='none'",
    "rloo": "RLOO (arXiv 2402.14740); TRL RLOOTrainer with normalize_advantages=False",
    "reinforce_pp": "REINFORCE++ (arXiv 2501.03262): the batch's mean and std over completions",
    "reinforce_pp_baseline": "REINFORCE++-baseline (arXiv 2501.03262); verl core_algos.compute_reinforce_plus_plus_baseline_outcome_advantage",
    "opo": "OPO (arXiv 2505.23585); verl core_algos.compute_opo_outcome_advantage",
    "grpo_passk": "pass@k training (arXiv 2503.19595); verl core_algos.compute_grpo_passk_outcome_advantage",
    "gdpo": "GDPO (arXiv 2601.05242); TRL 1.16 GRPOConfig multi_objective_aggregation='normalize_then_sum', "
    "GRPOTrainer._generate_and_score_completions",
    "remax": "ReMax (arXiv 2310.10505); verl core_algos.compute_remax_outcome_advantage (baseline: the greedy completion's reward)",
    "otb": "Optimal Token Baseline (arXiv 2602.07078); verl core_algos.compute_optimal_token_baseline_advantage "
    "(adv_estimator='optimal_token_baseline', epsilon 1e-8; handle_zero_tail False as on verl's main branch, True in "
    "verl 0.9.1); one advantage per token",
}
"""Where each advantage estimator comes from (``dfpo objectives`` prints it)."""


def group_advantages(
    rewards: Tensor,
    group_ids: Tensor,
    *,
    scale: str = "group",
    eps: float = 1e-4,
    lengths: Tensor | None = None,
    reward_weights: Tensor | None = None,
    baselines: Tensor | None = None,
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

    - ``scale="gdpo"``: GDPO's decoupled normalisation (arXiv 2601.05242; TRL 1.16 ``multi_objective_aggregation=
      'normalize_then_sum'``): ``rewards`` is a (B, K) matrix, one column per reward function; each column is normalised
      within its group, (r_k - mean_group r_k) / (std_group r_k + eps) (unbiased std, as TRL's nanstd), the columns are
      summed with ``reward_weights`` (K,) (default 1 each, TRL's ``reward_weights``), and the sum is normalised over the
      batch, (s - mean_batch s) / (std_batch s + eps), as TRL does. Zero-sum per group.
    - ``scale="remax"``: ReMax (arXiv 2310.10505; verl compute_remax_outcome_advantage): R_i - b_i, b_i the reward of
      the greedy completion of completion i's prompt (``baselines`` (B,)); no std, and (as verl) a single-completion or
      all-equal group keeps R_i - b_i. Not zero-sum: sum_i A_i = G (mean R - b).

    ``lengths`` (B,): each completion's number of real tokens, needed by the length-weighted scales (``LENGTH_WEIGHTED``).
    ``reward_weights`` (K,): gdpo's weight of each reward function. ``baselines`` (B,): remax's greedy rewards.

    ``scale="otb"`` is refused in one sentence: it gives one advantage per token (``optimal_token_baseline``).

    A group whose rewards are all equal, or that has a single completion, gets A = 0
    exactly (never NaN) under every estimator but remax, so that no such group pushes its tokens.
    """
    if scale not in ADVANTAGE_SCALES:
        raise ValueError(f"scale must be one of {ADVANTAGE_SCALES}, got scale={scale!r}")
    if not (isinstance(eps, (int, float)) and eps >= 0 and eps == eps and eps != float("inf")):
        raise ValueError(f"eps must be a finite number >= 0, got eps={eps!r}")
    if scale in TOKEN_LEVEL:
        raise ValueError(
            f"scale={scale!r} gives one advantage per token from pi_old's per-token statistics: call optimal_token_baseline("
            "rewards, group_ids, mask, old_logp, sum_pi_squared), whose (B, T) result policy_loss takes as advantages"
        )
    _check_reward_shape(rewards, scale)
    if group_ids.ndim != 1 or group_ids.shape[0] != rewards.shape[0]:
        raise ValueError(f"group_ids must have shape ({rewards.shape[0]},), one per completion, got {tuple(group_ids.shape)}")
    if group_ids.is_floating_point() or group_ids.is_complex():
        raise ValueError(f"group_ids must be an integer tensor, got dtype={group_ids.dtype}")
    rewards = rewards if rewards.is_floating_point() else rewards.float()
    if not torch.isfinite(rewards).all():
        bad = torch.nonzero(~torch.isfinite(rewards)).flatten().tolist()[:5]
        raise ValueError(f"rewards must be finite; non-finite at indices {bad}")
    if scale in LENGTH_WEIGHTED and (lengths is None or lengths.shape != rewards.shape):
        got = "none" if lengths is None else f"shape {tuple(lengths.shape)}"
        raise ValueError(f"scale={scale!r} weighs completions by their lengths: pass lengths of shape {tuple(rewards.shape)}, got {got}")
    if scale in GREEDY_BASELINE:
        return rewards - _checked_baselines(baselines, rewards, scale)
    if rewards.shape[0] == 0:
        return rewards.new_zeros(0)
    if scale in MULTI_REWARD:
        return _decoupled_normalised(rewards, group_ids, _checked_weights(reward_weights, rewards), eps)
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


def _check_reward_shape(rewards: Tensor, scale: str) -> None:
    """One sentence unless ``rewards`` is (B, K) for a multi-reward estimator and (B,) for every other."""
    if scale in MULTI_REWARD and rewards.ndim != 2:
        raise ValueError(
            f"scale={scale!r} normalises each reward function separately: pass a (B, K) matrix of K reward functions' "
            f"values, got rewards of shape {tuple(rewards.shape)}"
        )
    if scale not in MULTI_REWARD and rewards.ndim != 1:
        raise ValueError(
            f"scale={scale!r} takes one reward per completion, shape (B,), got {tuple(rewards.shape)}: combine the reward "
            f"functions first, or use scale='gdpo' to normalise each separately"
        )


def _checked_weights(reward_weights: Tensor | None, rewards: Tensor) -> Tensor:
    """gdpo's weight per reward function (K,), ones when None; one sentence on a wrong shape or a non-finite weight."""
    K = rewards.shape[1]
    if reward_weights is None:
        return torch.ones(K, dtype=rewards.dtype, device=rewards.device)
    w = torch.as_tensor(reward_weights, dtype=rewards.dtype, device=rewards.device)
    if w.shape != (K,) or not bool(torch.isfinite(w).all()):
        raise ValueError(f"reward_weights must be {K} finite numbers, one per reward function (column), got {w.tolist()}")
    return w


def _checked_baselines(baselines: Tensor | None, rewards: Tensor, scale: str) -> Tensor:
    """remax's greedy-completion reward per completion (B,), in the rewards' dtype; one sentence when missing or bad."""
    if baselines is None or baselines.shape != rewards.shape:
        got = "none" if baselines is None else f"shape {tuple(baselines.shape)}"
        raise ValueError(
            f"scale={scale!r} subtracts the reward of each prompt's greedy completion: pass baselines of shape "
            f"{tuple(rewards.shape)}, got {got}"
        )
    b = baselines.to(rewards.dtype)
    if not bool(torch.isfinite(b).all()):
        raise ValueError(f"baselines must be finite; non-finite at indices {torch.nonzero(~torch.isfinite(b)).flatten().tolist()[:5]}")
    return b


def _decoupled_normalised(rewards: Tensor, group_ids: Tensor, weights: Tensor, eps: float) -> Tensor:
    """GDPO: every reward column normalised within its group, the columns' weighted sum normalised over the batch (B,).

    rewards (B, K) -> per column (r - mean_group r) / (std_group r + eps), 0 in a single-completion group
    (the unbiased std is undefined there; TRL never has one) -> s = sum_k w_k * that (B,) -> (s - mean s) / (std s + eps),
    0 everywhere when the batch has one completion or s is constant.
    """
    index, n_groups = group_index(group_ids)
    count = group_count(index, n_groups, rewards.dtype)[index, None]  # (B, 1)
    normalised = torch.zeros_like(rewards)  # (B, K)
    constant = torch.ones(rewards.shape[0], dtype=torch.bool, device=rewards.device)  # (B,) every column flat in the group
    for k in range(rewards.shape[1]):
        r = rewards[:, k]  # (B,)
        constant &= (group_amax(r, index, n_groups) == group_amin(r, index, n_groups))[index]
        centred = r - group_mean(r, index, n_groups)[index]  # (B,)
        std = torch.sqrt(group_sum(centred**2, index, n_groups)[index] / (count[:, 0] - 1).clamp(min=1))  # (B,) unbiased
        normalised[:, k] = torch.where(count[:, 0] < 2, torch.zeros_like(r), centred / (std + eps))
    combined = normalised @ weights  # (B,)
    if combined.numel() < 2 or bool(combined.max() == combined.min()):
        return torch.zeros_like(combined)
    adv = (combined - combined.mean()) / (combined.std() + eps)  # (B,) the batch mean is 0 up to round-off
    flat = constant | (count[:, 0] < 2)  # (B,) a group without signal
    return torch.where(flat, torch.zeros_like(adv), adv)  # gets 0 exactly, as under every estimator


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


# ----------------------------------------------------------------------------- the optimal token baseline (verl)


def sum_pi_squared(logits: Tensor) -> Tensor:
    """sum_v pi(v)^2 of each position's softmax, (..., V) -> (...): exp(logsumexp(2 z) - 2 logsumexp(z)), as verl's OTB
    docs (docs/algo/otb.md, the "Logit-Gradient Proxy") compute it from the forward's logits, in float64 inside."""
    z = logits.double()
    return torch.exp(torch.logsumexp(2 * z, dim=-1) - 2 * torch.logsumexp(z, dim=-1)).to(logits.dtype)


def optimal_token_baseline(
    rewards: Tensor,
    group_ids: Tensor,
    mask: Tensor,
    old_logp: Tensor,
    pi_squared: Tensor,
    *,
    is_weights: Tensor | None = None,
    eps: float = 1e-8,
    handle_zero_tail: bool = False,
) -> Tensor:
    """The Optimal Token Baseline's advantages (arXiv 2602.07078; verl core_algos.compute_optimal_token_baseline_advantage),
    one per token (B, T), for an outcome reward R_i (B,):

    - G_t = R_i at every real token (the reward-to-go of a reward paid at the last token);
    - w_t = 1 - 2 pi_t + sum_v pi(v)^2, pi_t = exp(old_logp) of the sampled token, ``pi_squared`` = sum_v pi(v)^2 (B, T)
      under pi_old (``sum_pi_squared`` of its logits); times ``is_weights``^2 (verl's rollout_is_weights) when given;
    - W_t = sum_{j <= t} w_j over real tokens (the "realized energy" of the path up to t);
    - per group and position, B_t = sum_i G_t W_t / (sum_i W_t + eps) over the completions with a real token at t;
    - A_t = (G_t - B_t) on real tokens, 0 on padding.

    A single-completion group has no baseline (A = R, as verl). ``handle_zero_tail`` (verl's option; off by default as on
    verl's main branch, where ray_trainer passes none, while verl 0.9.1's signature defaults it on): a group's unique
    longest completion gets baseline 0 past the second-longest length. ``tests/core/test_verl_advantages.py`` compares
    this with verl's own function in verl's environment.

    Cancellation: on a shared prefix pi_t and sum pi^2 are the same for every completion, so W_t is too and B_t is the
    group's plain mean (up to eps): the advantages at a shared-prefix position sum to 0; past it they need not.
    """
    B = rewards.shape[0]
    if rewards.ndim != 1 or group_ids.shape != rewards.shape:
        raise ValueError(f"rewards and group_ids must both have shape (B,), got {tuple(rewards.shape)} and {tuple(group_ids.shape)}")
    for name, x in (("mask", mask), ("old_logp", old_logp), ("pi_squared", pi_squared), ("is_weights", is_weights)):
        if x is not None and (x.ndim != 2 or x.shape[0] != B or x.shape != mask.shape):
            raise ValueError(f"{name} must have shape (B, T) = {tuple(mask.shape)} with B = {B}, got {tuple(x.shape)}")
    if not (isinstance(eps, (int, float)) and 0 <= eps < float("inf")):
        raise ValueError(f"eps must be a finite number >= 0, got eps={eps!r}")
    dtype = rewards.dtype if rewards.is_floating_point() else torch.float32
    real = mask.to(dtype)  # (B, T)
    for name, x in (("rewards", rewards), ("old_logp", old_logp), ("pi_squared", pi_squared), ("is_weights", is_weights)):
        if x is not None and not bool(torch.isfinite(torch.where(mask, x, 0) if x.ndim == 2 else x).all()):
            raise ValueError(f"{name} must be finite on real tokens")
    returns = rewards.to(dtype)[:, None] * real  # (B, T)
    w = 1 - 2 * old_logp.to(dtype).exp() + pi_squared.to(dtype)  # (B, T)
    if is_weights is not None:
        w = w * is_weights.to(dtype) ** 2
    energy = (w * real).cumsum(-1)  # (B, T) W_t
    index, n_groups = group_index(group_ids)
    num = torch.zeros(n_groups, mask.shape[1], dtype=dtype).index_add(0, index, returns * energy * real)  # (n_groups, T)
    den = torch.zeros(n_groups, mask.shape[1], dtype=dtype).index_add(0, index, energy * real) + eps  # (n_groups, T)
    baseline = (num / den)[index]  # (B, T)
    count = group_count(index, n_groups, dtype)[index]  # (B,)
    baseline = torch.where(count[:, None] < 2, torch.zeros_like(baseline), baseline)
    if handle_zero_tail:
        baseline = _zero_tail(baseline, mask.sum(-1), index, n_groups)
    return (returns - baseline) * real


def _zero_tail(baseline: Tensor, lengths: Tensor, index: Tensor, n_groups: int) -> Tensor:
    """verl's handle_zero_tail: in each group of two or more, a unique longest completion's baseline is 0 from the
    second-longest length on. (B, T) -> (B, T)."""
    out = baseline.clone()
    for g in range(n_groups):
        members = torch.nonzero(index == g).flatten()
        if members.numel() < 2:
            continue
        ordered = torch.sort(lengths[members]).values
        longest, second = int(ordered[-1]), int(ordered[-2])
        at_longest = members[lengths[members] == longest]
        if at_longest.numel() == 1 and longest > second:
            out[at_longest[0], second:] = 0.0
    return out


# ----------------------------------------------------------------------------- the advantage component's settings

ADV_SCALE = component_field(
    "group",
    "advantage",
    "choice",
    "group mean and std (paper eq 43; TRL scale_rewards='group')",
    trust_region=True,
    choices=ADVANTAGE_SCALES,
    doc="Advantage estimator the trainer passes to ``group_advantages``: group / batch / none / rloo / reinforce_pp / "
    "reinforce_pp_baseline / opo (these two weigh completions by their lengths) / grpo_passk / gdpo (one column per "
    "reward function) / remax (the greedy completion's reward as baseline) / otb (one advantage per token, "
    "``optimal_token_baseline``, for objectives whose components read advantages token by token); ``ESTIMATOR_SOURCES`` names each one's "
    "source.",
)

ADV_EPS = component_field(
    1e-4,
    "advantage",
    "number",
    "DeepSeekMath eq 3 / TRL: (R - mean) / (std + 1e-4)",
    trust_region=True,
    bounds=NONNEG,
    active_when=When("adv_scale", ("group", "batch", "reinforce_pp", "grpo_passk", "gdpo")),
    doc="Epsilon added to the std of the rewards in the advantage scales that divide by it (group, batch, reinforce_pp, "
    "grpo_passk, gdpo (both of its normalisations, 1e-4 in TRL); verl's grpo_passk uses 1e-6).",
)


def _check_token_level(spec: ObjectiveSpec) -> None:
    """A per-token estimator needs a spec whose every component reads advantages token by token."""
    reasons = spec.completion_advantage_reasons() if spec.adv_scale in TOKEN_LEVEL else []
    if reasons:
        raise ValueError(
            f"adv_scale={spec.adv_scale!r} gives one advantage per token, but {'; '.join(reasons)}: use a token-level "
            "ratio (ratio_level='token' or 'sequence_token') or another adv_scale"
        )


ADVANTAGE_COMPONENT = Component("advantage", validate=_check_token_level)


# ----------------------------------------------------------------------------- the premise of eq 2, per estimator


def estimator_inputs(scale: str) -> str:
    """What ``group_advantages`` reads for ``scale`` besides the group ids, in words."""
    if scale in MULTI_REWARD:
        return "a (B, K) matrix of K reward functions, their weights"
    if scale in LENGTH_WEIGHTED:
        return "rewards (B,), lengths (B,)"
    if scale in GREEDY_BASELINE:
        return "rewards (B,), the greedy completion's reward (B,)"
    if scale in TOKEN_LEVEL:
        return "rewards (B,), mask, pi_old's log-probs and sum pi^2 (B, T); gives (B, T)"
    return "rewards (B,)"


def zero_sum_in_group(scale: str, lengths: tuple[int, ...]) -> bool:
    """Whether ``scale``'s advantages sum to zero in both groups of a fixed two-group batch (rewards 1, 0, 0.5, 0 and
    0, 1, 0, 0: unique best completions, different means; a format column 1, 1, 0, 0 and 0, 1, 1, 1; greedy reward 1) at
    the given lengths (8 completions)."""
    rewards = torch.tensor([1.0, 0.0, 0.5, 0.0, 0.0, 1.0, 0.0, 0.0], dtype=torch.float64)  # (8,)
    ids = torch.tensor([0, 0, 0, 0, 1, 1, 1, 1])
    if scale in TOKEN_LEVEL:
        return _token_sums_vanish(rewards, ids, lengths) == "all"
    matrix = torch.stack([rewards, torch.tensor([1.0, 1.0, 0.0, 0.0, 0.0, 1.0, 1.0, 1.0], dtype=torch.float64)], -1)  # (8, 2)
    extra = {"lengths": torch.tensor(lengths), "baselines": torch.ones_like(rewards)}
    adv = group_advantages(matrix if scale in MULTI_REWARD else rewards, ids, scale=scale, **extra)  # (8,)
    return all(abs(float(adv[ids == g].sum())) < 1e-12 for g in (0, 1))


EQUAL_LENGTHS, UNEQUAL_LENGTHS = (8,) * 8, (5, 9, 12, 7, 6, 6, 10, 3)
"""The lengths ``estimator_rows`` checks the premise at."""


def _token_sums_vanish(rewards: Tensor, ids: Tensor, lengths: tuple[int, ...], prefix: int = 3) -> str:
    """Where OTB's advantages sum to zero over a group, position by position, on groups whose completions share their
    first ``prefix`` tokens (the same pi_old and sum pi^2 there) and differ after: 'all', 'shared prefix' or 'none'."""
    gen = torch.Generator().manual_seed(0)
    T = max(lengths)
    mask = torch.arange(T)[None, :] < torch.tensor(lengths)[:, None]  # (B, T)
    old = -0.1 - torch.rand(len(lengths), T, generator=gen, dtype=torch.float64)  # (B, T)
    pi_sq = 0.2 + 0.5 * torch.rand(len(lengths), T, generator=gen, dtype=torch.float64)  # (B, T)
    for g in ids.unique():  # one shared prefix per group
        rows = ids == g
        old[rows, :prefix], pi_sq[rows, :prefix] = old[rows][:1, :prefix], pi_sq[rows][:1, :prefix]
    adv = optimal_token_baseline(rewards, ids, mask, old, pi_sq)  # (B, T)
    sums = torch.stack([adv[ids == g].sum(0) for g in ids.unique()]).abs()  # (n_groups, T)
    if bool((sums < 1e-6).all()):
        return "all"
    return "shared prefix" if bool((sums[:, :prefix] < 1e-6).all()) else "none"


def estimator_rows() -> list[dict[str, str]]:
    """One row per advantage estimator: what it reads, whether its advantages sum to zero in a group at equal and at
    unequal lengths (computed now, on ``zero_sum_in_group``'s batch), and its source."""
    word = {True: "yes", False: "no"}
    ids = torch.tensor([0, 0, 0, 0, 1, 1, 1, 1])
    rewards = torch.tensor([1.0, 0.0, 0.5, 0.0, 0.0, 1.0, 0.0, 0.0], dtype=torch.float64)

    def cell(scale: str, lengths: tuple[int, ...]) -> str:
        if scale in TOKEN_LEVEL:  # per position: where do a group's advantages at one position sum to zero?
            return {"all": "yes", "shared prefix": "at shared-prefix positions", "none": "no"}[_token_sums_vanish(rewards, ids, lengths)]
        return word[zero_sum_in_group(scale, lengths)]

    return [
        {
            "adv_scale": scale,
            "reads": estimator_inputs(scale),
            "zero-sum, equal lengths": cell(scale, EQUAL_LENGTHS),
            "zero-sum, unequal lengths": cell(scale, UNEQUAL_LENGTHS),
            "source": ESTIMATOR_SOURCES[scale],
        }
        for scale in ADVANTAGE_SCALES
    ]
