"""A short DFPOGRPOTrainer run for ``accelerate launch`` (tiny offline model, CPU, gloo): each process writes
``rank<r>.json`` into ``--out`` with what every one of its loss calls held (group ids, advantages, prompt token
ids per row; with an adaptive entropy objective, the entropy each training call measured and its token count), the
whole-group check's own record and the log history, for test_trl_multiprocess.py to read.

    accelerate launch --multi_gpu --num_processes 2 --num_machines 1 --mixed_precision no --dynamo_backend no \\
        tests/integrations/trl_two_process_script.py --out DIR
"""

from __future__ import annotations

import argparse
import json
import warnings
from pathlib import Path

import torch
from datasets import Dataset
from trl import GRPOConfig

from dfpo.core.loss.adaptive_entropy import measured_entropy
from dfpo.integrations.trl import GROUP_KEY, DFPOGRPOTrainer
from dfpo.trainer.config import ModelConfig
from dfpo.trainer.policy import build_char_tokenizer, build_tiny_model

G = 4


class RecordingTrainer(DFPOGRPOTrainer):
    """DFPOGRPOTrainer that keeps, for every loss call, the rows it was given."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.calls: list[dict] = []
        self.entropy_calls: list[dict] = []  # what each training loss call added to its step's entropy measure
        if self.dfpo_entropy is not None:
            observe = self.dfpo_entropy.observe

            def recording_observe(old_logp, mask):
                self.entropy_calls.append(
                    {"step": int(self.state.global_step), "entropy": measured_entropy(old_logp, mask), "tokens": int(mask.sum())}
                )
                observe(old_logp, mask)

            self.dfpo_entropy.observe = recording_observe

    def _compute_loss(self, model, inputs):
        loss = super()._compute_loss(model, inputs)
        prompts = [ids[mask.bool()].tolist() for ids, mask in zip(inputs["prompt_ids"], inputs["prompt_mask"])]
        advantages = inputs["advantages"]
        self.calls.append(
            {
                "step": int(self._step),
                "group_ids": inputs[GROUP_KEY].tolist(),
                "advantages": (advantages if advantages.ndim == 1 else advantages[:, 0]).tolist(),
                "prompts": prompts,
            }
        )
        return loss


def reward(completions, answer, **kwargs):
    """Varies within a group, so TRL's group-normalised advantages are not all zero."""
    return [float(sum(map(ord, c)) % 3) + float(c.startswith(a)) for c, a in zip(completions, answer)]


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--out", required=True)
    p.add_argument("--objective", default="dfpo_min")
    p.add_argument("--steps", type=int, default=2)
    p.add_argument("--per-device", type=int, default=8)
    p.add_argument("--steps-per-generation", type=int, default=2)
    args = p.parse_args()
    torch.set_num_threads(1)
    tok = build_char_tokenizer()
    model = build_tiny_model(ModelConfig(tiny_hidden=32, tiny_layers=1, tiny_heads=2, tiny_intermediate=64), tok, seed=0)
    data = Dataset.from_dict({"prompt": [f"{i}+{i + 1}=" for i in range(16)], "answer": [str(2 * i + 1) for i in range(16)]})
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        config = GRPOConfig(
            output_dir=str(Path(args.out) / "trainer"), use_cpu=True, bf16=False, report_to=[], save_strategy="no",
            logging_steps=1, per_device_train_batch_size=args.per_device, gradient_accumulation_steps=2,
            num_generations=G, steps_per_generation=args.steps_per_generation, max_completion_length=4, max_steps=args.steps, learning_rate=1e-3, seed=0,
            disable_tqdm=True,
        )  # fmt: skip
    trainer = RecordingTrainer(
        model=model, reward_funcs=reward, args=config, train_dataset=data, processing_class=tok, objective=args.objective
    )
    trainer.train()
    rank, world = trainer.accelerator.process_index, trainer.accelerator.num_processes
    record = {
        "rank": rank,
        "world": world,
        "distributed_type": str(trainer.accelerator.distributed_type),
        "group_size": G,
        "groups_seen": trainer.dfpo_groups_seen,
        "calls": trainer.calls,
        "log_history": trainer.state.log_history,
        "entropy_calls": trainer.entropy_calls,
        "entropy_control": None if trainer.dfpo_entropy is None else trainer.dfpo_entropy.state(),
    }
    (Path(args.out) / f"rank{rank}.json").write_text(json.dumps(record))


if __name__ == "__main__":
    main()
