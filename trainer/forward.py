"""The policy's forward pass over a rollout batch: per-token log-probs of the completion tokens.

``completion_logprobs`` runs the model's decoder once, keeps the hidden states of the positions that
predict a real completion token (prompt positions and padding never reach the LM head), and scores
them with ``dfpo.core.logprobs.token_logprobs``: chunked over positions, with a backward pass that recomputes
each chunk's logits, so no (B, T, V) logits tensor exists in the forward or the backward pass.

It falls back to full logits (``completion_logits`` + log-softmax) for a model whose output is not a
plain linear head on the last hidden state: a head with a bias, a logit soft-cap or scale
(``final_logit_softcapping``, ``logit_scale``, ``logits_scaling``), or an adapter on the head itself.
``plain_lm_head`` says which path a model takes.

``fused_completion_loss`` is the update's default: the decoder's hidden states go to
``dfpo.core.fused.fused_head_loss``, which runs the LM head and the objective's loss together and takes the loss's
gradient inside the forward (three matmuls over the logits where ``completion_logprobs`` then ``policy_loss`` take
four). ``completion_logprobs`` stays for the log-probs alone (old and reference log-probs, ``optim.fused_head=off``).

The head's matmuls run in ``head_matmul_dtype(amp_dtype, head_dtype)`` (``optim.head_dtype``): under autocast with
``head_dtype = "autocast"`` (the default) in the autocast dtype (bf16 or fp16 operands, float32 accumulation where
the matmul gives it), as TRL's and Liger's heads run, with the softmax statistics in float32 and the float32 master
weight's gradient summed in float32; with ``"float32"``, or without autocast, in the weight's dtype. One copy of the
weight in the autocast dtype is made per call (V H 2 bytes: 297 MiB at V = 152k, H = 1024), as autocast's own cast
is; the full-logits fallback runs under autocast itself.

With ``shared_prompt = "auto"`` (``optim.shared_prompt``) ``completion_hidden`` runs a group's shared prompt once: the
rows of a group carry the same prompt, so the decoder runs over each distinct prompt (with gradients), its keys and
values are repeated to the prompt's rows (``repeat_interleave``: the backward sums every row's gradient into the one
prompt pass), and the completions run against that cache. The hidden states are today's to float32 round-off.
``shared_prompt_runs`` says which path a batch and model take: the shared one where the rows of each distinct prompt are
contiguous and fewer prompts than rows (``prompt_runs``), and the model a plain full-attention decoder
(``shared_prompt_model``); one pass over every row's prompt and completion otherwise.

Vocabulary statistics that only the diagnostics need (pi(y) and sum_v pi_v^2, for Energy's closed-form
norm) are computed by ``vocab_stats`` under no_grad, and only when asked.
"""

from __future__ import annotations

import inspect
from dataclasses import dataclass

import torch
from torch import Tensor

from ..core.fused import FusedHead, fused_head_loss
from ..core.logprobs import token_logprobs
from .config import HEAD_DTYPES, SHARED_PROMPT
from .sampler import RolloutBatch, autocast, cache_keyword, completion_logits, token_logp, token_stats

LOGIT_TRANSFORMS = ("final_logit_softcapping", "logit_scale", "logits_scaling")
"""Config attributes of models whose logits are not W h (the chunked path would be wrong for them)."""
SHARED_PROMPT_ATTENTION = ("eager", "sdpa")
"""Attention implementations the shared-prompt path is checked against (the tests compare it with one pass on both)."""


def head_matmul_dtype(amp_dtype: torch.dtype | None, head_dtype: str) -> torch.dtype | None:
    """The dtype the LM head's matmuls run in: the autocast dtype ``amp_dtype`` where ``head_dtype`` is "autocast",
    None (the weight's own dtype) where it is "float32" or where no autocast runs (``amp_dtype`` None)."""
    if head_dtype not in HEAD_DTYPES:
        raise ValueError(f"head_dtype must be one of {', '.join(HEAD_DTYPES)}, got head_dtype={head_dtype!r}")
    return amp_dtype if head_dtype == "autocast" else None


def _base_model(model):
    """The transformers model under a peft wrapper (LoRA layers stay injected in it)."""
    return model.get_base_model() if hasattr(model, "get_base_model") else model


