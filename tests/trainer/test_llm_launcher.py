"""`dfpo train --nproc 2` answers as one command: a signal stops every rank after its step with one message and the
shell's exit status, a start-up error is one line and exit 2, and no rank outlives a killed launcher."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from test_llm_data_parallel import ENV, _cmd, children

from dfpo.trainer.launch import Launcher, rank_environment
from dfpo.trainer.run.layout import RunDir

LONG = ("train.steps=400", "train.save_every=50")


def _alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state != "Z"


def _start(run: Path, *extra: str) -> subprocess.Popen:
    """The launcher in a session of its own (its process group is what a terminal's Ctrl-C reaches)."""
    return subprocess.Popen(
        _cmd(run, *LONG, *extra, nproc=2), env=ENV, start_new_session=True, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )


def _wait_for_steps(run: Path, proc: subprocess.Popen, n: int) -> None:
    deadline = time.time() + 240
    metrics = run / RunDir.METRICS
    while time.time() < deadline and proc.poll() is None:
        if metrics.is_file() and metrics.read_text().count("\n") >= n:
            return
        time.sleep(0.05)
    raise AssertionError(f"no {n} metrics lines within 240 s (exit {proc.poll()}): {proc.stderr.read() if proc.poll() is not None else ''}")


@pytest.mark.parametrize(
    "sig, to_group, code",
    [(signal.SIGTERM, False, 143), (signal.SIGINT, True, 130)],
    ids=["SIGTERM-to-the-launcher", "SIGINT-to-its-process-group"],
)
def test_a_signal_stops_every_rank_after_its_step_with_one_message(tmp_path, sig, to_group, code):
    run = tmp_path / "run"
    proc = _start(run)
    _wait_for_steps(run, proc, 2)
    ranks = children(proc.pid)
    assert len(ranks) == 2
    (os.killpg if to_group else os.kill)(proc.pid, sig)
    out, err = proc.communicate(timeout=240)
    assert proc.returncode == code, err[-3000:]
    assert "Traceback" not in err
    assert err.count(f"{signal.Signals(sig).name}: stopped after step") == 1, err[-3000:]
    assert f"resume with: dfpo train --resume {run}" in err
    assert not any(_alive(pid) for pid in ranks)
    logged = [json.loads(line)["step"] for line in (run / RunDir.METRICS).read_text().splitlines()]
    assert json.loads((run / RunDir.CHECKPOINT_META).read_text())["step"] == logged[-1]  # the checkpoint of the last finished step


def test_killing_the_launchers_process_group_stops_the_ranks(tmp_path):
    """SIGKILL leaves the launcher no chance to pass anything on: the kernel's parent-death signal stops the ranks."""
    run = tmp_path / "run"
    proc = _start(run)
    _wait_for_steps(run, proc, 2)
    ranks = children(proc.pid)
    assert len(ranks) == 2
    os.killpg(proc.pid, signal.SIGKILL)
    proc.wait()
    deadline = time.time() + 120
    while time.time() < deadline and any(_alive(pid) for pid in ranks):
        time.sleep(0.1)
    assert not any(_alive(pid) for pid in ranks), "ranks still training after their launcher was killed"
    logged = [json.loads(line)["step"] for line in (run / RunDir.METRICS).read_text().splitlines()]
    assert json.loads((run / RunDir.CHECKPOINT_META).read_text())["step"] == logged[-1]  # they stopped after a step, with a checkpoint


def test_an_error_on_every_rank_is_printed_once_with_exit_status_2(tmp_path):
    """A check the ranks make themselves (the reward function cannot be imported): one message, no traceback."""
    run = tmp_path / "run"
    proc = _start(run, "reward.kind=user", 'reward.user_fn="no_such_module_xyz:score"')
    _, err = proc.communicate(timeout=240)
    assert proc.returncode == 2, err[-3000:]
    assert err.count("dfpo: error:") == 1 and "no_such_module_xyz" in err, err[-3000:]
    assert "Traceback" not in err and "rank 0 reports" not in err


def test_a_run_folder_in_the_way_is_refused_before_any_rank_starts(tmp_path):
    run = tmp_path / "run"
    run.mkdir()
    (run / RunDir.CONFIG).write_text("mine\n")
    out = subprocess.run(_cmd(run, "train.steps=2", nproc=2), env=ENV, timeout=120, capture_output=True, text=True)
    assert out.returncode == 2 and out.stderr.count("dfpo: error:") == 1, out.stderr
    assert "was not started by dfpo train" in out.stderr
    assert sorted(p.name for p in run.iterdir()) == [RunDir.CONFIG]


def test_each_rank_gets_torchruns_environment_and_the_launchers_pid():
    env = rank_environment(1, 2, 29500)
    assert env | {"DFPO_LAUNCHER_PID": "x"} == {
        "RANK": "1",
        "LOCAL_RANK": "1",
        "WORLD_SIZE": "2",
        "LOCAL_WORLD_SIZE": "2",
        "GROUP_RANK": "0",
        "MASTER_ADDR": "127.0.0.1",
        "MASTER_PORT": "29500",
        "DFPO_LAUNCHER_PID": "x",
    }
    assert env["DFPO_LAUNCHER_PID"] == str(os.getpid())


@pytest.mark.parametrize(
    "codes, signals, status",
    [([0, 0], [], 0), ([2, 143], [], 2), ([0, 1], [], 1), ([143, 143], [15], 143), ([0, 0], [15], 0), ([-9, 0], [], 137)],
)
def test_the_launchers_exit_status(codes, signals, status):
    """0 when every rank finished; 128 + the signal that stopped the run; else rank 0's failure, else the first one."""
    launcher = Launcher(["true"], 2)
    launcher.procs = [type("P", (), {"returncode": c})() for c in codes]
    launcher.signals = signals
    assert launcher.exit_status() == status


_END = """
import atexit, sys
from dfpo.trainer.run.signals import end_of_program

class Teardown:
    def __del__(self):
        sys.stdout.write("teardown\\n")

keep = Teardown()  # a module global: collected in the interpreter's teardown
atexit.register(lambda: sys.stdout.write("exit function\\n"))
sys.stdout.write("output")  # buffered, no newline
end_of_program(3)
"""


@pytest.mark.parametrize("rank", [True, False], ids=["rank of --nproc", "any other process"])
def test_a_rank_ends_after_its_exit_functions_without_the_interpreters_teardown(rank):
    """A rank of the launcher exits with its status once its exit functions ran and its output is flushed, and skips
    the teardown in which C++ libraries can still abort a finished run; any other process ends as usual."""
    env = {k: v for k, v in ENV.items() if k != "DFPO_LAUNCHER_PID"}
    if rank:
        env["DFPO_LAUNCHER_PID"] = str(os.getpid())
    out = subprocess.run([sys.executable, "-c", _END], env=env, capture_output=True, text=True, timeout=60)
    assert out.returncode == 3, out.stderr
    assert out.stdout == ("outputexit function\n" if rank else "outputexit function\nteardown\n")
