"""dfpo train against TRL's GRPOTrainer at equal work, alternating the sides in one invocation.

    python benchmarks/vs_trl.py                 # CPU: grpo and gspo, 3 pairs each, 3 training steps per trial
    python benchmarks/vs_trl.py --quick         # CPU: grpo only, 2 pairs, 2 steps (a few minutes on 2 cores)
    python benchmarks/vs_trl.py --device cuda   # GPU: issue 48's measurement at Qwen3-0.6B's shape (about 4 minutes on an H200)
    python benchmarks/vs_trl.py --device cpu --shape tiny --max-new 16 --steps 2 --trials 3   # the GPU protocol rehearsed
    python benchmarks/vs_trl.py --model smollm2-135m-instruct --device cpu     # CPU: the packaged SmolLM2, A B B A

The CPU comparison (no ``--shape``, ``--device cpu``): both sides get the same model (a Qwen2-style config with a 32k
vocabulary, built from a config and saved to a temp folder: no download), the same tokenizer (word-level, 32k
entries), the same 16 prompts x G = 8, temperature 1 sampling with up to 32 new tokens (the EOS row of the LM head is
set so completions end at varying lengths), AdamW, 4 optimiser steps per rollout batch (one epoch of 4 mini-batches of
4 groups), the same objective (TRL loss_type 'grpo'; GSPO = TRL importance_sampling_level='sequence'), no KL, gradient
checkpointing off on both sides, float32 on CPU. Old log-probs are needed on both sides (K = 4): TRL recomputes them
for the whole rollout batch. dfpo takes the sampler's own log-probs (rollout.old_logp 'auto': exact for float32
sampling at temperature 1); ``--dfpo-old-logp recompute`` makes it recompute them as TRL does (for the rows after the
first optimiser step: the first step's forward serves its own rows). dfpo's update scores the LM head and the loss in
one pass (optim.fused_head 'eager', the trainer's default); ``--dfpo-fused-head off`` runs token_logprobs then
policy_loss instead. Every trial runs in a fresh process (so its peak RSS is its own) and trains ``--steps`` rollout
batches; the first is a warm-up and is left out of the times. Printed per trial: seconds per rollout batch split into
rollout (generation and rewards), old log-probs, update; completion tokens per second; peak RSS. Then, per objective,
the ratio dfpo / TRL of tokens per second for each pair, and its median and range.

``--model smollm2-135m-instruct`` runs the CPU comparison on the packaged SmolLM2-135M-Instruct (converted once into
dfpo's cache; its own tokenizer, raw prompts on both sides: dfpo data.chat_template=off) at the work of
configs/smollm2-cpu.toml (SMOLLM2_WORK: 4 prompts x G = 8, up to 16 new tokens, 2 optimiser steps per rollout batch)
with the sides alternated A B B A (``--pairs`` 2). ``--amp bf16`` runs both sides under bf16 autocast over float32 weights (dfpo
model.amp=bf16, TRL bf16=True), where the CPU computes bf16 in hardware (avx512_bf16 or amx_bf16); elsewhere it is
refused in one sentence before any work. The CPU comparison refuses to time, in one sentence, when the 1-minute load
average is above ``--max-load`` (default 0.7: another process is running; 0 = no check): its figures would be the
other process's as much as the code's.

The GPU protocol (``--device cuda``, or any ``--shape``), issue 48's measurement as one command: a Qwen3-0.6B-shaped
model (``--shape qwen3-0.6b``, the default: dfpo.trainer.model_shapes.QWEN3_06B, random init, saved in bfloat16 as the
real checkpoint is, loaded as float32 by both sides) with a word-level tokenizer covering all 151,936 rows, full
fine-tuning with gradient checkpointing, float32 master weights under bf16 autocast (dfpo model.dtype=float32
model.amp=bf16; TRL model_init_kwargs dtype float32 and bf16=True), 8 prompts x G = 8, ``--max-new`` (256) new
tokens (a random model draws EOS about once in 152k tokens, so completions run to the limit), grpo, 4 optimiser steps
per rollout batch, no KL. Three sides: dfpo with the sampler's log-probs (``rollout.old_logp=sampler``: under autocast
'auto' resolves to 'recompute', see trainer/stages/old_logp.py), dfpo recomputing them (``recompute``: TRL's work),
and TRL's GRPOTrainer (HF generate). ``--trials`` trials in the order A C B B C A (repeated: TRL second, so a short
run has every side), each in a fresh process sharing one torch.compile cache folder (the first dfpo trial compiles
the decode step, the others mostly read it back); on CUDA, trials that would not finish before ``--deadline-s`` (from
the command's start) are not started and one still running at it is stopped, so the command ends in time and prints
what it measured; a goal no trial measured makes the exit status 1. Printed: the card and the
versions, each trial's completion tok/s, step, rollout, old log-prob and update seconds (means over the timed steps)
and peak memory (CUDA: torch.cuda.max_memory_allocated of the trial's process; CPU: its peak RSS), a table per side,
then the issue's goals read off it, each with PASS or MISS. ``--shape tiny`` on the CPU rehearses the same protocol at
a tiny shape in seconds: float32 without autocast on both sides, or, with DFPO_CUDA_DEFAULTS=1 in the environment
(scripts/gpu_checks.sh --rehearse), CUDA's choices on the CPU (bf16 autocast, a static cache, the decode step compiled)
on dfpo's sides and bf16 autocast on TRL's (said in the header).

Imports are deferred into the functions on purpose: a trial's process imports only its own side's stack (dfpo's
trainer or TRL's; the TRL side takes dfpo's prompt generator and nothing else of it), so that neither side's peak
memory carries the other's modules.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from dfpo.trainer.model_shapes import QWEN3_06B

ROOT = Path(__file__).resolve().parents[1]
VOCAB = 32_000
PROMPTS, G, MAX_NEW, MINIBATCHES = 16, 8, 32, 4

SHAPES = ("tiny", "qwen3-0.6b")
TINY = dict(
    vocab_size=4096, hidden_size=64, intermediate_size=256, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
    head_dim=16, max_position_embeddings=1024, rope_theta=1_000_000.0, rms_norm_eps=1e-6, tie_word_embeddings=True,
    attention_bias=False, hidden_act="silu",
)  # fmt: skip
"""A Qwen3-style model small enough to rehearse the GPU protocol on a CPU in seconds."""
SIDES = ("dfpo-sampler", "dfpo-recompute", "trl")
"""The GPU protocol's sides, in the order of its tables."""
ORDER = ("dfpo-sampler", "trl", "dfpo-recompute")
"""The order of a trial sequence's first half (A C B, then B C A): TRL second, so that three trials measure every side."""
DFPO_OLD_LOGP = {"dfpo-sampler": "sampler", "dfpo-recompute": "recompute"}
PROTOCOL_PROMPTS = 8
CUDA_DEADLINE_S = 260.0
"""--device cuda's default --deadline-s: scripts/gpu_checks.sh gives the command 280 s; the deadline counts from its start,
model build included, and holds the first three trials (A C B, one of each side) at about 75 s a trial (a fourth would
end after 300 s, so 270 s held no more)."""
MODELS = ("built", "smollm2-135m-instruct")
"""The CPU comparison's models: the Qwen2-style model built from a config (the default), or the packaged SmolLM2."""
SMOLLM2_WORK = dict(prompts=4, group=8, max_new=16, minibatches=2)
"""The SmolLM2 comparison's work, configs/smollm2-cpu.toml's (issue 59 item 4): 4 prompts x G = 8, 16 new tokens,
2 optimiser steps per rollout batch (one epoch of 2 mini-batches of 2 groups)."""
MAX_LOAD = 0.7
"""The CPU comparison's default --max-load: above this 1-minute load average another process is running."""
GOALS = (
    ("tokens_per_s", "dfpo-recompute", ">=", 2.0, "dfpo / TRL completion tok/s at equal work"),
    ("tokens_per_s", "dfpo-sampler", ">=", 2.5, "dfpo / TRL completion tok/s with the sampler's log-probs"),
    ("update_s", "dfpo-sampler", "<=", 0.6, "dfpo's update / TRL's"),
    ("update_s", "dfpo-recompute", "<=", 0.6, "dfpo's update / TRL's"),
    ("peak_gib", "dfpo-sampler", "<=", 1.0, "dfpo's peak memory / TRL's"),
    ("peak_gib", "dfpo-recompute", "<=", 1.0, "dfpo's peak memory / TRL's"),
)
"""Issue 48's goals: (figure, dfpo side, direction, goal, what the ratio is); each ratio is dfpo's figure over TRL's."""


