"""User reward functions cannot hang, kill or poison a run: every failure scores 0 and is counted, calls run in
worker processes that are killed at their deadline, and SIGINT/SIGTERM work at any moment."""

from __future__ import annotations

import json
import math
import os
import re
import select
import signal
import struct
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path

import numpy as np
import psutil
import pytest
from hypothesis import given
from hypothesis import strategies as st
from reward_fixtures import spec
from tiny_run import TINY_MODEL_SETS

from dfpo.trainer.rewards import pool as reward_pool
from dfpo.trainer.rewards.compute import RewardComputer, RewardSpec, correctness_fn, reward_spec
from dfpo.trainer.rewards.pool import RewardPool
from dfpo.trainer.rewards.worker import as_reward
from dfpo.trainer.tasks import Example

EX = Example("1+1=", "2")
HERE = Path(__file__).resolve().parent


def _batch(name, n=4, **kw):
    with RewardComputer(spec(name), workers=kw.pop("workers", 2), **kw) as rc:
        return rc(["p"] * n, ["c"] * n, [EX] * n)


def _alive(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


def _wait_dead(pids, within_s=5.0) -> list[int]:
    """The pids still alive after ``within_s`` seconds."""
    deadline = time.monotonic() + within_s
    while any(_alive(p) for p in pids) and time.monotonic() < deadline:
        time.sleep(0.05)
    return [p for p in pids if _alive(p)]


def _live_children() -> list[psutil.Process]:
    return [p for p in psutil.Process().children(recursive=True) if p.status() != psutil.STATUS_ZOMBIE]


class _FloatRaises:
    def __float__(self):
        raise RuntimeError("no float")


@pytest.mark.parametrize(
    "raw, value",
    [
        (1, 1.0),
        (True, 1.0),
        (0.5, 0.5),
        (np.float32(0.25), 0.25),
        (-1e6, -1e6),
        (float("nan"), None),
        (1e308, None),
        (1e6 + 1, None),
        (10**400, None),
        (float("inf"), None),
        ("1.0", None),
        ([1.0], None),
        (None, None),
    ],
)
def test_a_reward_is_a_finite_number_within_bounds(raw, value):
    assert as_reward(raw) == value


def test_a_raising_float_conversion_is_not_swallowed_as_invalid():
    with pytest.raises(RuntimeError, match="no float"):
        as_reward(_FloatRaises())


@pytest.mark.parametrize(
    "name, key, detail",
    [
        ("sys_exit", "errors", "SystemExit: 3"),
        ("keyboard_interrupt", "errors", "KeyboardInterrupt"),
        ("raises", "errors", "RuntimeError: broken user reward"),
        ("os_exit", "errors", "exit code 7"),
        ("segfault", "errors", "killed by SIGSEGV"),
        ("float_raises", "errors", "RuntimeError: no float for you (raised by float() of the returned _FloatRaises)"),
        ("string", "invalid", "returned 'good'"),
        ("huge_float", "invalid", "returned 1e+308"),
        ("beyond_bound", "invalid", "returned 1000001.0"),
        ("huge_int", "invalid", "(int of 401 characters)"),
        ("nan", "invalid", "returned nan"),
        ("inf", "invalid", "returned inf"),
        ("a_list", "invalid", "returned [1.0, 0.0]"),
        ("unpicklable", "invalid", "returned <function unpicklable.<locals>.<lambda>"),
    ],
)
def test_a_misbehaving_reward_scores_zero_and_is_counted(name, key, detail, capsys):
    out = _batch(name)
    assert out.total == [0.0] * 4 and getattr(out, key) == 4
    assert out.errors + out.timeouts + out.invalid == 4  # counted once, under one key
    assert detail in capsys.readouterr().err  # the warning (all four failed) quotes the first failure


def test_a_reward_that_never_returns_costs_one_timeout_per_round_of_workers():
    """8 hanging calls on 4 workers: two rounds of timeout_s, not eight; both ways a call is stopped (interrupted
    in its worker, and the worker killed when the reward swallows the interrupt) count as timeouts."""
    for name in ("never_returns", "never_returns_swallowing_interrupts"):
        with RewardComputer(spec(name), workers=4, timeout_s=0.5) as rc:
            rc.wait_ready()
            t0 = time.monotonic()
            out = rc(["p"] * 8, ["c"] * 8, [EX] * 8)
            assert out.timeouts == 8 and out.total == [0.0] * 8
            assert time.monotonic() - t0 < 8 * 0.5 * 0.6  # two rounds (1 s) plus worker restarts, not 4 s


def test_slow_calls_run_concurrently():
    with RewardComputer(spec("sleeps_then_one"), workers=4, timeout_s=2.0) as rc:
        rc.wait_ready()
        t0 = time.monotonic()
        out = rc(["p"] * 8, ["c"] * 8, [EX] * 8)
        assert out.total == [1.0] * 8 and time.monotonic() - t0 < 8 * 0.2 * 0.75  # two rounds of 0.2 s, not eight


def test_more_than_half_failing_warns_once_per_kind_on_stderr(capsys):
    with RewardComputer(spec("fails_on_bad"), workers=2) as rc:
        rc(["p"] * 3, ["bad", "bad", "ok"], [EX] * 3)
        rc(["p"] * 3, ["bad", "bad", "ok"], [EX] * 3)
        err = capsys.readouterr().err
        assert err.count("dfpo: warning: 2 of 3 reward calls failed") == 1 and "ZeroDivisionError" in err
        rc(["p"] * 3, ["bad", "ok", "ok"], [EX] * 3)  # one of three: no warning
        assert capsys.readouterr().err == ""


def test_workers_are_started_once_and_reused_across_batches():
    with RewardComputer(spec("echo_pid"), workers=2) as rc:
        rc.wait_ready()
        pids = set(rc.worker_pids())
        seen = set()
        for _ in range(5):
            seen |= set(rc(["p"] * 6, ["c"] * 6, [EX] * 6).correct)
        assert {int(p) for p in seen} <= pids and len(pids) == 2 and set(rc.worker_pids()) == pids


def test_a_worker_that_dies_is_replaced_and_the_next_batch_is_scored():
    with RewardComputer(spec("os_exit"), workers=2) as rc:
        first = set(rc.worker_pids())
        assert rc(["p"] * 2, ["c"] * 2, [EX] * 2).errors == 2
        rc.wait_ready()
        assert len(rc.worker_pids()) == 2 and not first & set(rc.worker_pids())
        assert not _wait_dead(first, within_s=0)


def test_close_kills_every_worker_and_the_pool_refuses_work_after():
    rc = RewardComputer(spec("one"), workers=3)
    rc.wait_ready()
    pids = rc.worker_pids()
    assert len(pids) == 3 and all(_alive(p) for p in pids)
    with rc:
        pass
    assert not _wait_dead(pids, within_s=0) and rc.worker_pids() == []
    with pytest.raises(RuntimeError, match="closed"):
        rc(["p"], ["c"], [EX])
    rc.close()  # idempotent


def test_a_user_module_that_does_not_import_is_a_value_error_before_any_batch():
    with pytest.raises(ValueError, match="cannot import module 'no_such_module_xyz'"):
        RewardComputer(RewardSpec("user", "no_such_module_xyz:f"))
    with pytest.raises(ValueError, match="has no callable 'nope'"):
        RewardComputer(RewardSpec("user", "reward_fixtures:nope"))
    with pytest.raises(ValueError, match="reward.workers must be an integer >= 0"):
        RewardComputer(spec("one"), workers=-1)
    with pytest.raises(ValueError, match="reward.timeout_s must be a positive"):
        RewardComputer(spec("one"), timeout_s=0)
    assert not _live_children()


def test_a_reward_print_does_not_corrupt_the_results(capfd):
    assert _batch("prints", n=3).total == [1.0] * 3
    assert "a reward that prints to stdout" in capfd.readouterr().err


def test_a_process_a_reward_starts_does_not_outlive_the_call():
    with RewardComputer(spec("leaves_a_child"), workers=1) as rc:
        child = int(rc(["p"], ["c"], [EX]).total[0])
        assert child > 0 and not _wait_dead([child])  # while the pool lives: its worker was replaced


def test_a_process_forked_by_a_hanging_reward_dies_with_its_worker(tmp_path):
    pid_file = tmp_path / "child.pid"
    with RewardComputer(spec("forks_and_hangs"), workers=1, timeout_s=1.0) as rc:
        out = rc(["p"], ["c"], [Example("p", str(pid_file))])
        assert out.timeouts == 1 and not _wait_dead([int(pid_file.read_text())])


def test_threads_a_reward_leaves_do_not_accumulate():
    with RewardComputer(spec("leaves_a_thread"), workers=2) as rc:
        for _ in range(3):
            assert rc(["p"] * 4, ["c"] * 4, [EX] * 4).total == [1.0] * 4
        assert all(p.num_threads() < 3 for p in _live_children())  # each worker replaced after such a call


def test_workers_ignore_sigint_the_parent_decides():
    with RewardComputer(spec("sleeps_then_one"), workers=2, timeout_s=5.0) as rc:
        rc.wait_ready()
        pids = rc.worker_pids()
        timer = threading.Timer(0.1, lambda: [os.kill(p, signal.SIGINT) for p in pids])
        timer.start()
        out = rc(["p"] * 2, ["c"] * 2, [EX] * 2)
        timer.join()
        assert out.total == [1.0, 1.0] and rc.worker_pids() == pids


def test_hundreds_of_calls_that_never_return_leak_no_process_or_thread():
    threads_before = threading.active_count()
    with RewardComputer(spec("never_returns"), workers=4, timeout_s=0.05) as rc:
        for _ in range(25):
            assert rc(["p"] * 8, ["c"] * 8, [EX] * 8).timeouts == 8
        assert len(_live_children()) <= 4 and threading.active_count() == threads_before
    assert not _wait_dead([p.pid for p in _live_children()])


@pytest.mark.slow
def test_hundreds_of_calls_whose_worker_is_killed_leak_no_process_or_thread():
    threads_before = threading.active_count()
    with RewardComputer(spec("never_returns_swallowing_interrupts"), workers=4, timeout_s=0.05) as rc:
        for _ in range(25):
            assert rc(["p"] * 8, ["c"] * 8, [EX] * 8).timeouts == 8
        assert len(_live_children()) <= 4 and threading.active_count() == threads_before
    assert not _wait_dead([p.pid for p in _live_children()])


# -- the parent process: signals, exit ------------------------------------------------------------------
# The scripts import reward_pool alone (the standard library and dfpo's lazy package modules): a child starts in
# a fraction of a second instead of importing torch. One test runs the same through RewardComputer.

_SCRIPT = """
import os, signal, sys, time
sys.path.insert(0, {here!r})
from dfpo.trainer.rewards import pool as reward_pool
assert "torch" not in sys.modules
if signal.getsignal(signal.SIGINT) is signal.SIG_IGN:  # started under a shell's background job: SIGINT as Python's own start
    signal.signal(signal.SIGINT, signal.default_int_handler)
def pool(name, **kw):
    return reward_pool.RewardPool("user", "reward_fixtures:" + name, **kw)
def tasks(*completions):
    return [("p", c, "a", None) for c in completions]
if {handler!r} == "python":
    def handler(signum, frame):
        print("handler ran", flush=True)
        raise SystemExit(100 + signum)
    signal.signal(signal.SIGTERM, handler)
    signal.signal(signal.SIGINT, handler)
"""


def _start(body: str, handler: str) -> subprocess.Popen:
    code = _SCRIPT.format(here=str(HERE), handler=handler) + textwrap.dedent(body)
    return subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def _read_until(proc: subprocess.Popen, marker: str) -> list[str]:
    lines = []
    while marker not in (line := proc.stdout.readline()):
        assert line, f"the script ended before {marker!r}: {proc.stderr.read()}"
        lines.append(line)
    return lines


def _signal_while_computing(proc: subprocess.Popen, sig: int) -> tuple[list[int], str, str, float]:
    """Wait for the script's 'pids ...' and 'computing' lines, let the rewards spin, send ``sig``; the worker
    pids, the script's stdout and stderr, and the seconds from the signal to its exit."""
    pids = [int(p) for p in _read_until(proc, "computing")[0].split()[1:]]
    time.sleep(0.5)  # the rewards are spinning
    t0 = time.monotonic()
    proc.send_signal(sig)
    try:
        out, err = proc.communicate(timeout=60)
    except subprocess.TimeoutExpired:
        proc.kill()  # the script and, through its pool, its workers: no later test inherits them
        proc.communicate()
        raise
    return pids, out, err, time.monotonic() - t0


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT], ids=["SIGTERM", "SIGINT"])
@pytest.mark.parametrize("handler", ["default", "python"])
def test_a_signal_during_a_batch_of_spinning_rewards_ends_the_process_promptly(sig, handler):
    """A pure-Python spin loop and a catastrophic regex (it holds the GIL) are running: the signal's default
    action, or the Python handler, takes effect within seconds and no worker is left behind."""
    proc = _start(
        """
        p = pool("spins_or_regex", workers=2, timeout_s=600)
        p.wait_ready()
        print("pids", *p.pids(), flush=True)
        print("computing", flush=True)
        p.run(tasks("spin", "regex"))
        """,
        handler,
    )
    pids, out, err, took = _signal_while_computing(proc, sig)
    assert took < 5.0
    if handler == "python":
        assert "handler ran" in out and proc.returncode == 100 + sig, err
    elif sig == signal.SIGTERM:
        assert proc.returncode == -signal.SIGTERM, err
    else:
        assert "KeyboardInterrupt" in err and proc.returncode in (-signal.SIGINT, 1), err
    assert len(pids) == 2 and not _wait_dead(pids)


