"""Rollout / trainer mismatch correction: a detached importance weight pi_old / pi_rollout on the policy term, and the
rejection of tokens or sequences whose mismatch is too large (the correction component; rejection in ``rejection``).

The sampler (vLLM, another precision, tempered sampling) is not exactly pi_old. Like TRL's
``vllm_importance_sampling_correction``, verl's ``rollout_corr`` (``rollout_is``), OpenRLHF's ``is_correction_type``
and ROLL's ``train_infer_correction``, the per-token policy loss is multiplied by a detached weight built from
rho_t = pi_old(y_t) / pi_rollout(y_t) at one of four levels (``rollout_correction`` = LEVEL_TREATMENT):

    token       rho_t                                           (TRL, verl rollout_is='token', OpenRLHF tis / icepop)
    sequence    prod_t rho_t, at every token of the completion  (verl rollout_is='sequence', ROLL 'sequence')
    geometric   exp(mean_t log rho_t), per completion           (ROLL 'geometric')
    segment     exp(mean log rho) over each run of consecutive real tokens (ROLL 'segment': a multi-turn completion's
                turns, separated by masked environment tokens; one run = the geometric level)

treated one of two ways:

    truncate    w = clamp(rho, rollout_floor, rollout_cap)       (truncated IS; OpenRLHF tis also floors at 0.5)
    mask        w = rho if rollout_low <= rho <= rollout_cap else 0   (IcePop, arXiv 2510.18855 / Ring-1T: OpenRLHF
                'icepop' is token_mask at [0.5, 5])

``rollout_is_batch_normalise`` divides the truncated weights by their batch mean (verl ``rollout_is_batch_normalize``:
over real tokens at token level, over non-empty completions otherwise). ``rollout_bypass`` is verl's bypass mode: the
trainer passes the sampler's log-probs as ``old_logp`` (two policies, no old-log-prob pass) and the weight is built
from rho_t = sg(pi_theta(y_t)) / pi_old(y_t) instead, so no ``rollout_logp`` is needed.

How it composes with the group transforms: DFPO's transforms act on pi / pi_old (the trust-region ratio),
the correction is a separate factor on top of the transformed surrogate, never inside the transform.
Shared-token cancellation needs every copy of the shared token to carry the same coefficient: a weight read off the
shared token alone (the token level) is the same in every copy and keeps whatever the uncorrected objective cancels;
a weight read off the whole completion (sequence, geometric, segment) differs across the group and breaks it
(``tests/core/test_correction.py``; docs/cancellation.md's correction table; ledger claim ``rollout-correction-cancel``).

Which sampler log-prob (the truncation bias, TRL issue 6789): under top-p / top-k / min-p the sampler draws from the
renormalised, truncated distribution, so its log-prob of a kept token is log pi(y) - log Z_kept; compared with the
untruncated pi_old, rho carries the factor Z_kept <= 1 at every token (and its product over a completion). The
correction corrects the mismatch of two computations of one distribution, so ``rollout_logp`` must be the sampler's
log-prob under the *untruncated* distribution (tempered as sampled, over the whole vocabulary). dfpo's HF engine returns
both (``dfpo.trainer.sampler.Samples.logprobs_untruncated``), the trainer passes the untruncated one and logs the
truncation's own bias, the mean log kept mass, as ``rollout/log_kept_mass``; vLLM returns one logprobs_mode (the
processed, truncated one), so the trainer refuses a correction or rejection under vLLM with top-k / top-p.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

import torch
from torch import Tensor

from ..settings import Bounds
from .fields import UNIT, Component, When, component_field
from .ratios import LOG_RATIO_BOUND, level_log_ratio
from .rejection import rejection_coupling, rejection_filter

if TYPE_CHECKING:  # spec imports this module
    from .spec import ObjectiveSpec

LEVELS = ("token", "sequence", "geometric", "segment")
TREATMENTS = ("truncate", "mask")
CORRECTIONS = ("none", *(f"{level}_{treatment}" for level in LEVELS for treatment in TREATMENTS))
"""Every ``rollout_correction``: none, or LEVEL_TREATMENT."""


def correction_level(mode: str) -> tuple[str, str]:
    """(level, treatment) of a correction mode, e.g. ``sequence_mask`` -> (``sequence``, ``mask``)."""
    level, _, treatment = mode.rpartition("_")
    return level, treatment


def token_log_rho(spec: ObjectiveSpec, ctx) -> Tensor:
    """log rho_t (B, T), detached, padding 0: log pi_old - log pi_rollout, or in bypass mode sg(log pi_theta) - log pi_old."""
    x = ctx.x
    ref = x.logp.detach() if spec.rollout_bypass else x.old_logp
    base = x.old_logp if spec.rollout_bypass else ctx.rollout_logp
    return torch.where(x.mask, (ref - base).detach(), 0.0).clamp(-LOG_RATIO_BOUND, LOG_RATIO_BOUND)  # (B, T)


def rollout_weights(log_rho: Tensor, mask: Tensor, spec: ObjectiveSpec) -> Tensor:
    """The detached correction weight (B, T) of ``spec.rollout_correction`` (1 on padding and for ``none``)."""
    mode = spec.rollout_correction
    if mode == "none":
        return torch.ones_like(log_rho)
    level, treatment = correction_level(mode)
    rho = torch.exp(level_log_ratio(log_rho, mask, level).clamp(-LOG_RATIO_BOUND, LOG_RATIO_BOUND))  # (B, T)
    if treatment == "truncate":
        weight = rho.clamp(min=spec.rollout_floor, max=spec.rollout_cap)
    else:
        weight = torch.where((rho >= spec.rollout_low) & (rho <= spec.rollout_cap), rho, 0.0)
    if spec.rollout_is_batch_normalise:
        weight = weight / batch_mean(weight, mask, level).clamp(min=1e-8)
    return torch.where(mask, weight, 1.0)


def batch_mean(weight: Tensor, mask: Tensor, level: str) -> Tensor:
    """The batch mean of the weights (0-d; 1 for a batch with no real token): over real tokens at token (and segment)
    level, over non-empty completions' weights at sequence and geometric level (verl's rollout_is_batch_normalize)."""
    if level in ("token", "segment"):
        n = mask.sum()
        mean = torch.where(mask, weight, 0.0).sum() / n.clamp(min=1)
    else:
        rows = mask.any(-1)  # (B,)
        first = torch.where(mask, weight, 0.0).sum(-1) / mask.sum(-1).clamp(min=1)  # (B,) the row's one weight
        n = rows.sum()
        mean = torch.where(rows, first, 0.0).sum() / n.clamp(min=1)
    return torch.where(n > 0, mean, torch.ones_like(mean))


def correction_metrics(log_rho: Tensor, mask: Tensor, weight: Tensor, cap: float) -> dict[str, Tensor]:
    """The weights' mean, the share of real tokens zeroed (mask modes) or whose token ratio exceeds the cap, and the
    sequence-level ratio prod_t rho_t's min / mean / max over non-empty completions."""
    n = mask.sum().clamp(min=1)
    rho = torch.exp(log_rho)  # (B, T)
    seq = torch.exp(log_rho.sum(-1).clamp(-LOG_RATIO_BOUND, LOG_RATIO_BOUND))[mask.any(-1)]  # (B',)
    out = {
        "rollout/weight_mean": torch.where(mask, weight, 0.0).sum() / n,
        "rollout/weight_zero_frac": ((mask & (weight == 0)).sum() / n).to(weight.dtype),
        "rollout/token_truncated_frac": ((mask & (rho > cap)).sum() / n).to(weight.dtype),
    }
    if seq.numel():
        out.update({"rollout/seq_ratio_min": seq.min(), "rollout/seq_ratio_mean": seq.mean(), "rollout/seq_ratio_max": seq.max()})
    return out


