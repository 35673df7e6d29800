"""Shared-token cancellation probe (paper eq 2, 9, 13, 72).

Builds one group of completions whose first ``prefix_len`` positions are the same
(context, token) event in every completion: their log-probabilities are ONE leaf tensor
broadcast into every row, so autograd sums the per-completion coefficients on it. The
gradient on that leaf is the paper's residual sum_i A_i d w_i / d log pi(a*|h*); it is zero
exactly when the objective cancels the shared token.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
from torch import Tensor

from .advantages import group_advantages
from .aggregation import AGGREGATIONS
from .batch import LossBatch
from .core import policy_loss
from .objectives import OBJECTIVES, objective_from_label, resolve_objective
from .ratios import sequence_log_ratio
from .shapes import RATIO_SHAPES
from .spec import ObjectiveSpec


@dataclass(frozen=True)
class SharedPrefixGroup:
    """One group whose first ``prefix_len`` tokens are shared by every completion."""

    shared_logp: Tensor  # (prefix_len,) leaf, requires grad
    own_logp: Tensor  # (G, T - prefix_len) leaf, requires grad
    old_logp: Tensor  # (G, T)
    mask: Tensor  # (G, T) bool
    advantages: Tensor  # (G,)
    group_ids: Tensor  # (G,)
    rollout_logp: Tensor  # (G, T) the sampler's log-probs: one value at the shared event, random at each own token
    token_ids: Tensor | None = None  # (G, T) the tokens: one id per shared position, each completion's own ids after them

    def logp(self) -> Tensor:
        """(G, T): the shared leaf broadcast into every row, then each row's own tokens."""
        G = self.own_logp.shape[0]
        return torch.cat([self.shared_logp.expand(G, -1), self.own_logp], dim=1)


def make_shared_prefix_group(
    rewards: Tensor,
    lengths: list[int],
    *,
    prefix_len: int = 3,
    shared_log_ratio: float = 0.0,
    log_ratio_scale: float = 0.3,
    rollout_scale: float = 0.3,
    seed: int = 0,
    dtype: torch.dtype = torch.float64,
) -> SharedPrefixGroup:
    """A group with G = len(lengths) completions of the given total lengths (each > prefix_len).

    Shared positions get log-ratio ``shared_log_ratio`` (one value for the shared event, as it
    must be); each completion's own tokens get random log-ratios of scale ``log_ratio_scale``.
    The sampler's log-probs differ from pi_old by log(pi_old / pi_rollout) of scale ``rollout_scale``: one random value
    per shared position (the shared event has one pi_rollout, as it has one pi_old), an own value at each own token.
    """
    G = len(lengths)
    if any(L <= prefix_len for L in lengths):
        raise ValueError(f"every length must exceed prefix_len={prefix_len}, got lengths={lengths}")
    gen = torch.Generator().manual_seed(seed)
    T = max(lengths)
    shared = (-0.5 - torch.rand(prefix_len, generator=gen, dtype=dtype)).requires_grad_()  # (k,)
    own = (-0.5 - torch.rand(G, T - prefix_len, generator=gen, dtype=dtype)).requires_grad_()  # (G, T-k)
    own_shift = log_ratio_scale * torch.randn(G, T - prefix_len, generator=gen, dtype=dtype)
    mask = torch.arange(T)[None, :] < torch.tensor(lengths)[:, None]  # (G, T)
    logp = torch.cat([shared.detach().expand(G, -1), own.detach()], dim=1)
    shift = torch.cat([torch.full((G, prefix_len), shared_log_ratio, dtype=dtype), own_shift], dim=1)
    group_ids = torch.zeros(G, dtype=torch.long)
    advantages = group_advantages(rewards.to(dtype), group_ids)
    old_logp = logp - shift
    mismatch = rollout_scale * torch.randn(G, T, generator=gen, dtype=dtype)  # (G, T) log pi_old - log pi_rollout
    mismatch[:, :prefix_len] = mismatch[0, :prefix_len]
    positions = torch.arange(T)  # (T,)
    token_ids = torch.where(positions < prefix_len, positions, positions + T * (1 + torch.arange(G))[:, None])  # (G, T) own ids differ
    return SharedPrefixGroup(shared, own, old_logp, mask, advantages, group_ids, old_logp - mismatch, token_ids)


def _spec(objective: str | ObjectiveSpec, overrides: dict[str, object]) -> ObjectiveSpec:
    """The spec of a preset name, a label (``gspo_noclip:cancel=shared_whole``) or a spec, with ``overrides`` applied last."""
    return resolve_objective(objective_from_label(objective) if isinstance(objective, str) else objective, **overrides)


