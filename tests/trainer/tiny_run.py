"""`--set` lines shared by the LLM trainer's end-to-end tests: the tiny offline model, and a reward with
variance from the first step (the format reward pays completions that start with a letter or digit, about
2 in 3 characters, so groups are rarely all-equal)."""

import json
import os
import random
import signal
import subprocess
import sys
import time
from pathlib import Path

from dfpo.trainer.run.layout import RunDir

TINY_MODEL_SETS = [
    "model.tiny_hidden=32",
    "model.tiny_layers=1",
    "model.tiny_heads=2",
    "model.tiny_intermediate=64",
    "model.sft_steps=3",
    "model.sft_batch_size=8",
    "data.max_operand=9",
]
TEMPLATE_TASK_SETS = [
    *TINY_MODEL_SETS,
    "data.task=sum_template",
    "data.operands=3",
    "data.train_size=40",
    "data.eval_size=4",
    "data.eval_seed=0",
]
"""The tiny model on the template sum task ('a + b + c = N'): 40 training and 4 held-out problems, the same for every seed."""
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


def sigkill_then_resume(tmp_path: Path, sets: list[str], steps: int) -> tuple[Path, Path, int]:
    """The run of ``sets`` uninterrupted (``tmp_path/full``) and the same run SIGKILLed, then resumed
    (``tmp_path/killed``); returns both folders and the kill seed.

    The kill point comes from the seed (DFPO_KILL_SEED=<seed> reruns a failure): after a random number of metrics
    lines, then a random delay that lands anywhere inside the next step (with save_every=1, sometimes inside the
    checkpoint write). The resume must exit 0."""
    env = dict(os.environ, PYTHONHASHSEED="0")
    full = tmp_path / "full"
    subprocess.run(train_command(full, sets), check=True, env=env, timeout=300, capture_output=True)
    seed = int(os.environ.get("DFPO_KILL_SEED", time.time()))
    print(f"kill seed {seed} (DFPO_KILL_SEED={seed} reproduces it)")
    kill_after = random.Random(seed).randint(1, steps - 1)  # metrics lines to wait for
    killed = tmp_path / "killed"
    proc = subprocess.Popen(train_command(killed, sets), env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    metrics, deadline = killed / RunDir.METRICS, time.time() + 300
    while time.time() < deadline and proc.poll() is None:
        if metrics.exists() and len(metrics.read_text().splitlines()) >= kill_after:
            break
        time.sleep(0.01)
    time.sleep(random.Random(seed + 1).uniform(0.0, 0.3))
    assert proc.poll() is None, f"run finished before the kill (seed {seed})"
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    resume = [sys.executable, "-m", "dfpo", "train", "--quiet", "--resume", str(killed)]
    out = subprocess.run(resume, env=env, timeout=300, capture_output=True, text=True)
    assert out.returncode == 0, out.stderr[-2000:]
    return full, killed, seed
