"""Run folders survive misuse: one process at a time, restartable before the first checkpoint,
clean stops on SIGINT/SIGTERM, and damaged checkpoints or logs are named on resume."""

from __future__ import annotations

import errno
import hashlib
import json
import os
import pickle
import random
import re
import shlex
import shutil
import signal
import subprocess
import sys
import time
import tomllib
from pathlib import Path

import numpy as np
import pytest
import torch
from safetensors import SafetensorError

from dfpo.cli import main
from dfpo.core.files import WriteFailed
from dfpo.trainer.config import config_to_dict
from dfpo.trainer.run import checkpoint as checkpoint_module
from dfpo.trainer.run import logs as logs_module
from dfpo.trainer.run import state as state_module
from dfpo.trainer.run.checkpoint import load_checkpoint, save_checkpoint, set_rng_state
from dfpo.trainer.run.folder import RunFolderLock
from dfpo.trainer.run.layout import RunDir
from dfpo.trainer.run.signals import PARENT_DEATH, StoppedAtOnce, StopSignals
from dfpo.trainer.train import Trainer

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
    (run / RunDir.LOCK).write_text("999999")  # no process holds the flock
    trainer = Trainer(tiny_config(tmp_path), quiet=True)
    assert (run / RunDir.LOCK).read_text() == str(os.getpid())
    trainer.close()


def _killed_during_start_up(tmp_path) -> Path:
    """A real run SIGKILLed during its warm-up: config.toml and the mark written, no checkpoint yet."""
    run = tmp_path / "run"
    cmd = _cmd(run, 2)
    cmd[cmd.index("model.sft_steps=3")] = "model.sft_steps=100000"  # a warm-up that lasts
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.time() + 120
    while time.time() < deadline and not (run / RunDir.CONFIG).is_file():
        time.sleep(0.05)
    time.sleep(0.5)
    proc.kill()
    proc.wait()
    assert (run / RunDir.CONFIG).is_file() and not (run / RunDir.CHECKPOINT).exists()
    return run


def test_a_run_killed_during_start_up_starts_again_in_the_same_folder(tmp_path):
    run = _killed_during_start_up(tmp_path)
    assert json.loads((run / RunDir.MARK).read_text())["checkpointed"] is False
    summary = Trainer(tiny_config(tmp_path), quiet=True).run()
    assert summary["steps"] == 2 and (run / RunDir.CHECKPOINT).is_file()
    assert [json.loads(line)["step"] for line in (run / RunDir.METRICS).read_text().splitlines()] == [1, 2]
    assert json.loads((run / RunDir.MARK).read_text())["checkpointed"] is True


def _tree(folder: Path) -> dict[str, bytes]:
    """Every file under ``folder`` and its bytes, but dfpo's own lock (its PID changes hands)."""
    return {str(p.relative_to(folder)): p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file() and p.name != RunDir.LOCK}


def test_a_project_folder_holding_a_config_toml_is_refused_and_nothing_is_deleted(tmp_path):
    """A folder dfpo train did not mark as its own is never emptied, whatever it holds."""
    run = tmp_path / "run"
    (run / "src" / "pkg").mkdir(parents=True)
    (run / RunDir.CONFIG).write_text("[tool]\nname = 'mine'\n")
    (run / "src" / "pkg" / "code.py").write_text("print('hello')\n")
    (run / "notes.md").write_text("my notes\n")
    before = _tree(run)
    with pytest.raises(
        ValueError, match=r"is not empty \(config.toml, notes.md, src\) and was not started by dfpo train.*nothing was deleted"
    ):
        Trainer(tiny_config(tmp_path), quiet=True)
    assert _tree(run) == before and not (run / RunDir.LOCK).exists()  # not even a lock file left behind


