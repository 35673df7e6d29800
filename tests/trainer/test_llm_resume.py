"""A run SIGKILLed at a random point and resumed ends exactly like a run never killed (CPU)."""

import json
import signal
import subprocess
import time
from pathlib import Path

import torch
from tiny_run import FORMAT_REWARD_SETS, LOG_EVERY_STEP_SETS, TINY_MODEL_SETS, sigkill_then_resume, timeless_records, train_command

from dfpo.trainer.run.layout import RunDir

STEPS = 6
SETS = [
    *TINY_MODEL_SETS,
    "data.train_size=40",
    "data.eval_size=4",
    "rollout.prompts_per_step=2",
    "rollout.group_size=4",
    "rollout.max_new_tokens=3",
    *FORMAT_REWARD_SETS,
    "objective.name=dfpo_min",
    "optim.lr=1e-2",
    "optim.minibatch_groups=1",
    "optim.epochs=2",
    f"train.steps={STEPS}",
    *LOG_EVERY_STEP_SETS,
]


def _cmd(run_dir: Path) -> list[str]:
    return train_command(run_dir, SETS)


def test_sigkill_at_a_random_step_then_resume_equals_uninterrupted(tmp_path):
    full, killed, seed = sigkill_then_resume(tmp_path, SETS, STEPS)

    a = torch.load(full / RunDir.CHECKPOINT, weights_only=True)
    b = torch.load(killed / RunDir.CHECKPOINT, weights_only=True)
    assert a["step"] == b["step"] == STEPS
    for name in a["model"]:
        assert torch.equal(a["model"][name], b["model"][name]), f"{name} differs (kill seed {seed})"
    assert timeless_records(full / RunDir.METRICS) == timeless_records(killed / RunDir.METRICS), f"kill seed {seed}"
    assert timeless_records(full / RunDir.EVALS) == timeless_records(killed / RunDir.EVALS)
    assert timeless_records(full / RunDir.SAMPLES) == timeless_records(killed / RunDir.SAMPLES)


def test_resume_refuses_changes_that_break_exactness(tmp_path):
    from dfpo.cli import main

    run = tmp_path / "r"
    run.mkdir()
    (run / RunDir.CONFIG).write_text("seed = 0\n")
    assert main(["train", "--resume", str(run), "--set", "optim.lr=1.0"]) == 2
    assert main(["train", "--resume", str(tmp_path / "nothing")]) == 2


def test_resume_with_more_steps_extends_a_finished_run(tmp_path):
    from dfpo.cli import main

    config = tmp_path / "c.toml"
    config.write_text("")
    run = tmp_path / "run"
    sets = []
    for s in [x for x in SETS if not x.startswith("train.steps")] + ["train.steps=2", f"run_dir={run}"]:
        sets += ["--set", s]
    assert main(["train", "--quiet", "--config", str(config), *sets]) == 0
    assert main(["train", "--quiet", "--resume", str(run), "--set", "train.steps=3"]) == 0
    steps = [json.loads(line)["step"] for line in (run / RunDir.METRICS).read_text().splitlines()]
    assert steps == [1, 2, 3]


def test_sigkill_during_the_warm_start_leaves_a_folder_that_starts_again(tmp_path):
    """Killed before the first checkpoint (inside the supervised warm start): the same command runs
    the whole run again in the same folder."""
    run = tmp_path / "warm"
    cmd = _cmd(run) + ["--set", "model.sft_steps=400", "--set", "train.steps=2"]
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.time() + 120
    while time.time() < deadline and not (run / RunDir.CONFIG).exists():
        time.sleep(0.01)
    time.sleep(0.2)
    assert proc.poll() is None and not (run / RunDir.CHECKPOINT).exists(), "the warm start ended before the kill"
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    again = subprocess.run(
        _cmd(run) + ["--set", "model.sft_steps=3", "--set", "train.steps=2"], capture_output=True, text=True, timeout=300
    )
    assert again.returncode == 0, again.stderr[-2000:]
    assert json.loads((run / RunDir.SUMMARY).read_text())["steps"] == 2
