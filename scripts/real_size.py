"""A Qwen3-0.6B-shaped run on CPU: the path a user takes with a real checkpoint, at its real size, with no download.

    python scripts/real_size.py                       # every variant, 2 steps each, into runs/real-size/
    python scripts/real_size.py --variants full-ckpt --steps 2 --out /tmp/rs

1. A model folder: ``Qwen3ForCausalLM`` built from Qwen3-0.6B's own config (hidden 1024, 28 layers, 16 query / 8
   key-value heads of 128, MLP 3072, a 151,936-row vocabulary tied to the LM head: 596M parameters), randomly
   initialised and saved in bfloat16 as the real checkpoint is; a byte-level BPE tokenizer trained here on local
   text, with Qwen's special tokens (``<|endoftext|>``, ``<|im_start|>``, ``<|im_end|>``, ``<think>``, ``</think>``)
   and a Qwen3-style chat template (``enable_thinking=False`` writes the empty think block, as Qwen3's does).
2. A local JSONL task: GSM8K-style problems from reasoning-gym's ``gsm_symbolic`` (generated offline).
3. ``dfpo train --config configs/qwen3-0.6b-gsm8k.toml --set model.name=<folder> ...`` for 2 steps in each variant:
   full fine-tuning and LoRA, each with and without gradient checkpointing, each in its own process; then one run
   is resumed from its checkpoint.
4. Checks: every logged value finite, the chat template in the samples, the end-of-turn token among the stop
   tokens, the checkpoint resumed to the next step; and for each run its peak resident memory and the time of
   each stage next to an estimate from sizes (``dfpo.trainer.memory``).

A random-init model samples ids from all 151,936 rows, most of which this small tokenizer does not have: they
decode to nothing (transformers drops ids it does not know), as the 267 unused rows of the real Qwen3 tokenizer
would; a trained model never samples them. Rewards are therefore ~0: this run measures the path, not learning.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

from dfpo.trainer.model_shapes import QWEN3_06B

ROOT = Path(__file__).resolve().parents[1]
CONFIG = ROOT / "configs" / "qwen3-0.6b-gsm8k.toml"

SPECIAL_TOKENS = ("<|endoftext|>", "<|im_start|>", "<|im_end|>", "<think>", "</think>")
CHAT_TEMPLATE = (
    "{%- for message in messages %}"
    "{{- '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>' + '\\n' }}"
    "{%- endfor %}"
    "{%- if add_generation_prompt %}"
    "{{- '<|im_start|>assistant\\n' }}"
    "{%- if enable_thinking is defined and enable_thinking is false %}{{- '<think>\\n\\n</think>\\n\\n' }}{%- endif %}"
    "{%- endif %}"
)
"""Qwen3's chat template for what the trainer uses (user turns, the generation prompt, enable_thinking=False)."""

VARIANTS = {
    "full-ckpt": ["model.lora_r=0", "model.gradient_checkpointing=true"],
    "full": ["model.lora_r=0", "model.gradient_checkpointing=false"],
    "lora-ckpt": ["model.lora_r=16", "model.gradient_checkpointing=true", "optim.lr=1e-4"],
    "lora": ["model.lora_r=16", "model.gradient_checkpointing=false", "optim.lr=1e-4"],
}
"""Full fine-tuning and LoRA (r=16 on every projection), each with and without gradient checkpointing."""


def tokenizer_corpus() -> list[str]:
    """Local text to learn merges from, the same on every machine and at every commit: the task's own problems
    (reasoning-gym, fixed seed) and arithmetic written out with a boxed answer."""
    import reasoning_gym

    texts = [item["question"] for item in reasoning_gym.create_dataset("gsm_symbolic", size=200, seed=1)]
    texts += [f"{a} + {b} = {a + b}. The answer is \\boxed{{{a + b}}}." for a in range(60) for b in range(0, 60, 7)]
    return texts


