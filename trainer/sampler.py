"""Rollouts: a small engine interface, the transformers ``generate`` engine, batch tensors.

``RolloutEngine.generate(prompt_ids, n, params)`` takes token ids and returns, prompt-major,
``len(prompt_ids) * n`` completions as token-id lists (EOS kept when produced). That is all
a vLLM engine has to implement to plug in (it also speaks token ids).

``build_batch`` lays completions out for the trainer::

    input_ids  (B, P + T)   [left-padded prompt | completion, right-padded]
    mask       (B, T)       1 on real completion tokens (EOS included; nothing after it)

so that ``logits[:, P - 1 : P + T - 1]`` predict the completion tokens.
"""

from __future__ import annotations

import dataclasses
import functools
import inspect
import types
from dataclasses import dataclass
from typing import Protocol

import torch

from .decode import (
    DecodeOptions,
    StepOut,
    decode_loop,
    graph_compile_options,
    read_back,
    row_uniforms,
    score_step,
    static_cache_width,
)


@dataclass(frozen=True)
class SamplingParams:
    max_new_tokens: int
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = 0
    greedy: bool = False
    """Take the most probable token at every step (ReMax's baseline completion); temperature, top-k and top-p only
    shape the log-probs returned, not the choice."""


def greedy_params(max_new_tokens: int) -> SamplingParams:
    """Greedy decoding up to ``max_new_tokens`` (vLLM's temperature 0), for ReMax's baseline completion."""
    return SamplingParams(max_new_tokens=max_new_tokens, greedy=True)


class RolloutEngine(Protocol):
    def generate(self, prompt_ids: list[list[int]], n: int, params: SamplingParams) -> list[list[int]]:
        """Completions (token ids), prompt-major: [p0 s0, p0 s1, ..., p1 s0, ...]."""
        ...

    def sync_weights(self, model) -> None:
        """Make the engine sample from ``model``'s current weights (no-op when it holds the model)."""
        ...

    def sample(self, prompt_ids: list[list[int]], n: int, params: SamplingParams) -> Samples:
        """Completions with each token's log-prob under the sampler (pi_rollout) and the entropy of its distribution."""
        ...


