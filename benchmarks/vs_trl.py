"""dfpo train against TRL's GRPOTrainer at equal work, alternating A B A B in one invocation.

    python benchmarks/vs_trl.py                 # grpo and gspo, 3 pairs each, 3 training steps per trial
    python benchmarks/vs_trl.py --quick         # grpo only, 2 pairs, 2 steps (a few minutes on 2 cores)

Both sides get the same model (a Qwen2-style config with a 32k vocabulary, built from a config and saved
to a temp folder: no download), the same tokenizer (word-level, 32k entries), the same 16 prompts x G = 8,
temperature 1 sampling with up to 32 new tokens (the EOS row of the LM head is set so completions end at
varying lengths), AdamW, 4 optimiser steps per rollout batch (one epoch of 4 mini-batches of 4 groups),
the same objective (TRL loss_type 'grpo'; GSPO = TRL importance_sampling_level='sequence'), no KL,
gradient checkpointing off on both sides, float32 on CPU. Old log-probs are needed on both sides (K = 4):
TRL recomputes them for the whole rollout batch. dfpo takes the sampler's own log-probs (rollout.old_logp
'auto': exact for float32 sampling at temperature 1); ``--dfpo-old-logp recompute`` makes it recompute them
as TRL does (for the rows after the first optimiser step: the first step's forward serves its own rows).
dfpo's update scores the LM head and the loss in one pass (optim.fused_head 'eager', the trainer's default);
``--dfpo-fused-head off`` runs token_logprobs then policy_loss instead.

Every trial runs in a fresh process (so its peak RSS is its own) and trains ``--steps`` rollout batches;
the first is a warm-up and is left out of the times. Printed per trial: seconds per rollout batch split into
rollout (generation and rewards), old log-probs, update; completion tokens per second; peak RSS. Then,
per objective, the ratio dfpo / TRL of tokens per second for each pair, and its median and range.

Imports are deferred into the functions on purpose: a trial's process imports only its own side's stack (dfpo's
trainer or TRL's; the TRL side takes dfpo's prompt generator and nothing else of it), so that neither side's peak
RSS carries the other's modules.
"""

from __future__ import annotations

import argparse
import json
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

VOCAB = 32_000
PROMPTS, G, MAX_NEW, MINIBATCHES = 16, 8, 32, 4


def build_model(folder: Path, hidden: int, layers: int) -> None:
    """A Qwen2-style model with a 32k word-level vocabulary, its EOS logit raised so lengths vary."""
    # deferred: this runs in the parent only (see the module docstring)
    import torch
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers
    from transformers import AutoModelForCausalLM, PreTrainedTokenizerFast, Qwen2Config

    from dfpo.trainer.policy import CHARS, SPECIAL_TOKENS

    words = list(SPECIAL_TOKENS) + list(CHARS)
    words += [f"<w{i}>" for i in range(VOCAB - len(words))]
    core = Tokenizer(models.WordLevel(vocab={w: i for i, w in enumerate(words)}, unk_token="<unk>"))
    core.pre_tokenizer = pre_tokenizers.Split("", behavior="isolated")
    core.decoder = decoders.Fuse()
    tok = PreTrainedTokenizerFast(tokenizer_object=core, pad_token="<pad>", eos_token="<eos>", unk_token="<unk>")
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


def prompts_and_answers(n: int) -> list[tuple[str, str]]:
    """The prompts dfpo's built-in 'add' task makes (seeded), formatted as dfpo formats them."""
    # deferred: the TRL trial calls this too and needs no more of dfpo (see the module docstring)
    from dfpo.trainer.config import DataConfig
    from dfpo.trainer.tasks import load_splits

    data = DataConfig(task="add", train_size=n, eval_size=1)
    train, _ = load_splits(data, 0)
    return [(data.prompt_template.replace("{prompt}", ex.prompt), ex.answer) for ex in train[:n]]