def shared_token_gradient(objective: str | ObjectiveSpec, group: SharedPrefixGroup, **overrides: object) -> Tensor:
    """d loss / d log pi(shared token) summed over the group (prefix_len,): zero iff it cancels. ``objective``: a preset
    name, a label or a spec; ``overrides`` change it further."""
    logp = group.logp()
    entropy = torch.ones_like(logp)
    loss, _ = policy_loss(
        _spec(objective, overrides),
        logp=logp,
        old_logp=group.old_logp,
        advantages=group.advantages,
        mask=group.mask,
        group_ids=group.group_ids,
        entropy=entropy,
        rollout_logp=group.rollout_logp,
        ref_logp=group.old_logp,  # the reference is the policy that sampled (read by online IPO and a KL term only)
        token_ids=group.token_ids,  # read by the exact-cancellation arm only
        batch_metrics=False,  # the gradient alone is read
    )
    (grad,) = torch.autograd.grad(loss, group.shared_logp, allow_unused=True)
    return torch.zeros_like(group.shared_logp) if grad is None else grad


@dataclass(frozen=True)
class GroupBreakdown:
    """Per completion of a shared-prefix group: what each one contributes to the shared token.

    All (G,): ``coefficient`` = d loss / d log pi(first shared token) read in that completion (its
    sum over the group is the residual), ``seq_ratio`` s_i (eq 44), ``post_clip`` sbar_i (eq 47),
    ``weight`` stilde_i after the objective's transform (eq 18 / 50-55; sbar_i without one),
    ``clipped`` whether clipping zeroes the sequence's ratio gradient.
    """

    advantages: Tensor
    lengths: Tensor
    coefficient: Tensor
    seq_ratio: Tensor
    post_clip: Tensor
    weight: Tensor
    clipped: Tensor
    metrics: dict[str, Tensor]

    @property
    def residual(self) -> float:
        return float(self.coefficient.sum())


def group_breakdown(objective, group: SharedPrefixGroup, **overrides: object) -> GroupBreakdown:
    """Decompose one group's shared-token gradient by completion, with the weights behind it."""
    spec = _spec(objective, overrides)
    logp = group.logp().detach().requires_grad_()  # (G, T): one leaf per completion's copy of the shared token
    loss, metrics = policy_loss(
        spec,
        logp=logp,
        old_logp=group.old_logp,
        advantages=group.advantages,
        mask=group.mask,
        group_ids=group.group_ids,
        entropy=torch.ones_like(logp),
        rollout_logp=group.rollout_logp,
        ref_logp=group.old_logp,  # the reference is the policy that sampled (read by online IPO and a KL term only)
        token_ids=group.token_ids,  # read by the exact-cancellation arm only
    )
    (grad,) = torch.autograd.grad(loss, logp)
    lengths = group.mask.sum(-1)
    with torch.no_grad():
        batch = LossBatch.of(logp.detach(), group.old_logp, group.advantages, group.mask, group.group_ids)
        terms = RATIO_SHAPES[spec.ratio_level](spec, batch)
        s = torch.exp(sequence_log_ratio(logp, group.old_logp, group.mask, lengths))  # (G,) eq 44
        clipped = ((terms.clip_low | terms.clip_high) | ~group.mask).all(-1) & (lengths > 0)  # (G,) every real token clipped
    return GroupBreakdown(
        group.advantages,
        lengths,
        grad[:, 0].detach(),
        s,
        terms.post_clip,
        terms.weight,
        clipped,
        {k: v.detach() for k, v in metrics.items()},
    )


# ----------------------------------------------------------------------------- the atlas

CANCEL_TOL = 1e-12
"""A residual below this is "cancels" (float64 round-off is ~1e-16)."""
ATLAS_COLUMNS = ("equal L, r*=1", "equal L, r*=e^0.5", "unequal L, r*=1", "unequal L, r*=e^0.5")


@dataclass(frozen=True)
class AtlasCell:
    """The largest shared-token residual of one objective in one (aggregation, lengths, shared ratio) cell."""

    objective: str
    aggregation: str
    equal_lengths: bool
    shared_clipped: bool
    residual: float

    @property
    def label(self) -> str:
        return "cancels" if self.residual < CANCEL_TOL else f"{self.residual:.1e}"


def atlas_draws(groups: int, seed: int) -> list[tuple[list[float], list[int], list[int], int]]:
    """The atlas's random groups for ``seed``: (rewards, equal lengths, unequal lengths, the group's own seed) each.
    One generator draws them in turn, so the first k draws for any ``groups`` >= k are the draws for ``groups=k``
    (the explorer's atlas page reuses them when the count grows)."""
    gen = torch.Generator().manual_seed(seed)
    cases = []
    for _ in range(groups):
        rewards = [1.0, 0.0] + torch.randint(0, 2, (2,), generator=gen).double().tolist()
        unequal = torch.randint(4, 12, (4,), generator=gen).tolist()
        while len(set(unequal)) == 1:
            unequal = torch.randint(4, 12, (4,), generator=gen).tolist()
        cases.append((rewards, [8] * 4, unequal, int(torch.randint(0, 2**16, (1,), generator=gen))))
    return cases


