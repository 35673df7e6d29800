"""``policy_loss``: every objective as one composition of the components in this package.

    ratio shape (``RATIO_SHAPES``: ratio, clip rule eq 47/79, [DFPO group transform eqs 18,
    50-55 through a stop-gradient form]) -> PolicyTerms -> token mask -> each component's
    ``token_step`` (covariance control, rollout correction) -> aggregation -> each component's
    ``loss_term`` (KL to the reference, entropy bonus), and every metric computed once from the
    PolicyTerms, whatever the ratio level. No component is named here: each one's settings and
    step live in its own module (``objectives.COMPONENTS``).

Pure torch: tensors in, ``(loss, metrics)`` out; no I/O, no global state, no ``.item()``
on the hot path (group bookkeeping aside). Padding may hold anything, NaN and inf included:
every read of a padded tensor goes through ``torch.where`` on the mask.

Where this departs from the paper / peers:
1. Rows with no real token are ignored by the sequence means (TRL's grpo, sapo and luspo divide by B,
   empty rows included; ``tests/core/test_trl_crosscheck.py`` pins the factor B / non-empty rows).
2. DFPO's default stop-gradient form is ``ratio`` (eqs 59-62): sg(stilde/sbar) * sbar(theta), so a
   sequence GSPO clips gets no gradient, as the paper intends (App. B, K.3, K.5). The override
   ``stopgrad="score"`` (eq 68, 85, derived on the unclipped segment) gives clipped sequences a
   gradient scaled by stilde: no trust region on clipped sequences; ``gspo_noclip`` is its control.
3. ``weights/asym`` (eq 23) needs a per-sequence weight w_i for every objective: the
   post-transform weight stilde_i at sequence level, the token mean of the post-clip token
   weights at token level; Var is the population variance within a group, averaged over groups.
4. Half-precision inputs (float16, bfloat16) are computed in float32, as TRL and verl upcast log-probs:
   the loss and metrics come back in float32 and the gradient flows back to the half-precision ``logp``
   (and ``entropy``) through autograd, rounded to its dtype. A gradient float16 cannot hold (|g| > 65504,
   e.g. A = 1 on a ratio clamped at e^20 under a loss without a trust region) raises a ValueError in
   backward instead of becoming inf.
"""

from __future__ import annotations

import dataclasses

import torch
from torch import Tensor

from .aggregation import aggregate
from .batch import LossBatch, LossContext, PolicyTerms, TokenEvents
from .groups import Groups, group_amax, group_amin, group_sum
from .objectives import resolve_objective
from .ratios import clamped_share
from .shapes import RATIO_SHAPES
from .spec import COMPONENTS, ObjectiveSpec

LOGP_FLOOR = 1e4
"""Log-probs below -LOGP_FLOOR at a real token are refused: float64's smallest positive number is
e^-745, so no softmax produces them, and objectives that use log pi directly (CISPO) would overflow."""
ADVANTAGE_BOUND = 1e20
"""Advantages larger than this in magnitude are refused. A token's term is at most |A| times a weight of at most
e^LOG_RATIO_BOUND (about 4.9e8; CISPO's |log pi| * eps_high is smaller), so below the bound a float32 loss can only
overflow past about 7e9 real tokens in one batch; above it a few tokens already do (3e38 gave inf or NaN)."""


