"""One reward worker: a fresh interpreter that computes one reward, a call at a time, for ``pool.RewardPool``.

Run as a script (``python -P worker.py``) it is a worker; imported (by the pool, and by ``compute`` for
``as_reward`` / ``score``) it is the part of the protocol both sides share. Everything at module level is the
standard library, so a worker for a user reward starts in a fraction of a second with ~15 MiB and imports
nothing of dfpo but what the user's module does. A built-in kind's worker imports ``dfpo.trainer.rewards.compute``,
which stays free of torch: ~0.2 s and ~17 MiB, plus math-verify's own imports for that kind.

Protocol, one frame = 4-byte big-endian length + body:
    parent -> worker stdin, pickled (the worker trusts its parent): an init dict (sys.path, parent pid, kind,
        user_fn, the directory a reward file's relative path is read from, soft deadline, memory cap), then one task at a time: (call_id, prompt, completion, answer, meta).
    worker -> parent, JSON (the parent unpickles nothing that a process running user code wrote):
        ["ready"] or ["failed", message] once, then ["done", call_id, value, status, detail, recycle] per task;
        recycle is "" to keep the worker, else why it must be replaced.
    Each of these frames is at most PIPE_BUF bytes (written atomically); the parent checks each one
    (``pool.parse_frame``): JSON with no NaN, the shape and types above, the call id of the call it gave.
    The reward's return value is converted to a float in the worker (``score``); only numbers and short
    strings cross. The worker's original stdout carries its frames; its fd 1 then points at stderr, so a
    reward's ``print`` cannot corrupt them, and its stdin is /dev/null. A reward can still write on the
    result pipe (it runs in this process): what it writes is checked as the worker's own frames are, and
    anything but a well-formed answer with the call's random id is a reward error that ends the worker.

What the worker does for the pool (Linux):
1. It is a child subreaper (``prctl(PR_SET_CHILD_SUBREAPER)``): a process its reward forks stays its
   descendant whatever it does (setsid, a double fork), so the pool finds and kills the whole tree.
2. It asks for SIGKILL when its parent dies (``PR_SET_PDEATHSIG``); an idle worker also exits on EOF of its stdin.
3. Its memory is capped (``RLIMIT_DATA`` = reward.memory_limit_mb; the reward's child processes inherit the
   cap): a call that needs more fails with MemoryError. After each call it reports why it must be replaced,
   if it must: a MemoryError, resident memory past halfway from its start-up size to the cap (memory a
   reward keeps from call to call), more threads or running child processes than when it became ready, or
   its standard streams closed or replaced.
4. A call is interrupted at ``SOFT_DEADLINE_SHARE * timeout_s`` by an interval timer (the pool kills the worker
   at timeout_s); ``sys.exit`` and ``KeyboardInterrupt`` raised by a reward end only that call.
5. A reward that closes or replaces the worker's pipes to the parent (``os.closerange``) leaves it nothing to
   say: it exits at once with EXIT_PIPES_CLOSED, printing nothing, and the pool names that exit code.
"""

from __future__ import annotations

import importlib
import json
import math
import os
import pickle
import resource
import signal
import struct
import sys
from collections.abc import Callable

MAX_ABS_REWARD = 1e6
"""A reward outside +-MAX_ABS_REWARD (e.g. 1e308) is treated as invalid: it would swamp the group's advantages."""

BUILTIN_MODULE = "dfpo.trainer.rewards.compute"
BUILTIN_FUNCTIONS = {
    "exact": "exact_match",
    "last_int": "last_int_match",
    "equiv": "equiv_match",
    "math_verify": "math_verify_match",
    "reasoning_gym": "reasoning_gym_match",
}
"""Built-in kinds a worker can rebuild by name: the function of that name in BUILTIN_MODULE (whose
``warm_up(kind)`` the worker calls first)."""
KINDS = (*BUILTIN_FUNCTIONS, "user")
STATUSES = ("ok", "error", "timeout", "invalid")

SOFT_DEADLINE_SHARE = 0.9
"""The worker interrupts a call at this share of timeout_s; the parent kills it at timeout_s."""
DETAIL_CHARS = 300
"""Failure details are cut to this length (at most 12 bytes each as JSON): a frame stays within MAX_FRAME_BYTES."""
MAX_FRAME_BYTES = 4096 - 4
"""The longest frame body a worker writes: with its 4-byte length it is PIPE_BUF on Linux (one write, never
interleaved with another writer's); the parent refuses longer."""
EXIT_PIPES_CLOSED = 86
"""The exit code of a worker whose reward closed or replaced its pipes to the parent."""
MARKER_VARIABLE = "DFPO_REWARD_WORKER"
"""Set in each worker's environment (pool token / worker number): every process its reward starts inherits it,
so the pool finds them even after the worker died on its own (its orphans then belong to init)."""