def atlas(objectives=None, *, groups: int = 4, seed: int = 0) -> list[AtlasCell]:
    """For every objective: the largest shared-token residual over ``groups`` random groups (G = 4,
    both reward signs), per aggregation x equal/unequal lengths x shared ratio inside (1) or
    outside (e^0.5) the clip range. The same cells the cancellation tests state verdicts for."""
    cases = atlas_draws(groups, seed)
    out = []
    for name in objectives or OBJECTIVES:
        for agg in AGGREGATIONS:
            for equal in (True, False):
                for clipped in (False, True):
                    worst = 0.0
                    for rewards, eq_len, uneq_len, s in cases:
                        group = make_shared_prefix_group(
                            torch.tensor(rewards, dtype=torch.float64),
                            eq_len if equal else uneq_len,
                            shared_log_ratio=0.5 if clipped else 0.0,
                            seed=s,
                        )
                        worst = max(worst, float(shared_token_gradient(name, group, aggregation=agg).abs().max()))
                    out.append(AtlasCell(name, agg, equal, clipped, worst))
    return out


def atlas_rows(cells: list[AtlasCell]) -> tuple[list[str], list[dict]]:
    """(column names, one row per objective x aggregation) of the atlas."""
    rows: dict[tuple[str, str], dict] = {}
    for c in cells:
        row = rows.setdefault((c.objective, c.aggregation), {"objective": c.objective, "aggregation": c.aggregation})
        row[ATLAS_COLUMNS[(0 if c.equal_lengths else 2) + int(c.shared_clipped)]] = c.label
    return list(ATLAS_COLUMNS), list(rows.values())


# ----------------------------------------------------------------------------- rollout corrections


def rejecting_one(mode: str, group: SharedPrefixGroup) -> dict[str, float]:
    """Thresholds under which the rejection ``mode`` rejects exactly one completion of ``group`` (the most extreme by
    its statistic; a token-level mode about half of the real tokens): a completion-level rejection's verdict is read
    where it rejects part of the group (rejecting all, none, or two of opposite signs cancels by arithmetic)."""
    from .rejection import level_statistic, token_divergence

    level, _, estimator = mode.rpartition("_")
    log_rho = torch.where(group.mask, group.old_logp - group.rollout_logp, 0.0)  # (G, T)
    stat = level_statistic(token_divergence(log_rho, estimator), group.mask, level)  # (G, T)
    values = sorted((stat[group.mask] if level == "token" else stat[:, 0]).tolist())
    if level == "token":
        values = [values[len(values) // 2]] * 3
    top, bottom = (values[-2] + values[-1]) / 2, (values[0] + values[1]) / 2  # between the two largest / smallest
    if estimator != "k1":
        return {"rollout_rs_max": top}
    if top >= 0:
        return {"rollout_rs_low": 0.0, "rollout_rs_high": math.exp(top)}
    return {"rollout_rs_low": math.exp(bottom), "rollout_rs_high": 1e9}


CORRECTION_CASES = (("dapo", "equal"), ("dapo", "unequal"), ("grpo", "equal"))
"""The columns of the correction table: an objective that cancels a shared token there without a correction."""


CORRECTION_BOUNDS = {"rollout_low": 0.01, "rollout_cap": 100.0}
"""The truncation / mask band of the correction rows: wide enough that every weight of the table's groups is kept."""


def correction_settings() -> list[tuple[str, str]]:
    """(override, mode) of every rollout correction and rejection but 'none': the rows of the correction tables."""
    from .correction import CORRECTIONS
    from .rejection import REJECTIONS

    return [("rollout_correction", m) for m in CORRECTIONS if m != "none"] + [("rollout_rejection", m) for m in REJECTIONS if m != "none"]


def correction_atlas(seeds: int = 4) -> list[dict[str, str]]:
    """For every rollout correction and rejection: the largest shared-token residual over ``seeds`` groups (G = 4,
    rewards 1, 0, 1, 0, r* = 1, the sampler's log-probs off pi_old by scale 0.3 at each completion's own tokens) under
    each ``CORRECTION_CASES`` objective; a rejection at thresholds that reject one completion (``rejecting_one``)."""
    rows = []
    for key, mode in correction_settings():
        row = {"setting": f"{key}={mode}"}
        for objective, lengths in CORRECTION_CASES:
            worst = 0.0
            for seed in range(seeds):
                group = make_shared_prefix_group(
                    torch.tensor([1.0, 0.0, 1.0, 0.0], dtype=torch.float64), [8] * 4 if lengths == "equal" else [5, 9, 12, 7], seed=seed
                )
                extra = rejecting_one(mode, group) if key == "rollout_rejection" else CORRECTION_BOUNDS
                worst = max(worst, float(shared_token_gradient(objective, group, **{key: mode}, **extra).abs().max()))
            row[f"{objective}, {lengths} L"] = "cancels" if worst < CANCEL_TOL else f"{worst:.1e}"
        rows.append(row)
    return rows