def test_sigterm_reaches_a_trainer_style_handler_during_a_reward_computer_batch():
    """The same through RewardComputer, with dfpo imported: the handler runs although a regex holds the GIL."""
    code = f"""
import signal, sys
sys.path.insert(0, {str(HERE)!r})
from reward_fixtures import spec
from tiny_run import TINY_MODEL_SETS
from dfpo.trainer.rewards.compute import RewardComputer
from dfpo.trainer.tasks import Example
def handler(signum, frame):
    print("handler ran", flush=True)
    raise SystemExit(100 + signum)
signal.signal(signal.SIGTERM, handler)
with RewardComputer(spec("catastrophic_regex"), workers=2, timeout_s=600) as rc:
    rc.wait_ready()
    print("pids", *rc.worker_pids(), flush=True)
    print("computing", flush=True)
    rc(["p"] * 2, ["c"] * 2, [Example("p", "a")] * 2)
"""
    proc = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    pids, out, err, took = _signal_while_computing(proc, signal.SIGTERM)
    assert took < 5.0 and "handler ran" in out and proc.returncode == 100 + signal.SIGTERM, err
    assert len(pids) == 2 and not _wait_dead(pids)


@pytest.mark.parametrize("handler", ["default", "python"])
def test_a_signal_while_the_workers_start_ends_the_process_promptly(handler):
    """SIGTERM while the constructor waits for workers whose user module takes 60 s to import."""
    proc = _start(
        """
        print("starting", flush=True)
        reward_pool.RewardPool("user", "reward_fixtures_slow_import:one", workers=2)
        """,
        handler,
    )
    _read_until(proc, "starting")
    deadline = time.monotonic() + 30
    while len(workers := psutil.Process(proc.pid).children()) < 2 and time.monotonic() < deadline:
        time.sleep(0.05)
    time.sleep(0.5)  # importing the slow module
    t0 = time.monotonic()
    proc.send_signal(signal.SIGTERM)
    out, err = proc.communicate(timeout=60)
    assert time.monotonic() - t0 < 5.0
    assert proc.returncode == (100 + signal.SIGTERM if handler == "python" else -signal.SIGTERM), err
    assert len(workers) == 2 and not _wait_dead([w.pid for w in workers])