def _check_inputs(
    logp: Tensor,
    old_logp: Tensor,
    advantages: Tensor,
    mask: Tensor,
    group_ids: Tensor,
    entropy: Tensor | None,
    ref_logp: Tensor | None,
    rollout_logp: Tensor | None = None,
) -> Tensor:
    """Validate shapes and finiteness; return the mask as bool. Raises ValueError naming the argument."""
    if logp.ndim != 2:
        raise ValueError(f"logp must have shape (B, T), got logp.shape={tuple(logp.shape)}")
    if not logp.is_floating_point():
        raise ValueError(f"logp must be a floating tensor, got dtype={logp.dtype}")
    B, T = logp.shape
    for name, x in (("old_logp", old_logp), ("mask", mask), ("entropy", entropy), ("ref_logp", ref_logp), ("rollout_logp", rollout_logp)):
        if x is not None and tuple(x.shape) != (B, T):
            raise ValueError(f"{name} must have shape (B, T) = {(B, T)} like logp, got {name}.shape={tuple(x.shape)}")
    if tuple(advantages.shape) not in ((B,), (B, T)):
        raise ValueError(
            f"advantages must have shape (B,) = {(B,)}, one per completion, or (B, T) = {(B, T)}, one per token, "
            f"got advantages.shape={tuple(advantages.shape)}"
        )
    if tuple(group_ids.shape) != (B,):
        raise ValueError(f"group_ids must have shape (B,) = {(B,)}, got group_ids.shape={tuple(group_ids.shape)}")
    if group_ids.is_floating_point() or group_ids.is_complex():
        raise ValueError(f"group_ids must be an integer tensor, got dtype={group_ids.dtype}")
    if mask.dtype != torch.bool:
        if not bool(((mask == 0) | (mask == 1)).all()):
            raise ValueError("mask must be bool or hold only 0 and 1")
        mask = mask.bool()
    for name, x in (("logp", logp), ("old_logp", old_logp), ("entropy", entropy), ("ref_logp", ref_logp), ("rollout_logp", rollout_logp)):
        if x is None or bool(torch.isfinite(x.detach()).all()):  # the common case: one pass, no mask
            continue
        if not bool((torch.isfinite(x.detach()) | ~mask).all()):  # non-finite values outside padding
            bad = torch.nonzero(mask & ~torch.isfinite(x.detach()))[:3].tolist()
            raise ValueError(f"{name} holds non-finite values at real (unmasked) positions {bad}")
    if bool((mask & (logp.detach() < -LOGP_FLOOR)).any()):  # no softmax gives these; CISPO would overflow A * logp
        raise ValueError(
            f"logp must be >= -{LOGP_FLOOR:g} at real tokens (a log-probability), got min logp={float(torch.where(mask, logp.detach(), 0).min()):.3g}"
        )
    in_bound = torch.isfinite(advantages.detach()) & (
        advantages.detach().abs() <= ADVANTAGE_BOUND
    )  # (B,) or (B, T); float16 casts 1e20 to inf
    if advantages.ndim == 2:  # one per token: padding may hold anything
        in_bound = in_bound | ~mask
    if not bool(in_bound.all()):
        bad = [tuple(i) if len(i) > 1 else i[0] for i in torch.nonzero(~in_bound)[:5].tolist()]
        raise ValueError(
            f"advantages must be finite and at most {ADVANTAGE_BOUND:g} in magnitude (larger ones overflow the loss); "
            f"got {[float(advantages[i]) for i in bad]} at indices {bad}: rescale the rewards"
        )
    return mask


def _check_ids(mask: Tensor, **ids: Tensor | None) -> None:
    """ValueError naming the first of ``ids`` (token_ids, context_ids) that is given but is not an integer tensor of
    ``mask``'s shape (B, T)."""
    for name, x in ids.items():
        if x is None:
            continue
        if tuple(x.shape) != tuple(mask.shape):
            raise ValueError(f"{name} must have shape (B, T) = {tuple(mask.shape)} like logp, got {name}.shape={tuple(x.shape)}")
        if x.is_floating_point() or x.is_complex() or x.dtype == torch.bool:
            raise ValueError(f"{name} must be an integer tensor (one id per position), got dtype={x.dtype}")


def _check_token_advantages(spec: ObjectiveSpec, advantages: Tensor) -> None:
    """ValueError when per-token advantages (B, T) reach a spec that reads one advantage per completion."""
    reasons = spec.completion_advantage_reasons() if advantages.ndim == 2 else []
    if reasons:
        raise ValueError(
            f"objective {spec.name!r} needs one advantage per completion, shape (B,): {'; '.join(reasons)}; got per-token "
            f"advantages of shape {tuple(advantages.shape)}: pass one per completion or use a token-level ratio "
            "(ratio_level='token' or 'sequence_token')"
        )


