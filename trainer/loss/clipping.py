"""Clipping as a map from ratio to effective weight (paper eqs 46-49, 77-79).

Every clipped surrogate here is written "clip first, then multiply by the advantage"
(eq 49): surrogate = A * w(r, A). For PPO-style clipping the sign-aware post-clip weight
w is eq (47); for symmetric clipping (GRPO-fix, eq 79) w does not depend on the sign of A.
"""

from __future__ import annotations

import torch
from torch import Tensor

CLIP_MODES = ("ppo", "symmetric", "cispo", "none")


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


def clipped_weight(mode: str, ratio: Tensor, adv: Tensor, eps_low: float, eps_high: float) -> Tensor:
    """Effective weight w(r, A) for a clipping mode, so that surrogate = A * w."""
    if mode == "ppo":
        return sign_aware_clip(ratio, adv, eps_low, eps_high)
    if mode == "symmetric":
        return symmetric_clip(ratio, eps_low, eps_high)
    if mode == "none":
        return ratio
    raise ValueError(f"clip must be one of {CLIP_MODES} here, got clip={mode!r}")


def clip_fractions(mode: str, ratio: Tensor, adv: Tensor, eps_low: float, eps_high: float) -> tuple[Tensor, Tensor]:
    """Boolean maps of where clipping zeroes the gradient: (low side, high side).

    PPO (as TRL logs it): low when A < 0 and r < 1-eps_low, high when A > 0 and r > 1+eps_high.
    Symmetric: r below / above the clip range whatever the sign. CISPO: r > eps_high.
    """
    if mode == "ppo":
        return (adv < 0) & (ratio < 1.0 - eps_low), (adv > 0) & (ratio > 1.0 + eps_high)
    if mode == "symmetric":
        return ratio < 1.0 - eps_low, ratio > 1.0 + eps_high
    if mode == "cispo":
        return torch.zeros_like(ratio, dtype=torch.bool), ratio > eps_high
    no = torch.zeros_like(ratio, dtype=torch.bool)
    return no, no