def test_the_process_exits_after_a_reward_that_never_returns_without_close():
    proc = _start(
        """
        p = pool("never_returns_swallowing_interrupts", workers=2, timeout_s=0.2)
        out = p.run(tasks("c"))
        print("pids", *p.pids(), flush=True)
        print("done", out[0][1])
        """,
        "default",
    )
    out, err = proc.communicate(timeout=60)
    assert proc.returncode == 0 and out.splitlines()[-1] == "done timeout", err
    assert not _wait_dead([int(p) for p in out.splitlines()[0].split()[1:]])


def test_a_parent_killed_outright_takes_idle_and_busy_workers_along():
    proc = _start(
        """
        p = pool("catastrophic_regex", workers=3, timeout_s=600)
        p.wait_ready()
        print("pids", *p.pids(), flush=True)
        print("computing", flush=True)
        p.run(tasks("c"))  # one busy worker (holding the GIL), two idle
        """,
        "default",
    )
    pids, _, _, _ = _signal_while_computing(proc, signal.SIGKILL)
    assert len(pids) == 3 and not _wait_dead(pids)


@pytest.mark.slow
def test_math_verify_runs_in_workers_and_a_pathological_completion_times_out():
    """math-verify does not return on 9^(9^(9^9)) for minutes; its worker is stopped at the deadline."""
    with RewardComputer(RewardSpec("math_verify"), workers=2, timeout_s=3.0) as rc:
        rc.wait_ready()
        out = rc(["q"] * 3, ["so \\boxed{72}", "\\boxed{144/2}", "\\boxed{9^{9^{9^{9}}}}"], [Example("q", "72")] * 3)
        assert out.correct == [1.0, 1.0, 0.0] and out.timeouts == 1
        assert rc(["q"], ["\\boxed{71}"], [Example("q", "72")]).correct == [0.0]


