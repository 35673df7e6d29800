"""The HF engine's decode step: reads back to the host, operations dispatched, and (on CUDA) time against its floor.

    python benchmarks/decode_step.py                      # CPU, a tiny Qwen3-shaped model: the counts
    python benchmarks/decode_step.py --device cuda        # a Qwen3-0.6B-shaped model, 64 rows: counts, times, floor

For each way the decode loop can run (a dynamic cache dropping ended rows at every step, the CPU default; a static
cache read back every 16 steps, eager; the same through torch.compile(mode="reduce-overhead"), the CUDA default),
one line with:

- host reads / step: calls of .item / .tolist / bool() / int() / .cpu() ... per decode step, from two rollouts of
  different lengths (the difference over the extra steps; the goal is 1 / sync_every: none between reads);
- ops / step (on a CPU): aten operations dispatched per decode step outside the model's forward (the sampler's own
  work: warpers, the draw, buffer writes), and inside it (the model's); on CUDA not counted (nan): a dispatch mode
  would send the compiled step back through the compiler;
- on CUDA: ms / step, the median over rollouts of (time of a long rollout - time of a short one) / extra steps, and
  its ratio to the memory floor: the bytes a step must read at least (every weight once in the autocast dtype, and
  the KV cache written so far, at the rollout's mean length) over the device's copy bandwidth (measured here, with a
  large device-to-device copy). The goal: within 4x of the floor.

No row ever ends (the EOS id is outside the vocabulary), so every row decodes every step. Weights are random.
Both rollouts of a mode run on one cache (--prompt-len + --long within the same multiple of 64 columns as
--prompt-len + --short: checked) and so on one compiled step: the graph column says how many were compiled (1).
With DFPO_CUDA_DEFAULTS=1 a CPU runs CUDA's choices (bf16 autocast, static+graph compiled with aot_eager), the
rehearsal of scripts/gpu_checks.sh --rehearse; its ops are not counted for static+graph.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

import torch

from dfpo.trainer.model_shapes import QWEN3_06B

ROOT = Path(__file__).resolve().parents[1]
FLOOR_GOAL = 4.0
"""The issue's goal: a decode step within 4x of its memory floor."""

TINY = dict(
    vocab_size=4096, hidden_size=64, intermediate_size=192, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2, head_dim=16
)
"""A Qwen3-shaped model small enough to count on a CPU in seconds."""

MODES = {
    "dynamic": dict(kv_cache="dynamic", sync_every=1, decode_graph="off"),
    "static": dict(kv_cache="static", sync_every=16, decode_graph="off"),
    "static+graph": dict(kv_cache="static", sync_every=16, decode_graph="on"),
}
"""How the decode loop can run (rollout.kv_cache, rollout.sync_every, rollout.decode_graph)."""


def qwen3_shape(shape: str) -> dict:
    """The config of ``shape``: 'qwen3-0.6b' (``dfpo.trainer.model_shapes.QWEN3_06B``) or 'tiny'."""
    if shape == "tiny":
        return dict(TINY, max_position_embeddings=4096, tie_word_embeddings=True)
    return dict(QWEN3_06B)


def build(shape: str, device: str):
    """A random-init Qwen3ForCausalLM of ``shape`` in float32 (the trainer's master weights) on ``device``."""
    from transformers import Qwen3Config, Qwen3ForCausalLM

    torch.manual_seed(0)
    return Qwen3ForCausalLM(Qwen3Config(**qwen3_shape(shape))).float().to(device).eval()


def weight_bytes(model, dtype: torch.dtype) -> int:
    """Bytes of every parameter once in ``dtype`` (a tied head counted once)."""
    return sum(p.numel() for p in model.parameters()) * dtype.itemsize


def kv_bytes(model, rows: int, length: float, dtype: torch.dtype) -> float:
    """Bytes of the K and V cache of ``rows`` rows of ``length`` positions in ``dtype``."""
    c = model.config
    head_dim = getattr(c, "head_dim", None) or c.hidden_size // c.num_attention_heads
    return 2 * c.num_hidden_layers * c.num_key_value_heads * head_dim * rows * length * dtype.itemsize