class _UpcastHalf(torch.autograd.Function):
    """float16 / bfloat16 -> float32 whose backward rounds the gradient back to the input's dtype and refuses
    one the dtype cannot hold (|g| > its largest finite value, NaN) with a ValueError naming the argument."""

    @staticmethod
    def forward(ctx, x: Tensor, name: str) -> Tensor:
        ctx.name, ctx.dtype = name, x.dtype
        return x.float()

    @staticmethod
    def backward(ctx, grad: Tensor) -> tuple[Tensor, None]:
        limit = torch.finfo(ctx.dtype).max
        if not bool((grad.abs() <= limit).all()):  # one device sync, half-precision inputs only
            worst = float(torch.nan_to_num(grad.abs(), nan=float("inf")).max())
            raise ValueError(
                f"the gradient with respect to {ctx.name} does not fit {ctx.name}'s dtype {ctx.dtype} "
                f"(max |grad| = {worst:.3g} > {limit:g}); pass {ctx.name} in float32"
            )
        return grad.to(ctx.dtype), None


def compute_dtype(logp: Tensor) -> torch.dtype:
    """The dtype ``policy_loss`` computes in: ``logp``'s, at least float32."""
    return torch.promote_types(logp.dtype, torch.float32)


def _to_compute(x: Tensor | None, dtype: torch.dtype, name: str) -> Tensor | None:
    """``x`` in the compute dtype; a half-precision tensor with a gradient goes through ``_UpcastHalf``."""
    if x is None or x.dtype == dtype:
        return x
    if x.requires_grad and x.dtype in (torch.float16, torch.bfloat16) and dtype == torch.float32:
        return _UpcastHalf.apply(x, name)
    return x.to(dtype)


def _check_required(spec: ObjectiveSpec, supplied: dict[str, Tensor | None]) -> None:
    """ValueError naming each optional argument the spec needs but the caller left out, and what needs it."""
    for name, reason in spec.required_inputs().items():
        if supplied[name] is None:
            raise ValueError(f"{name} is required for {reason}, got {name}=None")


def _sanitise(x: Tensor | None, mask: Tensor) -> Tensor | None:
    """Zero the padded positions with ``torch.where`` so NaN/inf padding never propagates."""
    return None if x is None else torch.where(mask, x, 0.0)


def _share(flags: Tensor, within: Tensor, dtype: torch.dtype) -> Tensor:
    """Share of the True entries of ``within`` where ``flags`` is True too (bool ops, no float pass)."""
    return ((flags & within).sum() / within.sum().clamp(min=1)).to(dtype)


def group_variance(values: Tensor, group_ids: Tensor | Groups, valid: Tensor, sample_weight: Tensor | None = None) -> Tensor:
    """Population variance of ``values`` within each group, averaged over the groups that have a valid row (0-d).

    values, group_ids, valid: (B,). ``sample_weight`` (B,) weighs the rows of a group's mean and variance
    (the toy's exact mode: each completion's probability). Computed in float64 and saturated at the
    input dtype's largest finite value, so huge inputs cannot make it overflow to inf.
    """
    groups = Groups.of(group_ids)
    index, n_groups = groups.index, groups.n
    x = torch.where(valid, values.double(), 0.0)  # (B,) float64
    w = valid.double() if sample_weight is None else torch.where(valid, sample_weight.double(), 0.0)  # (B,)
    mass = group_sum(w, index, n_groups)  # (n,)
    mean = group_sum(w * x, index, n_groups) / torch.where(mass > 0, mass, 1.0)
    var = group_sum(w * (x - mean[index]) ** 2, index, n_groups) / torch.where(mass > 0, mass, 1.0)
    has = mass > 0
    out = torch.where(has, var, 0.0).sum() / has.sum().clamp(min=1)
    return out.clamp(max=torch.finfo(values.dtype).max).to(values.dtype)


