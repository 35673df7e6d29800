"""Per-token log-probs (and entropy) from last hidden states and the LM-head weight, in chunks.

``token_logprobs(hidden, lm_head_weight, targets)`` computes, for each position n,

    logp_n = z_n[y_n] - logsumexp(z_n),   H_n = -sum_k p_nk log p_nk,   z_n = W h_n / temperature

without ever holding the (N, V) logits of the whole batch: the LM head runs on ``chunk_size``
positions at a time, and the backward pass recomputes each chunk's logits instead of
saving them (a custom ``autograd.Function``), so the extra memory of forward plus backward is
O(chunk_size * V) rather than O(N * V). Pass only the positions whose next token is scored
(completion positions): prompt positions never reach the LM head.

Precision. The head's matmuls (the logits W h, and the backward's dz W and dz^T h) run in ``matmul_dtype``
(None: the weight's dtype): bf16 or fp16 operands under autocast, as TRL's and Liger's heads run, with the
float32 accumulation the matmul gives; the softmax statistics (logsumexp, entropy, d logp / d z) are always
float32 (float64 for a float64 head), and the weight's gradient is accumulated over chunks in float32 and
returned in the weight's own dtype (a float32 master weight gets a float32 gradient). A ``matmul_dtype``
other than the weight's makes one copy of W in it per forward and one per backward (V H itemsize bytes:
297 MiB in bf16 at V = 152k, H = 1024), as autocast's cast does. The head ignores an ambient
``torch.autocast``: forward and backward run in the dtype asked for, so the backward's recomputed logits are
the forward's.

For a loss of the log-probs, ``dfpo.core.fused.fused_policy_loss`` computes the loss's gradient inside the forward
instead (three matmuls, not four); ``token_logprobs`` stays for callers that want the log-probs only.

Gradients (per position, with upstream gradients g of logp and e of H):

    d logp / d z_k = 1[k = y] - p_k
    d H / d z_k    = -p_k (log p_k + H)

and d/dh = (dz)^T W / temperature, d/dW = sum_n dz_n h_n^T / temperature.
"""

from __future__ import annotations

import contextlib

import torch
from torch import Tensor

from .cast_in_place import InPlaceCasts, castable_in_place


def no_autocast(device: torch.device):
    """A context with torch.autocast off on ``device``'s type (a no-op context where autocast has no such type): the
    head's matmuls then run in the dtypes asked for, in the forward and in a custom backward alike."""
    kind = torch.device(device).type
    return torch.autocast(kind, enabled=False) if torch.amp.is_autocast_available(kind) else contextlib.nullcontext()


def check_matmul_dtype(matmul_dtype: object) -> None:
    """ValueError unless ``matmul_dtype`` is None or a floating torch.dtype."""
    if matmul_dtype is not None and not (isinstance(matmul_dtype, torch.dtype) and matmul_dtype.is_floating_point):
        raise ValueError(
            f"matmul_dtype must be None (the weight's dtype) or a floating torch.dtype such as torch.bfloat16, got matmul_dtype={matmul_dtype!r}"
        )


def matmul_weight(weight: Tensor, matmul_dtype: torch.dtype | None) -> Tensor:
    """The head's weight (V, H) in the dtype its matmuls run in: ``weight`` itself where ``matmul_dtype`` is None or
    its own dtype, else one detached copy in ``matmul_dtype`` (V H itemsize bytes)."""
    if matmul_dtype is None or matmul_dtype == weight.dtype:
        return weight
    return weight.detach().to(matmul_dtype)


def _chunk_logits(hidden: Tensor, weight: Tensor, temperature: float) -> Tensor:
    """Logits of one chunk in float32 (float64 stays float64): (n, H) x (V, H) -> (n, V), the matmul in ``weight``'s
    dtype (the hidden states are cast to it). The temperature divides the (n, H) hidden states, not the (n, V)
    logits: one pass over H numbers a position instead of V."""
    if temperature != 1.0:
        hidden = hidden / temperature
    z = hidden.to(weight.dtype) @ weight.T  # (n, V)
    return z.to(torch.promote_types(z.dtype, torch.float32))


def head_logits(hidden: Tensor, weight: Tensor, temperature: float, *, out: Tensor, casts: InPlaceCasts | None = None) -> Tensor:
    """Logits (n, V) of ``hidden`` (n, H) under ``weight`` (V, H) at ``temperature``, written into ``out`` (n, V) of
    the compute dtype (float32, or float64).

    The matmul runs in the weight's dtype (the hidden states are cast to it); a half-precision result is written
    into half of ``out``'s bytes and cast to float32 there (``InPlaceCasts.widen_``: ``casts``, the one a caller
    keeps for ``out``, else one made now; through a copy where ``out`` is not a contiguous float32 block). Writing
    into one reused block saves a fresh (n, V) allocation per chunk. ValueError where ``casts`` were made for another
    block or dtype (they would write the logits into that block's bytes).
    """
    hs = (hidden if temperature == 1.0 else hidden / temperature).to(weight.dtype)  # (n, H)
    if out.dtype == weight.dtype:
        return torch.mm(hs, weight.T, out=out)
    if castable_in_place(out, weight.dtype):
        if casts is not None and not casts.made_for(out, weight.dtype):
            raise ValueError(
                f"casts were made for a {tuple(casts.block.shape)} block at {casts.block.data_ptr():#x} in {casts.upper.dtype}, "
                f"not for out {tuple(out.shape)} at {out.data_ptr():#x} in {weight.dtype}; pass the casts made for out, or none"
            )
        casts = InPlaceCasts(out, weight.dtype) if casts is None else casts
        torch.mm(hs, weight.T, out=casts.upper)  # (n, V) half precision
        return casts.widen_()
    return out.copy_(hs @ weight.T)


