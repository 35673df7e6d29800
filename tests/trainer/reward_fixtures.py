"""Reward functions, good and misbehaving, that a reward worker process imports by 'module:function'.

pytest puts tests/trainer on sys.path (rootdir-relative "prepend" imports, no __init__.py), and a worker gets
the parent's sys.path, so ``reward_fixtures:NAME`` resolves in both. ``spec(NAME)`` builds the RewardSpec.
Nothing from dfpo is imported at module level: it would pull torch into every worker (seconds per start).
"""

from __future__ import annotations

import ctypes
import fcntl
import json
import os
import re
import signal
import stat
import struct
import subprocess
import sys
import threading
import time


def spec(name: str):
    """The RewardSpec of the function NAME of this module."""
    from dfpo.trainer.rewards.compute import RewardSpec

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


# -- rewards whose processes make sessions of their own (the answer names a folder for their pid files) ------


def _record_pid(folder: str, pid: int) -> None:
    with open(os.path.join(folder, f"{pid}.pid"), "w") as f:
        f.write(str(pid))


def _sleep_forever_as_a_child() -> None:
    """The body of a forked child: sleep 1000 s, then leave without running anything of the parent's."""
    try:
        time.sleep(1000)
    finally:
        os._exit(0)


def _fork_setsid_child(folder: str) -> None:
    """fork + setsid: a child in a session (and process group) of its own; its pid is recorded before this returns."""
    pid = os.fork()
    if pid == 0:
        os.setsid()
        _sleep_forever_as_a_child()
    _record_pid(folder, pid)


def _double_fork_daemon(folder: str) -> None:
    """The classic daemon: fork, setsid, fork again and let the middle process exit, so that the daemon is
    nobody's child; it points its standard streams at /dev/null and closes every other fd."""
    middle = os.fork()
    if middle == 0:
        os.setsid()
        daemon = os.fork()
        if daemon == 0:
            devnull = os.open(os.devnull, os.O_RDWR)
            for fd in (0, 1, 2):
                os.dup2(devnull, fd)
            os.closerange(3, 65536)
            _sleep_forever_as_a_child()
        _record_pid(folder, daemon)
        os._exit(0)
    os.waitpid(middle, 0)


def leaves_daemons(prompt, completion, answer):
    """Leaves a fork+setsid child and a double-fork daemon behind, and returns 1."""
    _fork_setsid_child(answer)
    _double_fork_daemon(answer)
    return 1.0


def leaves_daemons_in_env_folder(prompt, completion, answer):
    """leaves_daemons, their pid files in the folder named by $REWARD_FIXTURES_PID_FOLDER (for a whole run)."""
    return leaves_daemons(prompt, completion, os.environ["REWARD_FIXTURES_PID_FOLDER"])


def leaves_daemons_and_hangs(prompt, completion, answer):
    """Leaves both kinds of daemon, then hangs until its worker is killed."""
    leaves_daemons(prompt, completion, answer)
    never_returns_swallowing_interrupts(prompt, completion, answer)


def leaves_daemons_and_exits(prompt, completion, answer):
    """Leaves both kinds of daemon, then ends its worker (os._exit): the daemons are nobody's descendants then."""
    leaves_daemons(prompt, completion, answer)
    os._exit(7)


# -- rewards that write on their worker's result pipe -----------------------------------------------------


def _result_pipes() -> list[int]:
    """The pipes this process writes to, other than its standard streams: a worker's result pipe."""
    fds = []
    for name in os.listdir("/proc/self/fd"):
        fd = int(name)
        try:
            writable = fcntl.fcntl(fd, fcntl.F_GETFL) & os.O_ACCMODE == os.O_WRONLY
            if fd > 2 and writable and stat.S_ISFIFO(os.fstat(fd).st_mode):
                fds.append(fd)
        except OSError:  # the fd of the listing itself, closed by now
            pass
    return fds


def _write_on_result_pipe(body: bytes, length: int | None = None) -> float:
    """Writes a frame (its length, then ``body``) on the result pipe, and returns 1."""
    for fd in _result_pipes():
        os.write(fd, struct.pack(">I", len(body) if length is None else length) + body)
    return 1.0


def frame_not_json(prompt, completion, answer):
    return _write_on_result_pipe(b"not json")


def frame_forged_nan(prompt, completion, answer):
    """Python's json writes and reads NaN; JSON has no such value."""
    return _write_on_result_pipe(json.dumps(["done", "0" * 16, float("nan"), "ok", "", ""]).encode())


def frame_wrong_shape(prompt, completion, answer):
    return _write_on_result_pipe(json.dumps({"done": 1.0}).encode())


def frame_huge_length(prompt, completion, answer):
    return _write_on_result_pipe(b"[", length=2**32 - 1)


def frame_forged_done_early(prompt, completion, answer):
    """A well-formed 'done' written by the reward itself, before its worker's own."""
    return _write_on_result_pipe(json.dumps(["done", "0" * 16, 1.0, "ok", "", ""]).encode())


# -- rewards that close file descriptors ---------------------------------------------------------------


def closes_every_fd(prompt, completion, answer):
    os.closerange(3, 65536)
    return 1.0


def closes_stdout_and_stderr(prompt, completion, answer):
    os.close(1)
    os.close(2)
    return 1.0


# -- rewards that use memory -----------------------------------------------------------------------------

_kept: list[bytes] = []


def keeps_memory(prompt, completion, answer):
    """Keeps ``answer`` MiB (written, so resident) for good on every call, and returns its process id."""
    _kept.append(b"\x01" * (int(answer) << 20))
    return float(os.getpid())


def allocates(prompt, completion, answer):
    """Allocates ``answer`` MiB for the call only."""
    block = b"\x01" * (int(answer) << 20)
    return float(len(block) > 0)


def half_informative_reward(prompt: str, completion: str, answer: str) -> float:
    """A reward that is 0 for every completion of an odd first operand (no signal) and varies elsewhere
    (tests/trainer/test_llm_step.py's dynamic sampling test)."""
    first = int(prompt.split("+")[0].split()[-1]) if "+" in prompt else 0
    return float(len(completion) % 2) if first % 2 == 0 else 0.0