def test_pool_rejects_an_unknown_kind():
    with pytest.raises(ValueError, match="reward kind 'regex' unknown"):
        RewardPool("regex")


def test_a_function_from_correctness_fn_is_run_by_its_name():
    from dfpo.trainer.rewards.compute import correctness_fn, exact_match

    with RewardComputer(correctness_fn("user", "add", "reward_fixtures:os_exit"), workers=1) as rc:
        assert rc.spec == spec("os_exit") and rc(["p"], ["c"], [EX]).errors == 1  # in a worker: the process survives
    with RewardComputer(exact_match) as rc:
        assert rc.spec == RewardSpec("exact") and rc.worker_pids() == []
    with pytest.raises(ValueError, match="a worker process rebuilds the reward from its name"):
        RewardComputer(lambda p, c, e: 1.0)


@pytest.mark.slow
def test_reasoning_gym_scores_in_workers_equal_the_in_process_scores():
    from dfpo.trainer.config import DataConfig
    from dfpo.trainer.rewards.compute import correctness_fn, reward_spec
    from dfpo.trainer.tasks import load_splits

    train, _ = load_splits(DataConfig(task="reasoning_gym", name="gsm_symbolic", train_size=3, eval_size=2), seed=0)
    completions = [f"so \\boxed{{{ex.answer}}}" for ex in train] + ["\\boxed{-1}"] * 3
    examples = train + train
    local = correctness_fn("auto", "reasoning_gym")
    with RewardComputer(reward_spec("auto", "reasoning_gym"), workers=2) as rc:
        out = rc([ex.prompt for ex in examples], completions, examples)
    assert out.correct == [local(ex.prompt, c, ex) for ex, c in zip(examples, completions)] and out.correct[:3] == [1.0] * 3


