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

import math
from typing import TYPE_CHECKING

import torch
from torch import Tensor

from ..settings import Bounds
from .fields import NONNEG, UNIT_OPEN, Component, When, component_field
from .ratios import token_log_ratio

if TYPE_CHECKING:  # spec imports this module
    from .spec import ObjectiveSpec

COV_CONTROLS = ("none", "clip_cov", "kl_cov")


def token_covariance(logp: Tensor, adv: Tensor, mask: Tensor) -> Tensor:
    """cov_t = (A_t - mean A)(log pi_t - mean log pi) over the real tokens (B, T), detached; -inf elsewhere.
    ``adv``: (B,) one per completion or (B, T) one per token."""
    n = mask.sum().clamp(min=1)
    a = (adv if adv.ndim == 2 else adv[:, None]).expand_as(logp).detach()  # (B, T)
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


def covariance_tokens(spec: ObjectiveSpec, ctx) -> Tensor:
    """The tokens the spec's covariance control acts on (B, T) bool; none without one."""
    x, kept = ctx.x, ctx.kept
    if spec.cov_control == "clip_cov":
        clipped = ctx.terms.clip_low | ctx.terms.clip_high
        return clip_cov_tokens(x.logp, x.token_adv, kept, clipped, ratio=spec.cov_ratio, low=spec.cov_clip_low, high=spec.cov_clip_high)
    if spec.cov_control == "kl_cov":
        return kl_cov_tokens(x.logp, x.token_adv, kept, ratio=spec.cov_ratio)
    return torch.zeros_like(kept)


def covariance_step(spec: ObjectiveSpec, ctx, per_token: Tensor) -> tuple[Tensor, dict[str, Tensor]]:
    """Clip-Cov drops its tokens from the gradient (still counted by the aggregation, as verl's loss * 0); KL-Cov adds
    coef * |log r| on its tokens. ``cov/frac``: the share of real tokens acted on (0 without a control)."""
    tokens = covariance_tokens(spec, ctx)  # (B, T) bool
    x = ctx.x
    if spec.cov_control == "clip_cov":
        per_token = torch.where(tokens, 0.0, per_token)
    elif spec.cov_control == "kl_cov":
        log_ratio = token_log_ratio(x.logp, x.old_logp, x.mask)  # (B, T)
        per_token = per_token + torch.where(tokens, spec.kl_cov_coef * log_ratio.abs(), 0.0)
    n_real = x.lengths.sum().clamp(min=1).to(x.logp.dtype)
    return per_token, {"cov/frac": (tokens.sum() / n_real).to(x.logp.dtype)}


# ----------------------------------------------------------------------------- the covariance component's settings

COV_CONTROL = component_field(
    "none",
    "cov_control",
    "choice",
    "none: no covariance control",
    trust_region=True,
    choices=COV_CONTROLS,
    doc="Covariance token control (arXiv 2505.22617): ``none``, ``clip_cov`` (drop high-covariance tokens from the gradient) or ``kl_cov`` (a |log r| penalty on the top-covariance tokens). Token level only.",
)
COV_RATIO = component_field(
    2e-4,
    "cov_control",
    "number",
    "verl clip_cov_ratio / kl_cov_ratio default 0.0002 (arXiv 2505.22617)",
    trust_region=True,
    bounds=UNIT_OPEN,
    active_when=When("cov_control", ("none",), negate=True),
    doc="Share of real tokens Clip-Cov drops / KL-Cov penalises (at least one token).",
)
COV_CLIP_LOW = component_field(
    1.0,
    "cov_control",
    "number",
    "verl clip_cov_lb default 1.0",
    trust_region=True,
    bounds=Bounds(-math.inf, math.inf),
    active_when=When("cov_control", ("clip_cov",)),
    doc="Clip-Cov: lower bound of the covariance band it picks from.",
)
COV_CLIP_HIGH = component_field(
    5.0,
    "cov_control",
    "number",
    "verl clip_cov_ub default 5.0",
    trust_region=True,
    bounds=Bounds("cov_clip_low", math.inf),
    active_when=When("cov_control", ("clip_cov",)),
    doc="Clip-Cov: upper bound of the covariance band it picks from.",
)
KL_COV_COEF = component_field(
    1.0,
    "cov_control",
    "number",
    "verl compute_policy_loss_kl_cov's fallback 1.0 (verl's PolicyLossConfig default is 0.1)",
    trust_region=True,
    bounds=NONNEG,
    active_when=When("cov_control", ("kl_cov",)),
    doc="KL-Cov: weight of the |log r| penalty.",
)


def _check_cov(spec: ObjectiveSpec) -> None:
    if spec.cov_control != "none" and spec.ratio_level != "token":
        raise ValueError(
            f"cov_control={spec.cov_control!r} selects tokens and needs ratio_level='token', got ratio_level={spec.ratio_level!r}"
        )


def _cov_coupling(spec: ObjectiveSpec) -> list[str]:
    if spec.cov_control == "none":
        return []
    return [f"cov_control={spec.cov_control!r} centres on batch means and picks a share of the whole batch's tokens"]


COV_COMPONENT = Component("cov_control", validate=_check_cov, batch_coupling=_cov_coupling, token_step=covariance_step)
