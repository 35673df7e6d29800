"""Run folders survive misuse: one process at a time, restartable before the first checkpoint,
clean stops on SIGINT/SIGTERM, and damaged checkpoints or logs are named on resume."""

from __future__ import annotations

import errno
import json
import os
import re
import signal
import subprocess
import sys
import time
import tomllib
from pathlib import Path

import pytest
import torch

from dfpo.cli import main
from dfpo.trainer.llm.checkpoint import WriteFailed, load_checkpoint, save_checkpoint
from dfpo.trainer.llm.launch import PARENT_DEATH
from dfpo.trainer.llm.run_folder import RunFolderLock
from dfpo.trainer.llm.runlog import StoppedAtOnce, StopSignals
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


def _killed_during_start_up(tmp_path) -> Path:
    """A real run SIGKILLed during its warm-up: config.toml and the mark written, no checkpoint yet."""
    run = tmp_path / "run"
    cmd = _cmd(run, 2)
    cmd[cmd.index("model.sft_steps=3")] = "model.sft_steps=100000"  # a warm-up that lasts
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.time() + 120
    while time.time() < deadline and not (run / "config.toml").is_file():
        time.sleep(0.05)
    time.sleep(0.5)
    proc.kill()
    proc.wait()
    assert (run / "config.toml").is_file() and not (run / "checkpoint.pt").exists()
    return run


def test_a_run_killed_during_start_up_starts_again_in_the_same_folder(tmp_path):
    run = _killed_during_start_up(tmp_path)
    assert json.loads((run / ".dfpo-run.json").read_text())["checkpointed"] is False
    summary = Trainer(tiny_config(tmp_path), quiet=True).run()
    assert summary["steps"] == 2 and (run / "checkpoint.pt").is_file()
    assert [json.loads(line)["step"] for line in (run / "metrics.jsonl").read_text().splitlines()] == [1, 2]
    assert json.loads((run / ".dfpo-run.json").read_text())["checkpointed"] is True


def _tree(folder: Path) -> dict[str, bytes]:
    """Every file under ``folder`` and its bytes, but dfpo's own lock (its PID changes hands)."""
    return {str(p.relative_to(folder)): p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file() and p.name != ".lock"}


def test_a_project_folder_holding_a_config_toml_is_refused_and_nothing_is_deleted(tmp_path):
    """A folder dfpo train did not mark as its own is never emptied, whatever it holds."""
    run = tmp_path / "run"
    (run / "src" / "pkg").mkdir(parents=True)
    (run / "config.toml").write_text("[tool]\nname = 'mine'\n")
    (run / "src" / "pkg" / "code.py").write_text("print('hello')\n")
    (run / "notes.md").write_text("my notes\n")
    before = _tree(run)
    with pytest.raises(
        ValueError, match=r"is not empty \(config.toml, notes.md, src\) and was not started by dfpo train.*nothing was deleted"
    ):
        Trainer(tiny_config(tmp_path), quiet=True)
    assert _tree(run) == before and not (run / ".lock").exists()  # not even a lock file left behind


def test_a_finished_run_whose_checkpoint_was_pruned_keeps_its_logs(tmp_path):
    run = _finished_run(tmp_path)
    (run / "checkpoint.pt").unlink()
    before = _tree(run)
    with pytest.raises(ValueError, match=r"holds a dfpo run whose checkpoint.pt is gone .*nothing was deleted"):
        Trainer(tiny_config(tmp_path), quiet=True)
    assert _tree(run) == before


def test_a_start_up_leftover_with_a_file_of_someone_else_is_refused(tmp_path):
    run = _killed_during_start_up(tmp_path)
    (run / "mine.txt").write_text("not dfpo's")
    before = _tree(run)
    with pytest.raises(ValueError, match=r"files dfpo train did not write \(mine.txt\); nothing was deleted"):
        Trainer(tiny_config(tmp_path), quiet=True)
    assert _tree(run) == before


def test_a_run_folder_holding_a_run_points_to_resume(tmp_path):
    _finished_run(tmp_path)
    with pytest.raises(ValueError, match=r"holds a run \(checkpoint at step 2\); continue it with --resume"):
        Trainer(tiny_config(tmp_path), quiet=True)