@dataclasses.dataclass(frozen=True)
class Work:
    """What both sides do per rollout batch; the defaults are the CPU comparison's."""

    prompts: int = PROMPTS
    group: int = G
    max_new: int = MAX_NEW
    minibatches: int = MINIBATCHES
    device: str = "cpu"
    bf16: bool = False  # float32 master weights under bf16 autocast (CUDA, a CPU with bf16 in hardware, or the CUDA defaults)
    checkpointing: bool = False
    protocol: bool = False  # the GPU protocol: device, dtype and autocast named, no checkpoints written, TRL loads by path
    raw_prompts: bool = False  # dfpo data.chat_template=off, as TRL sees a plain-text prompt (a model with a chat template)


def qwen3_06b() -> dict:
    """Qwen3-0.6B's shape (``dfpo.trainer.model_shapes.QWEN3_06B``, which scripts/real_size.py builds too)."""
    return dict(QWEN3_06B)


def shape_config(shape: str) -> dict:
    """The Qwen3 config fields of ``shape`` (one of SHAPES)."""
    return dict(TINY) if shape == "tiny" else qwen3_06b()


def word_tokenizer(vocab: int):
    """A word-level tokenizer of ``vocab`` entries (dfpo's special tokens and characters, then ``<wN>`` words), so
    that every row of the LM head decodes to text."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    from dfpo.trainer.policy import CHARS, SPECIAL_TOKENS

    words = list(SPECIAL_TOKENS) + list(CHARS)
    words += [f"<w{i}>" for i in range(vocab - len(words))]
    core = Tokenizer(models.WordLevel(vocab={w: i for i, w in enumerate(words)}, unk_token="<unk>"))
    core.pre_tokenizer = pre_tokenizers.Split("", behavior="isolated")
    core.decoder = decoders.Fuse()
    return PreTrainedTokenizerFast(tokenizer_object=core, pad_token="<pad>", eos_token="<eos>", unk_token="<unk>")


def build_model(folder: Path, hidden: int, layers: int) -> None:
    """A Qwen2-style model with a 32k word-level vocabulary, its EOS logit raised so lengths vary."""
    # deferred: this runs in the parent only (see the module docstring)
    import torch
    from transformers import AutoModelForCausalLM, Qwen2Config

    tok = word_tokenizer(VOCAB)
    config = Qwen2Config(
        vocab_size=VOCAB, hidden_size=hidden, intermediate_size=4 * hidden, num_hidden_layers=layers, num_attention_heads=4,
        num_key_value_heads=2, max_position_embeddings=256, pad_token_id=tok.pad_token_id, eos_token_id=tok.eos_token_id,
        bos_token_id=tok.eos_token_id, tie_word_embeddings=False,
    )  # fmt: skip
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(config).float()
    with torch.no_grad():  # EOS logit ~ 8 + noise above a typical hidden state: a stop chance of a few % a token
        ids = tok(["12+34=", "7+8=", "99+1="], padding=True, return_tensors="pt")
        h = model.model(**ids).last_hidden_state.mean((0, 1))  # (H,)
        model.lm_head.weight[tok.eos_token_id] = 8.0 * h / h.norm() ** 2
    model.save_pretrained(folder)
    tok.save_pretrained(folder)


def build_shaped_model(folder: Path, fields: dict) -> int:
    """A randomly initialised Qwen3 model of ``fields`` (a config's shape) with a word-level tokenizer covering its
    whole vocabulary, saved in bfloat16 as Qwen3's checkpoints are; returns its parameter count. Nothing is done to
    the EOS row: a random model draws EOS about once in vocab_size tokens, so completions run to the limit."""
    # deferred: this runs in the parent only (see the module docstring)
    import torch
    from transformers import AutoModelForCausalLM, Qwen3Config

    tok = word_tokenizer(fields["vocab_size"])
    ids = dict(pad_token_id=tok.pad_token_id, eos_token_id=tok.eos_token_id, bos_token_id=tok.eos_token_id)
    from transformers.utils import logging

    logging.disable_progress_bar()  # the shard writer's bar: one trial's log stays one table
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(Qwen3Config(**fields, **ids)).to(torch.bfloat16)
    model.save_pretrained(folder)
    tok.save_pretrained(folder)
    return sum(p.numel() for p in model.parameters())


def prompts_and_answers(n: int) -> list[tuple[str, str]]:
    """The prompts dfpo's built-in 'add' task makes (seeded), formatted as dfpo formats them."""
    # deferred: the TRL trial calls this too and needs no more of dfpo (see the module docstring)
    from dfpo.trainer.config import DataConfig
    from dfpo.trainer.tasks import load_splits

    data = DataConfig(task="add", train_size=n, eval_size=1)
    train, _ = load_splits(data, 0)
    return [(data.prompt_template.replace("{prompt}", ex.prompt), ex.answer) for ex in train[:n]]


def dfpo_settings(
    folder: str, objective: str, steps: int, threads: int, out: Path, old_logp: str, fused_head: str, work: Work, extra: list[str]
) -> list[str]:
    """The ``--set`` list of a dfpo trial: the CPU comparison's as it always was, the protocol's device, dtype,
    autocast and no checkpoint after it, then ``extra`` (--dfpo-set)."""
    sets = [
        f'model.name="{folder}"', f"model.gradient_checkpointing={str(work.checkpointing).lower()}", f"data.train_size={work.prompts}",
        "data.eval_size=1", f"rollout.prompts_per_step={work.prompts}", f"rollout.group_size={work.group}",
        f"rollout.max_new_tokens={work.max_new}", "rollout.temperature=1.0", "rollout.top_p=1.0", "rollout.top_k=0",
        f"optim.minibatch_groups={work.prompts // work.minibatches}", "optim.epochs=1", "optim.lr=1e-5", f"objective.name={objective}",
        "eval.every=0", f"train.steps={steps}", "log.progress=false", "log.samples_every=0", "log.diagnostics=false",
        f"threads={threads}", f'run_dir="{out}"', f"rollout.old_logp={old_logp}", f"optim.fused_head={fused_head}",
    ]  # fmt: skip
    if work.protocol:
        amp = "bf16" if work.bf16 else "none"
        sets += [f"device={work.device}", "model.dtype=float32", f"model.amp={amp}", "train.save_every=0", "train.save_final=false"]
        sets += ["log.tensorboard=false"]
    elif work.bf16:
        sets.append("model.amp=bf16")
    if work.raw_prompts:
        sets.append("data.chat_template=off")
    return sets + list(extra)


def run_dfpo(
    folder: str, objective: str, steps: int, threads: int, out: Path, old_logp: str = "auto", fused_head: str = "eager",
    work: Work = Work(), extra: tuple[str, ...] = (),
) -> dict:  # fmt: skip
    # deferred: a trial imports only its own side's stack (see the module docstring)
    from dfpo.trainer.config import apply_overrides, config_from_dict
    from dfpo.trainer.train import Trainer

    sets = dfpo_settings(folder, objective, steps, threads, out, old_logp, fused_head, work, list(extra))
    trainer = Trainer(config_from_dict(apply_overrides({}, sets)), quiet=True)
    trainer.run()
    rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()][1:]  # warm-up left out
    per_step = {
        "rollout_s": [r["time/rollout_s"] for r in rows],
        "old_logp_s": [r["time/old_logp_s"] for r in rows],
        "update_s": [r["time/update_s"] for r in rows],
        "step_s": [r["time/step_s"] for r in rows],
        "tokens": [r["completion/length"] * work.prompts * work.group for r in rows],
    }
    result = {k: statistics.mean(v) for k, v in per_step.items()}
    engine = getattr(trainer.rollout_stage, "engine", None)
    graph = bool(getattr(getattr(engine, "resolved", None), "graph", False))  # still on after the run: no fallback
    return result | {"per_step": per_step, "pi_old": "sampler" if trainer.old_logp_from_sampler() else "recompute", "decode_graph": graph}