def asymmetry(weights: Tensor, adv: Tensor, group_ids: Tensor | Groups, valid: Tensor, sample_weight: Tensor | None = None) -> Tensor:
    """Eq (23), Asym = Var_i(w_i A_i) within each group, averaged over groups (population variance, ``group_variance``).

    weights, adv, group_ids, valid: (B,); rows with valid = False are left out. The product is taken in
    float64, so huge advantages or ratios cannot overflow before the variance.
    """
    var = group_variance(weights.double() * adv.double(), group_ids, valid, sample_weight)  # 0-d float64
    return var.clamp(max=torch.finfo(weights.dtype).max).to(weights.dtype)


def group_spread(weights: Tensor, group_ids: Tensor | Groups, valid: Tensor) -> Tensor:
    """max_i w_i - min_i w_i within each group, averaged over the groups that have a valid row (0-d): how far the
    sequence weights of eq 23 (stilde_i after the group transform, a row's mean token weight at token level) are from
    one value per group, the case where a shared token cancels by the advantages' zero sum. weights, valid: (B,)."""
    groups = Groups.of(group_ids)
    index, n = groups.index, groups.n
    high = group_amax(torch.where(valid, weights, float("-inf")), index, n)  # (n,)
    low = group_amin(torch.where(valid, weights, float("inf")), index, n)  # (n,)
    has = group_sum(valid.long(), index, n) > 0  # (n,) a group with a valid row
    spread = torch.where(has, high - low, 0.0)  # (n,)
    return spread.sum() / has.sum().clamp(min=1)


def _clip_shares(terms: PolicyTerms, kept: Tensor, valid_rows: Tensor, dtype: torch.dtype) -> tuple[Tensor, Tensor]:
    """clip/frac_low and clip/frac_high: share of non-empty sequences (sequence clip) or of kept tokens."""
    if terms.clip_per_sequence:
        return _share(terms.clip_low.any(-1), valid_rows, dtype), _share(terms.clip_high.any(-1), valid_rows, dtype)
    return _share(terms.clip_low, kept, dtype), _share(terms.clip_high, kept, dtype)