def test_a_file_in_the_way_is_refused_and_left_alone(tmp_path):
    (tmp_path / "run").write_text("mine")
    with pytest.raises(ValueError, match="is a file, expected a folder"):
        Trainer(tiny_config(tmp_path), quiet=True)
    assert (tmp_path / "run").read_text() == "mine"


@pytest.mark.parametrize(
    "damage, message", [("empty", "checkpoint.pt is empty"), ("truncate", "checkpoint.pt does not match the checksum in checkpoint.json")]
)
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


# ----------------------------------------------------------------------------- checkpoints: checksum, full disk


def test_a_bit_flip_inside_the_checkpoint_is_refused_on_resume(tmp_path):
    run = _finished_run(tmp_path)
    ckpt = run / "checkpoint.pt"
    data = bytearray(ckpt.read_bytes())
    data[len(data) // 2] ^= 0x01  # one bit, in the middle of the tensors: torch.load alone would not notice
    ckpt.write_bytes(bytes(data))
    with pytest.raises(ValueError, match=r"checkpoint.pt does not match the checksum in checkpoint.json \(step 2"):
        Trainer(tiny_config(tmp_path, "train.steps=3"), resume=True, quiet=True)
    assert ckpt.read_bytes() == bytes(data)  # left as found


def test_a_kill_between_the_record_and_the_rename_rolls_forward(tmp_path):
    """checkpoint.json already names the new checkpoint, which still sits in checkpoint.pt.tmp: the load finishes
    the rename instead of calling the checkpoint damaged."""
    save_checkpoint(tmp_path, {"step": 1, "w": torch.ones(3)})
    old = (tmp_path / "checkpoint.pt").read_bytes()
    save_checkpoint(tmp_path, {"step": 2, "w": torch.zeros(3)})
    os.replace(tmp_path / "checkpoint.pt", tmp_path / "checkpoint.pt.tmp")  # the new file, not yet renamed
    (tmp_path / "checkpoint.pt").write_bytes(old)  # the old one still in place
    state = load_checkpoint(tmp_path)
    assert state["step"] == 2 and torch.equal(state["w"], torch.zeros(3))
    assert not (tmp_path / "checkpoint.pt.tmp").exists()


def test_a_full_disk_during_a_checkpoint_keeps_the_previous_one_and_no_temp_file(tmp_path, monkeypatch):
    save_checkpoint(tmp_path, {"step": 1, "w": torch.ones(3)}, config={"seed": 0})
    record = (tmp_path / "checkpoint.json").read_text()

    def disk_full(obj, fh):
        fh.write(b"PK\x03\x04 partial")
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(torch, "save", disk_full)
    with pytest.raises(WriteFailed, match=r"no space left on the device .* the previous checkpoint \(step 1\) is kept"):
        save_checkpoint(tmp_path, {"step": 2, "w": torch.zeros(3)}, config={"seed": 0})
    monkeypatch.undo()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["checkpoint.json", "checkpoint.pt"]
    assert (tmp_path / "checkpoint.json").read_text() == record
    assert load_checkpoint(tmp_path)["step"] == 1


def _mount_tmpfs(folder: Path, size: int) -> bool:
    folder.mkdir(parents=True, exist_ok=True)
    return subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(folder)], capture_output=True).returncode == 0


def _used(folder: Path) -> int:
    return sum(p.stat().st_size for p in folder.rglob("*") if p.is_file())


@pytest.mark.skipif(sys.platform != "linux", reason="needs a Linux tmpfs")
def test_a_real_full_disk_stops_with_one_message_and_resumes_once_there_is_room(tmp_path):
    """On a filesystem with room for one checkpoint but not for its replacement beside it: exit 1, one line naming the
    file and the kept step, no traceback, no temp file; after the filesystem grows, --resume finishes the run."""
    probe = tmp_path / "probe"
    subprocess.run(_cmd(probe, 1), check=True, capture_output=True, timeout=300)
    ckpt = (probe / "checkpoint.pt").stat().st_size
    end_of_run = sum(p.stat().st_size for p in probe.glob("curves.png"))  # drawn after the last checkpoint: no room for a checkpoint
    room = _used(probe) - end_of_run + ckpt // 2  # the first checkpoint fits; a second beside it does not
    disk = tmp_path / "disk"
    if not _mount_tmpfs(disk, room):
        pytest.skip("mounting a tmpfs needs root (CI runs as root)")
    try:
        run = disk / "run"
        proc = subprocess.run(_cmd(run, 3), capture_output=True, text=True, timeout=300)
        assert proc.returncode == 1, proc.stderr[-2000:]
        assert "Traceback" not in proc.stderr
        assert re.search(r"no space left on the device", proc.stderr), proc.stderr
        assert not [p.name for p in run.iterdir() if p.name.endswith(".tmp")]
        kept = json.loads((run / "checkpoint.json").read_text())["step"]
        assert load_checkpoint(run)["step"] == kept
        subprocess.run(["mount", "-o", f"remount,size={room * 4}", str(disk)], check=True)
        resumed = subprocess.run(
            [sys.executable, "-m", "dfpo", "train", "--quiet", "--resume", str(run)], capture_output=True, text=True, timeout=300
        )
        assert resumed.returncode == 0, resumed.stderr[-2000:]
        assert json.loads((run / "summary.json").read_text())["steps"] == 3
    finally:
        subprocess.run(["umount", "-l", str(disk)], capture_output=True)


