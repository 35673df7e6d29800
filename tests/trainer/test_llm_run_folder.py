"""Run folders survive misuse: one process at a time, restartable before the first checkpoint,
clean stops on SIGINT/SIGTERM, and damaged checkpoints or logs are named on resume."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from dfpo.cli import main
from dfpo.trainer.llm.runlog import RunFolderLock
from dfpo.trainer.llm.train import Trainer

sys.path.insert(0, str(Path(__file__).parent))
from test_llm_e2e import tiny_config  # noqa: E402
from test_llm_resume import SETS  # noqa: E402


def _finished_run(tmp_path, *extra):
    cfg = tiny_config(tmp_path, *extra)
    Trainer(cfg, quiet=True).run()
    return tmp_path / "run"


def test_a_run_folder_in_use_is_refused_naming_the_holder(tmp_path):
    run = tmp_path / "run"
    run.mkdir()
    holder = RunFolderLock(run)
    holder.acquire()
    try:
        with pytest.raises(ValueError, match=rf"is in use by process {os.getpid()}"):
            Trainer(tiny_config(tmp_path), quiet=True)
    finally:
        holder.release()


def test_a_stale_lock_of_a_dead_process_is_taken_over(tmp_path):
    run = tmp_path / "run"
    run.mkdir()
    (run / ".lock").write_text("999999")  # no process holds the flock
    trainer = Trainer(tiny_config(tmp_path), quiet=True)
    assert (run / ".lock").read_text() == str(os.getpid())
    trainer.close()


def test_a_run_stopped_before_its_first_checkpoint_starts_again_in_the_same_folder(tmp_path):
    run = tmp_path / "run"
    run.mkdir()
    (run / "config.toml").write_text("seed = 0\n")
    (run / "metrics.jsonl").write_text('{"step": 1, "reward/mean": 0.1')  # torn, no checkpoint
    summary = Trainer(tiny_config(tmp_path), quiet=True).run()
    assert summary["steps"] == 2 and (run / "checkpoint.pt").is_file()
    assert [json.loads(line)["step"] for line in (run / "metrics.jsonl").read_text().splitlines()] == [1, 2]


def test_a_run_folder_holding_a_run_points_to_resume(tmp_path):
    _finished_run(tmp_path)
    with pytest.raises(ValueError, match=r"holds a run \(checkpoint at step 2\); continue it with --resume"):
        Trainer(tiny_config(tmp_path), quiet=True)


def test_a_file_in_the_way_is_refused_and_left_alone(tmp_path):
    (tmp_path / "run").write_text("mine")
    with pytest.raises(ValueError, match="is a file, expected a folder"):
        Trainer(tiny_config(tmp_path), quiet=True)
    assert (tmp_path / "run").read_text() == "mine"


@pytest.mark.parametrize("damage, message", [("empty", "checkpoint.pt is empty"), ("truncate", "checkpoint.pt is truncated or corrupt")])
def test_a_damaged_checkpoint_is_named_on_resume(tmp_path, damage, message):
    run = _finished_run(tmp_path)
    ckpt = run / "checkpoint.pt"
    data = ckpt.read_bytes()
    ckpt.write_bytes(b"" if damage == "empty" else data[: len(data) // 2])
    with pytest.raises(ValueError, match=message):
        Trainer(tiny_config(tmp_path, "train.steps=3"), resume=True, quiet=True).run()


def test_resume_below_the_checkpoint_step_is_refused(tmp_path, capsys):
    run = _finished_run(tmp_path)
    assert main(["train", "--resume", str(run), "--set", "train.steps=1"]) == 2
    assert "train.steps=1 is below the checkpoint's step 2" in capsys.readouterr().err


def test_resume_drops_a_torn_tail_and_reports_lost_lines(tmp_path, capsys):
    run = _finished_run(tmp_path)
    lines = (run / "metrics.jsonl").read_text().splitlines()
    (run / "metrics.jsonl").write_text(lines[1] + "\n" + '{"step": 3, "rew')  # step 1 lost, a torn step-3 line
    summary = Trainer(tiny_config(tmp_path, "train.steps=3"), resume=True, quiet=True).run()
    err = capsys.readouterr().err
    assert "has no line for step(s) [1]" in err  # said even with quiet
    steps = [json.loads(line)["step"] for line in (run / "metrics.jsonl").read_text().splitlines()]
    assert steps == [2, 3]
    assert summary["steps"] == 3 and summary["steps_missing_from_log"] == [1]


def _cmd(run_dir: Path, steps: int) -> list[str]:
    config = run_dir.parent / "empty.toml"
    config.write_text("# every key comes from --set\n")
    cmd = [sys.executable, "-m", "dfpo", "train", "--quiet", "--config", str(config)]
    for s in [*SETS, f"train.steps={steps}", "train.save_every=50", f"run_dir={run_dir}"]:
        cmd += ["--set", s]
    return cmd


@pytest.mark.parametrize("sig, code", [(signal.SIGINT, 130), (signal.SIGTERM, 143)])
def test_a_signal_stops_after_the_step_with_a_checkpoint_and_the_run_resumes(tmp_path, sig, code):
    run = tmp_path / "run"
    proc = subprocess.Popen(_cmd(run, 400), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    deadline = time.time() + 120
    while time.time() < deadline and not ((run / "metrics.jsonl").is_file() and (run / "metrics.jsonl").read_text().count("\n") >= 2):
        time.sleep(0.05)
    proc.send_signal(sig)
    out, err = proc.communicate(timeout=120)
    assert proc.returncode == code, err
    assert "Traceback" not in err and f"resume with: dfpo train --resume {run}" in err
    logged = [json.loads(line)["step"] for line in (run / "metrics.jsonl").read_text().splitlines()]
    assert json.loads((run / "checkpoint.json").read_text())["step"] == logged[-1] >= 2  # checkpoint of the last finished step
    assert logged == list(range(1, logged[-1] + 1))
    resumed = subprocess.run(
        [sys.executable, "-m", "dfpo", "train", "--quiet", "--resume", str(run), "--set", f"train.steps={logged[-1] + 1}"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert resumed.returncode == 0, resumed.stderr
    assert json.loads((run / "summary.json").read_text())["steps"] == logged[-1] + 1
