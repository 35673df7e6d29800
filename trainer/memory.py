"""What memory a config certainly needs, checked against what the machine has before any work starts.

``memory_needs`` (pure) turns the settings and the model's shape into the bytes that must be held at the same
time, each attributed to the settings that drive it; ``check_memory`` refuses a run whose needs exceed the
memory available, in one sentence naming the dominant settings and their values. Without this a setting such as
``model.sft_batch_size = 1000000000`` or ``rollout.prompts_per_step = 100000000`` passes validation and the run
then grows its memory with no message until the machine kills it.

The estimate is a lower bound, so that a run it refuses cannot fit, and a run that fits is never refused:

- weights (and the reference model of a KL term without LoRA): parameters x bytes per parameter;
- under autocast over wider master weights, the HF engine's decoding copy of the linear weights in the autocast dtype
  (``policy.DecodeCopy``: every weight but the embedding's and the norms', the tied head included);
- training state: gradients and AdamW's two moments, 3 x the trainable parameters' bytes (LoRA adapters: 0);
- the largest of the phases, which never overlap:
  - the tiny preset's supervised warm start: ``model.sft_batch_size`` rows of at least 2 tokens, their float32
    logits and the logits' gradient (2 x rows x tokens x vocab x 4 bytes) and the layers' activations;
  - sampling: the key/value cache of the completions sampled at once (``rollout.prompts_per_step`` x
    ``rollout.group_size`` per process, at most ``rollout.batch_size`` when set; evaluation: ``data.eval_size`` x
    ``eval.k``), each at least the shortest prompt plus one token long, and the token ids of the rollout batch; a
    static cache (CUDA's default) is allocated whole at once, ``static_width`` columns a row (the shortest prompt
    plus rollout.max_new_tokens, rounded up as the engine does), and held between rollouts, through the update: it is
    counted as held the whole run, the larger of sampling's and evaluation's (the engine holds one at a time, freeing
    it before a rollout of another shape, so the two never add up);
  - the update: the activations a backward pass keeps for one micro-batch (whole groups: ``optim.microbatch_groups``,
    else ``optim.minibatch_groups``, x ``rollout.group_size`` rows), each row at least the shortest prompt plus
    one token long; one layer's input only with gradient checkpointing.

Left out (so that it stays a lower bound): attention scores, the logits the trainer computes in chunks, the
allocator's overhead, the framework's own memory. Standard library only; ``available_memory`` reads the device.
"""

from __future__ import annotations

import math
import sys
from dataclasses import dataclass
from pathlib import Path

PARAM_BYTES = {"float32": 4, "bfloat16": 2, "float16": 2}


@dataclass(frozen=True)
class ModelShape:
    """The sizes of a decoder-only transformer the estimate reads."""

    params: int
    vocab: int
    hidden: int
    intermediate: int
    layers: int
    kv_width: int
    """Key/value heads x head dimension: the width of one layer's cached keys (and values) per token."""
    tied: bool = False
    """The LM head is the embedding matrix."""


def decoder_params(vocab: int, hidden: int, intermediate: int, layers: int, q_width: int, kv_width: int, tied: bool) -> int:
    """Parameters of a Llama/Qwen-style decoder: embeddings (and an untied LM head), per layer the attention
    projections with their biases, a gated MLP and two norms, and the final norm."""
    attention = hidden * q_width + 2 * hidden * kv_width + q_width * hidden + q_width + 2 * kv_width
    mlp = 3 * hidden * intermediate
    return vocab * hidden * (1 if tied else 2) + layers * (attention + mlp + 2 * hidden) + hidden


