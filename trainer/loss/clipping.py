"""Clipping as a map from ratio to effective weight (paper eqs 46-49, 77-79).

Every clipped surrogate here is written "clip first, then multiply by the advantage"
(eq 49): surrogate = A * w(r, A). For PPO-style clipping the sign-aware post-clip weight
w is eq (47); for symmetric clipping (GRPO-fix, eq 79) w does not depend on the sign of A.
CISPO's weight is a detached cap that multiplies the score A * log pi instead.

Each clip mode is one ``ClipRule`` in ``CLIP_RULES``: its weight, where it zeroes the gradient
(the clip-fraction flags) and its surrogate form. A new clip mode is one new entry there.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import torch
from torch import Tensor

Flags = tuple[Tensor, Tensor]


def sign_aware_clip(ratio: Tensor, adv: Tensor, eps_low: float, eps_high: float) -> Tensor:
    """Eq (47): sbar = min(r, c) if A >= 0 else max(r, c), with c = clip(r, 1-eps_low, 1+eps_high).

    Then min(r A, c A) = A * sbar exactly (eq 49). ``adv`` broadcasts against ``ratio``.
    """
    # min(r, clip(r, lo, hi)) = min(r, hi) and max(r, clip(r, lo, hi)) = max(r, lo): one clamp
    # whose bound depends on the sign of A (a single pass over (B, T), forward and backward).
    inf = torch.tensor(float("inf"), dtype=ratio.dtype, device=ratio.device)
    low = torch.where(adv >= 0, -inf, torch.tensor(1.0 - eps_low, dtype=ratio.dtype, device=ratio.device))
    high = torch.where(adv >= 0, torch.tensor(1.0 + eps_high, dtype=ratio.dtype, device=ratio.device), inf)
    return torch.clamp(ratio, min=low, max=high)


def symmetric_clip(ratio: Tensor, eps_low: float, eps_high: float) -> Tensor:
    """Eq (79): phi(r) = clip(r, 1-eps_low, 1+eps_high); GRPO-fix uses eps_low = 1 (lower bound 0)."""
    return ratio.clamp(1.0 - eps_low, 1.0 + eps_high)


def _ppo_flags(ratio: Tensor, adv: Tensor, eps_low: float, eps_high: float) -> Flags:
    """PPO (as TRL logs it): low when A < 0 and r < 1-eps_low, high when A > 0 and r > 1+eps_high."""
    return (adv < 0) & (ratio < 1.0 - eps_low), (adv > 0) & (ratio > 1.0 + eps_high)


def _symmetric_flags(ratio: Tensor, adv: Tensor, eps_low: float, eps_high: float) -> Flags:
    """Symmetric: r below / above the clip range whatever the sign of A."""
    return ratio < 1.0 - eps_low, ratio > 1.0 + eps_high


def _cispo_weight(ratio: Tensor, adv: Tensor, eps_low: float, eps_high: float) -> Tensor:
    """CISPO (MiniMax-M1; TRL loss_type='cispo'): the detached cap sg(min(r, eps_high))."""
    return ratio.clamp(max=eps_high).detach()


def _cispo_flags(ratio: Tensor, adv: Tensor, eps_low: float, eps_high: float) -> Flags:
    """CISPO: the cap binds where r > eps_high."""
    return torch.zeros_like(ratio, dtype=torch.bool), ratio > eps_high


def _no_flags(ratio: Tensor, adv: Tensor, eps_low: float, eps_high: float) -> Flags:
    no = torch.zeros_like(ratio, dtype=torch.bool)
    return no, no


@dataclass(frozen=True)
class ClipRule:
    """One clip mode: weight w(r, A, eps_low, eps_high), clip flags, and how w enters the surrogate."""

    weight: Callable[[Tensor, Tensor, float, float], Tensor]
    flags: Callable[[Tensor, Tensor, float, float], Flags]
    score_function: bool = False
    """False: surrogate = A * w (eq 49). True: surrogate = w * A * log pi with w detached (CISPO)."""
    sequence_level: bool = True
    """Whether the rule may clip a sequence ratio s_i (CISPO is defined per token only)."""

    def surrogate(self, weight: Tensor, adv: Tensor, logp: Tensor) -> Tensor:
        """Per-token surrogate to maximise from the clipped weight; shapes broadcast (B, T)."""
        return weight * adv * logp if self.score_function else adv * weight


CLIP_RULES: dict[str, ClipRule] = {
    "ppo": ClipRule(sign_aware_clip, _ppo_flags),
    "symmetric": ClipRule(lambda r, a, lo, hi: symmetric_clip(r, lo, hi), _symmetric_flags),
    "cispo": ClipRule(_cispo_weight, _cispo_flags, score_function=True, sequence_level=False),
    "none": ClipRule(lambda r, a, lo, hi: r, _no_flags),
}
CLIP_MODES = tuple(CLIP_RULES)


def clip_rule(mode: str) -> ClipRule:
    """The registered rule of a clip mode; ValueError naming the mode otherwise."""
    if mode not in CLIP_RULES:
        raise ValueError(f"clip must be one of {CLIP_MODES}, got clip={mode!r}")
    return CLIP_RULES[mode]


def clipped_weight(mode: str, ratio: Tensor, adv: Tensor, eps_low: float, eps_high: float) -> Tensor:
    """Effective weight w(r, A) for a clip mode, so that surrogate = A * w (CISPO: w * A * log pi)."""
    return clip_rule(mode).weight(ratio, adv, eps_low, eps_high)


def clip_fractions(mode: str, ratio: Tensor, adv: Tensor, eps_low: float, eps_high: float) -> Flags:
    """Boolean maps of where clipping zeroes the gradient: (low side, high side)."""
    return clip_rule(mode).flags(ratio, adv, eps_low, eps_high)
