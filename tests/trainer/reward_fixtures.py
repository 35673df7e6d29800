"""Reward functions, good and misbehaving, that a reward worker process imports by 'module:function'.

pytest puts tests/trainer on sys.path (rootdir-relative "prepend" imports, no __init__.py), and a worker gets
the parent's sys.path, so ``reward_fixtures:NAME`` resolves in both. ``spec(NAME)`` builds the RewardSpec.
Nothing from dfpo is imported at module level: it would pull torch into every worker (seconds per start).
"""

from __future__ import annotations

import ctypes
import os
import re
import signal
import subprocess
import sys
import threading
import time


def spec(name: str):
    """The RewardSpec of the function NAME of this module."""
    from dfpo.trainer.llm.rewards import RewardSpec

    return RewardSpec("user", f"{__name__}:{name}")


def one(prompt, completion, answer):
    return 1.0


def matches(prompt, completion, answer):
    return float(completion == answer)


def fails_on_bad(prompt, completion, answer):
    if completion == "bad":
        raise ZeroDivisionError("division by zero")
    return 1.0


def echo_pid(prompt, completion, answer):
    return float(os.getpid())


def raises(prompt, completion, answer):
    raise RuntimeError("broken user reward")


def sys_exit(prompt, completion, answer):
    sys.exit(3)


def keyboard_interrupt(prompt, completion, answer):
    raise KeyboardInterrupt


def os_exit(prompt, completion, answer):
    os._exit(7)


def segfault(prompt, completion, answer):
    ctypes.string_at(0)  # reads address 0: SIGSEGV


def string(prompt, completion, answer):
    return "good"


def nan(prompt, completion, answer):
    return float("nan")


def inf(prompt, completion, answer):
    return float("inf")


def huge_float(prompt, completion, answer):
    return 1e308


def beyond_bound(prompt, completion, answer):
    return 1e6 + 1


def huge_int(prompt, completion, answer):
    return 10**400  # float() raises OverflowError


def a_list(prompt, completion, answer):
    return [1.0, 0.0]


def unpicklable(prompt, completion, answer):
    return lambda: 1.0


class _FloatRaises:
    def __float__(self):
        raise RuntimeError("no float for you")


def float_raises(prompt, completion, answer):
    return _FloatRaises()


def prints(prompt, completion, answer):
    print("a reward that prints to stdout")
    return 1.0


def sleeps_then_one(prompt, completion, answer):
    time.sleep(0.2)
    return 1.0


def sleeps_two_seconds(prompt, completion, answer):
    time.sleep(2.0)
    return 1.0


def never_returns(prompt, completion, answer):
    threading.Event().wait()


def never_returns_swallowing_interrupts(prompt, completion, answer):
    """Catches everything the worker raises into it: only killing the worker ends it."""
    while True:
        try:
            time.sleep(60)
        except BaseException:  # noqa: BLE001, S110 - the point of this fixture
            pass


def spins(prompt, completion, answer):
    while True:
        try:
            while True:
                pass
        except BaseException:  # noqa: BLE001, S110
            pass


def catastrophic_regex(prompt, completion, answer):
    return float(bool(re.match(r"(a+)+$", "a" * 40 + "b")))  # holds the GIL for hours


def spins_or_regex(prompt, completion, answer):
    return spins(prompt, completion, answer) if completion == "spin" else catastrophic_regex(prompt, completion, answer)


def leaves_a_child(prompt, completion, answer):
    """Starts a process that would run for 1000 s and returns: the child must not outlive the call."""
    proc = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(1000)"])
    print(f"child {proc.pid}", file=sys.stderr, flush=True)
    return float(proc.pid)


def forks_and_hangs(prompt, completion, answer):
    """Forks a child that sleeps 1000 s, then hangs: killing the worker must take the child along."""
    proc = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(1000)"])
    with open(answer, "w") as f:  # the test passes a file name as the answer
        f.write(str(proc.pid))
    spins(prompt, completion, answer)


def leaves_a_thread(prompt, completion, answer):
    threading.Thread(target=time.sleep, args=(1000,)).start()
    return 1.0


def ignores_sigterm_and_hangs(prompt, completion, answer):
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    catastrophic_regex(prompt, completion, answer)


def half_informative_reward(prompt: str, completion: str, answer: str) -> float:
    """A reward that is 0 for every completion of an odd first operand (no signal) and varies elsewhere
    (tests/trainer/test_llm_step.py's dynamic sampling test)."""
    first = int(prompt.split("+")[0].split()[-1]) if "+" in prompt else 0
    return float(len(completion) % 2) if first % 2 == 0 else 0.0