def run_trl(folder: str, objective: str, steps: int, threads: int, out: Path, work: Work = Work()) -> dict:
    import torch
    from datasets import Dataset
    from transformers import AutoModelForCausalLM, AutoTokenizer, TrainerCallback
    from trl import GRPOConfig, GRPOTrainer

    if threads:
        torch.set_num_threads(threads)
    cuda = work.device == "cuda"

    def sync():  # a phase's clock stops once the GPU has done its work
        if cuda:
            torch.cuda.synchronize()

    pairs = prompts_and_answers(work.prompts)
    data = Dataset.from_dict({"prompt": [p for p, _ in pairs], "answer": [a for _, a in pairs]})

    def correct(completions, answer, **kwargs):
        return [float(c.strip() == a) for c, a in zip(completions, answer)]

    extra = {"importance_sampling_level": "sequence", "epsilon": 3e-4, "epsilon_high": 4e-4} if objective == "gspo" else {"epsilon": 0.2}
    if work.protocol:  # the issue's: TRL loads the model itself, float32 master weights
        extra["model_init_kwargs"] = {"dtype": torch.float32}
    k = work.minibatches
    args = GRPOConfig(
        output_dir=str(out), use_cpu=not cuda, bf16=work.bf16, report_to=[], save_strategy="no", logging_steps=1, learning_rate=1e-5,
        per_device_train_batch_size=work.prompts * work.group // k, gradient_accumulation_steps=1, steps_per_generation=k,
        num_generations=work.group, num_iterations=1, max_completion_length=work.max_new, temperature=1.0, top_p=1.0, top_k=0,
        beta=0.0, loss_type="grpo", gradient_checkpointing=work.checkpointing, max_steps=steps * k, seed=0, disable_tqdm=True, **extra,
    )  # fmt: skip
    model = folder if work.protocol else AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32)
    trainer = GRPOTrainer(
        model=model, reward_funcs=correct, args=args, train_dataset=data, processing_class=AutoTokenizer.from_pretrained(folder)
    )
    phases = {"gen_and_score": [], "old_logp": [], "step_end": [], "lengths": []}
    gen_real, logps_real = trainer._generate_and_score_completions, trainer._get_per_token_logps_and_entropies

    def gen_timed(*a, **k):
        sync()
        t0 = time.perf_counter()
        out = gen_real(*a, **k)
        sync()
        phases["gen_and_score"].append(time.perf_counter() - t0)
        phases["lengths"].append(float(out["completion_mask"].sum()))
        return out

    def logps_timed(*a, **k):
        sync()
        t0 = time.perf_counter()
        out = logps_real(*a, **k)
        if not torch.is_grad_enabled():  # the old-log-prob recompute inside _generate_and_score_completions
            sync()
            phases["old_logp"].append(time.perf_counter() - t0)
        return out

    class StepClock(TrainerCallback):
        def on_step_end(self, args, state, control, **kwargs):
            sync()
            phases["step_end"].append(time.perf_counter())

    trainer._generate_and_score_completions, trainer._get_per_token_logps_and_entropies = gen_timed, logps_timed
    trainer.add_callback(StepClock())
    t_start = time.perf_counter()
    trainer.train()
    ends = [t_start] + phases["step_end"][k - 1 :: k]  # the end of each rollout batch's last optimiser step
    cycle = [b - a for a, b in zip(ends, ends[1:])][1:]
    old = phases["old_logp"][1:steps]  # one recompute call per rollout batch (chunked inside TRL)
    gen = [g - o for g, o in zip(phases["gen_and_score"][1:], old)]
    per_step = {
        "rollout_s": gen,
        "old_logp_s": old,
        "update_s": [c - g - o for c, g, o in zip(cycle, gen, old)],
        "step_s": cycle,
        "tokens": phases["lengths"][1:],
    }
    return {k: statistics.mean(v) for k, v in per_step.items()} | {"per_step": per_step, "pi_old": "recompute"}


