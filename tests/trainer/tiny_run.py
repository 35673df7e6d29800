"""`--set` lines shared by the LLM trainer's end-to-end tests: the tiny offline model, and a reward with
variance from the first step (the format reward pays completions that start with a letter or digit, about
2 in 3 characters, so groups are rarely all-equal)."""

import json
import sys

TINY_MODEL_SETS = [
    "model.tiny_hidden=32",
    "model.tiny_layers=1",
    "model.tiny_heads=2",
    "model.tiny_intermediate=64",
    "model.sft_steps=3",
    "model.sft_batch_size=8",
    "data.max_operand=9",
]
FORMAT_REWARD_SETS = ["reward.format_weight=1.0", 'reward.format_regex="^[0-9a-zA-Z]"']
LOG_EVERY_STEP_SETS = [
    "train.save_every=1",
    "eval.every=2",
    "eval.k=2",
    "log.tensorboard=false",
    "log.progress=false",
    "log.samples_every=1",
    "threads=1",
]
"""A checkpoint and samples every step, an eval every other step, no TensorBoard or progress bar, one thread."""


def train_command(run_dir, sets: list[str]) -> list[str]:
    """``python -m dfpo train`` with every key from ``sets`` (an empty config file beside ``run_dir``) into ``run_dir``."""
    config = run_dir.parent / "empty.toml"
    config.write_text("# every key comes from --set\n")
    cmd = [sys.executable, "-m", "dfpo", "train", "--quiet", "--config", str(config)]
    for s in [*sets, f"run_dir={run_dir}"]:
        cmd += ["--set", s]
    return cmd


def timeless_records(path) -> list[dict]:
    """The rows of a metrics.jsonl without their ``time/*`` keys (what two runs of the same work must agree on)."""
    return [{k: v for k, v in json.loads(line).items() if not k.startswith("time/")} for line in path.read_text().splitlines()]