def plain_lm_head(model) -> Tensor | None:
    """The LM-head weight (V, H) when logits = hidden @ W.T exactly; None when the model needs full logits."""
    base = _base_model(model)
    head = base.get_output_embeddings() if hasattr(base, "get_output_embeddings") else None
    if type(head) is not torch.nn.Linear or head.bias is not None or not hasattr(base, "get_decoder"):
        return None
    config = getattr(base, "config", None)
    if any(getattr(config, name, None) not in (None, 1.0) for name in LOGIT_TRANSFORMS):
        return None
    return head.weight


def prompt_runs(input_ids: Tensor, attention_mask: Tensor, prompt_width: int) -> Tensor | None:
    """Lengths (U,) of the runs of consecutive rows whose prompt region (the first ``prompt_width`` columns of
    ``input_ids`` (B, L) and ``attention_mask`` (B, L)) is identical, where each distinct prompt is one run and there
    are fewer runs than rows (U < B); None otherwise: every row's prompt its own, one prompt in rows apart, no prompt."""
    B, L = input_ids.shape
    if not 0 <= prompt_width <= L:
        raise ValueError(f"prompt_width must be in [0, {L}] (the batch's columns), got prompt_width={prompt_width}")
    if prompt_width == 0 or B < 2:
        return None
    prompts = torch.cat([input_ids[:, :prompt_width], attention_mask[:, :prompt_width].to(input_ids.dtype)], dim=1)  # (B, 2P)
    starts_run = torch.ones(B, dtype=torch.bool, device=prompts.device)  # (B,)
    starts_run[1:] = (prompts[1:] != prompts[:-1]).any(-1)
    starts = starts_run.nonzero().flatten()  # (U,) the first row of each run
    U = starts.numel()
    if U == B or torch.unique(prompts[starts], dim=0).shape[0] < U:  # every row its own, or a prompt in two runs
        return None
    return torch.diff(starts, append=starts.new_tensor([B]))  # (U,)


def _plain_cache_layers(config) -> bool:
    """Whether transformers' ``DynamicCache`` for ``config`` holds only plain full-attention layers (``DynamicLayer``:
    no sliding window, no linear-attention or shared-KV layers), the cache the shared-prompt path repeats row-wise."""
    try:
        from transformers import DynamicCache
        from transformers.cache_utils import DynamicLayer

        layers = DynamicCache(config=config).layers
    except Exception:  # noqa: BLE001 - a transformers or a config this path does not know: one pass instead
        return False
    return bool(layers) and all(type(layer) is DynamicLayer for layer in layers)


def shared_prompt_model(model) -> bool:
    """Whether ``model``'s decoder gives the hidden states of one pass when run as a prompt pass and a completion pass
    through a KV cache: a causal decoder taking ``position_ids`` and a cache, with eager or sdpa attention
    (``SHARED_PROMPT_ATTENTION``), only full-attention cache layers, no gradient checkpointing and no FSDP2 sharding."""
    base = _base_model(model)
    if not hasattr(base, "get_decoder"):
        return False
    decoder = base.get_decoder()
    config = getattr(decoder, "config", None)
    if config is None or getattr(config, "_attn_implementation", None) not in SHARED_PROMPT_ATTENTION:
        return False
    if not getattr(config, "is_causal", True):
        return False
    modules = list(decoder.modules())
    if any(getattr(m, "gradient_checkpointing", False) is True or type(m).__name__.startswith("FSDP") for m in modules):
        return False
    parameters = inspect.signature(decoder.forward).parameters
    if "position_ids" not in parameters or cache_keyword(decoder) not in parameters:
        return False
    return _plain_cache_layers(config)


def shared_prompt_runs(model, batch: RolloutBatch, shared_prompt: str) -> Tensor | None:
    """Which path ``completion_hidden`` takes: the run lengths (U,) of the batch's distinct prompts (``prompt_runs``) for
    the shared-prompt path, where ``shared_prompt`` is "auto", the prompts repeat in contiguous runs and ``model`` serves
    it (``shared_prompt_model``); None for one pass over every row's prompt and completion."""
    if shared_prompt not in SHARED_PROMPT:
        raise ValueError(f"shared_prompt must be one of {', '.join(SHARED_PROMPT)}, got shared_prompt={shared_prompt!r}")
    if shared_prompt == "off":
        return None
    runs = prompt_runs(batch.input_ids, batch.attention_mask, batch.prompt_width)
    if runs is None or not shared_prompt_model(model):
        return None
    return runs