def build_tokenizer(vocab_size: int = 8192):
    """A byte-level BPE tokenizer (as Qwen's) trained on ``tokenizer_corpus``, with Qwen's special tokens and chat
    template; the end-of-turn token ``<|im_end|>`` is its EOS and ``<|endoftext|>`` its pad, as in Qwen3."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    core = Tokenizer(models.BPE())
    core.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    core.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size, special_tokens=list(SPECIAL_TOKENS), initial_alphabet=pre_tokenizers.ByteLevel.alphabet()
    )
    core.train_from_iterator(tokenizer_corpus(), trainer)
    tok = PreTrainedTokenizerFast(tokenizer_object=core, eos_token="<|im_end|>", pad_token="<|endoftext|>")
    tok.chat_template = CHAT_TEMPLATE
    return tok


def build_model_folder(folder: Path) -> dict[str, object]:
    """Write the tokenizer and a randomly initialised Qwen3-0.6B-shaped model (bfloat16 safetensors) to ``folder``;
    returns what was built (parameters, seconds)."""
    import torch
    from transformers import AutoModelForCausalLM, GenerationConfig, Qwen3Config

    start = time.time()
    tok = build_tokenizer()
    special = {t: tok.convert_tokens_to_ids(t) for t in SPECIAL_TOKENS}
    config = Qwen3Config(**QWEN3_06B, bos_token_id=special["<|endoftext|>"], eos_token_id=special["<|im_end|>"], dtype="bfloat16")
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(config, dtype=torch.bfloat16)
    model.generation_config = GenerationConfig(
        bos_token_id=special["<|endoftext|>"],
        eos_token_id=[special["<|im_end|>"], special["<|endoftext|>"]],
        pad_token_id=special["<|endoftext|>"],
    )
    folder.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(folder, safe_serialization=True)
    tok.save_pretrained(folder)
    params = sum(p.numel() for p in model.parameters())
    return {"params": params, "tokenizer_vocab": len(tok), "seconds": time.time() - start}


def write_task(folder: Path, n_train: int = 32, n_eval: int = 8, seed: int = 0) -> tuple[Path, Path]:
    """GSM8K-style problems (reasoning-gym ``gsm_symbolic``, offline) as JSONL ``{"prompt", "answer"}``."""
    import reasoning_gym

    data = reasoning_gym.create_dataset("gsm_symbolic", size=n_train + n_eval, seed=seed)
    rows = [{"prompt": item["question"], "answer": str(item["answer"])} for item in data]
    train, evals = folder / "train.jsonl", folder / "eval.jsonl"
    train.write_text("".join(json.dumps(r) + "\n" for r in rows[:n_train]))
    evals.write_text("".join(json.dumps(r) + "\n" for r in rows[n_train:]))
    return train, evals


def run_settings(model: Path, train: Path, evals: Path, run_dir: Path, steps: int) -> list[str]:
    """The --set list that shrinks the real config to 2 prompts x 4 completions of 24 tokens, on CPU, offline. The
    format reward pays any non-empty text: a random model's completions decode to text or to nothing (ids past the
    tokenizer), so groups have reward variance and the update has a gradient (math-verify pays nothing here)."""
    return [
        f"model.name={model}",
        "data.task=jsonl",
        f"data.path={train}",
        f"data.eval_path={evals}",
        "data.eval_size=4",
        f"run_dir={run_dir}",
        "device=cpu",
        "rollout.prompts_per_step=2",
        "rollout.group_size=4",
        f"rollout.max_new_tokens={NEW_TOKENS}",
        "optim.minibatch_groups=2",
        "optim.microbatch_groups=1",
        f"train.steps={steps}",
        "train.save_every=1",
        "eval.every=0",
        "reward.format_weight=1.0",
        'reward.format_regex="."',
        "log.samples_every=1",
        "log.tensorboard=false",
    ]


NEW_TOKENS = 24
ROWS_PER_STEP = 2 * 4
"""rollout.prompts_per_step x rollout.group_size of ``run_settings``."""


@dataclass
class Measured:
    """One ``dfpo train`` process: its exit status, wall time, peak resident memory and output."""

    status: int
    wall_s: float
    peak_rss_gib: float
    output: str


def train_process(sets: list[str], *, resume: Path | None = None) -> Measured:
    """Run ``dfpo train`` (the real config, ``sets`` applied) in its own process; peak RSS from the kernel's
    accounting of that process (``os.wait4``), so runs do not see each other's memory."""
    cmd = [sys.executable, "-m", "dfpo", "train", "--quiet"]
    cmd += ["--resume", str(resume)] if resume else ["--config", str(CONFIG)]
    for s in sets:
        cmd += ["--set", s]
    start = time.time()
    with open(os.devnull, "rb") as stdin:
        proc = subprocess.Popen(cmd, stdin=stdin, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        output = proc.stdout.read()
        _, status, usage = os.wait4(proc.pid, 0)
    proc.returncode = os.waitstatus_to_exitcode(status)
    return Measured(proc.returncode, time.time() - start, usage.ru_maxrss / 2**20, output)


def read_jsonl(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def stage_times(run_dir: Path) -> dict[str, float]:
    """Seconds per stage, summed over the run's steps (``time/*`` of metrics.jsonl)."""
    rows = read_jsonl(run_dir / "metrics.jsonl")
    return {k: sum(r.get(f"time/{k}_s", 0.0) for r in rows) for k in ("rollout", "old_logp", "update", "step")}


def estimate_gib(sets: list[str], shortest_prompt: int) -> float:
    """The trainer's own lower bound of the memory this config needs (``dfpo.trainer.memory``), in GiB."""
    from transformers import AutoConfig

    from dfpo.trainer.config import load_config
    from dfpo.trainer.memory import memory_needs, pretrained_shape, total_bytes

    cfg = load_config(CONFIG, sets)
    shape = pretrained_shape(AutoConfig.from_pretrained(cfg.model.name))
    return total_bytes(memory_needs(cfg, shape, shortest_prompt=shortest_prompt, with_ref=False)) / 2**30


def stop_ids(model: Path) -> set[int]:
    """The ids that end a completion, by the trainer's own rule (the tokenizer's EOS and the generation config's)."""
    from types import SimpleNamespace

    from transformers import AutoTokenizer, GenerationConfig

    from dfpo.trainer.policy import generation_eos_ids

    tok = AutoTokenizer.from_pretrained(model)
    return {tok.eos_token_id, *generation_eos_ids(SimpleNamespace(generation_config=GenerationConfig.from_pretrained(model)))}


def check_run(run_dir: Path, steps: int) -> list[str]:
    """What a real-size run must show (finite metrics for every step, the chat template in what the model read, a
    checkpoint); a list of the problems found ([] when none)."""
    problems = []
    rows = read_jsonl(run_dir / "metrics.jsonl")
    if [r["step"] for r in rows] != list(range(1, steps + 1)):
        problems.append(f"metrics.jsonl holds steps {[r['step'] for r in rows]}, expected 1..{steps}")
    bad = [f"{k}@{r['step']}" for r in rows for k, v in r.items() if isinstance(v, float) and not math.isfinite(v)]
    if bad:
        problems.append(f"non-finite values: {bad[:5]}")
    varied = [r for r in rows if r.get("groups/zero_var_frac", 1.0) < 1.0]  # a step with a group whose rewards differ
    if not varied:
        problems.append("no group had rewards that differ in any step, so no gradient was shown (rare: rerun)")
    elif any(r.get("grad/norm", 0.0) <= 0 for r in varied):
        problems.append(f"a step with reward variance had no gradient: steps {[r['step'] for r in varied if r.get('grad/norm', 0.0) <= 0]}")
    samples = read_jsonl(run_dir / "samples.jsonl")
    template = "<|im_start|>user\n", "<|im_end|>\n<|im_start|>assistant\n<think>\n\n</think>\n\n"
    if not samples or not all(s["model_input"].startswith(template[0]) and s["model_input"].endswith(template[1]) for s in samples):
        problems.append("the prompts the model read do not carry Qwen3's chat template (user turn, assistant turn, empty think block)")
    if not (run_dir / "checkpoint.pt").is_file():
        problems.append("no checkpoint was written")
    return problems


def count_params(model: Path) -> int:
    """Parameters of the saved model, read from the safetensors header (nothing loaded)."""
    from safetensors import safe_open

    with safe_open(model / "model.safetensors", framework="pt") as f:
        return sum(math.prod(f.get_slice(k).get_shape()) for k in f.keys())


def prompt_lengths(model: Path, run_dir: Path) -> list[int]:
    """Tokens of each logged prompt as the model read it (samples.jsonl's ``model_input``)."""
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(model)
    return [len(tok(s["model_input"], add_special_tokens=False).input_ids) for s in read_jsonl(run_dir / "samples.jsonl")]


def update_flops(run_dir: Path, params: int, prompts: list[int], *, checkpointing: bool) -> float:
    """Matmul FLOPs of the run's updates, from sizes: 2 x params per token per forward-equivalent, 3 of them (forward
    and backward), 4 with checkpointing (the forward again), over every prompt and completion token the updates saw
    (``prompts``, the prompts' lengths as the model read them; the completions' mean length, from metrics.jsonl). LoRA
    runs the same matmuls (the frozen weights still pass the gradient on to earlier layers' adapters)."""
    steps = read_jsonl(run_dir / "metrics.jsonl")
    tokens = sum(ROWS_PER_STEP * (sum(prompts) / len(prompts) + r["completion/length"]) for r in steps)
    return 2.0 * params * tokens * (4 if checkpointing else 3)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--out", type=Path, default=ROOT / "runs" / "real-size")
    p.add_argument("--steps", type=int, default=2)
    p.add_argument("--variants", default=",".join(VARIANTS), help=f"comma-separated, of {', '.join(VARIANTS)}")
    p.add_argument("--no-resume", action="store_true", help="skip resuming the first variant for one more step")
    p.add_argument(
        "--discard-checkpoints",
        action="store_true",
        help="remove each variant's checkpoint once it is checked (and resumed): a full fine-tune's is 7.2 GB",
    )
    args = p.parse_args(argv)
    variants = [v.strip() for v in args.variants.split(",") if v.strip()]
    unknown = [v for v in variants if v not in VARIANTS]
    if unknown or not variants:
        p.error(f"--variants must name some of {', '.join(VARIANTS)}, got {args.variants!r}")
    taken = [str(args.out / v) for v in variants if (args.out / v).exists()]
    if taken:
        p.error(f"run folders exist: {', '.join(taken)}; choose another --out or remove them (this script never deletes)")
    args.out.mkdir(parents=True, exist_ok=True)
    model = args.out / "model"
    if not (model / "model.safetensors").is_file():
        built = build_model_folder(model)
        print(
            f"real-size: built {model}: {built['params'] / 1e6:.0f}M parameters, a tokenizer of {built['tokenizer_vocab']} tokens, {built['seconds']:.0f} s"
        )
    params = count_params(model)
    failed = [] if _end_of_turn_stops(model) else ["the chat template's end-of-turn token <|im_end|> does not end a completion"]
    train, evals = write_task(args.out)
    print(f"Each step: {ROWS_PER_STEP} completions of at most {NEW_TOKENS} new tokens; a model of {params / 1e6:.0f}M parameters.")
    print(
        "| variant | exit | wall s | peak RSS GiB | memory lower bound GiB | rollout s | update s "
        "| update GFLOP (estimate from sizes) | update GFLOP/s |"
    )
    print("|---|---|---|---|---|---|---|---|---|")
    for name in variants:
        run_dir = args.out / name
        sets = run_settings(model, train, evals, run_dir, args.steps) + VARIANTS[name]
        m = train_process(sets)
        t = stage_times(run_dir) if (run_dir / "metrics.jsonl").is_file() else {}
        prompts = prompt_lengths(model, run_dir) if m.status == 0 else [1]
        gflop = update_flops(run_dir, params, prompts, checkpointing="ckpt" in name) / 1e9 if m.status == 0 else math.nan
        update_s = t.get("update", math.nan)
        print(
            f"| {name} | {m.status} | {m.wall_s:.0f} | {m.peak_rss_gib:.1f} | {estimate_gib(sets, min(prompts)):.1f} | "
            f"{t.get('rollout', math.nan):.1f} | {update_s:.1f} | {gflop:.0f} | {gflop / update_s:.1f} |"
        )
        problems = check_run(run_dir, args.steps) if m.status == 0 else [m.output.strip().splitlines()[-1]]
        failed += [f"{name}: {x}" for x in problems]
        if name == variants[0] and not args.no_resume and not problems:
            failed += resume_for_one_step(run_dir, args.steps)
        if args.discard_checkpoints:
            discard_checkpoint(run_dir)
    for line in failed:
        print("real-size: FAILED", line)
    return 1 if failed else 0


def resume_for_one_step(run_dir: Path, steps: int) -> list[str]:
    """``dfpo train --resume`` the run for step ``steps + 1``; the problems found ([] when none)."""
    m = train_process([f"train.steps={steps + 1}"], resume=run_dir)
    logged = [r["step"] for r in read_jsonl(run_dir / "metrics.jsonl")]
    print(f"real-size: resumed {run_dir.name} for step {steps + 1}: exit {m.status}, {m.wall_s:.0f} s, steps logged {logged}")
    if m.status != 0 or logged != list(range(1, steps + 2)):
        return [f"resume of {run_dir.name}: exit {m.status}, steps {logged}: {m.output.strip().splitlines()[-1:]}"]
    return []


def discard_checkpoint(run_dir: Path) -> None:
    """Remove the checkpoint this script's run wrote into the run folder it created (and its record)."""
    from dfpo.trainer.run.layout import RunDir

    for name in (RunDir.CHECKPOINT, RunDir.CHECKPOINT_META):
        (run_dir / name).unlink(missing_ok=True)


def _end_of_turn_stops(model: Path) -> bool:
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(model).convert_tokens_to_ids("<|im_end|>") in stop_ids(model)


if __name__ == "__main__":
    raise SystemExit(main())