Outcome = tuple[float, str, str]
"""(value, status, detail) of one call; status in STATUSES, value 0.0 unless ok."""


# -- value conversion (in the worker, and in-process for the built-ins that run there) ----------------


def as_reward(raw: object) -> float | None:
    """A reward function's return value as a float, or None when it is not a finite number within +-MAX_ABS_REWARD.

    float() failing with TypeError, ValueError or OverflowError (``10**400``) means "not such a number": None.
    Any other exception raised by the value's ``__float__`` propagates: ``score`` counts it as an error.
    """
    if isinstance(raw, (str, bytes)) or not hasattr(raw, "__float__"):
        return None
    try:
        value = float(raw)
    except (TypeError, ValueError, OverflowError):
        return None
    return value if math.isfinite(value) and abs(value) <= MAX_ABS_REWARD else None


def describe_error(err: BaseException) -> str:
    """'ZeroDivisionError: division by zero', or just 'KeyboardInterrupt' when there is no message."""
    try:
        message = str(err)
    except Exception:  # noqa: BLE001 - a broken __str__ still leaves the exception's name
        message = ""
    return clip(f"{type(err).__name__}: {message}" if message else type(err).__name__)


def clip(text: str) -> str:
    """``text`` cut to DETAIL_CHARS characters."""
    return text if len(text) <= DETAIL_CHARS else text[: DETAIL_CHARS - 3] + "..."


def _short_repr(raw: object) -> str:
    try:
        text = repr(raw)
    except Exception:  # noqa: BLE001 - a broken __repr__ (or an int past the digit limit) still gets a name
        return f"<{type(raw).__name__} whose repr raised>"
    return text if len(text) <= 80 else f"{text[:60]}... ({type(raw).__name__} of {len(text)} characters)"


def score(raw: object) -> Outcome:
    """The outcome of a call that returned ``raw``: ok with its float, invalid, or error (its ``__float__`` raised)."""
    try:
        value = as_reward(raw)
    except _SoftDeadline:
        raise
    except BaseException as err:  # noqa: BLE001 - user code's __float__ may raise anything
        return 0.0, "error", clip(f"{describe_error(err)} (raised by float() of the returned {type(raw).__name__})")
    if value is None:
        return 0.0, "invalid", clip(f"returned {_short_repr(raw)} (not a finite number within +-{MAX_ABS_REWARD:g})")
    return value, "ok", ""


# -- naming and building the reward --------------------------------------------------------------------


USER_FN_FORMS = (
    "'module:function' or 'package.module:function' (a module importable from sys.path) or 'path/to/file.py:function' "
    "(a Python file, loaded by path; a relative path is relative to the current directory)"
)


def is_file_spec(spec: str) -> bool:
    """Whether a reward.user_fn names a file ('path/to/file.py:function', 'reward.py:score', '../r.txt:f'): the part
    before its last ':' holds a '/' (or the platform's separator) or ends in '.py'. Else it names a module."""
    target = spec.rpartition(":")[0] if isinstance(spec, str) else ""
    return "/" in target or os.sep in target or target.endswith(".py")


def parse_user_fn(spec: str) -> tuple[str, str]:
    """'package.module:function' -> (module name, function name); 'path/to/file.py:function' -> (path, function name).
    ValueError of one sentence naming the value and the forms (or, for a file, that it is not a .py file)."""
    if isinstance(spec, str) and is_file_spec(spec):
        path, _, attr = spec.rpartition(":")
        if not attr.isidentifier():
            raise ValueError(f"reward.user_fn must look like {USER_FN_FORMS}, got {spec!r}")
        if not path.endswith(".py"):
            raise ValueError(
                f"reward.user_fn {spec!r} names {path!r}, which is not a .py file; name a Python file as 'path/to/file.py:function'"
            )
        return path, attr
    module_name, colon, attr = spec.partition(":") if isinstance(spec, str) else ("", "", "")
    if not (colon and attr.isidentifier() and all(part.isidentifier() for part in module_name.split("."))):
        raise ValueError(f"reward.user_fn must look like {USER_FN_FORMS}, got {spec!r}")
    return module_name, attr


