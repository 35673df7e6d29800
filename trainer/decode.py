"""The HF engine's decode loop, built to stay on the device.

One rollout chunk is a prefill and then one token a step. Everything a step computes stays on the device:

- the sampled tokens, their log-probs under the sampling distribution (pi_rollout), their log-probs before top-k /
  top-p and the entropy of the sampling distribution are written into preallocated (N, T) device buffers;
- a row that produced EOS is masked (its later outputs are not written), not removed, between reads back to the host;
- every ``sync_every`` steps the loop reads one number back (how many rows are still sampling): it stops when none is,
  and with a dynamic KV cache drops the rows that ended (on a CPU, ``sync_every = 1``: a row's compute stops at once);
- each row draws its token by inverse CDF from one uniform per (row, step), drawn before the loop from the row's own
  seed (or the global RNG): batched, with no Python loop over rows in a step, and reproducible whatever the batch;
- with a static KV cache (preallocated for prompt + max_new_tokens, rounded up to ``CACHE_BUCKET``) a step's shapes
  never change, so on CUDA the step can run as a CUDA graph (``torch.compile(mode="reduce-overhead")``).

The buffers are read back once, at the end.

``DFPO_CUDA_DEFAULTS=1`` (``cuda_defaults_forced``) makes a CPU take the choices CUDA would: a static cache read back
every 16 steps, the decode step through torch.compile (traced whole, ``fullgraph=True``, with the ``aot_eager`` backend:
CUDA graphs need CUDA), and, in ``policy.resolve_amp``, bf16 autocast over float32 master weights. It rehearses the GPU
path where no GPU is (CI's device-versions environment, ``scripts/gpu_checks.sh --rehearse``); it is slower than the
CPU's own choices and never the default.
"""

from __future__ import annotations

import math
import os
from collections.abc import Callable
from dataclasses import dataclass

import torch
from torch import Tensor

from .config import decode_graph_refused

CACHE_BUCKET = 64
"""A static cache's length is prompt width + max_new_tokens rounded up to this, so that rollouts whose prompts differ
a little in length reuse one compiled step."""

CUDA_DEFAULTS_ENV = "DFPO_CUDA_DEFAULTS"
"""The environment variable that makes a CPU take the CUDA defaults (``cuda_defaults_forced``)."""


def cuda_defaults_forced() -> bool:
    """Whether ``DFPO_CUDA_DEFAULTS`` is 1 (unset, empty or 0: not); any other value is one sentence."""
    value = os.environ.get(CUDA_DEFAULTS_ENV, "").strip()
    if value not in ("", "0", "1"):
        raise ValueError(
            f"{CUDA_DEFAULTS_ENV}={value!r}: set it to 1 to give a CPU the CUDA defaults (static KV cache, compiled decode "
            "step, bf16 autocast), or to 0 or nothing for the CPU's own"
        )
    return value == "1"


def graph_compile_options(device: torch.device) -> dict:
    """torch.compile's arguments for the decode step on ``device``: a CUDA graph on CUDA; on a CPU given the CUDA
    defaults, the whole step traced as one graph (a graph break, which would split a CUDA graph, is an error) and run
    by ``aot_eager``."""
    if device.type == "cuda":
        return dict(mode="reduce-overhead", dynamic=False)
    return dict(backend="aot_eager", fullgraph=True, dynamic=False)


@dataclass(frozen=True)
class DecodeOptions:
    """How the decode loop runs (``rollout.sync_every``, ``rollout.kv_cache``, ``rollout.decode_graph``)."""

    sync_every: int = 0
    kv_cache: str = "auto"
    decode_graph: str = "auto"

    @classmethod
    def from_config(cls, rollout) -> DecodeOptions:
        return cls(rollout.sync_every, rollout.kv_cache, rollout.decode_graph)

    def resolve(self, device: torch.device) -> ResolvedDecode:
        """The concrete choices on ``device`` (a CPU's are CUDA's under ``DFPO_CUDA_DEFAULTS=1``); a choice the device
        cannot run is one sentence."""
        forced = device.type == "cpu" and cuda_defaults_forced()
        on_cuda = device.type == "cuda" or forced
        static = self.kv_cache == "static" or (self.kv_cache == "auto" and on_cuda)
        if self.decode_graph == "on" and not (on_cuda and static):
            raise decode_graph_refused(f"the rollout runs on {device.type}" if not on_cuda else "rollout.kv_cache = 'dynamic'")
        graph = self.decode_graph == "on" or (self.decode_graph == "auto" and on_cuda and static)
        sync_every = self.sync_every or (1 if device.type == "cpu" and not forced else 16)
        return ResolvedDecode(sync_every=sync_every, static_cache=static, graph=graph)


