"""M2PO's second-moment trust region (arXiv 2510.01161, "M2PO"): PPO clipping whose range is chosen per batch so that
the second moment of the log-ratio over the tokens the update would push further does not exceed a budget.

As the authors' code computes it (Infini-AI-Lab/M2PO, ``verl/trainer/ppo/core_algos.py``: ``compute_m2po_policy_loss``,
``kpo_clip_harmful_tokens``, ``_get_trust_region_tokens_delta_sq``, ``_solve_tau_from_sorted_delta2``):

1. The *harmful* tokens are the real tokens with A > 1e-12 and r > 1 + 1e-12, or A < -1e-12 and r < 1 - 1e-12
   (r = pi_theta / pi_old): the ones a PPO step would move further from pi_old.
2. M2 = mean over harmful tokens of delta^2, delta = log pi_old - log pi_theta. If there is no harmful token or
   M2 <= budget + 1e-12, no bound applies: the clip range is [0, 1e5] (the code's clip_low = 0, clip_high = 100000).
3. Otherwise, with v the harmful delta^2 sorted ascending, csum its prefix sums and n its count, k is the first index
   with (v_k - 1e-12)(n - k - 1) + csum_k >= budget * n - 1e-12; tau = 0 if k = 0, else sqrt(v_{k-1} - 1e-12): the
   largest breakpoint at which capping every |delta| at tau keeps the capped second moment within the budget.
4. The ratio is PPO-clipped (eq 47) to [exp(-tau), exp(tau)], each end widened to at least the optional
   ``m2po_min_eps_low`` / ``m2po_min_eps_high`` (the code's miniclip_low / miniclip_high). Under PPO's sign-aware form a
   bound binds only on harmful tokens, so this zeroes the gradient of exactly the harmful tokens with |delta| > tau:
   the extreme outliers of the paper's second-moment constraint; every other token keeps its gradient.

Where dfpo departs from that code: it computes tau over the batch ``policy_loss`` is given (the paper's mini-batch,
Algorithm 1); the released verl actor calls it once per micro-batch, so its bound depends on the micro-batch size.
The statistic couples the batch (``m2po_coupling``): the trainer and the fused LM head compute it over the whole batch.
sqrt(v_{k-1} - 1e-12) is read as 0 where v_{k-1} < 1e-12 (Python's float power would return a complex number there).
Log-ratios are clamped to +-LOG_RATIO_BOUND like every ratio of the core.

Pure torch: the sort and prefix sums run on the device, in float64, over the harmful tokens only (selecting them is
one device sync per call).
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

import torch
from torch import Tensor

from .fields import NONNEG, POSITIVE, UNIT, When, component_field

if TYPE_CHECKING:  # spec imports this module
    from .spec import ObjectiveSpec

NO_BOUND_HIGH = 100000.0
"""The upper ratio bound when no harmful token exceeds the budget (the code's ``clip_high = 100000``)."""
TINY = 1e-12
"""The code's tolerance on advantages, ratios, the budget and the breakpoints."""


def harmful_tokens(ratio: Tensor, adv: Tensor) -> Tensor:
    """(B, T) bool: A > 1e-12 and r > 1 + 1e-12, or A < -1e-12 and r < 1 - 1e-12 (``_get_trust_region_tokens_delta_sq``).

    ``ratio`` (B, T) is 1 at padding (the core zeroes padded log-probs), so padding is never harmful; ``adv`` (B, 1)."""
    return ((adv > TINY) & (ratio > 1.0 + TINY)) | ((adv < -TINY) & (ratio < 1.0 - TINY))


def m2po_tau(delta_sq: Tensor, harmful: Tensor, budget: float) -> tuple[Tensor, Tensor]:
    """(tau, bound_applies), 0-d float64: the cap on |delta| of M2PO's step 3, and whether the budget binds at all.

    delta_sq (B, T): squared log-ratios; harmful (B, T) bool. Vectorised form of ``_solve_tau_from_sorted_delta2``."""
    v = delta_sq.detach().double()[harmful].sort().values  # (n,) the harmful tokens' delta^2, ascending (one device sync)
    n = v.numel()
    if n == 0:  # no harmful token: no bound
        return v.new_full((), math.inf), torch.zeros((), dtype=torch.bool, device=v.device)
    csum = v.cumsum(0)  # (n,)
    applies = csum[-1] / n > budget + TINY
    k = torch.arange(n, device=v.device, dtype=torch.float64)  # (n,)
    reached = (v - TINY) * (n - k - 1) + csum >= budget * n - TINY  # (n,); true at k = n - 1 whenever the budget binds
    first = torch.where(reached, k, float(n)).min()  # the first breakpoint that reaches the budget
    below = v[(first - 1).clamp(0, n - 1).long()]  # v_{k-1}
    tau = torch.where(first > 0, (below - TINY).clamp(min=0.0).sqrt(), 0.0)
    return torch.where(applies, tau, math.inf), applies


def m2po_bounds(ratio: Tensor, adv: Tensor, spec: ObjectiveSpec) -> tuple[Tensor, Tensor]:
    """(low, high) 0-d ratio bounds of step 4 in ``ratio``'s dtype: [exp(-tau), exp(tau)] widened by the optional
    minimum ranges, or [0, 1e5] when the budget does not bind."""
    log_r = torch.log(ratio.detach())  # (B, T) the core's clamped log-ratio, 0 at padding
    tau, applies = m2po_tau(log_r * log_r, harmful_tokens(ratio.detach(), adv), spec.m2po_budget)
    low = torch.where(applies, torch.exp(-tau), 0.0)
    high = torch.where(applies, torch.exp(tau), NO_BOUND_HIGH)
    if spec.m2po_min_eps_low is not None:
        low = torch.minimum(low, torch.tensor(1.0 - spec.m2po_min_eps_low, dtype=low.dtype))
    if spec.m2po_min_eps_high is not None:
        high = torch.maximum(high, torch.tensor(1.0 + spec.m2po_min_eps_high, dtype=high.dtype))
    return low.to(ratio.dtype), high.to(ratio.dtype)


def m2po_weight(ratio: Tensor, adv: Tensor, spec: ObjectiveSpec, old_logp: Tensor | None) -> Tensor:
    """PPO's sign-aware clip (eq 47) at M2PO's batch bounds: min(r, high) for A >= 0, max(r, low) for A < 0 (B, T)."""
    low, high = m2po_bounds(ratio, adv, spec)
    inf = torch.full_like(low, math.inf)
    return torch.clamp(ratio, min=torch.where(adv >= 0, -inf, low), max=torch.where(adv >= 0, high, inf))


def m2po_flags(ratio: Tensor, adv: Tensor, spec: ObjectiveSpec, old_logp: Tensor | None) -> tuple[Tensor, Tensor]:
    """Where M2PO's bound zeroes the gradient: A < 0 and r < low (low), A > 0 and r > high (high)."""
    low, high = m2po_bounds(ratio, adv, spec)
    return (adv < 0) & (ratio < low), (adv > 0) & (ratio > high)


def m2po_coupling(spec: ObjectiveSpec) -> list[str]:
    """The clip component's batch coupling: M2PO's bound is a statistic of every harmful token of the batch."""
    if spec.clip == "m2po":
        return ["clip='m2po' chooses its clip range from the second moment of the log-ratio over the whole batch"]
    return []


# ----------------------------------------------------------------------------- M2PO's settings (clip component)

_M2PO = When("clip", ("m2po",))
M2PO_BUDGET = component_field(
    0.04,
    "clip",
    "number",
    "M2PO (arXiv 2510.01161): M2_budget=0.04 in the authors' train-scripts/m2po-qwen-math-7b-s*.sh "
    "(Infini-AI-Lab/M2PO, read by verl/workers/actor/dp_actor.py update_policy)",
    trust_region=True,
    bounds=POSITIVE,
    active_when=_M2PO,
    doc="M2PO: the largest second moment of the log-ratio over harmful tokens (A > 0 and r > 1, or A < 0 and r < 1); "
    "harmful tokens beyond the |log r| cap that meets it lose their gradient.",
)
M2PO_MIN_EPS_LOW = component_field(
    None,
    "clip",
    "optional_number",
    "None: M2PO's dp_actor reads miniclip_low with default None and the authors' scripts do not set it "
    "(compute_m2po_policy_loss's own default 0.3 is never used there)",
    trust_region=True,
    bounds=UNIT,
    active_when=_M2PO,
    doc="M2PO: the lower clip range is at least this (the code's miniclip_low); None: the budget's range alone.",
)
M2PO_MIN_EPS_HIGH = component_field(
    None,
    "clip",
    "optional_number",
    "None: M2PO's dp_actor reads miniclip_high with default None (compute_m2po_policy_loss's own default 0.5 unused)",
    trust_region=True,
    bounds=NONNEG,
    active_when=_M2PO,
    doc="M2PO: the upper clip range is at least this (the code's miniclip_high); None: the budget's range alone.",
)