def left_pad(seqs: list[list[int]], pad_id: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(ids, attention) (N, W) with each sequence right-aligned."""
    width = max(len(s) for s in seqs)
    ids = torch.full((len(seqs), width), pad_id, dtype=torch.long)  # (N, W)
    att = torch.zeros(len(seqs), width, dtype=torch.long)  # (N, W)
    for i, s in enumerate(seqs):
        if s:
            ids[i, width - len(s) :] = torch.tensor(s)
            att[i, width - len(s) :] = 1
    return ids, att


@dataclass
class Samples:
    """Sampled completions (prompt-major) and, per token, its log-prob and the entropy under the distribution
    it was sampled from (after temperature, top-k and top-p): log pi_rollout(y_t) and H_t.

    ``logprobs_untruncated``: each token's log-prob under the same tempered distribution before top-k / top-p, i.e. over
    the whole vocabulary; None where the engine does not return it (vLLM returns one logprobs_mode). Under truncation
    the sampled log-prob is this one minus log Z_kept, the log of the mass the truncation kept (TRL issue 6789).
    """

    tokens: list[list[int]]
    logprobs: list[list[float]]
    entropies: list[list[float]]
    logprobs_untruncated: list[list[float]] | None = None


def sampling_warpers(params: SamplingParams) -> list:
    """transformers' own logits warpers for the parameters, in generate's order: temperature, top-k, top-p."""
    return temperature_warpers(params) + truncation_warpers(params)


def temperature_warpers(params: SamplingParams) -> list:
    """transformers' temperature warper for the parameters ([] at temperature 1)."""
    from transformers.generation.logits_process import TemperatureLogitsWarper

    return [TemperatureLogitsWarper(params.temperature)] if params.temperature != 1.0 else []


def truncation_warpers(params: SamplingParams) -> list:
    """transformers' top-k and top-p warpers for the parameters, in generate's order ([] without truncation)."""
    from transformers.generation.logits_process import TopKLogitsWarper, TopPLogitsWarper

    warpers = []
    if params.top_k:
        warpers.append(TopKLogitsWarper(params.top_k))
    if params.top_p < 1.0:
        warpers.append(TopPLogitsWarper(params.top_p))
    return warpers


def truncates(params: SamplingParams) -> bool:
    """Whether sampling renormalises over part of the vocabulary (top-k or top-p)."""
    return bool(params.top_k) or params.top_p < 1.0


class HFGenerateEngine:
    """Sampling with the trainer's own transformers model and a KV cache; stops each row at EOS.

    The loop is ``generate``'s (a prefill, then one token a step, transformers' temperature / top-k / top-p warpers)
    run by ``dfpo.trainer.decode``, which keeps a step on the device: outputs go to preallocated buffers, a finished
    row is masked (and, with a dynamic cache, dropped at the next read back), tokens are drawn by inverse CDF from
    one uniform per (row, step), and every sampled token's log-prob and the entropy of its distribution are returned,
    so the trainer knows pi_rollout. ``decode`` chooses the cache, the read-back interval and the CUDA graph.

    Under autocast (``amp_dtype``) over wider master weights the step reads a ``policy.DecodeCopy`` of the linear
    weights in the autocast dtype, refreshed once a rollout, and a static cache holds its keys and values in that dtype
    (``autocast_static_cache``). The engine holds one static cache at a time (``_static_cache``): a rollout of other
    rows, or wider than the held cache, frees it (and its compiled steps) before allocating its own, so the memory a
    static cache takes is that of the largest rollout (``memory.memory_needs`` counts it), not the sum over shapes.
    """

    def __init__(
        self,
        model,
        pad_id: int,
        eos_ids: set[int],
        batch_size: int = 0,
        amp_dtype: torch.dtype | None = None,
        decode: DecodeOptions | None = None,
    ):
        self.model, self.pad_id, self.eos_ids, self.batch_size = model, pad_id, set(eos_ids), batch_size
        self.amp_dtype = amp_dtype
        self.device = next(model.parameters()).device
        self.resolved = (decode or DecodeOptions()).resolve(self.device)  # a choice the device cannot run fails here
        self._held: tuple[tuple[int, int], object] | None = None  # ((rows, width), the StaticCache reused across rollouts)
        self._graphs: dict[tuple, object] = {}  # (sampling, rows, width) -> the compiled decode step on the held cache
        self._copy = None  # the policy.DecodeCopy the steps read (None: the model itself)

    def sync_weights(self, model) -> None:
        """Sample from ``model`` (the trainer's model object itself: nothing to copy, unless it is another object, whose
        decoding copy and compiled steps are made anew)."""
        if model is not self.model:
            self._copy, self._graphs = None, {}
        self.model = model

    def generate(self, prompt_ids: list[list[int]], n: int, params: SamplingParams) -> list[list[int]]:
        """Completions (token ids), prompt-major, EOS kept when produced."""
        return self.sample(prompt_ids, n, params).tokens

    @torch.no_grad()
    def sample(self, prompt_ids: list[list[int]], n: int, params: SamplingParams, seeds: list[int] | None = None) -> Samples:
        """``n`` completions of every prompt with their sampler log-probs and entropies.

        ``seeds`` (one per prompt): completion j of prompt p draws its tokens from uniforms seeded by
        ``row_seed(seeds[p], j)``, so it does not depend on the other prompts sampled with it (None: the global RNG).
        """
        expanded = [p for p in prompt_ids for _ in range(n)]
        row_seeds = None if seeds is None else [row_seed(s, j) for s in seeds for j in range(n)]
        chunk = self.batch_size or len(expanded)
        was_training = self.model.training
        self.model.eval()
        decoder = self._decoder()  # the decoding copy refreshed with the current weights, once for the whole rollout
        out = Samples([], [], [], [])
        try:
            for start in range(0, len(expanded), chunk):
                part_seeds = None if row_seeds is None else row_seeds[start : start + chunk]
                part = self._sample_chunk(decoder, expanded[start : start + chunk], params, part_seeds)
                out.tokens += part.tokens
                out.logprobs += part.logprobs
                out.entropies += part.entropies
                out.logprobs_untruncated += part.logprobs_untruncated
        finally:
            self.model.train(was_training)
        return out

    def _decoder(self):
        """The module the decode steps run: the policy's ``DecodeCopy`` (made at the first rollout, refreshed at each)
        under autocast, where it holds the linear weights in the autocast dtype, or with a compiled step, where it
        carries no hook that asks for gradients; else, or where no copy can be made, the policy itself."""
        from .policy import decode_copy

        if self.amp_dtype is None and not self.resolved.graph:
            return self.model
        if self._copy is None:
            self._copy = decode_copy(self.model, self.amp_dtype) or False
        if self._copy is False:
            return self.model
        self._copy.refresh()
        return self._copy.model

    @property
    def decoding_module(self):
        """The module the last rollout decoded with (``_decoder``'s choice): the policy or its decoding copy."""
        return self._copy.model if self._copy else self.model

    @property
    def decode_copy_bytes(self) -> int:
        """Bytes held by the decoding copy of the weights (0: none)."""
        return self._copy.bytes if self._copy else 0

    def _sample_chunk(self, decoder, prompts: list[list[int]], params: SamplingParams, seeds: list[int] | None = None) -> Samples:
        device = self.device
        ids, att = left_pad(prompts, self.pad_id)  # (N, W)
        ids, att = ids.to(device), att.to(device)
        N, W, T = ids.shape[0], ids.shape[1], params.max_new_tokens
        uniforms = torch.zeros(N, T, dtype=torch.float64, device=device) if params.greedy else row_uniforms(N, T, seeds, device)
        tempering, truncating = temperature_warpers(params), truncation_warpers(params)
        if self.resolved.static_cache:
            cache = self._static_cache(N, static_cache_width(W, T))
            static_width = self._held[0][1]  # the held cache's width: at least W + T
        else:
            cache, static_width = self._dynamic_cache(), None
        keyword = cache_keyword(decoder)  # the KV cache, by the name this transformers takes it
        cache_kw = {keyword: cache}

        def forward(step_ids, mask, positions):  # (n, w) -> the last position's logits (n, V)
            return decoder(
                input_ids=step_ids, attention_mask=mask, position_ids=positions, use_cache=True, logits_to_keep=1, **cache_kw
            ).logits[:, -1]

        def step(step_ids, mask, positions, u) -> StepOut:
            return score_step(forward(step_ids, mask, positions), u, tempering, truncating, params.greedy)

        def run(graph: bool):
            # One autocast region around the whole loop: eager autocast caches its casts of float32 weights (those the
            # decoding copy leaves to it) until the region ends, so each is cast once a rollout, not once a step.
            with autocast(device, self.amp_dtype):
                return decode_loop(
                    step, self._graph_step(step, (sampling_key(params), N, static_width)) if graph else step, ids, att,
                    uniforms, eos=torch.tensor(sorted(self.eos_ids), device=device), pad_id=self.pad_id,
                    sync_every=self.resolved.sync_every, static_width=static_width,
                    drop_rows=None if static_width else cache_kw[keyword].batch_select_indices,
                )  # fmt: skip

        try:
            buffers, steps = run(self.resolved.graph)
        except Exception as err:  # noqa: BLE001 - whatever the compiled step raised: decode eagerly instead, once
            if not self.resolved.graph:
                raise
            self._graph_failed(err)
            # not on the cache that failed: it may hold a partial prefill, or tensors allocated in the failed call's dtypes
            cache_kw[keyword] = self._static_cache(N, static_width, fresh=True) if static_width else self._dynamic_cache()
            buffers, steps = run(False)
        tokens, logprobs, entropies, untruncated = read_back(buffers, steps, self.eos_ids)
        return Samples(tokens, logprobs, entropies, untruncated)

    def _dynamic_cache(self):
        from transformers import DynamicCache

        return DynamicCache(config=self.model.config)

    def _static_cache(self, rows: int, width: int, fresh: bool = False):
        """A StaticCache for ``rows`` rows at least ``width`` columns wide: the held one, reset, where it has those rows
        and is wide enough (``fresh``: never); else the held one and the steps compiled on it are freed first, and a new
        one is allocated (in the autocast dtype, ``autocast_static_cache``) and held."""
        if self._held is not None:
            (held_rows, held_width), cache = self._held
            if not fresh and held_rows == rows and held_width >= width:
                cache.reset()
                return cache
            self._held, self._graphs = None, {}  # the graphs replay on the held cache's tensors: they go with it
            del cache
        cache = autocast_static_cache(self.model.config, width, self.amp_dtype)
        self._held = ((rows, width), cache)
        return cache

    def _graph_failed(self, err: Exception) -> None:
        """The compiled decode step failed: say so in one line, naming the error at the root of what torch.compile
        raised, and decode eagerly from now on."""
        import warnings

        root = root_cause(err)
        first_line = (str(root).strip().splitlines() or [""])[0][:240]
        same = (
            "the same samples, without the compiled step"
            if self.amp_dtype is None
            else f"in {str(self.amp_dtype).removeprefix('torch.')} the eager step's log-probs differ from the compiled "
            "step's by round-off, about 2e-3, and a near-tie can draw another token"
        )
        warnings.warn(
            f"rollout.decode_graph: the decode step failed under torch.compile ({type(root).__name__}: {first_line}); this "
            f"rollout is decoded again eagerly on a fresh cache, and the next ones eagerly too ({same}); set "
            "rollout.decode_graph = 'off' to skip the attempt",
            RuntimeWarning,
            stacklevel=4,
        )
        self.resolved = dataclasses.replace(self.resolved, graph=False)
        self._graphs.clear()

    def _graph_step(self, step, key: tuple):
        """The decode step through torch.compile (``decode.graph_compile_options``: on CUDA a CUDA graph, captured once
        and replayed), one per (sampling parameters, batch rows, cache width). A compiled step keeps the closure of the
        rollout it was made in, whose cache is the held one (a new cache drops the compiled steps); each is compiled
        from its own copy of the step's code, so that torch.compile's cache of one code object never fills up with the
        shapes of a long run (past its recompile limit it would decode eagerly, saying nothing)."""
        if key not in self._graphs:
            fresh = types.FunctionType(step.__code__.replace(), step.__globals__, step.__name__, step.__defaults__, step.__closure__)
            self._graphs[key] = torch.compile(fresh, **graph_compile_options(self.device))
        compiled = self._graphs[key]

        def replay(*args):
            torch.compiler.cudagraph_mark_step_begin()  # the previous step's outputs were copied out: its buffers may be reused
            return compiled(*args)

        return replay


def sampling_key(params: SamplingParams) -> tuple:
    """What of the sampling parameters a compiled decode step depends on: not ``max_new_tokens`` (a step is the same
    whatever the number of steps), so rollouts of different lengths on one cache share one compiled step."""
    return (params.temperature, params.top_p, params.top_k, params.greedy)


def root_cause(err: BaseException) -> BaseException:
    """The exception at the end of ``err``'s chain of causes (what torch.compile wrapped, e.g. the operation's own
    RuntimeError inside a BackendCompilerFailed), or ``err`` itself."""
    seen = {id(err)}
    while err.__cause__ is not None and id(err.__cause__) not in seen:
        err = err.__cause__
        seen.add(id(err))
    return err


def autocast_static_cache(config, width: int, dtype: torch.dtype | None):
    """A transformers StaticCache of ``width`` columns whose layers hold keys and values in ``dtype`` (None: as they
    come). Under autocast over float32 weights a layer's keys come out in float32 (RoPE's cos/sin, Qwen3's k-norm) and
    its values in the autocast dtype; transformers 5.17 allocates both in the keys' dtype and its ``index_copy_`` then
    refuses the values, 5.25 holds float32 keys at twice the memory. Each layer here casts both to ``dtype`` before
    storing them (attention under autocast reads them in ``dtype`` either way)."""
    from transformers import StaticCache

    cache = StaticCache(config=config, max_cache_len=width)
    if dtype is not None:
        for layer in cache.layers:
            layer.__class__ = casting_layer(type(layer), dtype)
    return cache


@functools.cache
def casting_layer(base: type, dtype: torch.dtype) -> type:
    """``base`` (a transformers cache layer class) whose ``update`` casts the keys and values to ``dtype`` first."""

    def update(self, key_states, value_states, *args, **kwargs):
        return base.update(self, key_states.to(dtype), value_states.to(dtype), *args, **kwargs)

    return type(f"{base.__name__}In{str(dtype).removeprefix('torch.')}", (base,), {"update": update, "kv_dtype": dtype})


def cache_keyword(model) -> str:
    """The keyword a causal LM's ``forward`` takes its KV cache by: ``cache`` where it names one (transformers 5.24 on,
    which deprecates ``past_key_values`` with a FutureWarning until its removal in 5.40), else ``past_key_values``
    (transformers 4.56 to 5.23, and remote-code models written for them). A peft model is asked about its base model:
    its own ``forward`` passes the cache through ``**kwargs``."""
    base = model.get_base_model() if hasattr(model, "get_base_model") else model
    return "cache" if "cache" in inspect.signature(base.forward).parameters else "past_key_values"


def row_seed(*parts: int) -> int:
    """A 63-bit seed mixed from integers (seed, step, group, ...): distinct tuples give unrelated streams."""
    import hashlib

    digest = hashlib.blake2b("/".join(str(int(p)) for p in parts).encode(), digest_size=8).digest()
    return int.from_bytes(digest, "big") >> 1


def sampler_logp(samples: Samples, width: int) -> tuple[torch.Tensor, torch.Tensor]:
    """The sampler's per-token log-probs and entropies laid out like ``build_batch``'s mask: (B, width) each, 0 on padding.

    The log-probs are the untruncated ones where the engine returns them (``Samples.logprobs_untruncated``): pi_rollout as
    the same distribution the trainer computes pi_old from, so that a rollout correction's rho = pi_old / pi_rollout is the
    two computations' mismatch and not the truncation's kept mass; else the sampled ones."""
    logp = lay_out(samples.logprobs if samples.logprobs_untruncated is None else samples.logprobs_untruncated, width)  # (B, width)
    return logp, lay_out(samples.entropies, width)


def lay_out(values: list[list[float]], width: int) -> torch.Tensor:
    """Per-token values of each completion as (B, width) float32, 0 on padding."""
    out = torch.zeros(len(values), width)
    for i, row in enumerate(values):
        out[i, : min(len(row), width)] = torch.tensor(row[:width])
    return out


def log_kept_mass(samples: Samples, width: int, mask: torch.Tensor) -> float | None:
    """The mean over real tokens of log Z_kept = log pi_untruncated(y_t) - log pi_sampled(y_t) (<= 0; 0 without top-k /
    top-p): the bias a rollout correction would carry if it read the sampled log-probs. None when the engine returns no
    untruncated log-probs."""
    if samples.logprobs_untruncated is None or not bool(mask.any()):
        return None
    gap = lay_out(samples.logprobs_untruncated, width) - lay_out(samples.logprobs, width)  # (B, width)
    return float(gap[mask].mean())


@dataclass
class RolloutBatch:
    """Tensors of one rollout batch (B = prompts x G completions)."""

    input_ids: torch.Tensor  # (B, P + T)
    attention_mask: torch.Tensor  # (B, P + T)
    mask: torch.Tensor  # (B, T) bool, real completion tokens
    completion_ids: torch.Tensor  # (B, T), pad after the end
    group_ids: torch.Tensor  # (B,)
    truncated: torch.Tensor  # (B,) bool, hit max_new_tokens without EOS
    prompt_width: int

    def rows(self, index: torch.Tensor) -> RolloutBatch:
        return RolloutBatch(
            self.input_ids[index],
            self.attention_mask[index],
            self.mask[index],
            self.completion_ids[index],
            self.group_ids[index],
            self.truncated[index],
            self.prompt_width,
        )

    def trimmed(self) -> tuple[RolloutBatch, int]:
        """The same rows without the columns that are padding in every row: left padding of the prompts
        (all but the longest prompt's) and right padding of the completions. Returns (batch, completion width)."""
        P = self.prompt_width
        prompt_len = max(1, int(self.attention_mask[:, :P].sum(-1).max())) if P else 0
        width = max(1, int(self.attention_mask[:, P:].sum(-1).max()))  # completions are right-padded
        start = P - prompt_len
        return (
            RolloutBatch(
                self.input_ids[:, start : P + width],
                self.attention_mask[:, start : P + width],
                self.mask[:, :width],
                self.completion_ids[:, :width],
                self.group_ids,
                self.truncated,
                prompt_len,
            ),
            width,
        )


def build_batch(
    prompt_ids: list[list[int]], completions: list[list[int]], n: int, *, pad_id: int, eos_ids: set[int], max_new_tokens: int
) -> RolloutBatch:
    """Lay out prompt-major completions (n per prompt) as trainer tensors."""
    B = len(completions)
    prompts = [p for p in prompt_ids for _ in range(n)]
    p_ids, p_att = left_pad(prompts, pad_id)  # (B, P)
    T = max(1, max(len(c) for c in completions))
    c_ids = torch.full((B, T), pad_id, dtype=torch.long)  # (B, T)
    mask = torch.zeros(B, T, dtype=torch.bool)  # (B, T)
    truncated = torch.zeros(B, dtype=torch.bool)  # (B,)
    for i, c in enumerate(completions):
        if c:
            c_ids[i, : len(c)] = torch.tensor(c)
            mask[i, : len(c)] = True
        truncated[i] = len(c) >= max_new_tokens and (not c or c[-1] not in eos_ids)
    group_ids = torch.arange(len(prompt_ids)).repeat_interleave(n)  # (B,)
    return RolloutBatch(
        input_ids=torch.cat([p_ids, c_ids], dim=1),
        attention_mask=torch.cat([p_att, mask.long()], dim=1),
        mask=mask,
        completion_ids=c_ids,
        group_ids=group_ids,
        truncated=truncated,
        prompt_width=p_ids.shape[1],
    )


def autocast(device, dtype: torch.dtype | None):
    """torch.autocast on ``device`` with ``dtype``, or a no-op when dtype is None."""
    device = torch.device(device)
    return torch.autocast(device.type, dtype=dtype, enabled=dtype is not None)


def completion_logits(model, batch: RolloutBatch, device, amp_dtype: torch.dtype | None = None) -> torch.Tensor:
    """Logits predicting each completion token (B, T, V)."""
    att = batch.attention_mask.to(device)  # (B, L)
    position_ids = (att.cumsum(-1) - 1).clamp(min=0)  # (B, L) left padding aware
    with autocast(device, amp_dtype):
        out = model(input_ids=batch.input_ids.to(device), attention_mask=att, position_ids=position_ids, use_cache=False)
    P, T = batch.prompt_width, batch.mask.shape[1]
    return out.logits[:, P - 1 : P + T - 1]  # (B, T, V)


def token_logp(logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """log pi(y_t) (B, T) in float32 without materialising a second (B, T, V) tensor."""
    logits = logits.float()
    return logits.gather(-1, targets[..., None]).squeeze(-1) - torch.logsumexp(logits, dim=-1)  # (B, T)


@torch.no_grad()
def token_stats(logits: torch.Tensor, targets: torch.Tensor, max_elements: int = 2**27) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(entropy, pi(y_t), collision sum_n pi_n^2), each (B, T), no grad, in row chunks of at
    most ``max_elements`` logits (so a 150k vocabulary never needs a second full (B, T, V) copy)."""
    chunk = max(1, max_elements // max(1, logits.shape[1] * logits.shape[2]))
    ent, prob, coll = [], [], []
    for s in range(0, logits.shape[0], chunk):
        lp = torch.log_softmax(logits[s : s + chunk].detach().float(), dim=-1)  # (b, T, V)
        p = lp.exp()
        ent.append(-(p * lp).sum(-1))
        prob.append(p.gather(-1, targets[s : s + chunk, :, None]).squeeze(-1))
        coll.append((p * p).sum(-1))
    return torch.cat(ent), torch.cat(prob), torch.cat(coll)