def check_head_inputs(hidden: Tensor, lm_head_weight: Tensor, targets: Tensor, *, temperature: float, chunk_size: int) -> None:
    """ValueError naming the argument unless hidden (..., H), lm_head_weight (V, H) and targets (...) fit together
    and temperature > 0, chunk_size a positive int."""
    if hidden.shape[:-1] != targets.shape:
        raise ValueError(
            f"targets must have shape hidden.shape[:-1] = {tuple(hidden.shape[:-1])}, got targets.shape={tuple(targets.shape)}"
        )
    if lm_head_weight.ndim != 2 or lm_head_weight.shape[1] != hidden.shape[-1]:
        raise ValueError(f"lm_head_weight must have shape (V, {hidden.shape[-1]}), got lm_head_weight.shape={tuple(lm_head_weight.shape)}")
    if not (temperature > 0):
        raise ValueError(f"temperature must be > 0, got temperature={temperature!r}")
    if isinstance(chunk_size, bool) or not isinstance(chunk_size, int) or chunk_size < 1:
        raise ValueError(f"chunk_size must be a positive int, got chunk_size={chunk_size!r}")


def _logsumexp_(z: Tensor) -> Tensor:
    """logsumexp over the last dim, overwriting ``z`` (n, V) with exp(z - max): no (n, V) temporaries."""
    top = z.amax(dim=-1, keepdim=True)  # (n, 1)
    top = torch.where(torch.isfinite(top), top, torch.zeros_like(top))  # a row of -inf stays -inf, not NaN
    return z.sub_(top).exp_().sum(-1).log_().add_(top.squeeze(-1))  # (n,)


class _ChunkedTokenLogprobs(torch.autograd.Function):
    """Forward and backward of ``token_logprobs`` on flat (N, H) hidden states, chunk by chunk."""

    @staticmethod
    def forward(
        ctx, hidden: Tensor, weight: Tensor, targets: Tensor, temperature: float, chunk_size: int, with_entropy: bool, matmul_dtype
    ):
        with no_autocast(hidden.device):
            return _ChunkedTokenLogprobs._forward(ctx, hidden, weight, targets, temperature, chunk_size, with_entropy, matmul_dtype)

    @staticmethod
    def _forward(ctx, hidden, weight, targets, temperature, chunk_size, with_entropy, matmul_dtype):
        n_pos = hidden.shape[0]
        w = matmul_weight(weight, matmul_dtype)  # (V, H) in the matmul's dtype
        logp = torch.empty(n_pos, dtype=torch.promote_types(hidden.dtype, torch.float32), device=hidden.device)  # (N,)
        lse = torch.empty_like(logp)  # (N,) saved: the backward needs p = exp(z - lse)
        entropy = torch.empty_like(logp) if with_entropy else None  # (N,)
        for s in range(0, n_pos, chunk_size):
            z = _chunk_logits(hidden[s : s + chunk_size], w, temperature)  # (n, V)
            target_logit = z.gather(-1, targets[s : s + chunk_size, None]).squeeze(-1)  # (n,) read before z is overwritten
            if with_entropy:
                lse[s : s + chunk_size] = torch.logsumexp(z, dim=-1)
                logp_all = z.sub_(lse[s : s + chunk_size, None])  # (n, V)
                entropy[s : s + chunk_size] = -(logp_all.exp() * logp_all).sum(-1)
            else:
                lse[s : s + chunk_size] = _logsumexp_(z)
            logp[s : s + chunk_size] = target_logit - lse[s : s + chunk_size]
        ctx.save_for_backward(hidden, weight, targets, lse)
        ctx.temperature, ctx.chunk_size, ctx.matmul_dtype = temperature, chunk_size, matmul_dtype
        if entropy is None:
            return logp, logp.new_zeros(0)
        return logp, entropy

    @staticmethod
    def backward(ctx, grad_logp: Tensor, grad_entropy: Tensor):
        with no_autocast(grad_logp.device):
            return _ChunkedTokenLogprobs._backward(ctx, grad_logp, grad_entropy)

    @staticmethod
    def _backward(ctx, grad_logp: Tensor, grad_entropy: Tensor):
        hidden, weight, targets, lse = ctx.saved_tensors
        temperature, chunk = ctx.temperature, ctx.chunk_size
        w = matmul_weight(weight, ctx.matmul_dtype)  # (V, H) in the matmul's dtype, made again (not held since the forward)
        need_h, need_w = ctx.needs_input_grad[0], ctx.needs_input_grad[1]
        grad_h = torch.empty_like(hidden) if need_h else None  # (N, H)
        acc_dtype = torch.promote_types(weight.dtype, torch.float32)
        grad_w = torch.zeros(weight.shape, dtype=acc_dtype, device=weight.device) if need_w else None  # (V, H)
        with_entropy_grad = grad_entropy is not None and grad_entropy.numel() > 0
        for s in range(0, hidden.shape[0], chunk):
            h = hidden[s : s + chunk]  # (n, H)
            z = _chunk_logits(h, w, temperature)  # (n, V): the forward's logits, bit for bit
            g = grad_logp[s : s + chunk].to(z.dtype) / temperature  # (n,); 1/temperature folded in
            if with_entropy_grad:
                logp_all = z.sub_(lse[s : s + chunk, None])  # (n, V)
                e = grad_entropy[s : s + chunk].to(z.dtype) / temperature  # (n,)
                p = logp_all.exp()  # (n, V)
                ent = -(p * logp_all).sum(-1)  # (n,)
                dz = logp_all.add_(ent[:, None]).mul_(e[:, None]).add_(g[:, None]).mul_(p).neg_()  # -p (g + e (log p + H))
                row_sign = None
            else:
                # -p g = -sign(g) exp(z - lse + log|g|): one pass; sign(g) is applied on the (n, H) side below
                dz = z.sub_((lse[s : s + chunk] - g.abs().log())[:, None]).exp_()  # (n, V) = p |g|
                row_sign = -torch.sign(g)  # (n,)
                g = g.abs().neg()  # the target's +g, in the same sign convention: p|g| - |g| onehot
            dz.scatter_add_(-1, targets[s : s + chunk, None], g[:, None])  # g (onehot - p), up to row_sign
            dz = dz.to(w.dtype)  # (n, V) in the matmul's dtype
            if need_h:
                gh = dz @ w  # (n, H)
                grad_h[s : s + chunk] = gh if row_sign is None else gh.mul_(row_sign[:, None].to(gh.dtype))
            if need_w:
                hs = h.to(w.dtype)  # (n, H)
                hs = hs if row_sign is None else hs * row_sign[:, None].to(hs.dtype)
                if dz.dtype == acc_dtype:
                    grad_w.addmm_(dz.T, hs)  # accumulated inside the matmul: no (V, H) temporary
                else:
                    grad_w.add_(dz.T @ hs)  # (V, H) half-precision product, summed in float32
        return grad_h, None if grad_w is None else grad_w.to(weight.dtype), None, None, None, None, None