def user_file(spec: str, base_dir: str = "") -> str:
    """The absolute path of the file a 'path/to/file.py:function' names (a relative one from ``base_dir``, by default
    the current directory); ValueError of one sentence when it is not a readable regular file."""
    path, _ = parse_user_fn(spec)
    base_dir = base_dir or os.getcwd()
    full = os.path.normpath(os.path.join(base_dir, path))
    if not os.path.exists(full):
        raise ValueError(f"reward.user_fn {spec!r}: no file {full} (a relative path is read from the current directory, {base_dir})")
    if not os.path.isfile(full):
        raise ValueError(f"reward.user_fn {spec!r}: {full} is not a regular file; name a Python file as 'path/to/file.py:function'")
    if not os.access(full, os.R_OK):
        raise ValueError(f"reward.user_fn {spec!r}: {full} is not readable")
    return full


def check_user_fn(spec: str) -> None:
    """parse_user_fn, and for a file, that it exists (``user_file``): what a parent checks before it starts a worker."""
    if is_file_spec(spec):
        user_file(spec)
    else:
        parse_user_fn(spec)


def _import_failure(err: BaseException) -> str:
    """What importing a module raised: 'SystemExit(0)' (with a hint), or 'RuntimeError: its message'."""
    if isinstance(err, SystemExit):
        return f"SystemExit({err.code!r}) (a reward module defines functions; it must not exit when imported)"
    return describe_error(err)


def _load_file(spec: str, base_dir: str = "") -> object:
    """The module a 'path/to/file.py:function' names, run from its file (under a name of its own, so two files both
    called reward.py do not clash; its folder is not added to sys.path)."""
    import hashlib
    import importlib.util

    full = user_file(spec, base_dir)
    name = "dfpo_reward_file_" + hashlib.sha256(full.encode()).hexdigest()[:16]
    module_spec = importlib.util.spec_from_file_location(name, full)
    if module_spec is None or module_spec.loader is None:
        raise ValueError(f"reward.user_fn {spec!r}: {full} cannot be loaded as a Python file")
    module = importlib.util.module_from_spec(module_spec)
    sys.modules[name] = module  # as an import does: dataclasses and pickling in the file find their module
    try:
        module_spec.loader.exec_module(module)
    except (Exception, SystemExit) as err:  # noqa: BLE001 - user code runs at load; Ctrl-C still stops the caller
        sys.modules.pop(name, None)
        raise ValueError(f"reward.user_fn {spec!r}: running file {full} raised {_import_failure(err)}") from None
    return module


def load_user_fn(spec: str, base_dir: str = "") -> Callable:
    """'package.module:function' or 'path/to/file.py:function' (a relative path from ``base_dir``, by default the
    current directory) -> the function; ValueError naming what is wrong, whatever the import raised."""
    module_name, attr = parse_user_fn(spec)
    if is_file_spec(spec):
        module = _load_file(spec, base_dir)
        if not hasattr(module, attr):
            raise ValueError(f"reward.user_fn {spec!r}: file {module.__file__} defines no {attr!r}")
        fn = getattr(module, attr)
        if not callable(fn):
            raise ValueError(f"reward.user_fn {spec!r}: {attr!r} in file {module.__file__} is a {type(fn).__name__}, not a function")
        return fn
    try:
        module = importlib.import_module(module_name)
    except ImportError as err:
        raise ValueError(f"reward.user_fn {spec!r}: cannot import module {module_name!r} ({err})") from None
    except (Exception, SystemExit) as err:  # noqa: BLE001 - user code runs at import; Ctrl-C still stops the caller
        raise ValueError(f"reward.user_fn {spec!r}: importing module {module_name!r} raised {_import_failure(err)}") from None
    fn = getattr(module, attr, None)
    if not callable(fn):
        raise ValueError(f"reward.user_fn {spec!r}: module {module_name!r} has no callable {attr!r}")
    return fn


