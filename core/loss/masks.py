"""Token masks that drop tokens from the policy gradient (STAPO; top-entropy "80/20"; off-policy sequence masking)."""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch
from torch import Tensor

from .fields import NONNEG, UNIT, UNIT_OPEN, Component, When, component_field

if TYPE_CHECKING:  # spec imports this module
    from .spec import ObjectiveSpec


def stapo_spurious_mask(logp: Tensor, entropy: Tensor, adv: Tensor, mask: Tensor, *, tau_p: float, q: float) -> Tensor:
    """STAPO (arXiv 2602.15620): spurious tokens, True where a token is dropped (B, T); ``adv`` (B,) one
    per completion or (B, T) one per token.

    A real token is spurious when all three hold: A_i > 0; pi(y_it) < tau_p; its entropy is
    below the q-quantile of the entropies of the tokens satisfying the first two conditions
    in this batch.
    """
    prob = torch.exp(logp.detach())  # (B, T)
    positive = adv > 0 if adv.ndim == 2 else (adv > 0)[:, None]  # (B, T) or (B, 1)
    candidate = mask & positive & (prob < tau_p)  # (B, T)
    if not bool(candidate.any()):
        return candidate
    threshold = torch.quantile(entropy.detach()[candidate].to(torch.float64), q).to(entropy.dtype)
    return candidate & (entropy.detach() < threshold)


def low_entropy_mask(entropy: Tensor, mask: Tensor, *, keep_frac: float) -> Tensor:
    """Top-entropy training (Wang et al. 2025, TRL ``top_entropy_quantile``): True where dropped (B, T).

    Keeps the real tokens whose entropy is at or above the (1 - keep_frac)-quantile of the
    real tokens' entropies in this batch; keep_frac = 1 keeps every token.
    """
    if keep_frac >= 1.0 or not bool(mask.any()):
        return torch.zeros_like(mask)
    threshold = torch.quantile(entropy.detach()[mask].to(torch.float64), 1.0 - keep_frac).to(entropy.dtype)
    return mask & (entropy.detach() < threshold)


def off_policy_sequence_mask(logp: Tensor, old_logp: Tensor, adv: Tensor, mask: Tensor, *, delta: float) -> Tensor:
    """Off-policy sequence masking (DeepSeek-V3.2 eq 9; TRL off_policy_mask_threshold): True where dropped (B, T).

    A sequence is dropped when A_i < 0 and its mean token log(pi_old / pi_theta) exceeds ``delta``:
    a negative sample the policy has already moved far from.
    """
    gap = torch.where(mask, old_logp - logp.detach(), 0.0)  # (B, T)
    seq_kl = gap.sum(-1) / mask.sum(-1).clamp(min=1)  # (B,)
    drop = (adv < 0) & (seq_kl > delta)  # (B,)
    return drop[:, None] & mask


def _no_tokens_dropped(spec: ObjectiveSpec, logp: Tensor, old_logp: Tensor, entropy: Tensor | None, adv: Tensor, mask: Tensor) -> Tensor:
    return torch.zeros_like(mask)


TOKEN_MASK_FUNCTIONS = {
    "none": _no_tokens_dropped,
    "stapo": lambda spec, logp, old_logp, entropy, adv, mask: stapo_spurious_mask(
        logp, entropy, adv, mask, tau_p=spec.stapo_tau_p, q=spec.stapo_q
    ),
    "top_entropy": lambda spec, logp, old_logp, entropy, adv, mask: low_entropy_mask(entropy, mask, keep_frac=spec.top_entropy_frac),
    "opsm": lambda spec, logp, old_logp, entropy, adv, mask: off_policy_sequence_mask(logp, old_logp, adv, mask, delta=spec.opsm_delta),
}
"""Every token mask, keyed by the ``token_mask`` component: (spec, logp, old_logp, entropy, adv, mask) -> dropped (B, T) bool."""
TOKEN_MASKS = tuple(TOKEN_MASK_FUNCTIONS)
ENTROPY_MASKS = ("stapo", "top_entropy")
"""The token masks that read the policy's entropy."""


def dropped_tokens(spec: ObjectiveSpec, logp: Tensor, old_logp: Tensor, entropy: Tensor | None, adv: Tensor, mask: Tensor) -> Tensor:
    """Real tokens the spec's token mask drops from the policy gradient (B, T) bool."""
    if spec.token_mask in ENTROPY_MASKS and entropy is None:
        raise ValueError(f"entropy is required for token_mask={spec.token_mask!r}, got entropy=None")
    return TOKEN_MASK_FUNCTIONS[spec.token_mask](spec, logp, old_logp, entropy, adv, mask) & mask