def run_dfpo(folder: str, objective: str, steps: int, threads: int, out: Path, old_logp: str = "auto", fused_head: str = "eager") -> dict:
    # deferred: a trial imports only its own side's stack (see the module docstring)
    from dfpo.trainer.config import apply_overrides, config_from_dict
    from dfpo.trainer.train import Trainer

    sets = [
        f'model.name="{folder}"', "model.gradient_checkpointing=false", f"data.train_size={PROMPTS}", "data.eval_size=1",
        f"rollout.prompts_per_step={PROMPTS}", f"rollout.group_size={G}", f"rollout.max_new_tokens={MAX_NEW}",
        "rollout.temperature=1.0", "rollout.top_p=1.0", "rollout.top_k=0", f"optim.minibatch_groups={PROMPTS // MINIBATCHES}",
        "optim.epochs=1", "optim.lr=1e-5", f"objective.name={objective}", "eval.every=0", f"train.steps={steps}",
        "log.progress=false", "log.samples_every=0", "log.diagnostics=false", f"threads={threads}", f'run_dir="{out}"',
        f"rollout.old_logp={old_logp}", f"optim.fused_head={fused_head}",
    ]  # fmt: skip
    Trainer(config_from_dict(apply_overrides({}, sets)), quiet=True).run()
    rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()][1:]  # warm-up left out
    return {
        "rollout_s": statistics.mean(r["time/rollout_s"] for r in rows),
        "old_logp_s": statistics.mean(r["time/old_logp_s"] for r in rows),
        "update_s": statistics.mean(r["time/update_s"] for r in rows),
        "step_s": statistics.mean(r["time/step_s"] for r in rows),
        "tokens": statistics.mean(r["completion/length"] * PROMPTS * G for r in rows),
    }


def run_trl(folder: str, objective: str, steps: int, threads: int, out: Path) -> dict:
    import torch
    from datasets import Dataset
    from transformers import AutoModelForCausalLM, AutoTokenizer, TrainerCallback
    from trl import GRPOConfig, GRPOTrainer

    torch.set_num_threads(threads)
    pairs = prompts_and_answers(PROMPTS)
    data = Dataset.from_dict({"prompt": [p for p, _ in pairs], "answer": [a for _, a in pairs]})

    def correct(completions, answer, **kwargs):
        return [float(c.strip() == a) for c, a in zip(completions, answer)]

    extra = {"importance_sampling_level": "sequence", "epsilon": 3e-4, "epsilon_high": 4e-4} if objective == "gspo" else {"epsilon": 0.2}
    args = GRPOConfig(
        output_dir=str(out), use_cpu=True, bf16=False, report_to=[], save_strategy="no", logging_steps=1, learning_rate=1e-5,
        per_device_train_batch_size=PROMPTS * G // MINIBATCHES, gradient_accumulation_steps=1, steps_per_generation=MINIBATCHES,
        num_generations=G, num_iterations=1, max_completion_length=MAX_NEW, temperature=1.0, top_p=1.0, top_k=0, beta=0.0,
        loss_type="grpo", gradient_checkpointing=False, max_steps=steps * MINIBATCHES, seed=0, disable_tqdm=True, **extra,
    )  # fmt: skip
    model = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32)
    trainer = GRPOTrainer(
        model=model, reward_funcs=correct, args=args, train_dataset=data, processing_class=AutoTokenizer.from_pretrained(folder)
    )
    phases = {"gen_and_score": [], "old_logp": [], "step_end": [], "lengths": []}
    gen_real, logps_real = trainer._generate_and_score_completions, trainer._get_per_token_logps_and_entropies

    def gen_timed(*a, **k):
        t0 = time.perf_counter()
        out = gen_real(*a, **k)
        phases["gen_and_score"].append(time.perf_counter() - t0)
        phases["lengths"].append(float(out["completion_mask"].sum()))
        return out

    def logps_timed(*a, **k):
        t0 = time.perf_counter()
        out = logps_real(*a, **k)
        if not torch.is_grad_enabled():  # the old-log-prob recompute inside _generate_and_score_completions
            phases["old_logp"].append(time.perf_counter() - t0)
        return out

    class StepClock(TrainerCallback):
        def on_step_end(self, args, state, control, **kwargs):
            phases["step_end"].append(time.perf_counter())

    trainer._generate_and_score_completions, trainer._get_per_token_logps_and_entropies = gen_timed, logps_timed
    trainer.add_callback(StepClock())
    t_start = time.perf_counter()
    trainer.train()
    ends = [t_start] + phases["step_end"][MINIBATCHES - 1 :: MINIBATCHES]  # the end of each rollout batch's last optimiser step
    cycle = [b - a for a, b in zip(ends, ends[1:])][1:]
    old = phases["old_logp"][1:steps]  # one recompute call per rollout batch (chunked inside TRL)
    gen = [g - o for g, o in zip(phases["gen_and_score"][1:], old)]
    return {
        "rollout_s": statistics.mean(gen),
        "old_logp_s": statistics.mean(old),
        "update_s": statistics.mean(c - g - o for c, g, o in zip(cycle, gen, old)),
        "step_s": statistics.mean(cycle),
        "tokens": statistics.mean(phases["lengths"][1:]),
    }


