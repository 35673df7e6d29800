"""User reward functions cannot hang, kill or poison a run: every failure scores 0 and is counted."""

from __future__ import annotations

import subprocess
import sys
import textwrap
import threading
import time

import numpy as np
import pytest

from dfpo.trainer.llm.rewards import RewardComputer, as_reward
from dfpo.trainer.llm.tasks import Example

EX = Example("1+1=", "2")


def _batch(fn, n=4, **kw):
    return RewardComputer(fn, **kw)(["p"] * n, ["c"] * n, [EX] * n)


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
        (float("inf"), None),
        ("1.0", None),
        ([1.0], None),
        (None, None),
    ],
)
def test_a_reward_is_a_finite_number_within_bounds(raw, value):
    assert as_reward(raw) == value


@pytest.mark.parametrize(
    "fn, key",
    [
        (lambda p, c, e: sys.exit(3), "errors"),
        (lambda p, c, e: 1 / 0, "errors"),
        (lambda p, c, e: "good", "invalid"),
        (lambda p, c, e: 1e308, "invalid"),
        (lambda p, c, e: [1.0, 0.0], "invalid"),
    ],
    ids=["sys.exit", "raises", "string", "1e308", "list"],
)
def test_a_misbehaving_reward_scores_zero_and_is_counted(fn, key):
    out = _batch(fn)
    assert out.total == [0.0] * 4 and getattr(out, key) == 4


def test_a_reward_that_never_returns_costs_one_timeout_per_batch():
    never = threading.Event()
    t0 = time.monotonic()
    out = _batch(lambda p, c, e: never.wait(), n=32, timeout_s=0.3)
    assert out.timeouts == 32 and out.total == [0.0] * 32
    assert time.monotonic() - t0 < 1.5  # not 32 x 0.3 s


def test_slow_calls_run_concurrently():
    t0 = time.monotonic()
    out = _batch(lambda p, c, e: time.sleep(0.2) or 1.0, n=32, timeout_s=1.0)
    assert out.total == [1.0] * 32 and time.monotonic() - t0 < 1.0


def test_more_than_half_failing_warns_once_per_kind_on_stderr(capsys):
    rc = RewardComputer(lambda p, c, e: 1 / 0 if c == "bad" else 1.0)
    rc(["p"] * 3, ["bad", "bad", "ok"], [EX] * 3)
    rc(["p"] * 3, ["bad", "bad", "ok"], [EX] * 3)
    err = capsys.readouterr().err
    assert err.count("dfpo: warning: 2 of 3 reward calls failed") == 1 and "ZeroDivisionError" in err
    rc(["p"] * 3, ["bad", "ok", "ok"], [EX] * 3)  # one of three: no warning
    assert capsys.readouterr().err == ""


def test_the_process_exits_after_a_reward_that_never_returns():
    code = textwrap.dedent(
        """
        import threading
        from dfpo.trainer.llm.rewards import RewardComputer
        from dfpo.trainer.llm.tasks import Example
        out = RewardComputer(lambda p, c, e: threading.Event().wait(), timeout_s=0.2)(["p"], ["c"], [Example("p", "a")])
        print("done", out.timeouts)
        """
    )
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0 and proc.stdout.strip() == "done 1", proc.stderr
