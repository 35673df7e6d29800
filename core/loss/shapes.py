"""Ratio shapes: how each ``ratio_level`` turns log-probs into a per-token surrogate.

A ratio shape is one function ``(spec, batch) -> PolicyTerms`` registered in ``RATIO_SHAPES``
under its ratio level. It computes the importance ratio its level defines, clips it with the
spec's ``ClipRule`` and, for shapes that give one weight per sequence, hands that weight to
DFPO's group transform and stop-gradient form (``sequence_surrogate``). ``policy_loss`` then
masks, aggregates and computes every metric from the returned ``PolicyTerms``, whatever the
level, so a new objective with a new ratio shape is one new function here.

    token           r_it = pi/pi_old per token (eq 7), clipped per token (eq 47/79)
    sequence_token  GSPO-token: value s_i, gradient token by token
    sequence        GSPO's s_i = (prod_t r_it)^(1/L_i) (eq 44), clipped per sequence (eq 47)
    sequence_product  prod_t r_it (eq 11), VESPO's sequence weight
    geometric       GMPO (arXiv 2507.20673): each r_it clipped first, then the geometric mean
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

import torch
from torch import Tensor

from .batch import LossBatch, PolicyTerms
from .clipping import clip_rule
from .fields import Component, component_field
from .ratios import LOG_RATIO_BOUND, sequence_log_ratio, sequence_product_log_ratio, sequence_token_ratio, token_log_ratio
from .transforms import sequence_surrogate

if TYPE_CHECKING:  # spec imports this module
    from .spec import ObjectiveSpec

RatioShape = Callable[[object, LossBatch], PolicyTerms]
RATIO_SHAPES: dict[str, RatioShape] = {}
SEQUENCE_WEIGHT_LEVELS: set[str] = set()
"""Ratio levels that give one weight per sequence, which DFPO's transforms can act on."""


def register_ratio_shape(level: str, *, sequence_weight: bool = False) -> Callable[[RatioShape], RatioShape]:
    """Register ``fn`` as the shape of ``ratio_level=level``; ``sequence_weight`` allows DFPO's transforms on it."""

    def register(fn: RatioShape) -> RatioShape:
        if level in RATIO_SHAPES:
            raise ValueError(f"ratio_level={level!r} is already registered")
        RATIO_SHAPES[level] = fn
        if sequence_weight:
            SEQUENCE_WEIGHT_LEVELS.add(level)
        return fn

    return register


def _row_mean(values: Tensor, mask: Tensor, lengths: Tensor) -> Tensor:
    """Mean of (B, T) values over each row's real tokens (B,); 0 for an empty row."""
    return torch.where(mask, values, 0.0).sum(-1) / lengths.clamp(min=1)


# ----------------------------------------------------------------------------- the shapes


@register_ratio_shape("token")
def token_shape(spec: ObjectiveSpec, x: LossBatch) -> PolicyTerms:
    """Token ratio r_it (eq 7) clipped per token (eq 47, 79; CISPO's cap)."""
    ratio = torch.exp(token_log_ratio(x.logp, x.old_logp, x.mask))  # (B, T)
    return _token_terms(spec, ratio, x)


@register_ratio_shape("sequence_token")
def sequence_token_shape(spec: ObjectiveSpec, x: LossBatch) -> PolicyTerms:
    """GSPO-token: s_it = sg(s_i) pi/sg(pi), value s_i (eq 44) and a token-wise gradient, clipped per token."""
    seq_ratio = torch.exp(sequence_log_ratio(x.logp, x.old_logp, x.mask, x.lengths))  # (B,)
    return _token_terms(spec, sequence_token_ratio(x.logp, seq_ratio), x)


def _token_terms(spec: ObjectiveSpec, ratio: Tensor, x: LossBatch) -> PolicyTerms:
    rule = clip_rule(spec.clip)
    adv = x.token_adv  # (B, T): one per completion broadcast along its row, or one per token
    weight = rule.weight(ratio, adv, spec, x.old_logp)  # (B, T)
    low, high = rule.flags(ratio.detach(), adv, spec, x.old_logp)  # (B, T)
    row_weight = _row_mean(weight.detach(), x.mask, x.lengths)  # (B,)
    return PolicyTerms(
        surrogate=rule.surrogate(weight, adv, x.logp),
        ratio=ratio.detach(),
        post_clip=row_weight,
        weight=row_weight,
        clip_low=low,
        clip_high=high,
        clip_per_sequence=False,
    )


@register_ratio_shape("sequence", sequence_weight=True)
def sequence_shape(spec: ObjectiveSpec, x: LossBatch) -> PolicyTerms:
    """GSPO: s_i = exp((1/L_i) sum_t log r_it) (eq 44), clipped per sequence (eq 47), then DFPO's transform."""
    return _sequence_terms(spec, x, sequence_log_ratio(x.logp, x.old_logp, x.mask, x.lengths))