def worker(args) -> None:
    out = Path(tempfile.mkdtemp(prefix=f"vs_trl_{args.side}_"))
    if args.side == "dfpo":
        result = run_dfpo(args.model_dir, args.objective, args.steps, args.threads, out / "run", args.dfpo_old_logp, args.dfpo_fused_head)
    else:
        result = run_trl(args.model_dir, args.objective, args.steps, args.threads, out / "run")
    result["peak_rss_mib"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    result["tokens_per_s"] = result["tokens"] / result["step_s"]
    print("RESULT " + json.dumps(result), flush=True)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--objectives", nargs="+", default=["grpo", "gspo"], choices=["grpo", "gspo"])
    p.add_argument("--pairs", type=int, default=3, help="A B pairs per objective (default 3)")
    p.add_argument("--steps", type=int, default=3, help="rollout batches per trial, the first a warm-up (default 3)")
    p.add_argument("--hidden", type=int, default=128)
    p.add_argument("--layers", type=int, default=2)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--quick", action="store_true", help="grpo only, 2 pairs, 2 steps")
    p.add_argument(
        "--dfpo-old-logp", default="auto", choices=["auto", "recompute"],
        help="dfpo's rollout.old_logp: 'recompute' runs an old-log-prob forward as TRL does (the ablation of the sampler's log-probs)",
    )  # fmt: skip
    p.add_argument(
        "--dfpo-fused-head", default="eager", choices=["eager", "compile", "off"],
        help="dfpo's optim.fused_head: the LM head and the loss in one pass (eager, the default; compile) or off (token_logprobs, then policy_loss)",
    )  # fmt: skip
    p.add_argument("--side", choices=["dfpo", "trl"], help=argparse.SUPPRESS)
    p.add_argument("--objective", help=argparse.SUPPRESS)
    p.add_argument("--model-dir", help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.side:
        worker(args)
        return 0
    if args.quick:
        args.objectives, args.pairs, args.steps = ["grpo"], 2, 2
    if args.steps < 2 or args.pairs < 1:
        raise SystemExit(f"--steps must be >= 2 (one warm-up) and --pairs >= 1, got --steps {args.steps} --pairs {args.pairs}")
    folder = Path(tempfile.mkdtemp(prefix="vs_trl_model_"))
    build_model(folder, args.hidden, args.layers)
    print(f"model: Qwen2-style, vocab {VOCAB}, hidden {args.hidden}, {args.layers} layers; {PROMPTS} prompts x G={G}, "
          f"<= {MAX_NEW} new tokens, {MINIBATCHES} optimiser steps per rollout batch, {args.threads} threads, CPU float32; "
          f"dfpo rollout.old_logp={args.dfpo_old_logp}, optim.fused_head={args.dfpo_fused_head}")  # fmt: skip
    print(
        f"{'objective':9s} {'side':5s} {'rollout s':>9s} {'old-logp s':>10s} {'update s':>9s} {'step s':>7s} {'tok/s':>7s} {'peak MiB':>9s}"
    )
    ratios: dict[str, list[float]] = {}
    for objective in args.objectives:
        for pair in range(args.pairs):
            got = {}
            for side in ("dfpo", "trl") if pair % 2 == 0 else ("trl", "dfpo"):
                cmd = [sys.executable, __file__, "--side", side, "--objective", objective, "--model-dir", str(folder), "--steps", str(args.steps),
                       "--threads", str(args.threads), "--dfpo-old-logp", args.dfpo_old_logp, "--dfpo-fused-head", args.dfpo_fused_head]  # fmt: skip
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


if __name__ == "__main__":
    sys.exit(main())
