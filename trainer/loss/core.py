"""``policy_loss``: every objective as one composition of the components in this package.

    ratio level -> clipped weight (eq 47/79) -> [DFPO group transform (eqs 18, 50-55)]
    -> stop-gradient form -> per-token surrogate -> token mask -> KL -> aggregation

Pure torch: tensors in, ``(loss, metrics)`` out; no I/O, no global state, no ``.item()``
on the hot path (group bookkeeping aside). Padding may hold anything, NaN and inf included:
every read of a padded tensor goes through ``torch.where`` on the mask.

Where this departs from the paper / peers:
1. Rows with no real token are ignored by the sequence means (TRL divides by B).
2. DFPO's default stop-gradient form is ``ratio`` (eqs 59-62): sg(stilde/sbar) * sbar(theta), so a
   sequence GSPO clips gets no gradient, as the paper intends (App. B, K.3, K.5). The override
   ``stopgrad="score"`` (eq 68, 85, derived on the unclipped segment) gives clipped sequences a
   gradient scaled by stilde: no trust region on clipped sequences; ``gspo_noclip`` is its control.
3. ``weights/asym`` (eq 23) needs a per-sequence weight w_i for every objective: the
   post-transform weight stilde_i at sequence level, the token mean of the post-clip token
   weights at token level; Var is the population variance within a group, averaged over groups.
"""

from __future__ import annotations

import torch
from torch import Tensor

from dfpo.trainer.loss.aggregation import aggregate
from dfpo.trainer.loss.clipping import clip_fractions, clipped_weight
from dfpo.trainer.loss.groups import Groups, group_sum
from dfpo.trainer.loss.masks import low_entropy_mask, stapo_spurious_mask
from dfpo.trainer.loss.objectives import ObjectiveSpec, resolve_objective
from dfpo.trainer.loss.ratios import LOG_RATIO_BOUND, clamped_share, sequence_log_ratio, sequence_token_ratio, token_log_ratio
from dfpo.trainer.loss.transforms import group_transform


LOGP_FLOOR = 1e4
"""Log-probs below -LOGP_FLOOR at a real token are refused: float64's smallest positive number is
e^-745, so no softmax produces them, and objectives that use log pi directly (CISPO) would overflow."""


def _check_inputs(
    logp: Tensor,
    old_logp: Tensor,
    advantages: Tensor,
    mask: Tensor,
    group_ids: Tensor,
    entropy: Tensor | None,
    ref_logp: Tensor | None,
) -> Tensor:
    """Validate shapes and finiteness; return the mask as bool. Raises ValueError naming the argument."""
    if logp.ndim != 2:
        raise ValueError(f"logp must have shape (B, T), got logp.shape={tuple(logp.shape)}")
    if not logp.is_floating_point():
        raise ValueError(f"logp must be a floating tensor, got dtype={logp.dtype}")
    B, T = logp.shape
    for name, x in (("old_logp", old_logp), ("mask", mask), ("entropy", entropy), ("ref_logp", ref_logp)):
        if x is not None and tuple(x.shape) != (B, T):
            raise ValueError(f"{name} must have shape (B, T) = {(B, T)} like logp, got {name}.shape={tuple(x.shape)}")
    for name, x in (("advantages", advantages), ("group_ids", group_ids)):
        if tuple(x.shape) != (B,):
            raise ValueError(f"{name} must have shape (B,) = {(B,)}, got {name}.shape={tuple(x.shape)}")
    if group_ids.is_floating_point() or group_ids.is_complex():
        raise ValueError(f"group_ids must be an integer tensor, got dtype={group_ids.dtype}")
    if mask.dtype != torch.bool:
        if not bool(((mask == 0) | (mask == 1)).all()):
            raise ValueError("mask must be bool or hold only 0 and 1")
        mask = mask.bool()
    for name, x in (("logp", logp), ("old_logp", old_logp), ("entropy", entropy), ("ref_logp", ref_logp)):
        if x is None or bool(torch.isfinite(x.detach()).all()):  # the common case: one pass, no mask
            continue
        if not bool((torch.isfinite(x.detach()) | ~mask).all()):  # non-finite values outside padding
            bad = torch.nonzero(mask & ~torch.isfinite(x.detach()))[:3].tolist()
            raise ValueError(f"{name} holds non-finite values at real (unmasked) positions {bad}")
    if bool((mask & (logp.detach() < -LOGP_FLOOR)).any()):  # no softmax gives these; CISPO would overflow A * logp
        raise ValueError(f"logp must be >= -{LOGP_FLOOR:g} at real tokens (a log-probability), got min logp={float(torch.where(mask, logp.detach(), 0).min()):.3g}")
    if not bool(torch.isfinite(advantages.detach()).all()):
        bad = torch.nonzero(~torch.isfinite(advantages.detach())).flatten()[:5].tolist()
        raise ValueError(f"advantages must be finite; non-finite at indices {bad}")
    return mask