def copy_bandwidth(device: str, mib: int = 1024) -> float:
    """Bytes per second of a device-to-device copy (read + write) of ``mib`` MiB, best of 5."""
    src = torch.empty(mib * 2**20, dtype=torch.uint8, device=device)
    dst = torch.empty_like(src)
    best = float("inf")
    for _ in range(5):
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        dst.copy_(src)
        torch.cuda.synchronize()
        best = min(best, time.perf_counter() - t0)
    return 2 * src.numel() / best


def compiled_steps(engine) -> int:
    """How many decode steps the engine compiled (one per sampling parameters, rows and cache width)."""
    return len(engine._graphs)


def engine_for(model, mode: str, amp):
    from dfpo.trainer.decode import DecodeOptions
    from dfpo.trainer.sampler import HFGenerateEngine

    eos = {model.config.vocab_size}  # outside the vocabulary: no row ends
    return HFGenerateEngine(model, pad_id=0, eos_ids=eos, amp_dtype=amp, decode=DecodeOptions(**MODES[mode]))


def counts_per_step(engine, model, prompts, short: int, long: int, count_ops: bool = True) -> tuple[float, float, float]:
    """(host reads, ops outside the model, ops inside it) per decode step, from rollouts of ``short`` and ``long`` steps
    (the ops NaN when not ``count_ops``)."""
    from dfpo.trainer.decode_counts import DispatchCounter, count_host_reads
    from dfpo.trainer.sampler import SamplingParams

    seeds = list(range(len(prompts)))
    reads, other, inside = {}, {}, {}
    for steps in (short, long):
        engine.sample(prompts, 1, SamplingParams(max_new_tokens=steps), seeds=seeds)  # warm (a graph compiles here)
        with count_host_reads() as got:
            engine.sample(prompts, 1, SamplingParams(max_new_tokens=steps), seeds=seeds)
        reads[steps] = sum(got.values())
        if not count_ops:  # a dispatch mode would send a compiled step back through dynamo, and slows a GPU run
            continue
        counter = DispatchCounter().watch(engine.decoding_module)  # the policy, or the decoding copy its steps run
        with counter:
            engine.sample(prompts, 1, SamplingParams(max_new_tokens=steps), seeds=seeds)
        counter.remove_hooks()
        other[steps], inside[steps] = sum(counter.other.values()), sum(counter.model.values())
    extra = long - short
    per_step = lambda d: (d[long] - d[short]) / extra if d else float("nan")  # noqa: E731
    return per_step(reads), per_step(other), per_step(inside)


def ms_per_step(engine, prompts, short: int, long: int, repeats: int) -> float:
    """Median over ``repeats`` of (a ``long``-step rollout's time - a ``short`` one's) / (long - short), in ms."""
    from dfpo.trainer.sampler import SamplingParams

    seeds = list(range(len(prompts)))

    def timed(steps):
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        engine.sample(prompts, 1, SamplingParams(max_new_tokens=steps), seeds=seeds)
        torch.cuda.synchronize()
        return time.perf_counter() - t0

    timed(short), timed(long)  # warm
    return statistics.median((timed(long) - timed(short)) / (long - short) for _ in range(repeats)) * 1e3


def floor_ms(model, rows: int, prompt_len: int, long: int, amp, bandwidth: float) -> float:
    """The memory floor of a decode step in ms: weights once in the compute dtype + the KV cache at the mean length."""
    dtype = amp or torch.float32
    mean_len = prompt_len + long / 2
    return (weight_bytes(model, dtype) + kv_bytes(model, rows, mean_len, dtype)) / bandwidth * 1e3


