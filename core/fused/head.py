"""The fused path's entry points: ``fused_head_loss`` (the loss, log-probs and gradients in one pass) and
``fused_policy_loss`` (``policy_loss``'s signature); the checks, the layout of one call, its run and its result."""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
from torch import Tensor

from ..cast_in_place import CastsOf
from ..logprobs import check_head_inputs, check_matmul_dtype, matmul_weight, no_autocast
from ..loss import ObjectiveSpec, resolve_objective
from ..loss.core import LOGP_FLOOR
from .blocks import _half_precision_off_cpu, chunk_plan, default_chunk_size, scaled_block_size
from .coupling import coupling_unit, group_folded, positions, row_scaled
from .gradient import _Sum, backward_block, fused_pass, whole
from .kernels import _Kernels, _syncs_are_dear
from .rows import _RowsOf
from .scaled import path_of, scaled_pass
from .solve import _Inputs, solve
from .state import FusedCall, Layout
from .statistics import block, statistics
from .workspace import _kept


@dataclass
class FusedHead:
    """What ``fused_head_loss`` returns."""

    loss: Tensor
    """0-d loss (``policy_loss``'s value); its backward hands on the gradients of ``hidden`` and the LM-head weight."""
    metrics: dict[str, Tensor]
    """``policy_loss``'s metrics on the batch and ``fused/two_pass``."""
    logp: Tensor
    """(B, T) detached log-probs of the targets, compute dtype, 0 at padding."""
    entropy: Tensor | None
    """(B, T) detached entropies (when the objective reads them or ``with_entropy``), 0 at padding."""
    logp_grad: Tensor | None
    """(B, T) d loss / d logp (the coefficients the gradient was built from); None without gradients."""
    finite: bool
    """False when a real position's log-prob came out non-finite: the work stopped there, loss is NaN, gradients 0."""


class _HandOn(torch.autograd.Function):
    """The loss value; its backward hands on gradients computed in the forward, times the upstream gradient."""

    @staticmethod
    def forward(ctx, loss: Tensor, hidden: Tensor, weight: Tensor, grads: list) -> Tensor:
        ctx.grads, ctx.dtypes = grads, (hidden.dtype, weight.dtype)
        return loss.detach().clone()

    @staticmethod
    def backward(ctx, upstream: Tensor):
        if ctx.grads is None:
            raise RuntimeError("fused_policy_loss's gradients are handed on once: call backward on its loss once (no retain_graph)")
        (grad_h, grad_w), ctx.grads = ctx.grads, None
        out = [None if g is None else g.mul_(upstream.to(g.dtype)).to(dt) for g, dt in zip((grad_h, grad_w), ctx.dtypes)]
        return None, out[0], out[1], None