def _sanitise(x: Tensor | None, mask: Tensor) -> Tensor | None:
    """Zero the padded positions with ``torch.where`` so NaN/inf padding never propagates."""
    return None if x is None else torch.where(mask, x, 0.0)


def _sequence_weights(
    spec: ObjectiveSpec, logp: Tensor, old_logp: Tensor, adv: Tensor, mask: Tensor, groups: Groups, lengths: Tensor
):
    """Sequence level: per-token surrogate (B, T), ratio s (B,), post-transform weight (B,)."""
    seq_ratio = torch.exp(sequence_log_ratio(logp, old_logp, mask, lengths))  # (B,) eq 44
    sbar = clipped_weight(spec.clip, seq_ratio, adv, spec.eps_low, spec.eps_high)  # (B,) eq 47
    if spec.transform == "none":
        surrogate = adv * sbar  # (B,) eq 49
        return surrogate[:, None].expand_as(logp), seq_ratio, sbar.detach()
    empty = lengths == 0
    if bool(empty.any()):  # empty rows take no part in a group transform: each is a group of its own
        solo = groups.n + torch.arange(lengths.numel(), device=lengths.device)
        groups = Groups(torch.where(empty, solo, groups.index), groups.n + lengths.numel())
    transform_lengths = lengths if spec.length_aware else None
    if spec.stopgrad == "none":  # Table 3 ablation: the transform stays in the graph
        stilde = group_transform(spec.transform, sbar, adv, groups, transform_lengths, spec.tr_floor)
        return (adv * stilde)[:, None].expand_as(logp), seq_ratio, stilde.detach()
    with torch.no_grad():
        stilde = group_transform(spec.transform, sbar.detach(), adv, groups, transform_lengths, spec.tr_floor)
    if spec.stopgrad == "ratio":  # eq 59-62: sg(stilde / sbar) * sbar(theta), zero gradient where clipped
        positive = sbar.detach() > 0
        factor = torch.where(positive, stilde / torch.where(positive, sbar.detach(), 1.0), 0.0)
        return (adv * factor * sbar)[:, None].expand_as(logp), seq_ratio, stilde
    # score form, eq 68: value stilde * A, gradient stilde * A * grad log pi(y_it) at every token
    score = torch.exp(logp - logp.detach())  # (B, T), value 1
    return (adv * stilde)[:, None] * score, seq_ratio, stilde