def _ratio_max(ratio: Tensor, mask: Tensor) -> Tensor:
    """Largest ratio at a real token (1 for a batch with none)."""
    if not bool(mask.any()):
        return ratio.new_ones(())
    return torch.where(mask, ratio, float("-inf")).amax()


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
    rollout_logp: Tensor | None = None,
    token_ids: Tensor | None = None,
    context_ids: Tensor | None = None,
    batch_metrics: bool = True,
    **overrides: object,
) -> tuple[Tensor, dict[str, Tensor]]:
    """The loss (to minimise) of one objective on a batch of completions, and its metrics.

    Shapes: logp, old_logp, mask, entropy, ref_logp, rollout_logp (B, T); group_ids (B,); advantages (B,), one per
    completion, or (B, T), one per token (the optimal token baseline; refused by a spec that reads one per completion,
    ``spec.completion_advantage_reasons()``: a sequence ratio, OPSM, online IPO).
    ``rollout_logp`` (the sampler's log-probs) is read by the spec's ``rollout_correction`` only. ``token_ids`` (B, T)
    integer, the completions' tokens, and ``context_ids`` (B, T) integer, the context of each token where it is not the
    prefix (the toy's parameter rows), are read by the exact-cancellation arm (``cancel``, ``dfpo.core.loss.cancel``) only.
    ``objective`` is an ObjectiveSpec (used as it is: a spec is valid by construction) or the
    name of a preset of ``OBJECTIVES``; ``overrides`` change its components one by one.
    Computed in ``logp``'s dtype, at least float32 (``compute_dtype``): the loss and metrics come back in it.
    A missing ``entropy`` / ``ref_logp`` / ``rollout_logp`` the spec needs (``spec.required_inputs()``) is
    refused before any other work. ``batch_metrics=False`` leaves out the metrics of the whole batch that the loss
    does not read (loss/policy, clip/*, ratio/*, weights/asym, weights/spread): the same loss, for a caller that reads only it or
    its gradient (the atlas page calls this ~2,000 times per seed).
    """
    spec = objective if isinstance(objective, ObjectiveSpec) and not overrides else resolve_objective(objective, **overrides)
    _check_required(spec, {"entropy": entropy, "ref_logp": ref_logp, "rollout_logp": rollout_logp, "token_ids": token_ids})
    mask = _check_inputs(logp, old_logp, advantages, mask, group_ids, entropy, ref_logp, rollout_logp)
    _check_ids(mask, token_ids=token_ids, context_ids=context_ids)
    _check_token_advantages(spec, advantages)
    dtype = compute_dtype(logp)  # float32 for half-precision inputs
    logp = _sanitise(_to_compute(logp, dtype, "logp"), mask)  # (B, T)
    metrics: dict[str, Tensor] = {}
    events = TokenEvents(token_ids, context_ids, mask, group_ids)
    for component in COMPONENTS:  # the exact-cancellation arm: the same values, no gradient at whole-group shared tokens
        if component.logp_step:
            logp, step_metrics = component.logp_step(spec, logp, events)  # (B, T)
            metrics.update(step_metrics)
    old_logp, ref_logp, rollout_logp = (None if t is None else t.detach().to(dtype) for t in (old_logp, ref_logp, rollout_logp))
    entropy = _to_compute(entropy, dtype, "entropy")
    x = LossBatch.of(logp, _sanitise(old_logp, mask), advantages, mask, group_ids)  # advantages (B,) or (B, T)
    lengths = x.lengths  # (B,)
    terms = RATIO_SHAPES[spec.ratio_level](spec, x)

    ctx = LossContext(
        x=x,
        terms=terms,
        kept=mask,
        agg_mask=mask,
        agg_lengths=lengths,
        entropy=entropy,
        ref_logp=_sanitise(ref_logp, mask),
        rollout_logp=_sanitise(rollout_logp, mask),
    )
    dropped, leaves_count, renormalised = torch.zeros_like(mask), torch.zeros_like(mask), False
    for component in COMPONENTS:  # the token mask, the rollout rejection: tokens out of the policy gradient
        if component.token_filter:
            drop, renormalise, filter_metrics = component.token_filter(spec, ctx)
            metrics.update(filter_metrics)
            if drop is not None:
                dropped = dropped | drop  # (B, T)
                if renormalise:
                    leaves_count, renormalised = leaves_count | drop, True
    kept = mask & ~dropped  # (B, T)
    if renormalised:  # the aggregation counts the tokens no renormalising filter dropped
        ctx = dataclasses.replace(ctx, kept=kept, agg_mask=mask & ~leaves_count, agg_lengths=None)
    else:
        ctx = dataclasses.replace(ctx, kept=kept)
    agg_mask, agg_lengths = ctx.agg_mask, ctx.agg_lengths
    per_token = -torch.where(kept, terms.surrogate, 0.0)  # (B, T)
    for component in COMPONENTS:  # covariance control, rollout correction: changes to the per-token loss
        if component.token_step:
            per_token, step_metrics = component.token_step(spec, ctx, per_token)
            metrics.update(step_metrics)
    policy = aggregate(per_token, agg_mask, spec.aggregation, spec.max_completion_length, agg_lengths)
    loss = policy
    for component in COMPONENTS:  # the KL to the reference, the entropy bonus: terms added to the loss
        if component.loss_term:
            term, term_metrics = component.loss_term(spec, ctx)
            loss = loss if term is None else loss + term
            metrics.update(term_metrics)

    if not batch_metrics:
        return loss, metrics
    n_real = lengths.sum().clamp(min=1).to(logp.dtype)
    valid_rows = lengths > 0  # (B,)
    clip_low, clip_high = _clip_shares(terms, kept, valid_rows, logp.dtype)
    metrics.update(
        {
            "loss/policy": policy.detach(),
            "clip/frac_low": clip_low,
            "clip/frac_high": clip_high,
            "ratio/mean": torch.where(mask, terms.ratio, 0.0).sum() / n_real,
            "ratio/max": _ratio_max(terms.ratio, mask),
            "weights/asym": asymmetry(terms.weight, x.adv, x.groups, valid_rows),
            "weights/spread": group_spread(terms.weight, x.groups, valid_rows),
            "ratio/clamped_frac": clamped_share(logp, x.old_logp, mask),
        }
    )
    return loss, metrics