def worker(args) -> None:
    out = Path(tempfile.mkdtemp(prefix=f"vs_trl_{args.side}_"))
    work = Work(**json.loads(args.work)) if args.work else Work()
    if args.side == "dfpo":
        old_logp, fused_head, extra = args.dfpo_old_logp, args.dfpo_fused_head, args.dfpo_set or ()
        result = run_dfpo(args.model_dir, args.objective, args.steps, args.threads, out / "run", old_logp, fused_head, work, extra)
    else:
        result = run_trl(args.model_dir, args.objective, args.steps, args.threads, out / "run", work)
    result["peak_rss_mib"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    result["peak_gib"] = peak_gib(work.device)
    result["tokens_per_s"] = result["tokens"] / result["step_s"]
    print("RESULT " + json.dumps(result), flush=True)


def peak_gib(device: str) -> float:
    """This process's peak memory in GiB: CUDA's peak allocated bytes on a GPU, the peak resident set on a CPU."""
    if device == "cuda":
        import torch

        return torch.cuda.max_memory_allocated() / 2**30
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20


# -- the GPU protocol: pure parts ---------------------------------------------------------------------------------------


def trial_order(trials: int) -> list[str]:
    """The sides of ``trials`` trials: A C B B C A, repeated (each side as often early as late; TRL second, so the first
    three trials measure every side)."""
    cycle = list(ORDER) + list(reversed(ORDER))
    return [cycle[i % len(cycle)] for i in range(trials)]


def side_summary(trials: list[dict]) -> dict:
    """One side's figures from its trials' results: completion tok/s the median of the trials' (each its tokens over
    its step seconds, means of its timed steps); update seconds the median of every timed step's; peak GiB the largest
    trial's; and each phase's range over every timed step."""
    steps = {k: [x for t in trials for x in t["per_step"][k]] for k in ("step_s", "rollout_s", "old_logp_s", "update_s")}
    return {
        "trials": len(trials),
        "tokens_per_s": statistics.median(t["tokens_per_s"] for t in trials),
        "update_s": statistics.median(steps["update_s"]),
        "peak_gib": max(t["peak_gib"] for t in trials),
        "ranges": {k: (min(v), max(v)) for k, v in steps.items()},
    }


def goal_lines(sides: dict[str, dict]) -> list[str]:
    """Issue 48's goals read off the side summaries (``side_summary``; a side absent: not measured): each line the
    ratio dfpo / TRL of one figure, the two figures, and PASS where the ratio meets the goal, else MISS."""
    units = {"tokens_per_s": ("{:.0f}", " tok/s"), "update_s": ("{:.2f}", " s"), "peak_gib": ("{:.2f}", " GiB")}
    lines = []
    for figure, side, direction, goal, what in GOALS:
        head = f"goal {what} ({side}) {direction} {goal:.1f}:"
        missing = [s for s in (side, "trl") if s not in sides]
        if missing:
            lines.append(f"{head} not measured (no {' or '.join(missing)} trial finished)")
            continue
        ours, theirs = sides[side][figure], sides["trl"][figure]
        ratio = ours / theirs if theirs > 0 else math.inf
        met = ratio >= goal if direction == ">=" else ratio <= goal
        fmt, unit = units[figure]
        lines.append(f"{head} {ratio:.2f} ({fmt.format(ours)}{unit} / {fmt.format(theirs)}{unit}) {'PASS' if met else 'MISS'}")
    return lines


def summary_table(sides: dict[str, dict]) -> list[str]:
    """The per-side table in the issue's layout (markdown): medians, and ranges over every timed step."""

    def span(pair: tuple[float, float]) -> str:
        return f"{pair[0]:.2f}-{pair[1]:.2f}"

    lines = [
        "| side | completion tok/s (median of trials) | step s | rollout s | old log-probs s | update s (median) | peak GiB | trials |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for side in SIDES:
        if side in sides:
            s, r = sides[side], sides[side]["ranges"]
            lines.append(
                f"| {side} | {s['tokens_per_s']:.0f} | {span(r['step_s'])} | {span(r['rollout_s'])} | {span(r['old_logp_s'])} | "
                f"{s['update_s']:.2f} ({span(r['update_s'])}) | {s['peak_gib']:.2f} | {s['trials']} |"
            )
    return lines


# -- the command ---------------------------------------------------------------------------------------------------------

LEGACY_ONLY = ("objectives", "pairs", "hidden", "layers", "dfpo_old_logp", "model", "amp", "max_load")
PROTOCOL_ONLY = ("trials", "max_new", "deadline_s", "dfpo_set", "json")


def parse(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="vs_trl.py", description=__doc__.splitlines()[0])
    p.add_argument("--device", choices=["cpu", "cuda"], default="cpu", help="cpu (default: the CPU comparison) or cuda (the GPU protocol)")
    p.add_argument(
        "--shape", choices=SHAPES,
        help="run the GPU protocol at this model shape (default with --device cuda: qwen3-0.6b); on the CPU, tiny rehearses it",
    )  # fmt: skip
    p.add_argument("--objectives", nargs="+", choices=["grpo", "gspo"], help="CPU comparison: objectives (default grpo gspo)")
    p.add_argument("--pairs", type=int, help="CPU comparison: A B pairs per objective (default 3)")
    p.add_argument("--steps", type=int, default=3, help="rollout batches per trial, the first a warm-up (default 3)")
    p.add_argument("--hidden", type=int, help="CPU comparison: hidden size (default 128)")
    p.add_argument("--layers", type=int, help="CPU comparison: layers (default 2)")
    p.add_argument("--threads", type=int, help="torch threads per trial (default 2 on the CPU; 0 = torch's default, on CUDA)")
    p.add_argument("--quick", action="store_true", help="CPU comparison: grpo only, 2 pairs, 2 steps")
    p.add_argument(
        "--model", choices=MODELS,
        help="CPU comparison: the model (default built: a Qwen2-style config; smollm2-135m-instruct: the packaged SmolLM2, A B B A)",
    )  # fmt: skip
    p.add_argument("--amp", choices=["none", "bf16"], help="CPU comparison: bf16 autocast on both sides (a CPU with bf16 in hardware)")
    p.add_argument(
        "--max-load", type=float,
        help=f"CPU comparison: refuse to time above this 1-minute load average (default {MAX_LOAD:g}; 0 = no check)",
    )  # fmt: skip
    p.add_argument(
        "--dfpo-old-logp", choices=["auto", "sampler", "recompute"],
        help="CPU comparison: dfpo's rollout.old_logp (default auto): 'recompute' runs an old-log-prob forward as TRL does (the ablation of the sampler's log-probs)",
    )  # fmt: skip
    p.add_argument(
        "--dfpo-fused-head", default="eager", choices=["eager", "compile", "off"],
        help="dfpo's optim.fused_head: the LM head and the loss in one pass (eager, the default; compile) or off (token_logprobs, then policy_loss)",
    )  # fmt: skip
    p.add_argument("--trials", type=int, help="GPU protocol: trials in all, in the order A B C C B A (default 6)")
    p.add_argument("--max-new", type=int, help="GPU protocol: new tokens per completion (default 256; 16 at --shape tiny)")
    p.add_argument(
        "--deadline-s", type=float,
        help=f"GPU protocol: seconds from the start after which no trial runs (default {CUDA_DEADLINE_S:g} on CUDA, 0 = none on the CPU)",
    )  # fmt: skip
    p.add_argument("--dfpo-set", action="append", metavar="KEY=VALUE", help="GPU protocol: a dfpo setting for both dfpo sides (repeatable)")
    p.add_argument("--json", metavar="PATH", help="GPU protocol: also write the trials, the per-side figures and the goal lines there")
    p.add_argument("--side", choices=["dfpo", "trl"], help=argparse.SUPPRESS)
    p.add_argument("--objective", help=argparse.SUPPRESS)
    p.add_argument("--model-dir", help=argparse.SUPPRESS)
    p.add_argument("--work", help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.side:
        return args
    args.protocol = args.shape is not None or args.device == "cuda"
    stray = [n for n in (LEGACY_ONLY if args.protocol else PROTOCOL_ONLY) if getattr(args, n) is not None]
    if args.protocol and args.quick:
        stray.insert(0, "quick")
    if stray:
        flag = "--" + stray[0].replace("_", "-")
        if args.protocol:
            p.error(
                f"{flag} belongs to the CPU comparison (--device cpu, no --shape); the GPU protocol takes --trials, --steps and --max-new"
            )
        p.error(f"{flag} belongs to the GPU protocol: add --device cuda, or --shape tiny to rehearse it on the CPU")
    if args.protocol:
        args.shape = args.shape or "qwen3-0.6b"
        args.trials = 6 if args.trials is None else args.trials
        args.max_new = (16 if args.shape == "tiny" else 256) if args.max_new is None else args.max_new
        args.deadline_s = (CUDA_DEADLINE_S if args.device == "cuda" else 0.0) if args.deadline_s is None else args.deadline_s
        args.threads = (0 if args.device == "cuda" else 2) if args.threads is None else args.threads
        args.dfpo_set = args.dfpo_set or []
        for name, value, least in (("--steps", args.steps, 2), ("--trials", args.trials, 1), ("--max-new", args.max_new, 1)):
            if value < least:
                p.error(f"{name} must be at least {least}{' (one warm-up, then timed steps)' if name == '--steps' else ''}, got {value}")
        if args.deadline_s < 0:
            p.error(f"--deadline-s must be 0 (none) or positive, got {args.deadline_s:g}")
        bad = [s for s in args.dfpo_set if "=" not in s]
        if bad:
            p.error(f"--dfpo-set takes KEY=VALUE (a dfpo setting, as dfpo train --set), got {bad[0]!r}")
    else:
        args.model = args.model or "built"
        args.objectives = args.objectives or (["grpo"] if args.model != "built" else ["grpo", "gspo"])
        args.pairs = (2 if args.model != "built" else 3) if args.pairs is None else args.pairs
        args.amp = args.amp or "none"
        args.max_load = MAX_LOAD if args.max_load is None else args.max_load
        if args.max_load < 0:
            p.error(f"--max-load must be 0 (no check) or positive, got {args.max_load:g}")
        if args.model != "built" and (args.hidden is not None or args.layers is not None):
            p.error(f"--hidden and --layers shape the built model; --model {args.model} has its own shape")
        args.hidden = 128 if args.hidden is None else args.hidden
        args.layers = 2 if args.layers is None else args.layers
        args.threads = 2 if args.threads is None else args.threads
        args.dfpo_old_logp = args.dfpo_old_logp or "auto"
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse(argv)
    if args.side:
        worker(args)
        return 0
    if args.protocol:
        return protocol_main(args)
    return legacy_main(args)


def load_refusal(max_load: float, load: float | None = None, cores: int | None = None) -> str | None:
    """None where the 1-minute load average (``load``, read from the OS when None) is at most ``max_load`` or the check
    is off (0); else the one sentence that refuses to time."""
    import os

    if max_load <= 0:
        return None
    load = os.getloadavg()[0] if load is None else load
    if load <= max_load:
        return None
    cores = os.cpu_count() if cores is None else cores
    return (
        f"vs_trl: not timing: the 1-minute load average is {load:.2f} on {cores} cores, above --max-load {max_load:g}, so "
        "another process is running and its work would be in the figures; run it on a quiet machine, or pass --max-load 0 "
        "to time anyway"
    )


def amp_refusal(amp: str) -> str | None:
    """None where the CPU comparison can run ``--amp`` here; else the trainer's own sentence for model.amp on this CPU."""
    if amp == "none":
        return None
    import torch

    from dfpo.trainer.policy import resolve_amp

    try:
        resolve_amp(amp, torch.device("cpu"))
    except ValueError as err:
        return f"vs_trl: --amp {amp}: {err}"
    return None


def comparison_model(args, folder: Path) -> tuple[str, str]:
    """(the folder both sides load, the header's words for it): the built Qwen2-style model, or the packaged SmolLM2
    converted into dfpo's cache (a missing package is the trainer's one sentence)."""
    if args.model == "built":
        build_model(folder, args.hidden, args.layers)
        return str(folder), f"Qwen2-style, vocab {VOCAB}, hidden {args.hidden}, {args.layers} layers"
    from dfpo.trainer.packaged_model import resolve_model_name

    path = resolve_model_name(args.model)
    return path, f"{args.model} (the packaged SmolLM2-135M-Instruct, {path}), raw prompts on both sides"


def comparison_work(args) -> Work:
    """The CPU comparison's work: the built model's defaults, or SMOLLM2_WORK on raw prompts for the packaged SmolLM2;
    bf16 autocast on both sides with ``--amp bf16``."""
    sized = {} if args.model == "built" else dict(SMOLLM2_WORK, raw_prompts=True)
    return Work(bf16=args.amp == "bf16", **sized)


def legacy_main(args) -> int:
    """The CPU comparison: dfpo and TRL alternated A B, B A per objective (unchanged since before the GPU protocol, but
    for --model, --amp and the load check)."""
    if args.quick:
        args.objectives, args.pairs, args.steps = ["grpo"], 2, 2
    if args.steps < 2 or args.pairs < 1:
        raise SystemExit(f"--steps must be >= 2 (one warm-up) and --pairs >= 1, got --steps {args.steps} --pairs {args.pairs}")
    refused = load_refusal(args.max_load) or amp_refusal(args.amp)
    if refused:
        print(refused, file=sys.stderr)
        return 2
    try:
        folder, described = comparison_model(args, Path(tempfile.mkdtemp(prefix="vs_trl_model_")))
    except ValueError as err:
        print(f"vs_trl: --model {args.model}: {err}", file=sys.stderr)
        return 2
    work = comparison_work(args)
    precision = "CPU bf16 autocast over float32 weights" if work.bf16 else "CPU float32"
    print(f"model: {described}; {work.prompts} prompts x G={work.group}, <= {work.max_new} new tokens, {work.minibatches} optimiser steps per rollout "
          f"batch, {args.threads} threads, {precision}; dfpo rollout.old_logp={args.dfpo_old_logp}, "
          f"optim.fused_head={args.dfpo_fused_head}")  # fmt: skip
    print(
        f"{'objective':9s} {'side':5s} {'rollout s':>9s} {'old-logp s':>10s} {'update s':>9s} {'step s':>7s} {'tok/s':>7s} {'peak MiB':>9s}"
    )
    ratios: dict[str, list[float]] = {}
    for objective in args.objectives:
        for pair in range(args.pairs):
            got = {}
            for side in ("dfpo", "trl") if pair % 2 == 0 else ("trl", "dfpo"):
                cmd = [sys.executable, __file__, "--side", side, "--objective", objective, "--model-dir", folder, "--steps", str(args.steps),
                       "--threads", str(args.threads), "--dfpo-old-logp", args.dfpo_old_logp, "--dfpo-fused-head", args.dfpo_fused_head]  # fmt: skip
                if work != Work():
                    cmd += ["--work", json.dumps(dataclasses.asdict(work))]
                proc = subprocess.run(cmd, capture_output=True, text=True)
                line = next((x for x in proc.stdout.splitlines() if x.startswith("RESULT ")), None)
                if proc.returncode or line is None:
                    raise SystemExit(f"{side} {objective} trial failed:\n{proc.stderr[-3000:]}")
                r = got[side] = json.loads(line[len("RESULT ") :])
                print(f"{objective:9s} {side:5s} {r['rollout_s']:9.2f} {r['old_logp_s']:10.2f} {r['update_s']:9.2f} {r['step_s']:7.2f} "
                      f"{r['tokens_per_s']:7.0f} {r['peak_rss_mib']:9.0f}", flush=True)  # fmt: skip
            ratios.setdefault(objective, []).append(got["dfpo"]["tokens_per_s"] / got["trl"]["tokens_per_s"])
    for objective, rs in ratios.items():
        print(f"{objective}: dfpo / TRL tokens per second, per pair: {', '.join(f'{r:.2f}' for r in rs)}; "
              f"median {statistics.median(rs):.2f}, range [{min(rs):.2f}, {max(rs):.2f}]")  # fmt: skip
    return 0


def no_cuda_line() -> str | None:
    """None where CUDA is usable, else the one line that says it is not."""
    import torch

    if torch.cuda.is_available():
        return None
    return (
        f"no CUDA device: torch.cuda.is_available() is False (torch {torch.__version__}, CUDA build {torch.version.cuda}); "
        "run --device cpu (with --shape tiny to rehearse the GPU protocol) or on a machine with a CUDA GPU"
    )


def versions() -> str:
    from importlib.metadata import PackageNotFoundError, version

    def v(name: str) -> str:
        try:
            return version(name)
        except PackageNotFoundError:
            return "not installed"

    return f"torch {v('torch')}, transformers {v('transformers')}, trl {v('trl')}"


def protocol_main(args) -> int:
    """Issue 48's measurement: three sides in fresh processes, A B C C B A, then the per-side table and the goals."""
    start = time.monotonic()
    cuda = args.device == "cuda"
    if cuda and (line := no_cuda_line()):
        print(line, file=sys.stderr)
        return 2
    import torch

    card = torch.cuda.get_device_name() if cuda else "CPU"
    print(f"vs_trl --device {args.device} --shape {args.shape}: {card} ({versions()})", flush=True)
    fields = shape_config(args.shape)
    folder = Path(tempfile.mkdtemp(prefix="vs_trl_model_"))
    built = time.monotonic()
    params = build_shaped_model(folder, fields)
    built = time.monotonic() - built
    from dfpo.trainer.decode import cuda_defaults_forced

    forced = not cuda and cuda_defaults_forced()  # DFPO_CUDA_DEFAULTS=1: the rehearsal takes CUDA's choices on the CPU
    work = Work(
        prompts=PROTOCOL_PROMPTS, max_new=args.max_new, device=args.device, bf16=cuda or forced, checkpointing=True, protocol=True
    )  # fmt: skip
    f = fields
    precision = (
        "float32 master weights under bf16 autocast (dfpo model.dtype=float32 model.amp=bf16; TRL model_init_kwargs dtype float32, bf16=True)"
        + ("; dfpo on CUDA's choices (DFPO_CUDA_DEFAULTS=1: static cache, compiled decode step), the CPU rehearsal" if forced else "")
        if work.bf16
        else "float32 without autocast on both sides (TRL bf16=False), the CPU rehearsal; DFPO_CUDA_DEFAULTS=1 rehearses CUDA's choices"
    )
    memory = "torch.cuda.max_memory_allocated of the trial's process" if cuda else "the trial process's peak RSS (ru_maxrss)"
    print(
        f"model: Qwen3, shape {args.shape} (hidden {f['hidden_size']}, {f['num_hidden_layers']} layers, {f['num_attention_heads']}/"
        f"{f['num_key_value_heads']} heads of {f['head_dim']}, MLP {f['intermediate_size']}, vocab {f['vocab_size']}, tied head: "
        f"{params / 1e6:.1f}M parameters), random init, saved in bfloat16, loaded float32 by both sides; a word-level tokenizer of "
        f"{f['vocab_size']} entries; built in {built:.0f} s\n"
        f"work: {work.prompts} prompts x G={work.group}, {work.max_new} new tokens at temperature 1, grpo, {work.minibatches} optimiser "
        f"steps per rollout batch, no KL, full fine-tuning, gradient checkpointing, {precision}; {args.steps} rollout batches "
        f"per trial, the first a warm-up left out; {args.threads or 'default'} torch threads\n"
        f"sides: dfpo-sampler (rollout.old_logp=sampler), dfpo-recompute (rollout.old_logp=recompute, TRL's work), trl "
        f"(GRPOTrainer, HF generate); dfpo optim.fused_head={args.dfpo_fused_head}"
        f"{''.join(' ' + s for s in args.dfpo_set)}; {args.trials} trials, A C B B C A, each in a fresh process"
        f"{f', none started after {args.deadline_s:g} s' if args.deadline_s else ''}; peak GiB = {memory}",
        flush=True,
    )
    print(
        f"{'trial':>5s} {'side':14s} {'pi_old':9s} {'tok/s':>7s} {'step s':>7s} {'rollout s':>9s} {'old-logp s':>10s} "
        f"{'update s':>9s} {'peak GiB':>8s} graph",
        flush=True,
    )
    env = dict(os.environ, TORCHINDUCTOR_CACHE_DIR=str(folder.parent / f"{folder.name}_compile"))  # one compile cache for all trials
    results: dict[str, list[dict]] = {}
    order, longest, failed = trial_order(args.trials), 0.0, False
    for i, side in enumerate(order, 1):
        left = args.deadline_s - (time.monotonic() - start) if args.deadline_s else None
        if left is not None and left < max(longest, 1.0):
            print(f"trials {i}-{len(order)} not started: {max(left, 0):.0f} s left of --deadline-s {args.deadline_s:g}, "
                  f"the longest trial took {longest:.0f} s", flush=True)  # fmt: skip
            break
        cmd = [sys.executable, __file__, "--side", side.split("-")[0], "--objective", "grpo", "--model-dir", str(folder),
               "--steps", str(args.steps), "--threads", str(args.threads), "--dfpo-old-logp", DFPO_OLD_LOGP.get(side, "auto"),
               "--dfpo-fused-head", args.dfpo_fused_head, "--work", json.dumps(dataclasses.asdict(work))]  # fmt: skip
        cmd += [f"--dfpo-set={s}" for s in args.dfpo_set]
        t0 = time.monotonic()
        try:
            proc = subprocess.run(cmd, capture_output=True, text=True, timeout=left, env=env)
        except subprocess.TimeoutExpired:
            print(f"{i:5d} {side:14s} stopped at --deadline-s {args.deadline_s:g} after {time.monotonic() - t0:.0f} s", flush=True)
            break
        longest = max(longest, time.monotonic() - t0)
        line = next((x for x in proc.stdout.splitlines() if x.startswith("RESULT ")), None)
        if proc.returncode or line is None:
            failed = True
            print(f"{i:5d} {side:14s} failed (exit {proc.returncode}); the end of its stderr:\n{proc.stderr[-2500:]}", flush=True)
            continue
        r = json.loads(line[len("RESULT ") :])
        results.setdefault(side, []).append(r)
        graph = {True: "on", False: "off"}.get(r.get("decode_graph"), "-")  # off on dfpo's side: the compiled step fell back
        print(f"{i:5d} {side:14s} {r['pi_old']:9s} {r['tokens_per_s']:7.0f} {r['step_s']:7.2f} {r['rollout_s']:9.2f} "
              f"{r['old_logp_s']:10.2f} {r['update_s']:9.2f} {r['peak_gib']:8.2f} {graph}", flush=True)  # fmt: skip
    sides = {side: side_summary(trials) for side, trials in results.items()}
    goals = goal_lines(sides)
    print("\n".join(summary_table(sides) + goals))
    if args.json:
        record = {"card": card, "versions": versions(), "shape": args.shape, "work": dataclasses.asdict(work), "order": order,
                  "results": results, "sides": sides, "goals": goals, "seconds": time.monotonic() - start}  # fmt: skip
        Path(args.json).write_text(json.dumps(record, indent=1) + "\n")
    unmeasured = [side for side in SIDES if side not in sides]
    if unmeasured:
        print(f"vs_trl: no {', '.join(unmeasured)} trial finished, so {'no goal' if len(unmeasured) == len(SIDES) else 'some goals'} "
              "could be read; exit status 1", flush=True)  # fmt: skip
    print(f"vs_trl: {time.monotonic() - start:.0f} s in all", flush=True)
    return 1 if failed or unmeasured else 0


if __name__ == "__main__":
    sys.exit(main())