def _token_weights(spec: ObjectiveSpec, logp: Tensor, old_logp: Tensor, adv: Tensor, mask: Tensor):
    """Token / sequence_token level: per-token surrogate (B, T), ratio (B, T), post-clip weight (B, T)."""
    if spec.ratio_level == "sequence_token":
        seq_ratio = torch.exp(sequence_log_ratio(logp, old_logp, mask, mask.sum(-1)))  # (B,)
        ratio = sequence_token_ratio(logp, seq_ratio)  # (B, T)
    else:
        ratio = torch.exp(token_log_ratio(logp, old_logp, mask))  # (B, T) eq 7
    if spec.clip == "cispo":  # MiniMax-M1 / TRL: -sg(min(r, eps_high)) * A * log pi
        weight = ratio.clamp(max=spec.eps_high).detach()
        return weight * adv[:, None] * logp, ratio, weight
    weight = clipped_weight(spec.clip, ratio, adv[:, None], spec.eps_low, spec.eps_high)  # (B, T)
    return adv[:, None] * weight, ratio, weight


def _token_mask(spec: ObjectiveSpec, logp: Tensor, entropy: Tensor | None, adv: Tensor, mask: Tensor) -> Tensor:
    """Tokens dropped from the policy gradient (B, T) bool."""
    if spec.token_mask == "none":
        return torch.zeros_like(mask)
    if entropy is None:
        raise ValueError(f"entropy is required for token_mask={spec.token_mask!r}, got entropy=None")
    if spec.token_mask == "stapo":
        return stapo_spurious_mask(logp, entropy, adv, mask, tau_p=spec.stapo_tau_p, q=spec.stapo_q)
    return low_entropy_mask(entropy, mask, keep_frac=spec.top_entropy_frac)


def _share(flags: Tensor, within: Tensor, dtype: torch.dtype) -> Tensor:
    """Share of the True entries of ``within`` where ``flags`` is True too (bool ops, no float pass)."""
    return ((flags & within).sum() / within.sum().clamp(min=1)).to(dtype)


def asymmetry(weights: Tensor, adv: Tensor, group_ids: Tensor | Groups, valid: Tensor) -> Tensor:
    """Eq (23), Asym = Var_i(w_i A_i) within each group, averaged over groups (population variance).

    weights, adv, group_ids, valid: (B,). Rows with valid = False are left out. Computed in float64
    and saturated at the input dtype's largest finite value, so huge advantages or ratios cannot
    make the metric overflow to inf.
    """
    groups = Groups.of(group_ids)
    index, n_groups = groups.index, groups.n
    out_dtype = weights.dtype
    coef = torch.where(valid, weights.double() * adv.double(), 0.0)  # (B,) float64
    count = group_sum(valid.to(coef.dtype), index, n_groups)  # (n,)
    mean = group_sum(coef, index, n_groups) / count.clamp(min=1)
    var = group_sum(torch.where(valid, (coef - mean[index]) ** 2, 0.0), index, n_groups) / count.clamp(min=1)
    has = count > 0
    asym = torch.where(has, var, 0.0).sum() / has.sum().clamp(min=1)
    return asym.clamp(max=torch.finfo(out_dtype).max).to(out_dtype)