def _one_pass_hidden(model, batch: RolloutBatch, device, amp_dtype: torch.dtype | None) -> Tensor:
    """Last hidden states at the positions predicting each completion token (B, T, H), one pass over every row."""
    att = batch.attention_mask.to(device)  # (B, L)
    position_ids = (att.cumsum(-1) - 1).clamp(min=0)  # (B, L) left padding aware
    decoder = _base_model(model).get_decoder()
    with autocast(device, amp_dtype):
        out = decoder(input_ids=batch.input_ids.to(device), attention_mask=att, position_ids=position_ids, use_cache=False)
    P, T = batch.prompt_width, batch.mask.shape[1]
    return out.last_hidden_state[:, P - 1 : P + T - 1]  # (B, T, H)


def _shared_prompt_hidden(model, batch: RolloutBatch, device, amp_dtype: torch.dtype | None, runs: Tensor) -> Tensor:
    """``_one_pass_hidden``'s (B, T, H) with each distinct prompt run once: the decoder over the U prompts of ``runs``
    (U,) with a cache, each layer's keys and values repeated to the B rows (the backward sums the rows' gradients into
    the prompt pass), then over the completion positions P .. P + T - 2 (the last token predicts nothing) against it."""
    from transformers import DynamicCache

    decoder = _base_model(model).get_decoder()
    P, T, B = batch.prompt_width, batch.mask.shape[1], batch.mask.shape[0]
    ids = batch.input_ids.to(device)  # (B, L)
    att = batch.attention_mask.to(device)  # (B, L)
    position_ids = (att.cumsum(-1) - 1).clamp(min=0)  # (B, L) left padding aware, as the one pass's
    runs = runs.to(device)  # (U,)
    first = runs.cumsum(0) - runs  # (U,) the first row of each prompt's run
    cache = DynamicCache(config=decoder.config)
    keyword = cache_keyword(decoder)
    with autocast(device, amp_dtype):
        prompt = decoder(
            input_ids=ids[first, :P],
            attention_mask=att[first, :P],
            position_ids=position_ids[first, :P],
            use_cache=True,
            **{keyword: cache},
        ).last_hidden_state  # (U, P, H)
        for layer in cache.layers:
            layer.keys = layer.keys.repeat_interleave(runs, dim=0, output_size=B)  # (B, kv heads, P, head dim)
            layer.values = layer.values.repeat_interleave(runs, dim=0, output_size=B)  # (B, kv heads, P, head dim)
        last = prompt[:, -1:].repeat_interleave(runs, dim=0, output_size=B)  # (B, 1, H) predicts completion token 0
        if T == 1:
            return last
        completion = decoder(
            input_ids=ids[:, P : P + T - 1],
            attention_mask=att[:, : P + T - 1],
            position_ids=position_ids[:, P : P + T - 1],
            use_cache=True,
            **{keyword: cache},
        ).last_hidden_state  # (B, T - 1, H)
    return torch.cat([last, completion], dim=1)  # (B, T, H)


def completion_hidden(model, batch: RolloutBatch, device, amp_dtype: torch.dtype | None = None, *, shared_prompt: str = "off") -> Tensor:
    """Last hidden states at the positions predicting each completion token (B, T, H): one pass over every row, or with
    ``shared_prompt`` "auto" each distinct prompt once where ``shared_prompt_runs`` finds the batch and model fit."""
    runs = shared_prompt_runs(model, batch, shared_prompt)
    if runs is None:
        return _one_pass_hidden(model, batch, device, amp_dtype)  # (B, T, H)
    return _shared_prompt_hidden(model, batch, device, amp_dtype, runs)  # (B, T, H)


@dataclass
class TokenScores:
    """What one forward pass gives the trainer, all (B, T) float32, zero at padded positions."""

    logp: Tensor
    """log pi(y_t), with the graph when computed with gradients."""
    entropy: Tensor | None
    """Entropy of pi(. | context) when asked for (with the graph too: an entropy bonus needs it)."""
    kept: Tensor | None = None
    """Detached (B, T, H) hidden states, or (B, T, V) logits on the full-logits path; kept only for ``vocab_stats``."""