def tiny_shape(mcfg, vocab: int) -> ModelShape:
    """The tiny preset's shape (``policy.build_tiny_model``: Qwen2, tied embeddings, half as many key/value heads)."""
    head_dim = mcfg.tiny_hidden // mcfg.tiny_heads
    kv_width = max(1, mcfg.tiny_heads // 2) * head_dim
    params = decoder_params(vocab, mcfg.tiny_hidden, mcfg.tiny_intermediate, mcfg.tiny_layers, mcfg.tiny_hidden, kv_width, tied=True)
    return ModelShape(params, vocab, mcfg.tiny_hidden, mcfg.tiny_intermediate, mcfg.tiny_layers, kv_width, tied=True)


def pretrained_shape(config) -> ModelShape | None:
    """A transformers config's shape (None when it does not name the sizes of a decoder)."""
    try:
        hidden, layers, vocab = int(config.hidden_size), int(config.num_hidden_layers), int(config.vocab_size)
        heads = int(config.num_attention_heads)
    except (AttributeError, TypeError, ValueError):
        return None
    head_dim = int(getattr(config, "head_dim", None) or hidden // max(1, heads))
    kv_width = int(getattr(config, "num_key_value_heads", None) or heads) * head_dim
    intermediate = int(getattr(config, "intermediate_size", None) or 4 * hidden)
    tied = bool(getattr(config, "tie_word_embeddings", False))
    params = decoder_params(vocab, hidden, intermediate, layers, heads * head_dim, kv_width, tied)
    return ModelShape(params, vocab, hidden, intermediate, layers, kv_width, tied)


def linear_params(shape: ModelShape) -> int:
    """Parameters of the linear layers (attention, MLP and the LM head, tied or not): all but the embedding's, unless
    it is the head, and the norms'."""
    norms = (2 * shape.layers + 1) * shape.hidden
    return shape.params - (0 if shape.tied else shape.vocab * shape.hidden) - norms


@dataclass(frozen=True)
class Need:
    """Bytes that must be held, what for, and the settings that drive them."""

    what: str
    bytes: int
    settings: tuple[tuple[str, object], ...]
    phase: str = ""
    """'' for what is held the whole run; else the phase (phases never overlap: the largest counts)."""


def _model_settings(cfg) -> tuple[tuple[str, object], ...]:
    """The settings the model's size comes from: model.name, or the tiny preset's dimension furthest above its default."""
    m = cfg.model
    if m.name != "tiny":
        return (("model.name", m.name),)
    default = type(m)()
    key = max(("tiny_hidden", "tiny_intermediate", "tiny_layers"), key=lambda k: getattr(m, k) / getattr(default, k))
    return ((f"model.{key}", getattr(m, key)),)


@dataclass(frozen=True)
class _Sizes:
    """Bytes per unit that every phase reads: per parameter, per cached token, per token of activations."""

    param: int
    kv_per_token: int
    activations_per_token: int


def _sizes(cfg, shape: ModelShape, amp_bytes: int = 0) -> _Sizes:
    m = cfg.model
    param = 4 if m.name == "tiny" or m.dtype == "auto" else PARAM_BYTES[m.dtype]
    act = amp_bytes or (2 if m.amp in ("bf16", "fp16") else param)
    per_token_layer = shape.hidden if m.gradient_checkpointing else 4 * shape.hidden + 3 * shape.intermediate
    return _Sizes(param, shape.layers * 2 * shape.kv_width * act, shape.layers * per_token_layer * act)


def _rows_at_once(rows: int, batch_size: int, settings: tuple) -> tuple[int, tuple]:
    """Rows sampled in one generate call: all of them, or ``rollout.batch_size`` when that is fewer (then it is the
    setting to name)."""
    if batch_size and batch_size < rows:
        return batch_size, (("rollout.batch_size", batch_size),)
    return rows, settings


def _warm_start(cfg, shape: ModelShape, sizes: _Sizes) -> Need:
    m = cfg.model
    tokens = m.sft_batch_size * 2  # a prompt token, and the answer's first token or the EOS
    return Need(
        "the supervised warm start's logits and activations",
        tokens * (2 * shape.vocab * 4 + sizes.activations_per_token),  # float32 logits and their gradient
        (("model.sft_batch_size", m.sft_batch_size),),
        "warm start",
    )


def _sampling_rows(cfg, world: int) -> tuple[int, tuple, int]:
    """(rows sampled at once, the settings that set them, the rollout batch's rows per process)."""
    r = cfg.rollout
    batch_rows = math.ceil(r.prompts_per_step / world) * r.group_size
    rows, settings = _rows_at_once(
        batch_rows, r.batch_size, (("rollout.prompts_per_step", r.prompts_per_step), ("rollout.group_size", r.group_size))
    )
    return rows, settings, batch_rows


def _evaluation_rows(cfg, world: int) -> tuple[int, tuple]:
    """(rows evaluated at once, the settings that set them)."""
    all_rows = math.ceil(cfg.data.eval_size / world) * cfg.eval.k
    return _rows_at_once(all_rows, cfg.rollout.batch_size, (("data.eval_size", cfg.data.eval_size), ("eval.k", cfg.eval.k)))


def _sampling(cfg, shape: ModelShape, sizes: _Sizes, seq: int, world: int, cached: int) -> Need:
    """Sampling's phase: the KV cache of ``cached`` positions a row (0: a static cache, counted as held), the log-probs,
    the last logits and the batch's ids."""
    rows, settings, batch_rows = _sampling_rows(cfg, world)
    batch_ids = batch_rows * world * seq * 8  # every process holds the whole batch's int64 ids
    cache = rows * cached * sizes.kv_per_token + rows * seq * 4 + rows * shape.vocab * 4  # keys, values; log-probs; last logits
    return Need(f"sampling {rows} completions at once", cache + batch_ids, settings, "sampling")


def _evaluation(cfg, shape: ModelShape, sizes: _Sizes, world: int, cached: int) -> Need:
    rows, settings = _evaluation_rows(cfg, world)
    return Need(
        f"evaluating {rows} completions at once", rows * cached * sizes.kv_per_token + rows * shape.vocab * 4, settings, "evaluation"
    )


def _static_cache(cfg, sizes: _Sizes, width: int, world: int) -> Need:
    """The static KV cache the engine holds between rollouts, through the update too: one at a time, so the larger of
    sampling's and evaluation's, each row ``width`` columns."""
    held = [_sampling_rows(cfg, world)[:2]]
    if cfg.eval.every:
        held.append(_evaluation_rows(cfg, world))
    rows, settings = max(held, key=lambda h: h[0])
    return Need(f"the static KV cache of {rows} completions x {width} positions", rows * width * sizes.kv_per_token, settings)


def _update(cfg, sizes: _Sizes, seq: int, world: int) -> Need:
    o, g = cfg.optim, cfg.rollout.group_size
    if o.max_tokens_per_microbatch:  # micro-batches of whole groups under a token budget: one group at the least
        rows, settings = g, (("rollout.group_size", g),)
    else:
        groups = o.microbatch_groups or o.minibatch_groups
        key = "optim.microbatch_groups" if o.microbatch_groups else "optim.minibatch_groups"
        rows, settings = max(1, math.ceil(groups / world)) * g, ((key, groups), ("rollout.group_size", g))
    return Need(f"the update's activations for {rows} rows", rows * seq * sizes.activations_per_token, settings, "update")


def memory_needs(
    cfg,
    shape: ModelShape,
    *,
    shortest_prompt: int,
    with_ref: bool,
    world: int = 1,
    resume: bool = False,
    static_width: int = 0,
    amp_bytes: int = 0,
) -> list[Need]:
    """What a run of ``cfg`` on a model of ``shape`` holds in memory at the least, per process (see the module
    docstring). ``shortest_prompt``: tokens of the shortest encoded prompt; ``with_ref``: the objective has a KL term;
    ``static_width``: the columns of the rollouts' static KV cache at the least (0: a dynamic cache, which grows);
    ``amp_bytes``: bytes of the autocast dtype the run resolved (0: none, or as ``model.amp`` names it)."""
    m, sizes = cfg.model, _sizes(cfg, shape, amp_bytes)
    model_settings = _model_settings(cfg)
    weights = shape.params * sizes.param
    needs = [Need("the weights", weights, model_settings)]
    if amp_bytes and amp_bytes < sizes.param and cfg.rollout.engine == "hf":
        copy = Need("the decoding copy of the linear weights in the autocast dtype", linear_params(shape) * amp_bytes, model_settings)
        needs.append(copy)
    if with_ref and m.lora_r <= 0:
        needs.append(Need("the reference model", weights, model_settings))
    if m.lora_r <= 0:  # LoRA's adapters are left out (a lower bound)
        needs.append(Need("the gradients and AdamW state", 3 * weights, model_settings))
    if m.name == "tiny" and m.sft_steps > 0 and not resume:
        needs.append(_warm_start(cfg, shape, sizes))
    seq = shortest_prompt + 1
    cached = 0 if static_width else seq  # a row's cached positions in a phase (a static cache is held: counted below)
    if static_width:
        needs.append(_static_cache(cfg, sizes, max(seq, static_width), world))
    needs.append(_sampling(cfg, shape, sizes, seq, world, cached))
    if cfg.eval.every:
        needs.append(_evaluation(cfg, shape, sizes, world, cached))
    needs.append(_update(cfg, sizes, seq, world))
    return needs


def total_bytes(needs: list[Need]) -> int:
    """What is held the whole run plus the largest phase."""
    phases = [n.bytes for n in needs if n.phase]
    return sum(n.bytes for n in needs if not n.phase) + max(phases, default=0)


def human_bytes(n: float) -> str:
    """1536 -> '1.5 KiB', 3e12 -> '2.7 TiB'."""
    for unit in ("B", "KiB", "MiB", "GiB", "TiB", "PiB"):
        if n < 1024 or unit == "PiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return f"{n:.1f} PiB"


def check_memory(needs: list[Need], available: int | None, where: str, processes: int = 1) -> None:
    """ValueError naming the need that weighs most, its settings and values, unless ``needs`` (of each of
    ``processes`` sharing the memory) fit in ``available`` bytes (None: unknown, nothing checked). ``where``: the
    memory's name in the message ('RAM', 'cuda:0')."""
    total = total_bytes(needs) * processes
    if available is None or total <= available:
        return
    top = max(needs, key=lambda n: n.bytes)
    named = " and ".join(f"{k}={v}" for k, v in top.settings)
    raise ValueError(
        f"{named}: at least {human_bytes(top.bytes)} for {top.what}, {human_bytes(total)} for the whole run, more than "
        f"the {human_bytes(available)} of {where} available; lower {' or '.join(k for k, _ in top.settings)}"
    )


def available_memory(device) -> tuple[int | None, str]:
    """(bytes free now, its name) on ``device``: a CUDA device's free memory, else the machine's available RAM
    (Linux's MemAvailable); (None, ...) when unknown."""
    if getattr(device, "type", "cpu") == "cuda":
        import torch  # deferred: this module stays light (the device is known only once torch is loaded)

        free, _ = torch.cuda.mem_get_info(device)
        return int(free), str(device)
    if not sys.platform.startswith("linux"):
        return None, "RAM"
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) * 1024, "RAM"
    except (OSError, ValueError, IndexError):
        pass
    return None, "RAM"