@dataclass(frozen=True)
class ResolvedDecode:
    sync_every: int
    static_cache: bool
    graph: bool


@dataclass
class DecodeBuffers:
    """Per-row, per-step outputs of the decode loop, on the device, each (N, T)."""

    tokens: Tensor  # (N, T) long, pad after a row's EOS
    logp: Tensor  # (N, T) float32, log pi_rollout(y_t) under the sampling distribution
    logp_full: Tensor  # (N, T) float32, the same before top-k / top-p
    entropy: Tensor  # (N, T) float32, entropy of the sampling distribution

    @classmethod
    def empty(cls, rows: int, steps: int, pad_id: int, device) -> DecodeBuffers:
        zeros = lambda: torch.zeros(rows, steps, device=device)  # noqa: E731
        return cls(torch.full((rows, steps), pad_id, dtype=torch.long, device=device), zeros(), zeros(), zeros())

    def write(self, rows: slice | Tensor, step: int, live: Tensor, out: StepOut, pad_id: int) -> None:
        """Row ``rows[i]``'s outputs of ``step`` where ``live[i]`` (it had not ended); ended rows keep pad / 0."""
        self.tokens[rows, step] = torch.where(live, out.tokens, pad_id)  # (n,)
        self.logp[rows, step] = torch.where(live, out.logp, 0.0)
        self.logp_full[rows, step] = torch.where(live, out.logp_full, 0.0)
        self.entropy[rows, step] = torch.where(live, out.entropy, 0.0)


@dataclass
class StepOut:
    """One decode step's results, each (n,)."""

    tokens: Tensor
    logp: Tensor
    logp_full: Tensor
    entropy: Tensor


def row_uniforms(rows: int, steps: int, seeds: list[int] | None, device) -> Tensor:
    """One uniform in [0, 1) per (row, step), float64 (N, T): row i's from its own generator seeded by ``seeds[i]``
    (drawn on the CPU, so a seed gives the same draws on every device), else from the global RNG of ``device``."""
    if seeds is None:
        return torch.rand(rows, steps, dtype=torch.float64, device=device)  # (N, T)
    table = torch.stack([torch.rand(steps, dtype=torch.float64, generator=torch.Generator().manual_seed(s)) for s in seeds])
    return table.to(device)  # (N, T)


def inverse_cdf_draw(probs: Tensor, u: Tensor) -> Tensor:
    """Token i of each row with probability probs[i] / sum(probs): the first index whose float64 cumulative mass
    exceeds u * total, for u uniform in [0, 1). A token of zero mass is never drawn. probs (n, V), u (n,) -> (n,)"""
    cdf = probs.double().cumsum(-1)  # (n, V)
    target = u.to(cdf.dtype) * cdf[:, -1]  # (n,) in [0, total)
    return torch.searchsorted(cdf, target[:, None], right=True).squeeze(-1).clamp_(max=probs.shape[-1] - 1)  # (n,)


def score_step(logits: Tensor, u: Tensor, tempering: list, truncating: list, greedy: bool) -> StepOut:
    """The next token of each row and its statistics from the last position's logits (n, V): transformers' warpers
    (temperature, then top-k / top-p), a draw by inverse CDF from u (n,) (argmax when greedy), the token's log-prob
    under the sampling distribution and before truncation, and the sampling distribution's entropy."""
    scores = logits.float()  # (n, V)
    for warp in tempering:
        scores = warp(None, scores)
    tempered = scores  # (n, V) before top-k / top-p
    for warp in truncating:
        scores = warp(None, scores)
    logp_all = torch.log_softmax(scores, dim=-1)  # (n, V); -inf where a warper removed a token
    probs = logp_all.exp()  # (n, V)
    tokens = logp_all.argmax(-1) if greedy else inverse_cdf_draw(probs, u)  # (n,)
    chosen = logp_all.gather(-1, tokens[:, None]).squeeze(-1)  # (n,)
    full = torch.log_softmax(tempered, dim=-1).gather(-1, tokens[:, None]).squeeze(-1) if truncating else chosen  # (n,)
    entropy = -torch.where(logp_all > -math.inf, probs * logp_all, 0.0).sum(-1)  # (n,)
    return StepOut(tokens, chosen, full, entropy)