def token_logprobs(
    hidden: Tensor,
    lm_head_weight: Tensor,
    targets: Tensor,
    *,
    temperature: float = 1.0,
    chunk_size: int = 1024,
    with_entropy: bool = True,
    matmul_dtype: torch.dtype | None = None,
) -> tuple[Tensor, Tensor | None]:
    """Log-prob of ``targets`` and (optionally) the entropy under softmax(W h / temperature).

    Shapes: hidden (..., H), lm_head_weight (V, H), targets (...) int64 in [0, V).
    Returns logp (...) and entropy (...) in float32 (float64 for float64 inputs) (None when ``with_entropy`` is False);
    both are differentiable with respect to ``hidden`` and ``lm_head_weight``, whose gradients come in their own
    dtypes. ``matmul_dtype``: the dtype of the head's three matmuls (None: the weight's; module doc, "Precision").
    """
    check_head_inputs(hidden, lm_head_weight, targets, temperature=temperature, chunk_size=chunk_size)
    check_matmul_dtype(matmul_dtype)
    lead = targets.shape
    flat_h = hidden.reshape(-1, hidden.shape[-1])  # (N, H)
    flat_t = targets.reshape(-1).long()  # (N,)
    if flat_t.numel() and (int(flat_t.min()) < 0 or int(flat_t.max()) >= lm_head_weight.shape[0]):
        raise ValueError(f"targets must lie in [0, {lm_head_weight.shape[0]}), got values in [{int(flat_t.min())}, {int(flat_t.max())}]")
    logp, entropy = _ChunkedTokenLogprobs.apply(flat_h, lm_head_weight, flat_t, float(temperature), chunk_size, with_entropy, matmul_dtype)
    return logp.reshape(lead), entropy.reshape(lead) if with_entropy else None


def naive_token_logprobs(hidden: Tensor, lm_head_weight: Tensor, targets: Tensor, *, temperature: float = 1.0) -> tuple[Tensor, Tensor]:
    """The reference: full (..., V) float32 logits, ``log_softmax`` and a gather (what ``token_logprobs`` avoids)."""
    z = hidden @ lm_head_weight.T  # (..., V)
    logp_all = torch.log_softmax(z.to(torch.promote_types(z.dtype, torch.float32)) / temperature, dim=-1)  # (..., V)
    return logp_all.gather(-1, targets[..., None].long()).squeeze(-1), -(logp_all.exp() * logp_all).sum(-1)