# -- processes a reward leaves behind, whatever session they made ---------------------------------------


def _recorded_pids(folder: Path) -> list[int]:
    """The pids the daemon-leaving fixtures wrote into ``folder``."""
    return [int(f.read_text()) for f in folder.glob("*.pid")]


def test_daemons_a_reward_leaves_end_with_its_worker(tmp_path):
    """A fork+setsid child and a double-fork daemon are outside the worker's process group; the worker is
    replaced after such a call, and they end with it while the pool lives on."""
    with RewardComputer(spec("leaves_daemons"), workers=1) as rc:
        out = rc(["p"] * 2, ["c"] * 2, [Example("p", str(tmp_path))] * 2)
        assert out.total == [1.0, 1.0]
        daemons = _recorded_pids(tmp_path)
        assert len(daemons) == 4 and not _wait_dead(daemons)


def test_daemons_of_a_reward_killed_at_its_deadline_end_with_its_worker(tmp_path):
    with RewardComputer(spec("leaves_daemons_and_hangs"), workers=1, timeout_s=0.5) as rc:
        assert rc(["p"], ["c"], [Example("p", str(tmp_path))]).timeouts == 1
        daemons = _recorded_pids(tmp_path)
        assert len(daemons) == 2 and not _wait_dead(daemons)