def completion_logprobs(
    model,
    batch: RolloutBatch,
    device,
    amp_dtype: torch.dtype | None = None,
    *,
    with_entropy: bool = True,
    keep_hidden: bool = False,
    chunk_size: int = 1024,
    head_dtype: str = "autocast",
    shared_prompt: str = "off",
) -> TokenScores:
    """Per-token log-probs (and entropy) of the batch's completion tokens under ``model``; the head's matmuls in
    ``head_matmul_dtype(amp_dtype, head_dtype)``, the decoder over a group's shared prompt once where ``shared_prompt``
    is "auto" (``completion_hidden``)."""
    matmul_dtype = head_matmul_dtype(amp_dtype, head_dtype)
    targets = batch.completion_ids.to(device)  # (B, T)
    mask = batch.mask.to(device)  # (B, T)
    weight = plain_lm_head(model)
    if weight is None:  # full-logits fallback
        logits = completion_logits(model, batch, device, amp_dtype)  # (B, T, V)
        logp = torch.where(mask, token_logp(logits, targets), 0.0)
        entropy = None
        if with_entropy:
            logp_all = torch.log_softmax(logits.float(), dim=-1)  # (B, T, V)
            entropy = torch.where(mask, -(logp_all.exp() * logp_all).sum(-1), 0.0)
        return TokenScores(logp, entropy, logits.detach() if keep_hidden else None)
    hidden = completion_hidden(model, batch, device, amp_dtype, shared_prompt=shared_prompt)  # (B, T, H)
    real = mask.nonzero(as_tuple=True)
    # The head's matmuls in matmul_dtype (None: the weight's); hidden's gradient comes back in the weight's dtype.
    lp_real, ent_real = token_logprobs(
        hidden[real].to(weight.dtype), weight, targets[real], chunk_size=chunk_size, with_entropy=with_entropy, matmul_dtype=matmul_dtype
    )  # (N,)
    logp = torch.zeros(mask.shape, dtype=lp_real.dtype, device=lp_real.device).index_put(real, lp_real)  # (B, T)
    entropy = None if ent_real is None else torch.zeros_like(logp).index_put(real, ent_real)
    return TokenScores(logp, entropy, hidden.detach() if keep_hidden else None)


def fused_completion_loss(
    model,
    batch: RolloutBatch,
    device,
    amp_dtype: torch.dtype | None,
    spec,
    *,
    old_logp: Tensor | None,
    advantages: Tensor,
    ref_logp: Tensor | None,
    rollout_logp: Tensor | None,
    with_entropy: bool,
    keep_hidden: bool = False,
    compile: bool = False,
    head_dtype: str = "autocast",
    shared_prompt: str = "off",
) -> tuple[FusedHead, TokenScores] | None:
    """The objective's loss of the batch's completions with the LM head fused in (``fused_head_loss``), and its
    log-probs (and entropies) as ``TokenScores``; None for a model whose head is not ``plain_lm_head``. The head's
    matmuls run in ``head_matmul_dtype(amp_dtype, head_dtype)``; the decoder runs over a group's shared prompt once where
    ``shared_prompt`` is "auto" (``completion_hidden``).

    ``old_logp`` None: the policy's own log-probs, detached (the first optimiser step of a rollout batch).
    """
    matmul_dtype = head_matmul_dtype(amp_dtype, head_dtype)
    weight = plain_lm_head(model)
    if weight is None:
        return None
    hidden = completion_hidden(model, batch, device, amp_dtype, shared_prompt=shared_prompt)  # (B, T, H)
    out = fused_head_loss(
        spec,
        hidden=hidden,
        lm_head_weight=weight,
        targets=batch.completion_ids.to(device),
        old_logp=old_logp,
        advantages=advantages,
        mask=batch.mask.to(device),
        group_ids=batch.group_ids.to(device),
        ref_logp=ref_logp,
        rollout_logp=rollout_logp,
        with_entropy=with_entropy,
        compile=compile,
        matmul_dtype=matmul_dtype,
    )
    return out, TokenScores(out.logp, out.entropy, hidden.detach() if keep_hidden else None)


@torch.no_grad()
def vocab_stats(model, scores: TokenScores, batch: RolloutBatch, device, chunk_rows: int = 8) -> tuple[Tensor, Tensor]:
    """(pi(y_t), sum_v pi_v^2), each (B, T), from a forward pass's kept hidden states (or logits), no grad."""
    targets = batch.completion_ids.to(device)
    weight = plain_lm_head(model)
    probs, collisions = [], []
    for s in range(0, targets.shape[0], chunk_rows):
        part = scores.kept[s : s + chunk_rows]
        logits = part if weight is None else part.to(weight.dtype) @ weight.T  # (b, T, V)
        _, prob, coll = token_stats(logits, targets[s : s + chunk_rows])
        probs.append(prob)
        collisions.append(coll)
    return torch.cat(probs), torch.cat(collisions)