def build_call(kind: str, user_fn: str = "", base_dir: str = "") -> Callable[[str, str, str, dict | None], object]:
    """The reward of ``kind`` as call(prompt, completion, answer, meta) -> raw value (imports what it needs; a reward
    file's relative path is read from ``base_dir``)."""
    if kind == "user":
        fn = load_user_fn(user_fn, base_dir)
        return lambda prompt, completion, answer, meta: fn(prompt=prompt, completion=completion, answer=answer)
    if kind not in BUILTIN_FUNCTIONS:
        raise ValueError(f"reward kind {kind!r} unknown; known: {', '.join(KINDS)}")
    module = importlib.import_module(BUILTIN_MODULE)
    module.warm_up(kind)  # its imports now, not within the first call's deadline
    builtin = getattr(module, BUILTIN_FUNCTIONS[kind])
    Example = module.Example  # noqa: N806 - the rewards module's own (dfpo.trainer.tasks'): this file imports only the standard library

    return lambda prompt, completion, answer, meta: builtin(prompt, completion, Example(prompt, answer, meta or {}))


# -- framing -------------------------------------------------------------------------------------------


def write_frame(fd: int, body: bytes) -> None:
    """Length and body on ``fd``, in as many writes as it takes."""
    view = memoryview(struct.pack(">I", len(body)) + body)
    while view:
        view = view[os.write(fd, view) :]


def _read_frame(stream) -> bytes | None:
    """One frame's body from a blocking binary stream; None at EOF."""
    head = stream.read(4)
    if len(head) < 4:
        return None
    (length,) = struct.unpack(">I", head)
    body = stream.read(length)
    return body if len(body) == length else None


# -- the worker ----------------------------------------------------------------------------------------


class _SoftDeadline(BaseException):
    """Raised into a reward call by the worker's interval timer, shortly before the parent would kill it."""


_armed = False


def _on_alarm(signum, frame) -> None:
    global _armed
    if _armed:
        _armed = False
        raise _SoftDeadline


def _timed(call: Callable[[], object], soft_s: float) -> Outcome:
    """Outcome of ``call()`` (converted), interrupted after ``soft_s`` seconds when it lets itself be."""
    global _armed
    signal.signal(signal.SIGALRM, _on_alarm)  # again each call: a reward may have taken SIGALRM for itself
    _armed = True
    signal.setitimer(signal.ITIMER_REAL, soft_s)
    try:
        return score(call())
    except _SoftDeadline:
        return 0.0, "timeout", f"no result within reward.timeout_s={soft_s / SOFT_DEADLINE_SHARE:g} (interrupted in its worker)"
    except BaseException as err:  # noqa: BLE001 - sys.exit and KeyboardInterrupt from a reward end only its call
        return 0.0, "error", describe_error(err)
    finally:
        _armed = False
        signal.setitimer(signal.ITIMER_REAL, 0)


def _thread_count() -> int:
    try:
        return len(os.listdir("/proc/self/task"))
    except OSError:
        import threading

        return threading.active_count()


def _has_running_children() -> bool:
    """True while a child process of this worker runs (the ones that ended, adopted orphans included, are reaped)."""
    while True:
        try:
            pid, _ = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return False
        if pid == 0:
            return True


def _resident_mib() -> float:
    """This process's resident memory in MiB (0 where /proc is missing)."""
    try:
        with open("/proc/self/statm") as f:
            pages = int(f.read().split()[1])
    except (OSError, IndexError, ValueError):
        return 0.0
    return pages * os.sysconf("SC_PAGE_SIZE") / 2**20


def _prctl(option: int, value: int) -> None:
    """Linux prctl through ctypes (no package needed); nothing elsewhere."""
    if sys.platform.startswith("linux"):
        try:
            import ctypes

            ctypes.CDLL(None, use_errno=True).prctl(option, value, 0, 0, 0)
        except (OSError, AttributeError):
            pass


PR_SET_PDEATHSIG = 1
PR_SET_CHILD_SUBREAPER = 36


def _cap_memory(limit_mb: int) -> None:
    """RLIMIT_DATA (soft and hard) at ``limit_mb`` MiB, or lower where the inherited hard limit already is; 0 = none."""
    if limit_mb:
        _, hard = resource.getrlimit(resource.RLIMIT_DATA)
        cap = limit_mb << 20 if hard == resource.RLIM_INFINITY else min(hard, limit_mb << 20)
        resource.setrlimit(resource.RLIMIT_DATA, (cap, cap))


def _identities(fds: tuple[int, ...]) -> tuple:
    """(device, inode) of each fd, None for a closed one: a reward that closes or replaces one changes this."""
    out = []
    for fd in fds:
        try:
            st = os.fstat(fd)
            out.append((st.st_dev, st.st_ino))
        except OSError:
            out.append(None)
    return tuple(out)