def test_daemons_of_a_reward_whose_worker_died_on_its_own_end_with_it(tmp_path):
    """The worker's os._exit hands its orphans to init: they are found by the marker they inherited."""
    with RewardComputer(spec("leaves_daemons_and_exits"), workers=1) as rc:
        assert rc(["p"], ["c"], [Example("p", str(tmp_path))]).errors == 1
        daemons = _recorded_pids(tmp_path)
        assert len(daemons) == 2 and not _wait_dead(daemons)


def test_after_a_process_that_ends_normally_no_daemon_of_its_rewards_is_alive(tmp_path):
    proc = _start(
        f"""
        p = pool("leaves_daemons", workers=2)
        print([o[1] for o in p.run([("p", "c", {str(tmp_path)!r}, None)] * 4)], flush=True)
        """,
        "default",
    )
    out, err = proc.communicate(timeout=60)
    assert proc.returncode == 0 and out.strip() == str(["ok"] * 4), err
    daemons = _recorded_pids(tmp_path)
    assert len(daemons) == 8 and not _wait_dead(daemons)


@pytest.mark.slow
def test_a_run_that_ends_normally_leaves_no_daemon_of_its_reward_alive(tmp_path, monkeypatch):
    """dfpo train with a reward that leaves a fork+setsid child and a double-fork daemon on every call: rc 0,
    and none of them outlives the run."""
    from dfpo.cli import main

    monkeypatch.setenv("REWARD_FIXTURES_PID_FOLDER", str(tmp_path))
    config = tmp_path / "empty.toml"
    config.write_text("# every key comes from --set\n")
    sets = [
        *TINY_MODEL_SETS,
        *("train.steps=1", "rollout.prompts_per_step=2", "rollout.group_size=2", "eval.every=0", "eval.k=1", "data.eval_size=2"),
        *("log.tensorboard=false", "log.progress=false", f'run_dir="{tmp_path / "run"}"'),
        *("reward.kind=user", 'reward.user_fn="reward_fixtures:leaves_daemons_in_env_folder"', "reward.workers=1"),
    ]
    assert main(["train", "--quiet", "--config", str(config), *(arg for s in sets for arg in ("--set", s))]) == 0
    daemons = _recorded_pids(tmp_path)
    assert len(daemons) >= 8 and not _wait_dead(daemons)


# -- the result pipe: every frame is checked ---------------------------------------------------------------


@pytest.mark.parametrize(
    "name, detail",
    [
        ("frame_not_json", "not JSON"),
        ("frame_forged_nan", "not JSON"),
        ("frame_wrong_shape", "not a known message"),
        ("frame_huge_length", "4294967295 bytes"),
        ("frame_forged_done_early", "not the answer to the call it was given"),
    ],
)
def test_a_bad_frame_on_the_result_pipe_is_a_reward_error_and_its_worker_is_replaced(name, detail, capsys):
    with RewardComputer(spec(name), workers=2, timeout_s=5.0) as rc:
        rc.wait_ready()
        first = set(rc.worker_pids())
        t0 = time.monotonic()
        for _ in range(2):  # the run goes on
            out = rc(["p"] * 3, ["c"] * 3, [EX] * 3)
            assert out.total == [0.0] * 3 and out.errors == 3
        assert time.monotonic() - t0 < 5.0  # found at once, not at a deadline
        assert not first & set(rc.worker_pids())
    err = capsys.readouterr().err
    assert "BadWorkerFrame" in err and detail in err, err


@given(
    st.binary(max_size=64)
    | st.builds(
        lambda v: json.dumps(v).encode(),
        st.recursive(
            st.none() | st.booleans() | st.floats() | st.text(max_size=8), lambda inner: st.lists(inner, max_size=7), max_leaves=12
        ),
    )
)
def test_parse_frame_returns_a_protocol_message_or_refuses_with_bad_frame(body):
    """Whatever a reward writes on the pipe: a message of the protocol's shapes, or BadFrame; never another exception."""
    try:
        message = reward_pool.parse_frame(body)
    except reward_pool.BadFrame:
        return
    assert message in (["ready"],) or message[0] in ("failed", "done")
    if message[0] == "done":
        assert math.isfinite(message[2]) and message[3] in ("ok", "error", "timeout", "invalid")