def fused_head_loss(
    objective: str | ObjectiveSpec,
    *,
    hidden: Tensor,
    lm_head_weight: Tensor,
    targets: Tensor,
    old_logp: Tensor | None,
    advantages: Tensor,
    mask: Tensor,
    group_ids: Tensor,
    ref_logp: Tensor | None = None,
    rollout_logp: Tensor | None = None,
    temperature: float = 1.0,
    chunk_size: int | None = None,
    max_logits_mib: float = 2048.0,
    compile: bool = False,
    with_entropy: bool = False,
    solve_once: bool | None = None,
    matmul_dtype: torch.dtype | None = None,
    **overrides: object,
) -> FusedHead:
    """The LM head, the log-probs (and entropies) and the objective's loss with its gradients in one pass (package doc).

    Shapes: hidden (B, T, H), lm_head_weight (V, H), targets, old_logp, mask, ref_logp, rollout_logp (B, T);
    advantages, group_ids (B,). ``old_logp`` None: the policy's own log-probs, detached (the first optimiser step of a
    rollout batch, ratio 1). ``with_entropy`` computes entropies the objective does not read (for a log).
    ``solve_once``: the coefficients solved once for the whole batch, after a pass of statistics (package doc, "One
    solve on a GPU"); None: where the hidden states are not on the CPU. Inputs are
    checked (with ``policy_loss``'s own checks) before the LM head runs. A non-finite log-prob at a real position stops
    the work and returns ``finite=False`` (loss NaN, zero gradients), so a trainer can skip the step.
    ``matmul_dtype``: the dtype of the head's matmuls (None: the weight's), e.g. torch.bfloat16 for a float32 master
    weight under bf16 autocast: one bf16 copy of W for the call (V H 2 bytes), every statistic in float32 and W's
    gradient summed in float32 and returned in W's dtype (``dfpo.core.logprobs``, "Precision"); an ambient
    torch.autocast is ignored.
    """
    spec = objective if isinstance(objective, ObjectiveSpec) and not overrides else resolve_objective(objective, **overrides)
    check_matmul_dtype(matmul_dtype)
    if chunk_size is None:
        half = _half_precision_off_cpu(lm_head_weight, matmul_dtype)
        chunk_size = default_chunk_size(hidden.shape[-1], half_precision_off_cpu=half)
    _check_options(hidden, lm_head_weight, targets, temperature, chunk_size, max_logits_mib, solve_once)
    solve_once = _syncs_are_dear(hidden.device) if solve_once is None else solve_once
    mm_weight = matmul_weight(lm_head_weight.detach(), matmul_dtype)  # (V, H) in the matmuls' dtype
    dtype = torch.promote_types(torch.promote_types(lm_head_weight.dtype, mm_weight.dtype), torch.float32)  # the compute dtype
    keep_entropy = spec.needs_entropy or with_entropy
    x, logp_buf, entropy_buf = _loss_inputs(
        spec, dtype, hidden.device, targets, keep_entropy,
        old_logp=old_logp, advantages=advantages, mask=mask, group_ids=group_ids, ref_logp=ref_logp, rollout_logp=rollout_logp,
    )  # fmt: skip
    layout, plan = _layout(
        spec, x, group_ids, hidden, lm_head_weight, targets, dtype, chunk_size, max_logits_mib, temperature, keep_entropy
    )
    n_pos = int(layout.rows.numel())
    if solve_once:  # the whole batch as one unit in two passes: one (B, T) solve, not one per block
        paths = [(0, n_pos, "two")] if n_pos else []
    else:
        paths = [(s, e, path_of(layout, s, e, two)) for s, e, two in plan]
    call = _call(layout, x, hidden, mm_weight, paths, logp_buf, entropy_buf, compile=compile)
    with no_autocast(hidden.device):
        two_pass_tokens, scaled_tokens, finite = _run(call, paths)
    return _result(call, hidden, lm_head_weight, finite, two_pass_tokens, scaled_tokens)


def _check_options(
    hidden: Tensor, lm_head_weight: Tensor, targets: Tensor, temperature: float, chunk_size: int, max_logits_mib: float, solve_once: object
) -> None:
    """The head's inputs and the call's options, each fault refused in one sentence (ValueError)."""
    check_head_inputs(hidden, lm_head_weight, targets, temperature=temperature, chunk_size=chunk_size)
    if not (isinstance(max_logits_mib, (int, float)) and not isinstance(max_logits_mib, bool) and max_logits_mib >= 0):
        raise ValueError(f"max_logits_mib must be a number >= 0, got max_logits_mib={max_logits_mib!r}")
    if targets.ndim != 2:
        raise ValueError(f"targets must have shape (B, T), got targets.shape={tuple(targets.shape)}")
    if solve_once is not None and not isinstance(solve_once, bool):
        raise ValueError(f"solve_once must be True, False or None (by device), got solve_once={solve_once!r}")


