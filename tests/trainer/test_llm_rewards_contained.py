"""User reward functions cannot hang, kill or poison a run: every failure scores 0 and is counted, calls run in
worker processes that are killed at their deadline, and SIGINT/SIGTERM work at any moment."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path

import numpy as np
import psutil
import pytest
from reward_fixtures import spec

from dfpo.trainer.llm import reward_pool
from dfpo.trainer.llm.reward_pool import RewardPool, as_reward
from dfpo.trainer.llm.rewards import RewardComputer, RewardSpec
from dfpo.trainer.llm.tasks import Example

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
# The scripts load reward_pool.py by path (standard library only): a child starts in a fraction of a second
# instead of importing torch through dfpo. One test runs the same through RewardComputer.

_SCRIPT = """
import importlib.util, os, signal, sys, time
sys.path.insert(0, {here!r})
found = importlib.util.spec_from_file_location("reward_pool", {pool!r})
reward_pool = sys.modules["reward_pool"] = importlib.util.module_from_spec(found)
found.loader.exec_module(reward_pool)
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
    code = _SCRIPT.format(here=str(HERE), pool=reward_pool.__file__, handler=handler) + textwrap.dedent(body)
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
    out, err = proc.communicate(timeout=60)
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
from dfpo.trainer.llm.rewards import RewardComputer
from dfpo.trainer.llm.tasks import Example
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
    from dfpo.trainer.llm.rewards import correctness_fn, exact_match

    with RewardComputer(correctness_fn("user", "add", "reward_fixtures:os_exit"), workers=1) as rc:
        assert rc.spec == spec("os_exit") and rc(["p"], ["c"], [EX]).errors == 1  # in a worker: the process survives
    with RewardComputer(exact_match) as rc:
        assert rc.spec == RewardSpec("exact") and rc.worker_pids() == []
    with pytest.raises(ValueError, match="a worker process rebuilds the reward from its name"):
        RewardComputer(lambda p, c, e: 1.0)


@pytest.mark.slow
def test_reasoning_gym_scores_in_workers_equal_the_in_process_scores():
    from dfpo.trainer.llm.config import DataConfig
    from dfpo.trainer.llm.rewards import correctness_fn, reward_spec
    from dfpo.trainer.llm.tasks import load_splits

    train, _ = load_splits(DataConfig(task="reasoning_gym", name="gsm_symbolic", train_size=3, eval_size=2), seed=0)
    completions = [f"so \\boxed{{{ex.answer}}}" for ex in train] + ["\\boxed{-1}"] * 3
    examples = train + train
    local = correctness_fn("auto", "reasoning_gym")
    with RewardComputer(reward_spec("auto", "reasoning_gym"), workers=2) as rc:
        out = rc([ex.prompt for ex in examples], completions, examples)
    assert out.correct == [local(ex.prompt, c, ex) for ex, c in zip(examples, completions)] and out.correct[:3] == [1.0] * 3
