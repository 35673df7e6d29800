"""A complete TRL script with a dfpo objective: DFPO Min-Replace inside TRL's GRPOTrainer.

    python examples/trl_dfpo.py                         # a tiny offline model, 4 optimiser steps on CPU
    python examples/trl_dfpo.py --objective gspo        # any dfpo preset or label, e.g. dfpo_min:stopgrad=score
    accelerate launch --multi_gpu --num_processes 2 --num_machines 1 --mixed_precision no --dynamo_backend no examples/trl_dfpo.py

The last line runs two processes: torchrun ranks, on the CPU with gloo since the config says use_cpu=True
(accelerate's ``--cpu`` flag would start a single process). Each process generates and trains on whole groups
of its own: TRL's sampler repeats a prompt num_generations times in a row, and accelerate hands each process
per_device_train_batch_size x steps_per_generation consecutive rows, a multiple of num_generations.

Swap in your own model, dataset, reward functions and GRPOConfig as with GRPOTrainer; the differences are
the ``objective`` argument and that per_device_train_batch_size must be a multiple of num_generations
(every loss call holds whole groups). dfpo's metrics appear in TRL's logs under ``dfpo/``.
"""

from __future__ import annotations

import argparse
import tempfile

from datasets import Dataset
from trl import GRPOConfig

from dfpo.integrations.trl import DFPOGRPOTrainer
from dfpo.trainer.config import ModelConfig
from dfpo.trainer.policy import build_char_tokenizer, build_tiny_model


def correct_sum(completions, answer, **kwargs):
    """1 for the right sum, plus 0.1 a digit as a shaping term (TRL's reward-function signature)."""
    return [float(c.strip().startswith(a)) + 0.1 * sum(ch.isdigit() for ch in c) for c, a in zip(completions, answer)]


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--objective", default="dfpo_min")
    p.add_argument("--steps", type=int, default=4)
    args = p.parse_args()
    tok = build_char_tokenizer()  # offline: a character tokenizer and a small Qwen2 built from a config
    model = build_tiny_model(ModelConfig(tiny_hidden=64, tiny_layers=2, tiny_heads=4, tiny_intermediate=128), tok, seed=0)
    data = Dataset.from_dict(
        {"prompt": [f"{a}+{b}=" for a in range(8) for b in range(8)], "answer": [str(a + b) for a in range(8) for b in range(8)]}
    )
    config = GRPOConfig(
        output_dir=tempfile.mkdtemp(prefix="trl_dfpo_"), use_cpu=True, bf16=False, report_to=[], save_strategy="no",
        per_device_train_batch_size=16, num_generations=8, steps_per_generation=2, max_completion_length=4,
        max_steps=args.steps, learning_rate=1e-3, logging_steps=1,
    )  # fmt: skip
    trainer = DFPOGRPOTrainer(
        model=model, reward_funcs=correct_sum, args=config, train_dataset=data, processing_class=tok, objective=args.objective
    )
    trainer.train()
    if not trainer.is_world_process_zero():  # print once; the logged metrics are averaged over the processes
        return
    for row in trainer.state.log_history:  # TRL logs rewards with a generation step, dfpo's metrics with each loss
        shown = {k: row[k] for k in ("reward", "dfpo/loss/policy", "dfpo/weights/asym", "dfpo/clip/frac_high") if k in row}
        if shown:
            print(f"step {row['step']}: " + ", ".join(f"{k} {v:.3g}" for k, v in shown.items()))


if __name__ == "__main__":
    main()