def _loss_inputs(
    spec: ObjectiveSpec,
    dtype: torch.dtype,
    device: torch.device,
    targets: Tensor,
    keep_entropy: bool,
    *,
    old_logp: Tensor | None,
    advantages: Tensor,
    mask: Tensor,
    group_ids: Tensor,
    ref_logp: Tensor | None,
    rollout_logp: Tensor | None,
) -> tuple[_Inputs, Tensor, Tensor | None]:
    """The loss inputs checked (with every check of ``policy_loss``, on (B, T) placeholders, before the V-sized work),
    and the (B, T) log-prob buffer (placeholders: old_logp, or 0; ratio 1) and entropy buffer (0, or None)."""
    B, T = targets.shape
    placeholder = torch.zeros((B, T), dtype=dtype, device=device) if old_logp is None else old_logp.detach()
    if tuple(placeholder.shape) != (B, T):
        raise ValueError(f"old_logp must have shape (B, T) = {(B, T)} like targets, got old_logp.shape={tuple(placeholder.shape)}")
    if tuple(mask.shape) != (B, T):
        raise ValueError(f"mask must have shape (B, T) = {(B, T)} like targets, got mask.shape={tuple(mask.shape)}")
    x = _Inputs(spec, old_logp, advantages, mask, group_ids, ref_logp, rollout_logp, targets if spec.needs_token_ids else None)
    placeholder = torch.where(mask.bool(), placeholder.to(dtype), 0.0).nan_to_num(0.0).clamp(min=-LOGP_FLOOR)  # (B, T)
    entropy_buf = torch.zeros((B, T), dtype=dtype, device=device) if keep_entropy else None
    with torch.no_grad():  # every check of policy_loss, on (B, T) placeholders, before the V-sized work
        x.loss(placeholder, entropy_buf if spec.needs_entropy else None)
    x.mask = mask.bool()
    return x, placeholder.clone(), entropy_buf  # (B, T): the log-probs known so far, placeholders elsewhere