# ----------------------------------------------------------------------------- the token mask component's settings

TOKEN_MASK = component_field(
    "none",
    "token_mask",
    "choice",
    "none: every real token gets a gradient",
    trust_region=True,
    choices=TOKEN_MASK_FUNCTIONS,
    doc="Tokens dropped from the gradient: ``none``, ``stapo`` (spurious tokens), ``top_entropy``, ``opsm``.",
)
MASK_RENORMALISE = component_field(
    True,
    "token_mask",
    "bool",
    "STAPO: the loss is divided by the number of kept tokens",
    trust_region=True,
    active_when=When("token_mask", ("none",), negate=True),
    doc="Aggregate over kept tokens only (STAPO) rather than over all real tokens (TRL top-entropy).",
)
STAPO_TAU_P = component_field(
    0.002,
    "token_mask",
    "number",
    "STAPO (arXiv 2602.15620) latest version: tau_p = 0.002",
    trust_region=True,
    bounds=UNIT_OPEN,
    active_when=When("token_mask", ("stapo",)),
    doc="STAPO probability threshold tau_p.",
)
STAPO_Q = component_field(
    0.75,
    "token_mask",
    "number",
    "STAPO (arXiv 2602.15620) latest version: q = 0.75",
    trust_region=True,
    bounds=UNIT,
    active_when=When("token_mask", ("stapo",)),
    doc="STAPO entropy quantile q.",
)
TOP_ENTROPY_FRAC = component_field(
    0.2,
    "token_mask",
    "number",
    "Wang et al. 2025 ('80/20'): keep the top 20% highest-entropy tokens",
    trust_region=True,
    bounds=UNIT_OPEN,
    active_when=When("token_mask", ("top_entropy",)),
    doc='Fraction of highest-entropy tokens kept by ``token_mask="top_entropy"``.',
)
OPSM_DELTA = component_field(
    0.5,
    "token_mask",
    "number",
    "DeepSeek-V3.2 (arXiv 2512.02556) eq 9 names delta without a value; TRL's docs suggest 0.5",
    trust_region=True,
    bounds=NONNEG,
    active_when=When("token_mask", ("opsm",)),
    doc="Off-policy sequence mask: a sequence with A < 0 whose mean log(pi_old / pi) exceeds delta is dropped.",
)


def _mask_inputs(spec: ObjectiveSpec) -> dict[str, str]:
    return {"entropy": f"token_mask={spec.token_mask!r}"} if spec.token_mask in ENTROPY_MASKS else {}


def _mask_coupling(spec: ObjectiveSpec) -> list[str]:
    reasons = []
    if spec.token_mask in ("stapo", "top_entropy"):
        reasons.append(f"token_mask={spec.token_mask!r} thresholds at a quantile over the whole batch")
    if spec.token_mask != "none" and spec.mask_renormalise and spec.aggregation != "constant":
        reasons.append("mask_renormalise=True divides by kept tokens, not by the real tokens micro-batches are weighted by")
    return reasons


def token_mask_filter(spec: ObjectiveSpec, ctx) -> tuple[Tensor, bool, dict[str, Tensor]]:
    """The token mask's dropped tokens, whether they leave the count (``mask_renormalise``) and ``mask/frac``."""
    x = ctx.x
    adv = x.adv if spec.token_mask == "opsm" else x.token_adv  # OPSM: a completion's sign; the others: a token's
    dropped = dropped_tokens(spec, x.logp, x.old_logp, ctx.entropy, adv, x.mask)  # (B, T)
    n_real = x.lengths.sum().clamp(min=1).to(x.logp.dtype)
    renormalise = spec.mask_renormalise and spec.token_mask != "none"
    return dropped, renormalise, {"mask/frac": (dropped.sum() / n_real).to(x.logp.dtype)}


def _opsm_advantage(spec: ObjectiveSpec) -> str | None:
    if spec.token_mask == "opsm":
        return "token_mask='opsm' drops a whole completion by the sign of its advantage"
    return None


TOKEN_MASK_COMPONENT = Component(
    "token_mask",
    required_inputs=_mask_inputs,
    batch_coupling=_mask_coupling,
    token_filter=token_mask_filter,
    completion_advantage=_opsm_advantage,
)