def correction_step(spec: ObjectiveSpec, ctx, per_token: Tensor) -> tuple[Tensor, dict[str, Tensor]]:
    """The policy term times the detached correction weight, and the correction's metrics (nothing for ``none``)."""
    if spec.rollout_correction == "none":
        return per_token, {}
    log_rho = token_log_rho(spec, ctx)  # (B, T)
    weight = rollout_weights(log_rho, ctx.x.mask, spec)  # (B, T)
    return per_token * weight, correction_metrics(log_rho, ctx.x.mask, weight, spec.rollout_cap)


def correction_filter(spec: ObjectiveSpec, ctx) -> tuple[Tensor | None, bool, dict[str, Tensor]]:
    """The tokens the rejection drops (``rejection``), read off the same rho_t as the weight."""
    if spec.rollout_rejection == "none":
        return None, False, {}
    return rejection_filter(spec, token_log_rho(spec, ctx), ctx.x.mask)


# ----------------------------------------------------------------------------- the correction component's settings

_CORRECTED = When("rollout_correction", ("none",), negate=True)
ROLLOUT_CORRECTION = component_field(
    "none",
    "correction",
    "choice",
    "none, as verl's rollout_is (null by default); TRL 1.16 turns vllm_importance_sampling_correction on under vLLM as "
    "sequence_mask with clip_max 3.0 and no clip_min",
    trust_region=True,
    choices=CORRECTIONS,
    doc="Detached pi_old / pi_rollout weight on the policy term (needs ``rollout_logp`` unless ``rollout_bypass``): "
    "LEVEL_TREATMENT with level token / sequence / geometric / segment and treatment truncate / mask (token_mask is IcePop); "
    "see ``dfpo.core.loss.correction``.",
)
ROLLOUT_LOW = component_field(
    0.5,
    "correction",
    "number",
    "verl rollout_is mask lower bound 0.5 (TRL 1.16 vllm_importance_sampling_clip_min: None, no lower bound; OpenRLHF "
    "is_correction_threshold [0.5, 5.0])",
    trust_region=True,
    bounds=UNIT,
    active_when=When("rollout_correction", tuple(m for m in CORRECTIONS if m.endswith("_mask"))),
    doc="Lower bound of the mask modes' kept interval [low, cap].",
)
ROLLOUT_CAP = component_field(
    2.0,
    "correction",
    "number",
    "verl rollout_is_threshold 2.0 (TRL 1.16 vllm_importance_sampling_clip_max 3.0)",
    trust_region=True,
    bounds=Bounds(1.0, math.inf),
    active_when=_CORRECTED,
    doc="Truncation cap of the truncate modes, upper bound of the mask modes.",
)
ROLLOUT_FLOOR = component_field(
    0.0,
    "correction",
    "number",
    "0: no lower clamp (TRL, verl); OpenRLHF's 'tis' clamps at its lower threshold 0.5, ROLL's at 0",
    trust_region=True,
    bounds=UNIT,
    active_when=When("rollout_correction", tuple(m for m in CORRECTIONS if m.endswith("_truncate"))),
    doc="Lower clamp of the truncate modes' weight (OpenRLHF 'tis': 0.5).",
)
ROLLOUT_IS_BATCH_NORMALISE = component_field(
    False,
    "correction",
    "bool",
    "False, as verl's rollout_is_batch_normalize",
    trust_region=True,
    active_when=_CORRECTED,
    doc="Divide the correction weights by their batch mean (verl rollout_is_batch_normalize): over real tokens at token and "
    "segment level, over non-empty completions at sequence and geometric level.",
)
ROLLOUT_BYPASS = component_field(
    False,
    "correction",
    "bool",
    "False: decoupled, three policies (verl bypass_mode=false)",
    trust_region=True,
    doc="verl's bypass mode: ``old_logp`` is the sampler's log-prob (two policies, no old-log-prob pass) and the correction "
    "and rejection read rho_t = sg(pi_theta) / pi_old, with no ``rollout_logp``.",
)


def _correction_inputs(spec: ObjectiveSpec) -> dict[str, str]:
    if spec.rollout_bypass:
        return {}
    for name in ("rollout_correction", "rollout_rejection"):
        if getattr(spec, name) != "none":
            return {"rollout_logp": f"{name}={getattr(spec, name)!r}"}
    return {}


def _correction_coupling(spec: ObjectiveSpec) -> list[str]:
    reasons = []
    if spec.rollout_correction != "none" and spec.rollout_is_batch_normalise:
        reasons.append("rollout_is_batch_normalise=True divides the correction weights by their mean over the whole batch")
    return reasons + rejection_coupling(spec)


CORRECTION_COMPONENT = Component(
    "correction",
    required_inputs=_correction_inputs,
    batch_coupling=_correction_coupling,
    token_filter=correction_filter,
    token_step=correction_step,
)