def round_up(n: int, to: int) -> int:
    return -(-n // to) * to


def static_cache_width(prompt_width: int, max_new_tokens: int) -> int:
    """The columns of a static cache for prompts of ``prompt_width`` and ``max_new_tokens`` new tokens: their sum
    rounded up to ``CACHE_BUCKET``."""
    return round_up(prompt_width + max_new_tokens, CACHE_BUCKET)


@dataclass
class DecodeState:
    """What the loop carries between steps. ``rows`` are the buffer rows still in the batch: ``slice(None)`` while
    that is all N (always, with a static cache: indexing by it is a view, not a gather), else an index (n,);
    ``ended`` (N,) marks rows that produced EOS; ``att`` (n, L) is the attention mask over the cache's columns."""

    rows: slice | Tensor
    ended: Tensor
    att: Tensor
    prompt_len: Tensor  # (n,)


StepFn = Callable[[Tensor, Tensor, Tensor, Tensor], StepOut]
"""(input ids (n, w), attention mask, position ids (n, w), uniforms (n,)) -> the step's outputs."""


def decode_loop(
    prefill_fn: StepFn,
    step_fn: StepFn,
    prompt_ids: Tensor,
    prompt_att: Tensor,
    uniforms: Tensor,
    *,
    eos: Tensor,
    pad_id: int,
    sync_every: int,
    static_width: int | None,
    drop_rows: Callable[[Tensor], None] | None,
) -> tuple[DecodeBuffers, int]:
    """Run the prefill (``prefill_fn``, step 0) and then ``step_fn`` up to T = uniforms.shape[1] steps in all; returns
    the buffers and the steps run.

    ``static_width``: the static cache's length L (the attention mask spans it from the start), or None for a dynamic
    cache (the mask grows a column a step). ``drop_rows(index)``: keeps only those rows of a dynamic cache (None: rows
    are never removed). Reads back to the host: one every ``sync_every`` steps, none in between.
    prompt_ids, prompt_att (N, W); uniforms (N, T); eos (E,)."""
    N, W = prompt_ids.shape
    T = uniforms.shape[1]
    device = prompt_ids.device
    width = static_width or (W + T)
    att = torch.zeros(N, width, dtype=prompt_att.dtype, device=device)  # (N, L)
    att[:, :W] = prompt_att
    state = DecodeState(slice(None), torch.zeros(N, dtype=torch.bool, device=device), att, prompt_att.sum(-1))
    buffers = DecodeBuffers.empty(N, T, pad_id, device)
    step_ids, positions = prompt_ids, (prompt_att.cumsum(-1) - 1).clamp(min=0)  # (N, W)
    for step in range(T):
        visible = state.att if static_width else state.att[:, : W + step]  # (n, L) or (n, W + step)
        out = (step_fn if step else prefill_fn)(step_ids, visible, positions, uniforms[state.rows, step])
        next_tokens = out.tokens  # (n,)
        live = ~state.ended[state.rows]  # (n,) rows that had not ended before this step
        buffers.write(state.rows, step, live, out, pad_id)
        ended = ~live | torch.isin(next_tokens, eos)  # (n,) rows that have ended by now
        state.ended[state.rows] = ended
        if step + 1 == T:
            return buffers, T
        if (step + 1) % sync_every == 0:
            sampling = ~ended  # (n,)
            still = int(sampling.sum())  # the one read back of this step
            if still == 0:
                return buffers, step + 1
            if drop_rows is not None and still < len(sampling):
                keep = sampling.nonzero().flatten()  # (n',)
                drop_rows(keep)
                rows = keep if isinstance(state.rows, slice) else state.rows[keep]  # (n',)
                state = DecodeState(rows, state.ended, state.att[keep], state.prompt_len[keep])
                next_tokens, ended = next_tokens[keep], ended[keep]
        state.att[:, W + step] = 1  # the column of the token fed next
        step_ids = torch.where(ended, pad_id, next_tokens)[:, None]  # (n, 1) an ended row is fed pad
        positions = (state.prompt_len + step)[:, None]  # (n, 1)
    return buffers, T


def read_back(buffers: DecodeBuffers, steps: int, eos_ids: set[int]) -> tuple[list[list[int]], ...]:
    """The buffers as per-row lists, each cut after the row's first EOS (or at ``steps``): four reads back in all."""
    tokens = buffers.tokens[:, :steps].tolist()
    logp = buffers.logp[:, :steps].tolist()
    full = buffers.logp_full[:, :steps].tolist()
    entropy = buffers.entropy[:, :steps].tolist()
    lengths = [len(cut_at_eos(row, eos_ids)[0]) for row in tokens]
    cut = lambda rows: [r[:n] for r, n in zip(rows, lengths)]  # noqa: E731
    return cut(tokens), cut(logp), cut(entropy), cut(full)


def cut_at_eos(ids: list[int], eos_ids: set[int]) -> tuple[list[int], bool]:
    """Tokens up to and including the first EOS; (tokens, ended_with_eos)."""
    for j, t in enumerate(ids):
        if t in eos_ids:
            return ids[: j + 1], True
    return ids, False