@register_ratio_shape("sequence_product", sequence_weight=True)
def sequence_product_shape(spec: ObjectiveSpec, x: LossBatch) -> PolicyTerms:
    """The un-normalised sequence ratio prod_t r_it (eq 11), as VESPO weighs it; log clamped to +-LOG_RATIO_BOUND."""
    log_s = sequence_product_log_ratio(x.logp, x.old_logp, x.mask).clamp(-LOG_RATIO_BOUND, LOG_RATIO_BOUND)  # (B,)
    return _sequence_terms(spec, x, log_s)


def _sequence_terms(spec: ObjectiveSpec, x: LossBatch, log_s: Tensor) -> PolicyTerms:
    """One weight per sequence from its log-ratio (B,): clipped (eq 47) or gated, then transformed.

    A score-function rule (VESPO) multiplies A_i log pi(y_it) by its detached weight instead.
    """
    seq_ratio = torch.exp(log_s)  # (B,)
    rule = clip_rule(spec.clip)
    sbar = rule.weight(seq_ratio, x.adv, spec, None)  # (B,) eq 47
    if rule.score_function:
        surrogate, weight = rule.surrogate(sbar[:, None], x.adv[:, None], x.logp), sbar.detach()
    else:
        surrogate, weight = sequence_surrogate(spec, sbar, x)
    low, high = rule.flags(seq_ratio.detach(), x.adv, spec, None)  # (B,)
    return PolicyTerms(
        surrogate=surrogate,
        ratio=seq_ratio.detach()[:, None].expand_as(x.logp),
        post_clip=sbar.detach(),
        weight=weight,
        clip_low=low[:, None].expand_as(x.mask),
        clip_high=high[:, None].expand_as(x.mask),
        clip_per_sequence=True,
    )


@register_ratio_shape("geometric", sequence_weight=True)
def geometric_shape(spec: ObjectiveSpec, x: LossBatch) -> PolicyTerms:
    """GMPO (arXiv 2507.20673): w_i = exp((1/L_i) sum_t log clip(r_it)), each token clipped first.

    The clip is the sign-aware PPO clip (eq 47) per token, so a clipped token drops out of the
    gradient while the others keep theirs: grad w_i = w_i (1/L_i) sum_{t unclipped} grad log pi(y_it).
    GMPO states its range in log space, |log r| <= 0.4, i.e. eps_low = 1 - e^-0.4, eps_high = e^0.4 - 1.
    """
    ratio = torch.exp(token_log_ratio(x.logp, x.old_logp, x.mask))  # (B, T)
    rule = clip_rule(spec.clip)
    adv = x.adv[:, None]  # (B, 1)
    clipped = rule.weight(ratio, adv, spec, x.old_logp)  # (B, T), > 0 (eps_low < 1)
    sbar = torch.exp(_row_mean(torch.log(clipped), x.mask, x.lengths))  # (B,) geometric mean
    surrogate, weight = sequence_surrogate(spec, sbar, x)
    low, high = rule.flags(ratio.detach(), adv, spec, x.old_logp)  # (B, T)
    return PolicyTerms(
        surrogate=surrogate,
        ratio=ratio.detach(),
        post_clip=sbar.detach(),
        weight=weight,
        clip_low=low,
        clip_high=high,
        clip_per_sequence=False,
    )


# ----------------------------------------------------------------------------- the ratio component's settings

RATIO_LEVEL = component_field(
    "token",
    "ratio",
    "choice",
    "token ratio r_it (paper eq 7; PPO, GRPO)",
    trust_region=True,
    choices=RATIO_SHAPES,
    doc="``token`` r_it (eq 7); ``sequence`` s_i (eq 44, GSPO); ``sequence_token`` (GSPO-token); ``geometric`` (GMPO).",
)


def _check_ratio_level(spec: ObjectiveSpec) -> None:
    """DFPO's transforms act on one weight per sequence; GMPO takes the log of clipped token ratios."""
    if spec.transform != "none" and spec.ratio_level not in SEQUENCE_WEIGHT_LEVELS:
        raise ValueError(
            f"transform={spec.transform!r} acts on sequence weights and needs ratio_level in {sorted(SEQUENCE_WEIGHT_LEVELS)}, "
            f"got ratio_level={spec.ratio_level!r}"
        )
    if spec.ratio_level == "geometric" and spec.clip != "none" and spec.eps_low >= 1.0:
        raise ValueError(
            f"ratio_level='geometric' takes the log of clipped token ratios and needs eps_low < 1, got eps_low={spec.eps_low!r}"
        )


def _sequence_advantage(spec: ObjectiveSpec) -> str | None:
    """A sequence-weight level multiplies one weight per completion by that completion's advantage."""
    if spec.ratio_level in SEQUENCE_WEIGHT_LEVELS:
        return f"ratio_level={spec.ratio_level!r} weighs each completion by one ratio times its advantage"
    return None


RATIO_COMPONENT = Component("ratio", validate=_check_ratio_level, completion_advantage=_sequence_advantage)