def policy_loss(
    objective: str | ObjectiveSpec,
    *,
    logp: Tensor,
    old_logp: Tensor,
    advantages: Tensor,
    mask: Tensor,
    group_ids: Tensor,
    entropy: Tensor | None = None,
    ref_logp: Tensor | None = None,
    **overrides: object,
) -> tuple[Tensor, dict[str, Tensor]]:
    """The loss (to minimise) of one objective on a batch of completions, and its metrics.

    Shapes: logp, old_logp, mask, entropy, ref_logp (B, T); advantages, group_ids (B,).
    ``objective`` names a preset of ``OBJECTIVES`` (or is an ObjectiveSpec); ``overrides``
    change its components one by one (see ``ObjectiveSpec``).
    """
    spec = resolve_objective(objective, **overrides)
    mask = _check_inputs(logp, old_logp, advantages, mask, group_ids, entropy, ref_logp)
    if spec.beta > 0 and ref_logp is None:
        raise ValueError(f"ref_logp is required when beta > 0, got beta={spec.beta} and ref_logp=None")
    logp = _sanitise(logp, mask)  # (B, T)
    old_logp = _sanitise(old_logp, mask).detach()  # (B, T)
    adv = advantages.detach().to(logp.dtype)  # (B,)
    lengths = mask.sum(-1)  # (B,)
    n_real = lengths.sum().clamp(min=1).to(logp.dtype)
    valid_rows = lengths > 0  # (B,)
    groups = Groups.of(group_ids)

    if spec.ratio_level == "sequence":
        surrogate, seq_ratio, seq_weight = _sequence_weights(spec, logp, old_logp, adv, mask, groups, lengths)
        seq_ratio = seq_ratio.detach()  # (B,)
        # Clip fractions count sequences (as TRL logs GSPO): one flag per non-empty row.
        low, high = clip_fractions(spec.clip, seq_ratio, adv, spec.eps_low, spec.eps_high)  # (B,)
        clip_low, clip_high = _share(low, valid_rows, logp.dtype), _share(high, valid_rows, logp.dtype)
        ratio_mean = (lengths * seq_ratio).sum() / n_real  # token-weighted, as for token ratios
        ratio_max = torch.where(valid_rows, seq_ratio, float("-inf")).amax() if bool(valid_rows.any()) else seq_ratio.new_ones(())
    else:
        surrogate, ratio, token_weight = _token_weights(spec, logp, old_logp, adv, mask)
        ratio = ratio.detach()  # (B, T)
        low, high = clip_fractions(spec.clip, ratio, adv[:, None], spec.eps_low, spec.eps_high)  # (B, T)
        seq_weight = torch.where(mask, token_weight.detach(), 0.0).sum(-1) / lengths.clamp(min=1)  # (B,) row means
        ratio_mean = torch.where(mask, ratio, 0.0).sum() / n_real
        ratio_max = torch.where(mask, ratio, float("-inf")).amax() if bool(valid_rows.any()) else ratio.new_ones(())

    if spec.token_mask == "none":
        kept, agg_mask, agg_lengths = mask, mask, lengths
        per_token = -surrogate  # (B, T); aggregate reads it only where mask holds
        mask_frac = torch.zeros((), dtype=logp.dtype)
    else:
        dropped = _token_mask(spec, logp, _sanitise(entropy, mask), adv, mask) & mask  # (B, T); only masks read entropy
        kept = mask & ~dropped
        agg_mask, agg_lengths = (kept, None) if spec.mask_renormalise else (mask, lengths)
        per_token = -torch.where(kept, surrogate, 0.0)  # (B, T)
        mask_frac = (dropped.sum() / n_real).to(logp.dtype)
    if spec.ratio_level != "sequence":  # token level: share of kept tokens where clipping bites
        clip_low, clip_high = _share(low, kept, logp.dtype), _share(high, kept, logp.dtype)
    policy = aggregate(per_token, agg_mask, spec.aggregation, spec.max_completion_length, agg_lengths)
    loss = policy
    metrics: dict[str, Tensor] = {}
    if spec.beta > 0:
        ref = _sanitise(ref_logp, mask).detach()
        ref_gap = (ref - logp).clamp(-LOG_RATIO_BOUND, LOG_RATIO_BOUND)  # (B, T), bounded like the ratios
        k3 = torch.exp(ref_gap) - ref_gap - 1  # (B, T) k3 estimator
        loss = policy + spec.beta * aggregate(k3, agg_mask, spec.aggregation, spec.max_completion_length, agg_lengths)
        metrics["kl/ref"] = torch.where(mask, k3.detach(), 0.0).sum() / n_real

    metrics.update(
        {
            "loss/policy": policy.detach(),
            "clip/frac_low": clip_low,
            "clip/frac_high": clip_high,
            "ratio/mean": ratio_mean,
            "ratio/max": ratio_max,
            "weights/asym": asymmetry(seq_weight, adv, groups, valid_rows),
            "mask/frac": mask_frac,
            "ratio/clamped_frac": clamped_share(logp, old_logp, mask),
        }
    )
    return loss, metrics