def _layout(
    spec: ObjectiveSpec,
    x: _Inputs,
    group_ids: Tensor,
    hidden: Tensor,
    lm_head_weight: Tensor,
    targets: Tensor,
    dtype: torch.dtype,
    chunk_size: int,
    max_logits_mib: float,
    temperature: float,
    keep_entropy: bool,
) -> tuple[Layout, list[tuple[int, int, bool]]]:
    """The real positions laid out unit after unit (``coupling_unit``), their chunks (``chunk_plan``) and what is asked
    of them; a target outside the vocabulary is refused in one sentence."""
    unit = coupling_unit(spec)
    rows, cols, sizes = positions(x.mask, group_ids, unit)
    n_pos, V = int(rows.numel()), lm_head_weight.shape[0]
    max_unit = int(max_logits_mib * 2**20 // (V * dtype.itemsize))
    plan = (
        [(s, min(s + chunk_size, n_pos), False) for s in range(0, n_pos, chunk_size)]
        if unit == "token"
        else chunk_plan(sizes, chunk_size, max_unit)
    )
    flat_y = targets[rows, cols].long()  # (N,)
    if n_pos and (int(flat_y.min()) < 0 or int(flat_y.max()) >= V):
        raise ValueError(f"targets must lie in [0, {V}) at real positions, got values in [{int(flat_y.min())}, {int(flat_y.max())}]")
    need_h = torch.is_grad_enabled() and hidden.requires_grad
    need_w = torch.is_grad_enabled() and lm_head_weight.requires_grad
    scaled = (need_h or need_w) and row_scaled(spec)  # a completion longer than a block: scaled once (package doc)
    layout = Layout(
        rows=rows, cols=cols, flat_y=flat_y, vocab=V, hidden_size=lm_head_weight.shape[1], temperature=temperature,
        dtype=dtype, device=hidden.device, chunk_size=chunk_size,
        scaled_block=scaled_block_size(chunk_size, V, dtype.itemsize),  # a scaled unit's block
        max_unit=max_unit, need_h=need_h, need_w=need_w, scaled=scaled,
        folded=scaled and need_w and group_folded(spec),  # a scaled group's d W in one running sum (group_folded)
        keep_entropy=keep_entropy, needs_entropy=spec.needs_entropy,
    )  # fmt: skip
    return layout, plan


def _call(
    layout: Layout,
    x: _Inputs,
    hidden: Tensor,
    lm_head_weight: Tensor,
    paths: list[tuple[int, int, str]],
    logp_buf: Tensor,
    entropy_buf: Tensor | None,
    *,
    compile: bool,
) -> FusedCall:
    """The call's state: the one logits block as long as the longest of ``paths``' blocks, the kernels, the casts, the
    hidden rows and the gradients' buffers; ``lm_head_weight`` is the (detached) weight in the matmuls' dtype, the
    gradients' buffers are in the compute dtype."""
    n_pos = int(layout.rows.numel())
    block_of = {"one": n_pos, "two": layout.chunk_size, "scaled": layout.scaled_block}  # positions per block, by path
    longest = max((min(block_of[how], e - s) for s, e, how in paths), default=0)
    buf = _kept(0, (longest, layout.vocab), layout.dtype, hidden.device)  # (n, V) the one logits block, reused
    kernels = _Kernels(compile and layout.keep_entropy)  # compiled only where it saves the second block (package doc)
    casts_of = CastsOf(lm_head_weight.dtype)  # a half-precision head's casts in place, of buf's and spare's blocks
    rows_of = _RowsOf(hidden.detach(), layout.rows, layout.cols)  # a chunk's hidden rows: a view where they are consecutive
    # hidden's gradient is written chunk by chunk into its (B, T, H) place (zero only at padding)
    B, T = logp_buf.shape
    grad_h = rows_of.gradient(layout.dtype, full=n_pos == B * T) if layout.need_h else None  # (B * T, H)
    grad_w = _Sum(torch.empty(lm_head_weight.shape, dtype=layout.dtype, device=hidden.device)) if layout.need_w else None  # (V, H)
    return FusedCall(
        **vars(layout), x=x, weight=lm_head_weight.detach(), longest=longest, buf=buf, kernels=kernels, casts_of=casts_of,
        rows_of=rows_of, logp_buf=logp_buf, entropy_buf=entropy_buf, grad_h=grad_h, grad_w=grad_w,
    )  # fmt: skip


def _run(call: FusedCall, paths: list[tuple[int, int, str]]) -> tuple[int, int, bool]:
    """Each unit (or run of units) by its path, in order: (tokens that took two passes, tokens scaled, finite). The
    work stops at the first non-finite log-prob."""
    two_pass_tokens, scaled_tokens = 0, 0
    for start, end, how in paths:
        if how == "scaled":
            again = scaled_pass(call, start, end)
            if again is None:
                return two_pass_tokens, scaled_tokens, False
            scaled_tokens += end - start - again
            two_pass_tokens += again
            continue
        if how == "two":
            if not statistics(call, start, end):  # the whole unit's log-probs first
                return two_pass_tokens, scaled_tokens, False
            if not call.with_grad:
                continue
            two_pass_tokens += end - start
            solve(call)
            fused_pass(call, start, end, checked=True)
            continue
        done = block(call, start, end)
        if not bool(torch.isfinite(done.logp).all()):
            return two_pass_tokens, scaled_tokens, False
        solve(call)
        backward_block(call, start, end, done, whole(call, start, end))
    return two_pass_tokens, scaled_tokens, True


def _result(call: FusedCall, hidden: Tensor, lm_head_weight: Tensor, finite: bool, two_pass_tokens: int, scaled_tokens: int) -> FusedHead:
    """What the call returns: the loss (its backward hands on the gradients), metrics, log-probs and entropies; NaN and
    zero gradients where a log-prob was not finite; the loss of the values alone where no gradient was asked for."""
    x, dtype, n_pos = call.x, call.dtype, int(call.rows.numel())
    loss, metrics, grad_h = call.loss, call.metrics, call.grad_h
    grad_w = None if call.grad_w is None else call.grad_w.total()
    if not finite:
        loss, metrics = torch.full((), math.nan, dtype=dtype, device=hidden.device), {}
        grad_h = None if grad_h is None else grad_h.zero_()
        grad_w = None if grad_w is None else grad_w.zero_()
    elif loss is None:  # no gradient asked for, or no real position: the loss of the values alone
        with torch.no_grad():
            loss, metrics = x.loss(call.logp_buf, call.entropy_buf if call.needs_entropy else None)
    metrics = {k: v.detach() for k, v in metrics.items()}
    metrics["fused/two_pass"] = torch.tensor(two_pass_tokens / max(n_pos, 1), dtype=dtype, device=hidden.device)
    metrics["fused/row_scaled"] = torch.tensor(scaled_tokens / max(n_pos, 1), dtype=dtype, device=hidden.device)
    if call.with_grad:
        grads = [None if grad_h is None else grad_h.view(hidden.shape), grad_w]  # (B, T, H), (V, H)
        out = _HandOn.apply(loss, hidden, lm_head_weight, grads)
    else:
        out = loss.detach()
    entropy = None if call.entropy_buf is None else torch.where(x.mask, call.entropy_buf, 0.0)
    return FusedHead(
        loss=out,
        metrics=metrics,
        logp=torch.where(x.mask, call.logp_buf, 0.0),
        entropy=entropy,
        logp_grad=call.c_buf if call.with_grad and finite else None,
        finite=finite,
    )


def fused_policy_loss(
    objective: str | ObjectiveSpec,
    *,
    hidden: Tensor,
    lm_head_weight: Tensor,
    targets: Tensor,
    old_logp: Tensor | None,
    advantages: Tensor,
    mask: Tensor,
    group_ids: Tensor,
    ref_logp: Tensor | None = None,
    rollout_logp: Tensor | None = None,
    temperature: float = 1.0,
    chunk_size: int | None = None,
    max_logits_mib: float = 2048.0,
    compile: bool = False,
    solve_once: bool | None = None,
    **overrides: object,
) -> tuple[Tensor, dict[str, Tensor]]:
    """``policy_loss(objective, logp=token_logprobs(hidden, W, targets), ...)`` with the LM head fused in: the same loss,
    metrics and gradients (to float round-off) for every objective, from three matmuls over the logits, never a
    (B, T, V) tensor (package doc: ``dfpo.core.fused``).

    Shapes: hidden (B, T, H), lm_head_weight (V, H), targets, old_logp, mask, ref_logp, rollout_logp (B, T) (old_logp
    None: the policy's own log-probs, detached); advantages, group_ids (B,). Returns (loss, metrics) as ``policy_loss``
    does, with ``fused/two_pass``: the share of real tokens whose logits took two passes (a coupled unit larger than
    ``max_logits_mib`` of float32 logits). ``chunk_size``: positions per logits block (None: ``default_chunk_size``
    of the hidden size); ``compile``: the elementwise work through ``torch.compile``; ``solve_once``: the coefficients
    solved once for the batch, in two passes (None: off the CPU; package doc, "One solve on a GPU"). A non-finite
    log-prob at a real position is refused with a ValueError.
    """
    out = fused_head_loss(
        objective,
        hidden=hidden,
        lm_head_weight=lm_head_weight,
        targets=targets,
        old_logp=old_logp,
        advantages=advantages,
        mask=mask,
        group_ids=group_ids,
        ref_logp=ref_logp,
        rollout_logp=rollout_logp,
        temperature=temperature,
        chunk_size=chunk_size,
        max_logits_mib=max_logits_mib,
        compile=compile,
        solve_once=solve_once,
        **overrides,
    )
    if not out.finite:
        raise ValueError(
            "the LM head gives non-finite log-probs at real (unmasked) positions: check hidden and lm_head_weight for NaN or inf"
        )
    return out.loss, out.metrics