def parse(argv):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--device", default="cpu", choices=["cpu", "cuda"])
    p.add_argument("--shape", choices=["tiny", "qwen3-0.6b"], help="default: qwen3-0.6b on cuda, tiny on cpu")
    p.add_argument("--rows", type=int, default=64, help="rows decoded at once (default 64: 8 prompts x G = 8)")
    p.add_argument("--prompt-len", type=int, default=64)
    p.add_argument("--short", type=int, default=16, help="steps of the short rollout (default 16)")
    p.add_argument("--long", type=int, default=48, help="steps of the long rollout (default 48)")
    p.add_argument("--repeats", type=int, default=2)
    p.add_argument(
        "--modes", nargs="+", choices=list(MODES),
        help="default: dynamic and static on cpu; on cuda static+graph (the default there), static, dynamic, in that order, so a time limit cuts the least used",
    )  # fmt: skip
    args = p.parse_args(argv)
    if args.long <= args.short or args.short < 1 or args.rows < 1 or args.prompt_len < 1:
        p.error(
            f"need 1 <= --short < --long and --rows, --prompt-len >= 1; got --short {args.short} --long {args.long} --rows {args.rows} --prompt-len {args.prompt_len}"
        )
    if args.device == "cuda" and not torch.cuda.is_available():
        p.error(
            "--device cuda: no CUDA device is visible to torch on this machine; run it on a GPU machine (scripts/gpu_checks.sh) or use --device cpu"
        )
    from dfpo.trainer.decode import CACHE_BUCKET, cuda_defaults_forced, static_cache_width

    args.cuda_choices = args.device == "cuda" or cuda_defaults_forced()
    if args.modes and "static+graph" in args.modes and not args.cuda_choices:
        p.error("--modes static+graph captures a CUDA graph: it needs --device cuda (or DFPO_CUDA_DEFAULTS=1 to rehearse it on the CPU)")
    args.shape = args.shape or ("qwen3-0.6b" if args.device == "cuda" else "tiny")
    args.modes = args.modes or (["static+graph", "static", "dynamic"] if args.cuda_choices else ["dynamic", "static"])
    widths = static_cache_width(args.prompt_len, args.short), static_cache_width(args.prompt_len, args.long)
    if "static+graph" in args.modes and widths[0] != widths[1]:
        p.error(
            f"--prompt-len {args.prompt_len} with --short {args.short} and --long {args.long} needs caches of {widths[0]} and "
            f"{widths[1]} columns, so the decode step would compile twice; keep --prompt-len + --long within {widths[0]} "
            f"(caches grow by {CACHE_BUCKET} columns)"
        )
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse(argv)
    amp = torch.bfloat16 if args.cuda_choices else None
    model = build(args.shape, args.device)
    gen = torch.Generator().manual_seed(0)
    prompts = torch.randint(1, model.config.vocab_size, (args.rows, args.prompt_len), generator=gen).tolist()
    card = torch.cuda.get_device_name() if args.device == "cuda" else "CPU"
    params_m = sum(p.numel() for p in model.parameters()) / 1e6
    print(f"decode step: {args.shape} ({params_m:.2f}M parameters, float32 master weights, autocast {amp or 'none'}) on {card}; "
          f"{args.rows} rows, prompts of {args.prompt_len} tokens, rollouts of {args.short} and {args.long} steps; torch {torch.__version__}")  # fmt: skip
    bandwidth = copy_bandwidth(args.device) if args.device == "cuda" else None
    if bandwidth:
        floor = floor_ms(model, args.rows, args.prompt_len, args.long, amp, bandwidth)
        print(
            f"copy bandwidth {bandwidth / 1e9:.0f} GB/s; floor {floor:.3f} ms a step (weights once in {amp}, KV cache at the mean length)"
        )
    print(
        f"{'mode':13s} {'host reads/step':>15s} {'ops/step outside':>16s} {'ops/step model':>14s} {'graphs':>6s} {'ms/step':>8s} {'x floor':>8s}"
    )
    for mode in args.modes:
        engine = engine_for(model, mode, amp)
        count_ops = args.device == "cpu" and mode != "static+graph"
        reads, other, inside = counts_per_step(engine, model, prompts, args.short, args.long, count_ops=count_ops)
        timing = ""
        if bandwidth:
            ms = ms_per_step(engine, prompts, args.short, args.long, args.repeats)
            verdict = "PASS" if ms / floor <= FLOOR_GOAL else "MISS"
            timing = f" {ms:8.3f} {ms / floor:7.2f}x  goal <= {FLOOR_GOAL:.0f}x: {verdict}"
        graphs = compiled_steps(engine) if engine.resolved.graph else 0
        fell_back = "" if engine.resolved.graph or mode != "static+graph" else "  (the compiled step failed: decoded eagerly)"
        print(f"{mode:13s} {reads:15.3f} {other:16.1f} {inside:14.1f} {graphs:6d}{timing}{fell_back}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