def test_parse_frame_accepts_what_a_worker_writes():
    for message in (
        ["ready"],
        ["failed", "ValueError: no"],
        ["done", "ab12", 0.5, "ok", "", ""],
        ["done", "ab12", 0, "timeout", "late", "memory: 9 MiB"],
    ):
        assert reward_pool.parse_frame(json.dumps(message).encode()) == message


def test_the_longest_frame_a_worker_writes_fits_the_bound():
    """Details of DETAIL_CHARS characters that JSON escapes at 12 bytes each (astral characters), and a recycle
    reason as long: still one atomic write (PIPE_BUF with its length)."""
    widest = "\U0001f600" * reward_pool.DETAIL_CHARS
    frame = json.dumps(["done", "0" * 16, -reward_pool.MAX_ABS_REWARD, "invalid", widest, "m" * reward_pool.DETAIL_CHARS])
    assert len(frame.encode()) <= reward_pool.MAX_FRAME_BYTES == select.PIPE_BUF - 4  # the length takes 4 bytes


def test_a_frame_longer_than_the_bound_is_refused_as_soon_as_its_length_is_read():
    buf = bytearray(struct.pack(">I", reward_pool.MAX_FRAME_BYTES + 1) + b"x")
    with pytest.raises(reward_pool.BadFrame, match=f"{reward_pool.MAX_FRAME_BYTES + 1} bytes long"):
        list(reward_pool.take_frames(buf))


# -- rewards that close file descriptors -------------------------------------------------------------------


def test_a_reward_that_closes_every_fd_is_an_error_in_one_line_without_a_traceback(capfd):
    with RewardComputer(spec("closes_every_fd"), workers=2) as rc:
        for _ in range(2):
            out = rc(["p"] * 3, ["c"] * 3, [EX] * 3)
            assert out.total == [0.0] * 3 and out.errors == 3
    err = capfd.readouterr().err
    assert "Traceback" not in err and "Exception ignored" not in err, err
    assert err.count("\n") == 1 and "closed its worker's pipes to the trainer" in err, err


def test_a_reward_that_closes_its_standard_streams_is_scored_and_its_worker_replaced(capfd):
    with RewardComputer(spec("closes_stdout_and_stderr"), workers=1) as rc:
        first = rc.worker_pids()
        assert rc(["p"] * 3, ["c"] * 3, [EX] * 3).total == [1.0] * 3
        assert not set(first) & set(rc.worker_pids())
    err = capfd.readouterr().err
    assert "Traceback" not in err and "Exception ignored" not in err, err


# -- memory: a cap per worker, and workers recycled ------------------------------------------------------


def test_a_worker_whose_reward_keeps_memory_is_replaced_before_its_cap_naming_the_reward(capsys):
    """16 MiB kept per call, 40 calls (640 MiB): every call scores, no worker ever holds more than its cap of
    128 MiB, and the warning names the reward and the setting."""
    with RewardComputer(spec("keeps_memory"), workers=1, memory_limit_mb=128) as rc:
        pids = set()
        for _ in range(10):
            out = rc(["p"] * 4, ["c"] * 4, [Example("p", "16")] * 4)
            assert out.errors == 0 and all(v > 0 for v in out.total)
            pids |= {int(v) for v in out.total}
            assert all(p.memory_info().rss <= 128 << 20 for p in _live_children())
    assert len(pids) >= 5
    err = capsys.readouterr().err
    assert err.count("\n") == 1, err
    assert "reward_fixtures:keeps_memory" in err and "reward.memory_limit_mb = 128" in err, err


def test_a_call_that_needs_more_than_the_cap_is_a_memory_error_naming_the_setting(capsys):
    with RewardComputer(spec("allocates"), workers=1, memory_limit_mb=128) as rc:
        out = rc(["p"] * 2, ["c"] * 2, [Example("p", "1024"), Example("p", "1")])
        assert out.total == [0.0, 1.0] and out.errors == 1
    assert "MemoryError" in capsys.readouterr().err  # the worker replaced for its memory, said once