def test_a_finished_run_whose_checkpoint_was_pruned_keeps_its_logs(tmp_path):
    run = _finished_run(tmp_path)
    (run / RunDir.CHECKPOINT).unlink()
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
    ckpt = run / RunDir.CHECKPOINT
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
    lines = (run / RunDir.METRICS).read_text().splitlines()
    (run / RunDir.METRICS).write_text(lines[1] + "\n" + '{"step": 3, "rew')  # step 1 lost, a torn step-3 line
    summary = Trainer(tiny_config(tmp_path, "train.steps=3"), resume=True, quiet=True).run()
    err = capsys.readouterr().err
    assert "has no line for step(s) [1]" in err  # said even with quiet
    steps = [json.loads(line)["step"] for line in (run / RunDir.METRICS).read_text().splitlines()]
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
    while time.time() < deadline and not ((run / RunDir.METRICS).is_file() and (run / RunDir.METRICS).read_text().count("\n") >= 2):
        time.sleep(0.05)
    proc.send_signal(sig)
    out, err = proc.communicate(timeout=120)
    assert proc.returncode == code, err
    assert "Traceback" not in err and f"resume with: dfpo train --resume {run}" in err
    logged = [json.loads(line)["step"] for line in (run / RunDir.METRICS).read_text().splitlines()]
    assert json.loads((run / RunDir.CHECKPOINT_META).read_text())["step"] == logged[-1] >= 2  # checkpoint of the last finished step
    assert logged == list(range(1, logged[-1] + 1))
    resumed = subprocess.run(
        [sys.executable, "-m", "dfpo", "train", "--quiet", "--resume", str(run), "--set", f"train.steps={logged[-1] + 1}"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert resumed.returncode == 0, resumed.stderr
    assert json.loads((run / RunDir.SUMMARY).read_text())["steps"] == logged[-1] + 1


# ----------------------------------------------------------------------------- checkpoints: checksum, full disk


def test_a_bit_flip_inside_the_checkpoint_is_refused_on_resume(tmp_path):
    run = _finished_run(tmp_path)
    ckpt = run / RunDir.CHECKPOINT
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
    old = (tmp_path / RunDir.CHECKPOINT).read_bytes()
    save_checkpoint(tmp_path, {"step": 2, "w": torch.zeros(3)})
    os.replace(tmp_path / RunDir.CHECKPOINT, tmp_path / "checkpoint.pt.tmp")  # the new file, not yet renamed
    (tmp_path / RunDir.CHECKPOINT).write_bytes(old)  # the old one still in place
    state = load_checkpoint(tmp_path)
    assert state["step"] == 2 and torch.equal(state["w"], torch.zeros(3))
    assert not (tmp_path / "checkpoint.pt.tmp").exists()


def test_a_full_disk_during_a_checkpoint_keeps_the_previous_one_and_no_temp_file(tmp_path, monkeypatch):
    save_checkpoint(tmp_path, {"step": 1, "w": torch.ones(3)}, config={"seed": 0})
    record = (tmp_path / RunDir.CHECKPOINT_META).read_text()

    def disk_full(obj, fh):
        fh.write(b"PK\x03\x04 partial")
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(torch, "save", disk_full)
    with pytest.raises(WriteFailed, match=r"no space left on the device .* the previous checkpoint \(step 1\) is kept"):
        save_checkpoint(tmp_path, {"step": 2, "w": torch.zeros(3)}, config={"seed": 0})
    monkeypatch.undo()
    assert sorted(p.name for p in tmp_path.iterdir()) == [RunDir.CHECKPOINT_META, RunDir.CHECKPOINT]
    assert (tmp_path / RunDir.CHECKPOINT_META).read_text() == record
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
    ckpt = (probe / RunDir.CHECKPOINT).stat().st_size
    end_of_run = sum(p.stat().st_size for p in probe.glob(RunDir.CURVES))  # drawn after the last checkpoint: no room for a checkpoint
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
        kept = json.loads((run / RunDir.CHECKPOINT_META).read_text())["step"]
        assert load_checkpoint(run)["step"] == kept
        subprocess.run(["mount", "-o", f"remount,size={room * 4}", str(disk)], check=True)
        resumed = subprocess.run(
            [sys.executable, "-m", "dfpo", "train", "--quiet", "--resume", str(run)], capture_output=True, text=True, timeout=300
        )
        assert resumed.returncode == 0, resumed.stderr[-2000:]
        assert json.loads((run / RunDir.SUMMARY).read_text())["steps"] == 3
    finally:
        subprocess.run(["umount", "-l", str(disk)], capture_output=True)


# ----------------------------------------------------------------------------- resume: the config the checkpoint was made with


def test_resume_refuses_a_hand_edited_objective_naming_the_file_and_key(tmp_path, capsys):
    run = _finished_run(tmp_path)
    path = run / RunDir.CONFIG
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
    path = run / RunDir.CONFIG
    good = path.read_text()
    path.write_text("" if damage == "empty" else good[: len(good) // 2] + '"unterminated')
    assert main(["train", "--quiet", "--resume", str(run), "--set", "train.steps=3"]) == 2
    assert message in capsys.readouterr().err
    assert main(["train", "--quiet", "--resume", str(run), "--set", "train.steps=3", "--restore-config"]) == 0
    assert tomllib.loads(path.read_text()) == tomllib.loads(good) | {"train": tomllib.loads(good)["train"] | {"steps": 3}}


def test_resume_rewrites_config_toml_atomically(tmp_path, monkeypatch):
    """A write of config.toml that fails half-way (a full disk) leaves the old file whole."""
    run = _finished_run(tmp_path)
    good = (run / RunDir.CONFIG).read_text()
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
    assert (run / RunDir.CONFIG).read_text() == good
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
    while time.time() < deadline and not (run / RunDir.CONFIG).is_file():
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


class _SignalsItselfWhileFinalisedAndWraps:
    """As ``_SignalsItselfWhileFinalised``, but the stop leaves ``__del__`` wrapped in a RuntimeError, as Python 3.11
    wraps one raised inside ``__set_name__`` (a class made while a finaliser runs)."""

    def __del__(self):
        try:
            os.kill(os.getpid(), signal.SIGTERM)
            time.sleep(0.05)
        except StoppedAtOnce as err:
            raise RuntimeError("Error calling __set_name__ on '_Field' instance") from err


def test_a_wrapped_stop_swallowed_by_a_finaliser_is_a_stop_not_a_reported_error(monkeypatch):
    """A stop that a finaliser swallows inside another exception is still known as a stop (``stop_beneath``): it
    wakes the redelivery at once, and the hook that reports ignored exceptions ("Exception ignored in ...") never
    sees it."""
    reported = []
    monkeypatch.setattr(sys, "unraisablehook", lambda unraisable: reported.append(unraisable.exc_value))
    with pytest.raises(StoppedAtOnce), StopSignals():
        _SignalsItselfWhileFinalisedAndWraps()
        deadline = time.monotonic() + 5 * StopSignals.REDELIVER_S
        while time.monotonic() < deadline:
            time.sleep(0.01)
    assert reported == []


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
    while time.time() < deadline and not ((run / RunDir.METRICS).is_file() and (run / RunDir.METRICS).read_text().count("\n") >= 1):
        time.sleep(0.02)
    time.sleep(0.5)  # step 1's checkpoint written, step 2 under way (its rewards take about 1.6 s)
    proc.send_signal(signal.SIGINT)
    time.sleep(0.2)
    proc.send_signal(signal.SIGINT)
    _, err = proc.communicate(timeout=120)
    assert proc.returncode == 130, err
    assert "Traceback" not in err
    kept = json.loads((run / RunDir.CHECKPOINT_META).read_text())["step"]
    assert re.search(
        rf"SIGINT again: stopped at once during step {kept + 1}, which is lost \(it runs again on resume\); no finished step is lost: "
        rf"the checkpoint of step {kept}, the last finished one, is on disk",
        err,
    ), err
    resumed = subprocess.run(
        [sys.executable, "-m", "dfpo", "train", "--quiet", "--resume", str(run), "--set", f"train.steps={kept + 1}"],
        capture_output=True,
        text=True,
        timeout=300,
        env=env,
    )
    assert resumed.returncode == 0, resumed.stderr[-2000:]


# ----------------------------------------------------------------------------- nothing read from a run folder runs code


@pytest.fixture(scope="module")
def finished_template(tmp_path_factory) -> Path:
    """One finished tiny run (2 steps), copied by ``_copy_of_finished`` into each test that damages one."""
    base = tmp_path_factory.mktemp("finished")
    Trainer(tiny_config(base), quiet=True).run()
    return base / "run"


def _copy_of_finished(template: Path, tmp_path: Path) -> Path:
    """A finished run at tmp_path/run, where ``tiny_config(tmp_path)`` points."""
    run = tmp_path / "run"
    shutil.copytree(template, run)
    (run / RunDir.LOCK).unlink()
    return run


def _error_lines(stderr: str) -> list[str]:
    return [line for line in stderr.splitlines() if line.startswith("dfpo: error:")]


class _RunsCodeWhenUnpickled:
    """What a planted checkpoint carries: unpickling it runs a shell command that creates ``marker``."""

    def __init__(self, marker: Path):
        self.marker = marker

    def __reduce__(self):
        return (os.system, (f"touch {shlex.quote(str(self.marker))}",))


def _plant(run: Path, marker: Path, *, form: str, record: bool) -> Path:
    """Replace the run's checkpoint.pt with a pickle that would create ``marker`` (``form``: a torch.save zip or a bare
    pickle); ``record``: give checkpoint.json its checksum (a checksum says the file is intact, not who wrote it),
    else delete checkpoint.json."""
    ckpt = run / RunDir.CHECKPOINT
    planted = {"step": 2, "model": {}, "payload": _RunsCodeWhenUnpickled(marker)}
    if form == "zip":
        torch.save(planted, ckpt)
    else:
        ckpt.write_bytes(pickle.dumps(planted))
    if record:
        meta = json.loads((run / RunDir.CHECKPOINT_META).read_text())
        meta.update(sha256=hashlib.sha256(ckpt.read_bytes()).hexdigest(), size=ckpt.stat().st_size)
        (run / RunDir.CHECKPOINT_META).write_text(json.dumps(meta))
    else:
        (run / RunDir.CHECKPOINT_META).unlink()
    return ckpt


@pytest.mark.parametrize("record", [True, False], ids=["with-matching-record", "without-record"])
@pytest.mark.parametrize("form", ["zip", "bare-pickle"])
def test_a_planted_pickle_never_runs_on_resume_and_the_message_names_the_file(finished_template, tmp_path, capsys, form, record):
    run = _copy_of_finished(finished_template, tmp_path)
    marker = tmp_path / "code-ran"
    ckpt = _plant(run, marker, form=form, record=record)
    assert main(["train", "--quiet", "--resume", str(run), "--set", "train.steps=3"]) == 2
    err = capsys.readouterr().err
    assert not marker.exists()
    errors = _error_lines(err)
    assert "Traceback" not in err and len(errors) == 1 and str(ckpt) in errors[0], err


@pytest.mark.parametrize("form", ["zip", "bare-pickle"])
def test_load_checkpoint_loads_tensors_and_plain_data_only(tmp_path, form):
    """The last line of defence, whatever ran before it: a checkpoint with a verified checksum is still read with
    torch.load(weights_only=True), and one that needs more is refused naming the file."""
    save_checkpoint(tmp_path, {"step": 2, "w": torch.ones(3)}, config={"seed": 0})
    marker = tmp_path / "code-ran"
    ckpt = _plant(tmp_path, marker, form=form, record=True)
    with pytest.raises(ValueError, match=rf"{re.escape(str(ckpt))} holds .*not tensors or plain data.*not loaded"):
        load_checkpoint(tmp_path)
    assert not marker.exists()


def test_a_checkpoint_loads_with_weights_only(finished_template):
    """Every value a checkpoint holds is a tensor or plain data: torch.load(weights_only=True) reads it with no
    allow-list (the NumPy RNG state included)."""
    state = torch.load(finished_template / RunDir.CHECKPOINT, weights_only=True)
    assert state["step"] == 2 and {"model", "optimizer", "scheduler", "rng", "sampler", "config"} <= set(state)


def test_a_checkpoint_of_the_previous_format_still_loads_and_restores_its_random_state(tmp_path):
    """Format 2 kept NumPy's RNG key as an ndarray: the narrow allow-list transformers' Trainer also uses for it
    (ndarray, dtype, uint32) lets runs started before format 3 resume; nothing else is allowed."""
    np.random.seed(7)
    old_numpy_state = np.random.get_state()  # ('MT19937', ndarray of uint32, pos, has_gauss, gauss)
    expected = np.random.rand(3)
    rng = {"python": random.getstate(), "numpy": old_numpy_state, "torch": torch.get_rng_state()}
    save_checkpoint(tmp_path, {"step": 1, "rng": rng}, config={"seed": 0})
    state = load_checkpoint(tmp_path)
    np.random.seed(0)
    set_rng_state(state["rng"])
    assert np.array_equal(np.random.rand(3), expected)


# ----------------------------------------------------------------------------- a checkpoint is verified, or not loaded


@pytest.mark.parametrize(
    "damage, says",
    [
        ("missing", r"no checkpoint.json beside it"),
        ("empty", r"checkpoint.json is empty"),
        ("torn", r"checkpoint.json is not valid JSON"),
        ("no-checksum", r"checkpoint.json holds no checksum"),
    ],
)
def test_a_checkpoint_without_a_usable_record_is_refused_saying_which(finished_template, tmp_path, damage, says):
    """A bit flipped in checkpoint.pt and its record gone: no unverified checkpoint is ever loaded."""
    run = _copy_of_finished(finished_template, tmp_path)
    ckpt = run / RunDir.CHECKPOINT
    data = bytearray(ckpt.read_bytes())
    data[len(data) // 2] ^= 0x01
    ckpt.write_bytes(bytes(data))
    record = run / RunDir.CHECKPOINT_META
    if damage == "missing":
        record.unlink()
    elif damage == "empty":
        record.write_text("")
    elif damage == "torn":
        record.write_text(record.read_text()[:40])
    else:
        meta = json.loads(record.read_text())
        del meta["sha256"]
        record.write_text(json.dumps(meta))
    with pytest.raises(ValueError, match=rf"{says}.*cannot be verified.*nothing was loaded"):
        Trainer(tiny_config(tmp_path, "train.steps=3"), resume=True, quiet=True)
    assert ckpt.read_bytes() == bytes(data)


# ----------------------------------------------------------------------------- a run has an identity


def test_resume_refuses_a_checkpoint_copied_from_another_run_naming_both(tmp_path, capsys):
    """A gspo run's checkpoint, record and config copied into a dfpo_min run's folder: metrics.jsonl would mix two
    runs. The folder's mark says which run it holds, and the resume is refused before anything is written."""
    mine = _finished_run(tmp_path / "mine", "objective.name=dfpo_min")
    other = _finished_run(tmp_path / "other", "objective.name=gspo")
    for name in (RunDir.CHECKPOINT, RunDir.CHECKPOINT_META, RunDir.CONFIG):
        shutil.copy(other / name, mine / name)
    before = _tree(mine)
    assert main(["train", "--quiet", "--resume", str(mine), "--set", "train.steps=3"]) == 2
    err = capsys.readouterr().err
    assert re.search(r"holds the run dfpo_min seed 0 \(config [0-9a-f]{12}, \.dfpo-run\.json\).*gspo seed 0 \(config [0-9a-f]{12}", err), (
        err
    )
    assert _tree(mine) == before


def test_the_mark_records_the_runs_identity_when_it_starts(finished_template):
    mark = json.loads((finished_template / RunDir.MARK).read_text())
    assert mark["identity"]["objective"] == "dfpo_min" and mark["identity"]["seed"] == 0
    assert re.fullmatch(r"[0-9a-f]{64}", mark["identity"]["config_sha256"])


def test_the_identity_ignores_what_a_resume_may_change_and_nothing_else():
    from dfpo.trainer.run.folder import run_identity

    base = config_to_dict(tiny_config(Path("/a")))
    same = config_to_dict(tiny_config(Path("/b"), "train.steps=9", "train.save_every=3", "eval.every=0"))
    assert run_identity(base) == run_identity(same)
    for change in ("seed=1", "optim.lr=0.5", "objective.name=gspo", "rollout.group_size=2"):
        assert run_identity(config_to_dict(tiny_config(Path("/a"), change))) != run_identity(base), change


# ----------------------------------------------------------------------------- init_model: written whole, cleared only if dfpo's


def _killed_after_the_warm_up(tmp_path: Path, monkeypatch) -> Path:
    """A run stopped between its warm-up (init_model written) and its first checkpoint."""

    def killed(*args, **kwargs):
        raise KeyboardInterrupt

    with monkeypatch.context() as m:
        m.setattr(state_module, "save_checkpoint", killed)
        with pytest.raises(KeyboardInterrupt):
            Trainer(tiny_config(tmp_path), quiet=True)
    run = tmp_path / "run"
    assert (run / RunDir.INIT_MODEL / "model.safetensors").is_file() and not (run / RunDir.CHECKPOINT).exists()
    return run


def test_a_run_nested_in_a_start_up_leftovers_init_model_is_never_deleted(tmp_path, monkeypatch):
    """Run X stopped after its warm-up; run Y trained in X/init_model/other; X's command again is refused, naming
    Y's folder, and Y is left whole."""
    x = _killed_after_the_warm_up(tmp_path, monkeypatch)
    y = x / RunDir.INIT_MODEL / "other"
    Trainer(tiny_config(tmp_path, f'run_dir="{y}"'), quiet=True).run()
    before = _tree(x)
    with pytest.raises(ValueError, match=r"files dfpo train did not write \(init_model/other\); nothing was deleted"):
        Trainer(tiny_config(tmp_path), quiet=True)
    assert _tree(x) == before and (y / RunDir.CHECKPOINT).is_file()


@pytest.mark.parametrize("intruder", ["notes.txt", "sub/file", "link"])
def test_an_init_model_holding_anything_else_is_refused(tmp_path, monkeypatch, intruder):
    x = _killed_after_the_warm_up(tmp_path, monkeypatch)
    path = x / RunDir.INIT_MODEL / intruder
    if intruder == "link":
        (tmp_path / "target.txt").write_text("not dfpo's")
        path.symlink_to(tmp_path / "target.txt")
    else:
        path.parent.mkdir(exist_ok=True)
        path.write_text("mine")
    before = _tree(x)
    with pytest.raises(ValueError, match=r"files dfpo train did not write \(init_model/.*\); nothing was deleted"):
        Trainer(tiny_config(tmp_path), quiet=True)
    assert _tree(x) == before


def test_a_run_stopped_after_its_warm_up_starts_again_in_the_same_folder(tmp_path, monkeypatch):
    run = _killed_after_the_warm_up(tmp_path, monkeypatch)
    summary = Trainer(tiny_config(tmp_path), quiet=True).run()
    assert summary["steps"] == 2 and (run / RunDir.CHECKPOINT).is_file()


def test_resume_without_init_model_says_it_is_missing_not_to_download(finished_template, tmp_path, capsys):
    run = _copy_of_finished(finished_template, tmp_path)
    shutil.rmtree(run / RunDir.INIT_MODEL)
    assert main(["train", "--quiet", "--resume", str(run), "--set", "train.steps=3"]) == 2
    err = capsys.readouterr().err
    assert f"{run / 'init_model'} is missing" in err and "hub" not in err, err


def test_resume_with_a_truncated_init_model_says_which_file(finished_template, tmp_path, capsys):
    run = _copy_of_finished(finished_template, tmp_path)
    weights = run / RunDir.INIT_MODEL / "model.safetensors"
    weights.write_bytes(weights.read_bytes()[:100])
    assert main(["train", "--quiet", "--resume", str(run), "--set", "train.steps=3"]) == 2
    assert "model.safetensors" in capsys.readouterr().err


# ----------------------------------------------------------------------------- run_dir a broken symbolic link


@pytest.mark.parametrize("kind", ["dangling", "loop"])
def test_a_run_dir_that_is_a_broken_symlink_is_refused_naming_it(tmp_path, capsys, kind):
    link = tmp_path / "run"
    link.symlink_to(tmp_path / "nowhere" if kind == "dangling" else link)
    config = tmp_path / "c.toml"
    config.write_text("")
    assert main(["train", "--quiet", "--config", str(config), "--set", f"run_dir={link}"]) == 2
    err = capsys.readouterr().err
    assert "Traceback" not in err and f"run_dir {str(link)!r} is a symbolic link" in err, err
    assert link.is_symlink() and not (tmp_path / "nowhere").exists()


# ----------------------------------------------------------------------------- full disk: one message at every write


class _FullAfter:
    """A binary file whose writes fail with ENOSPC once ``room`` bytes are written (a disk filling up)."""

    def __init__(self, fh, room: int):
        self.fh, self.room = fh, room

    def write(self, data) -> int:
        if len(data) > self.room:
            raise OSError(errno.ENOSPC, "No space left on device")
        self.room -= len(data)
        return self.fh.write(data)

    def __getattr__(self, name):
        return getattr(self.fh, name)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.fh.close()


def test_a_full_disk_inside_torch_save_is_a_write_failure_not_its_runtime_error(tmp_path, monkeypatch):
    """torch.save turns the ENOSPC of the file it writes into 'RuntimeError: ... unexpected pos': the checkpoint
    writer reports the OSError behind it, and the previous checkpoint stays."""
    save_checkpoint(tmp_path, {"step": 1, "w": torch.ones(3)}, config={"seed": 0})
    monkeypatch.setattr(checkpoint_module, "open", lambda path, mode="r": _FullAfter(open(path, mode), 200), raising=False)
    with pytest.raises(WriteFailed, match=r"checkpoint.pt: no space left on the device .* the previous checkpoint \(step 1\) is kept"):
        save_checkpoint(tmp_path, {"step": 2, "w": torch.zeros(1000)}, config={"seed": 0})
    monkeypatch.undo()
    assert sorted(p.name for p in tmp_path.iterdir()) == [RunDir.CHECKPOINT_META, RunDir.CHECKPOINT]
    assert load_checkpoint(tmp_path)["step"] == 1


def test_a_full_disk_writing_init_model_is_one_message_and_the_same_command_starts_again(tmp_path, monkeypatch, capsys):
    """safetensors reports ENOSPC as SafetensorError; the run stops with the one message, and once there is room the
    same command starts the run again in the same folder."""
    import transformers.modeling_utils

    def disk_full(*args, **kwargs):
        raise SafetensorError("Error while serializing: I/O error: No space left on device (os error 28)")

    run = tmp_path / "run"
    config = tmp_path / "c.toml"
    config.write_text("")
    argv = ["train", "--quiet", "--config", str(config)] + [x for s in [*SETS, "train.steps=1", f"run_dir={run}"] for x in ("--set", s)]
    with monkeypatch.context() as m:
        m.setattr(transformers.modeling_utils, "safe_save_file", disk_full)
        assert main(argv) == 1
    err = capsys.readouterr().err
    assert "Traceback" not in err and len(_error_lines(err)) == 1
    assert f"{run / 'init_model'}: no space left on the device" in err and "run the same command again" in err, err
    assert main(argv) == 0


def test_logs_that_cannot_be_closed_on_a_full_disk_are_one_message(tmp_path, monkeypatch):
    """A line that could not be written stays in the file's buffer, and closing the file tries again: that second
    failure is the same message, never a bare OSError."""
    run = _finished_run(tmp_path)
    trainer = Trainer(tiny_config(tmp_path, "train.steps=3"), resume=True, quiet=True)

    def disk_full():
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(trainer.logs.metrics, "close", disk_full)
    with pytest.raises(WriteFailed, match=rf"{re.escape(str(run / 'metrics.jsonl'))}: no space left on the device"):
        trainer.close()
    monkeypatch.undo()
    trainer.close()


def test_a_full_disk_while_resume_trims_the_logs_is_one_message(tmp_path, monkeypatch):
    run = _finished_run(tmp_path)
    lines = (run / RunDir.METRICS).read_text()
    (run / RunDir.METRICS).write_text(lines + '{"step": 3}\n')  # a line past the checkpoint: the resume drops it

    def disk_full(path, text):
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(logs_module, "write_text_atomic", disk_full)
    with pytest.raises(WriteFailed, match=r"metrics.jsonl: no space left on the device"):
        Trainer(tiny_config(tmp_path, "train.steps=3"), resume=True, quiet=True)
    assert (run / RunDir.METRICS).read_text() == lines + '{"step": 3}\n'


@pytest.mark.slow
@pytest.mark.skipif(sys.platform != "linux", reason="needs a Linux tmpfs")
def test_every_level_of_free_space_ends_in_one_message_and_keeps_the_last_checkpoint(tmp_path):
    """dfpo train on filesystems from a few KiB to about the size of a whole run: every one where the finished run's
    files cannot fit stops with exit 1 and one line naming the file and the space, no traceback, no temporary file,
    and a checkpoint it wrote still loads; near the top a run may also finish (how much room a checkpoint being
    replaced needs at once depends on the filesystem's block rounding), and then it finished cleanly."""
    probe = tmp_path / "probe"
    cmd = lambda run: _cmd(run, 3) + ["--set", "train.save_every=1"]  # noqa: E731
    subprocess.run(cmd(probe), check=True, capture_output=True, timeout=300)
    final = _used(probe)  # what the finished run keeps: a disk smaller than this cannot hold it
    need = final + (probe / RunDir.CHECKPOINT).stat().st_size  # the run, and a second checkpoint being written
    disk = tmp_path / "disk"
    if not _mount_tmpfs(disk, 4096):
        pytest.skip("mounting a tmpfs needs root (CI runs as root)")
    subprocess.run(["umount", "-l", str(disk)], capture_output=True)
    for i in range(13):
        room = max(4096, need * i // 13)
        assert _mount_tmpfs(disk, room)
        try:
            run = disk / "run"
            proc = subprocess.run(cmd(run), capture_output=True, text=True, timeout=300)
            where = f"room {room} of {need}: {proc.stderr[-3000:]}"
            assert "Traceback" not in proc.stderr, where
            if proc.returncode == 0 and room >= final:
                assert json.loads((run / RunDir.CHECKPOINT_META).read_text())["step"] == 3, where
                continue
            assert proc.returncode == 1, where
            errors = [line for line in proc.stderr.splitlines() if line.startswith("dfpo: error:")]
            assert len(errors) == 1 and "no space left on the device" in errors[0], where
            assert not [p for p in disk.rglob("*") if p.name.endswith(".tmp")], where
            if (run / RunDir.CHECKPOINT).is_file():
                assert load_checkpoint(run)["step"] == json.loads((run / RunDir.CHECKPOINT_META).read_text())["step"], where
        finally:
            subprocess.run(["umount", "-l", str(disk)], capture_output=True)