# ----------------------------------------------------------------------------- resume: the config the checkpoint was made with


def test_resume_refuses_a_hand_edited_objective_naming_the_file_and_key(tmp_path, capsys):
    run = _finished_run(tmp_path)
    path = run / "config.toml"
    path.write_text(path.read_text().replace('name = "dfpo_min"', 'name = "gspo"'))
    assert main(["train", "--resume", str(run), "--set", "train.steps=3"]) == 2
    err = capsys.readouterr().err
    assert (
        f"{path} differs from the config checkpoint.pt was made with: objective.name ('dfpo_min' in the checkpoint, 'gspo' in config.toml)"
        in err
    )


@pytest.mark.parametrize(
    "damage, message", [("empty", "is empty: a resume never falls back to built-in defaults"), ("torn", "is not valid TOML")]
)
def test_resume_refuses_an_empty_or_torn_config_and_restore_config_repairs_it(tmp_path, capsys, damage, message):
    run = _finished_run(tmp_path)
    path = run / "config.toml"
    good = path.read_text()
    path.write_text("" if damage == "empty" else good[: len(good) // 2] + '"unterminated')
    assert main(["train", "--quiet", "--resume", str(run), "--set", "train.steps=3"]) == 2
    assert message in capsys.readouterr().err
    assert main(["train", "--quiet", "--resume", str(run), "--set", "train.steps=3", "--restore-config"]) == 0
    assert tomllib.loads(path.read_text()) == tomllib.loads(good) | {"train": tomllib.loads(good)["train"] | {"steps": 3}}


def test_resume_rewrites_config_toml_atomically(tmp_path, monkeypatch):
    """A write of config.toml that fails half-way (a full disk) leaves the old file whole."""
    run = _finished_run(tmp_path)
    good = (run / "config.toml").read_text()
    real_fdopen = os.fdopen

    def fails_half_way(fd, *args, **kwargs):
        fh = real_fdopen(fd, *args, **kwargs)
        if ".config.toml." not in os.readlink(f"/proc/self/fd/{fd}"):  # only the rewrite of config.toml fails
            return fh
        real_write = fh.write

        def write(text):
            real_write(text[: len(text) // 2])
            raise OSError(errno.ENOSPC, "No space left on device")

        fh.write = write
        return fh

    monkeypatch.setattr(os, "fdopen", fails_half_way)
    with pytest.raises(WriteFailed, match="config.toml: no space left"):
        Trainer(tiny_config(tmp_path, "train.steps=3"), resume=True, quiet=True)
    monkeypatch.undo()
    assert (run / "config.toml").read_text() == good
    assert not [p.name for p in run.iterdir() if p.name.endswith(".tmp")]


# ----------------------------------------------------------------------------- signals at any moment


@pytest.mark.parametrize("sig, code", [(signal.SIGTERM, 143), (signal.SIGINT, 130)])
def test_a_signal_during_start_up_stops_at_once_and_the_same_command_starts_again(tmp_path, sig, code):
    """During the warm-up there is no step to finish: the signal stops the program within seconds, and the folder
    it leaves is cleared by the next start of the same command."""
    run = tmp_path / "run"
    cmd = _cmd(run, 2)
    cmd[cmd.index("model.sft_steps=3")] = "model.sft_steps=100000"
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    deadline = time.time() + 120
    while time.time() < deadline and not (run / "config.toml").is_file():
        time.sleep(0.05)
    time.sleep(0.5)  # inside the warm-up
    t0 = time.monotonic()
    proc.send_signal(sig)
    _, err = proc.communicate(timeout=60)
    assert time.monotonic() - t0 < 10
    assert proc.returncode == code, err
    assert "Traceback" not in err
    assert (
        f"{signal.Signals(sig).name} during start-up: stopped before the first training step; start it again with the same command" in err
    )
    cmd[cmd.index("model.sft_steps=100000")] = "model.sft_steps=3"
    again = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
    assert again.returncode == 0, again.stderr[-2000:]


class _SignalsItselfWhileFinalised:
    """Sends SIGTERM to its own process from ``__del__``, as a signal that arrives while the garbage collector runs a
    finaliser: Python ignores an exception raised there ("Exception ignored in ... __del__")."""

    def __del__(self):
        os.kill(os.getpid(), signal.SIGTERM)
        time.sleep(0.05)  # the handler runs here, inside the finaliser


@pytest.mark.parametrize("training", [False, True], ids=["start-up", "second-signal-in-training"])
def test_a_signal_swallowed_by_a_finaliser_still_stops_the_program(training, capsys):
    """A stop raised inside __del__ is lost to Python; the signal is delivered again until the program stops
    (a run once went on warming up for minutes after SIGTERM)."""
    swallowed = False
    with pytest.raises(StoppedAtOnce), StopSignals() as stop:
        if training:
            stop.training().signum = signal.SIGINT  # a first signal already recorded: the next one stops at once
        _SignalsItselfWhileFinalised()  # collected at once: the handler's exception is ignored
        assert stop.signum == signal.SIGTERM
        swallowed = True  # the program went on after the signal
        deadline = time.monotonic() + 5 * StopSignals.REDELIVER_S
        while time.monotonic() < deadline:  # the warm-up going on
            time.sleep(0.01)
    assert swallowed and signal.getsignal(signal.SIGTERM) is not stop._handle
    assert "Exception ignored" not in capsys.readouterr().err


def test_repeated_parent_death_signals_stop_after_the_step_not_at_once():
    """A dying launcher's kernel sends the rank PARENT_DEATH once per thread it is handed to: two of them are still
    one "stop after the step", where two SIGTERMs would stop at once and lose the step."""
    with StopSignals() as stop:
        stop.training()
        for _ in range(3):
            os.kill(os.getpid(), PARENT_DEATH)
            time.sleep(0.05)
        assert stop.signum == PARENT_DEATH


def test_a_second_signal_stops_at_once_and_the_last_checkpoint_resumes(tmp_path):
    """The first SIGINT waits for the end of the step; a second one stops now, naming the lost step and the kept
    checkpoint."""
    run = tmp_path / "run"
    cmd = _cmd(run, 400)
    cmd[cmd.index("train.save_every=50")] = "train.save_every=1"
    # a reward that sleeps 0.2 s a call on one worker: steps of about 2 s, long enough to signal twice inside one
    cmd += ["--set", "reward.kind=user", "--set", 'reward.user_fn="reward_fixtures:sleeps_then_one"', "--set", "reward.workers=1"]
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(Path(__file__).parent), os.environ.get("PYTHONPATH", "")]))
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
    deadline = time.time() + 240
    while time.time() < deadline and not ((run / "metrics.jsonl").is_file() and (run / "metrics.jsonl").read_text().count("\n") >= 1):
        time.sleep(0.02)
    time.sleep(0.5)  # step 1's checkpoint written, step 2 under way (its rewards take about 1.6 s)
    proc.send_signal(signal.SIGINT)
    time.sleep(0.2)
    proc.send_signal(signal.SIGINT)
    _, err = proc.communicate(timeout=120)
    assert proc.returncode == 130, err
    assert "Traceback" not in err
    kept = json.loads((run / "checkpoint.json").read_text())["step"]
    assert re.search(rf"SIGINT again: stopped at once during step \d+, which is lost; resume from the checkpoint of step {kept}", err), err
    resumed = subprocess.run(
        [sys.executable, "-m", "dfpo", "train", "--quiet", "--resume", str(run), "--set", f"train.steps={kept + 1}"],
        capture_output=True,
        text=True,
        timeout=300,
        env=env,
    )
    assert resumed.returncode == 0, resumed.stderr[-2000:]