def test_max_tasks_per_worker_starts_a_new_worker_after_that_many_calls():
    with RewardComputer(spec("echo_pid"), workers=1, max_tasks_per_worker=2) as rc:
        pids = [int(v) for _ in range(3) for v in rc(["p"] * 2, ["c"] * 2, [EX] * 2).total]
    assert len(set(pids)) == 3 and pids[0] == pids[1] and pids[2] == pids[3] and pids[4] == pids[5]


def test_the_config_defaults_are_the_pool_defaults():
    from dfpo.trainer.config import RewardConfig

    assert RewardConfig().memory_limit_mb == reward_pool.DEFAULT_MEMORY_LIMIT_MB
    assert RewardConfig().max_tasks_per_worker == 0  # never recycled for their count, as multiprocessing's default


@pytest.mark.parametrize(
    "setting, value, message",
    [
        ("memory_limit_mb", -1, "reward.memory_limit_mb must be 0 (no cap) or an integer >= 64"),
        ("memory_limit_mb", 10, "reward.memory_limit_mb must be 0 (no cap) or an integer >= 64"),
        ("memory_limit_mb", 1.5, "reward.memory_limit_mb must be 0 (no cap) or an integer >= 64"),
        ("max_tasks_per_worker", -1, "reward.max_tasks_per_worker must be an integer >= 0"),
        ("max_tasks_per_worker", True, "reward.max_tasks_per_worker must be an integer >= 0"),
    ],
)
def test_memory_and_recycling_settings_are_checked_before_any_worker_starts(setting, value, message):
    with pytest.raises(ValueError, match=re.escape(message)):
        RewardComputer(spec("one"), **{setting: value})
    assert not _live_children()


# -- naming the user's function ----------------------------------------------------------------------------


@pytest.mark.parametrize("user_fn", [".mod:fn", "mod.:fn", "mod:fn.x", "mod", ":fn", "mod:", "pkg/mod.py:fn.x"])
def test_a_user_fn_that_is_not_module_colon_function_is_one_sentence_naming_it(user_fn):
    """(A file path such as 'pkg/mod.py:fn' is a form of its own since issue 47: tests/trainer/test_reward_file.py.)"""
    message = (
        "reward.user_fn must look like 'module:function' or 'package.module:function' (a module importable from sys.path) "
        "or 'path/to/file.py:function' (a Python file, loaded by path; a relative path is relative to the current "
        f"directory), got {user_fn!r}"
    )
    with pytest.raises(ValueError, match=re.escape(message)):
        reward_spec("user", "add", user_fn)
    with pytest.raises(ValueError, match=re.escape(message)):
        RewardComputer(RewardSpec("user", user_fn))
    with pytest.raises(ValueError, match=re.escape(message)):
        reward_pool.RewardPool("user", user_fn)


@pytest.mark.parametrize(
    "module, raised",
    [("reward_fixtures_exits_at_import", "SystemExit(0)"), ("reward_fixtures_raises_at_import", "RuntimeError: this module refuses")],
)
def test_a_user_module_that_exits_or_raises_at_import_is_one_sentence_naming_it(module, raised):
    message = f"reward.user_fn '{module}:one': importing module '{module}' raised {raised}"
    with pytest.raises(ValueError, match=re.escape(message)):
        RewardComputer(RewardSpec("user", f"{module}:one"))  # in its worker
    with pytest.raises(ValueError, match=re.escape(message)):
        correctness_fn("user", "add", f"{module}:one")  # in this process: the import must not end it


@pytest.mark.parametrize("user_fn", ["../pkg/mod:fn", "reward_fixtures_exits_at_import:one"])
def test_the_trainer_refuses_a_bad_user_reward_in_one_line_before_any_work(tmp_path, capsys, user_fn):
    from dfpo.cli import main

    config = tmp_path / "c.toml"
    config.write_text(f'run_dir = "{tmp_path / "run"}"\n[reward]\nkind = "user"\nuser_fn = "{user_fn}"\n')
    assert main(["train", "--config", str(config)]) == 2
    err = capsys.readouterr().err
    errors = [line for line in err.splitlines() if not line.startswith("dfpo train: start-up")]  # the progress lines aside
    assert len(errors) == 1 and "reward.user_fn" in errors[0] and "Traceback" not in err, err
    assert not (tmp_path / "run").exists()