class _Baseline:
    """What the worker is when it becomes ready (threads, children, fds, memory), to tell after each call whether it must be replaced."""

    def __init__(self, in_fd: int, out_fd: int, memory_limit_mb: int):
        self.pipes = (in_fd, out_fd)
        self.memory_limit_mb = memory_limit_mb
        self.threads, self.children = _thread_count(), _has_running_children()
        self.streams_id, self.pipes_id = _identities((0, 1, 2)), _identities(self.pipes)
        self.resident_mib = _resident_mib()

    def pipes_intact(self) -> bool:
        return _identities(self.pipes) == self.pipes_id

    def recycle_reason(self, outcome: Outcome) -> str:
        """Why this worker must be replaced after a call with ``outcome`` ('' = keep it)."""
        limit = self.memory_limit_mb
        if outcome[2].startswith("MemoryError"):
            return f"memory: a call failed with MemoryError (reward.memory_limit_mb = {limit})"
        if limit and (now := _resident_mib()) > (self.resident_mib + limit) / 2:
            return f"memory: {now:.0f} MiB resident after a call, past halfway to reward.memory_limit_mb = {limit}"
        if _thread_count() > self.threads:
            return "threads: the reward left a thread running"
        if not self.children and _has_running_children():
            return "children: the reward left a process running"
        if _identities((0, 1, 2)) != self.streams_id:
            return "streams: the reward closed or replaced the worker's standard streams"
        return ""


def _send(fd: int, *message) -> None:
    write_frame(fd, json.dumps(message).encode())


def _serve(inp, out_fd: int, call: Callable, soft_s: float, me: _Baseline) -> None:
    """Answer tasks until EOF (the parent closed the pipe or died) or until a call leaves the worker unfit."""
    while me.pipes_intact() and (frame := _read_frame(inp)) is not None:
        call_id, prompt, completion, answer, meta = pickle.loads(frame)
        try:
            outcome = _timed(lambda: call(prompt, completion, answer, meta), soft_s)  # noqa: B023 - called at once
        except _SoftDeadline:  # the timer went off between the call and disarming it
            outcome = 0.0, "timeout", "no result within reward.timeout_s (interrupted in its worker)"
        if outcome[2].startswith("MemoryError") and me.memory_limit_mb:
            outcome = (
                *outcome[:2],
                clip(f"{outcome[2]} (each worker's memory is capped at reward.memory_limit_mb = {me.memory_limit_mb})"),
            )
        recycle = me.recycle_reason(outcome)
        if not me.pipes_intact():
            break
        _send(out_fd, "done", call_id, *outcome, recycle)
        if recycle:
            return  # the parent kills this worker, with the threads and processes the reward left
    os._exit(EXIT_PIPES_CLOSED if not me.pipes_intact() else 0)


def worker_main() -> None:
    """One worker: read the init frame, build the reward, say ready, then serve tasks."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C is the parent's to handle
    inp = os.fdopen(os.dup(0), "rb")
    out_fd = os.dup(1)
    devnull = os.open(os.devnull, os.O_RDONLY)
    os.dup2(devnull, 0)
    os.dup2(2, 1)  # a reward's print() goes to stderr, never into the frames
    frame = _read_frame(inp)
    if frame is None:
        return
    init = pickle.loads(frame)
    _prctl(PR_SET_PDEATHSIG, signal.SIGKILL)
    if os.getppid() != init["parent_pid"]:  # the parent died before the request: exit now
        os._exit(1)
    _prctl(PR_SET_CHILD_SUBREAPER, 1)
    sys.path[:] = init["sys_path"]
    try:
        _cap_memory(init["memory_limit_mb"])
        call = build_call(init["kind"], init["user_fn"], init.get("base_dir", ""))
    except BaseException as err:  # noqa: BLE001 - whatever importing the reward raises is reported, not printed
        message = clip(str(err)) if isinstance(err, ValueError) else describe_error(err)
        if isinstance(err, MemoryError):
            message += f" (each worker's memory is capped at reward.memory_limit_mb = {init['memory_limit_mb']})"
        _send(out_fd, "failed", clip(message))
        return
    me = _Baseline(inp.fileno(), out_fd, init["memory_limit_mb"])
    _send(out_fd, "ready")
    _serve(inp, out_fd, call, init["soft_s"], me)


if __name__ == "__main__":
    try:
        worker_main()
    except OSError:  # a pipe to the parent broken under it (the parent gone, or a reward's doing): nothing to say
        os._exit(EXIT_PIPES_CLOSED)
