"""Reward calls in worker processes that can be killed: a bounded pool, started once and reused.

Imported, this module is the parent's side (``RewardPool``); run as a script (``python -P reward_pool.py``)
it is one worker. Everything at module level is the standard library, so a worker for a user reward starts
in a fraction of a second with ~15 MiB and imports nothing of dfpo but what the user's module does. A built-in
kind's worker imports ``dfpo.trainer.llm.rewards``, which stays free of torch (``dfpo/__init__`` and
``dfpo/trainer/__init__`` resolve their names on first use): ~0.2 s and ~17 MiB, plus math-verify's own imports
for that kind (~1 s for two workers on a shared 2-core machine; it was ~3-12 s and ~230 MiB with torch).

Protocol, one frame = 4-byte big-endian length + body:
    parent -> worker stdin, pickled: an init dict (sys.path, parent pid, kind, user_fn, soft deadline),
        then one task at a time: (prompt, completion, answer, meta).
    worker -> parent, JSON (the parent unpickles nothing that a process running user code wrote):
        ["ready"] or ["failed", message] once, then ["done", value, status, detail, recycle] per task.
    The reward's return value is converted to a float in the worker (``score``); only numbers and short
    strings cross. The worker's original stdout carries its frames; its fd 1 then points at stderr, so a
    reward's ``print`` cannot corrupt them, and its stdin is /dev/null.

Choices:
1. Workers are fresh interpreters started by ``subprocess`` (fork + exec, as multiprocessing's ``spawn``;
   never a plain fork of a process holding torch threads), each in its own session: killing the worker's
   process group (SIGKILL) also kills what the reward forked (unless it made a session of its own), and a
   terminal's Ctrl-C (sent to the foreground group) does not reach workers; they ignore SIGINT too. The
   parent decides.
   multiprocessing's spawn would also re-import the parent's main module in every worker.
2. Two deadlines per call. The worker arms an interval timer at ``SOFT_DEADLINE_SHARE * timeout_s`` that
   raises into the reward: sleeps, waits, Python loops and sympy stop there and the worker is kept
   (cheap: a math-verify worker's restart costs its sympy imports). A call still running at ``timeout_s`` (the
   timer swallowed, or C code holding the GIL such as a catastrophic regex) has its worker's process
   group killed; a new worker is started. Both count as timeouts.
3. Parent death: a worker asks the kernel for SIGKILL when its parent dies (Linux
   ``prctl(PR_SET_PDEATHSIG)`` through ctypes, no package needed; it works while the reward holds the
   GIL, where a watchdog thread would not); an idle worker also exits on EOF of its stdin (any POSIX).
   Caveats: PDEATHSIG follows the *thread* that started the worker (start the pool from a thread that
   lives as long as it, e.g. the main thread; a worker killed this way is replaced and counted only if it
   was computing); processes forked by a still-running reward outlive a parent that dies without running
   Python's exit hooks (SIGKILL, or SIGTERM with no handler); ``close()`` and the exit hook kill them
   in every other case.
4. The parent never blocks without a timeout: it polls the workers' pipes for at most ``POLL_S`` at a
   time; Python signal handlers run at once (PEP 475 retries the poll after them), and a handler that
   raises ends the batch and kills the workers that were computing.
5. After each call a worker that has more threads or running child processes than when it became ready
   says so and is replaced (its process group killed): nothing a reward started outlives its call.
6. A worker that dies (``os._exit``, a signal) scores its call 0 as an error naming the exit code and is
   replaced. ``sys.exit`` and ``KeyboardInterrupt`` raised by a reward are caught in the worker: errors
   too, and the worker is kept.
"""

from __future__ import annotations

import importlib
import json
import math
import os
import pickle
import select
import signal
import struct
import subprocess
import sys
import time
import weakref
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field

MAX_ABS_REWARD = 1e6
"""A reward outside +-MAX_ABS_REWARD (e.g. 1e308) is treated as invalid: it would swamp the group's advantages."""

BUILTIN_MODULE = "dfpo.trainer.llm.rewards"
BUILTIN_FUNCTIONS = {
    "exact": "exact_match",
    "equiv": "equiv_match",
    "math_verify": "math_verify_match",
    "reasoning_gym": "reasoning_gym_match",
}
"""Built-in kinds a worker can rebuild by name: the function of that name in BUILTIN_MODULE (whose
``warm_up(kind)`` the worker calls first)."""
KINDS = (*BUILTIN_FUNCTIONS, "user")

SOFT_DEADLINE_SHARE = 0.9
"""The worker interrupts a call at this share of timeout_s; the parent kills it at timeout_s."""
STARTUP_TIMEOUT_S = 120.0
"""A worker that is not ready (interpreter up, reward imported) after this long is killed (a start failure)."""
POLL_S = 0.1
"""The longest the parent waits in one poll: signal handlers and deadlines are never further away."""
KILL_WAIT_S = 5.0
"""How long the parent waits to reap a worker it killed (SIGKILL takes effect at once unless it is stuck in the kernel)."""
DETAIL_CHARS = 300
"""Failure details are cut to this length: a result frame stays below PIPE_BUF, so it is written atomically."""

Outcome = tuple[float, str, str]
"""(value, status, detail) of one call; status in ok | error | timeout | invalid, value 0.0 unless ok."""
Task = tuple[str, str, str, "dict | None"]
"""(prompt, completion, answer, meta) of one call; meta only for kinds that read it (reasoning_gym)."""


def default_workers() -> int:
    """min(8, CPU count): reward calls are short and CPU-bound; more workers than cores only adds memory."""
    return max(1, min(8, os.cpu_count() or 1))


def check_pool_settings(timeout_s: float, workers: int) -> None:
    """ValueError naming a timeout that is not a positive finite number of seconds or a negative worker count."""
    if isinstance(timeout_s, bool) or not (isinstance(timeout_s, (int, float)) and 0 < timeout_s < math.inf):
        raise ValueError(f"reward.timeout_s must be a positive, finite number of seconds, got {timeout_s!r}")
    if isinstance(workers, bool) or not isinstance(workers, int) or workers < 0:
        raise ValueError(f"reward.workers must be an integer >= 0 (0 = min(8, CPU count) = {default_workers()} here), got {workers!r}")


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
    return _clip(f"{type(err).__name__}: {message}" if message else type(err).__name__)


def _clip(text: str) -> str:
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
        return 0.0, "error", _clip(f"{describe_error(err)} (raised by float() of the returned {type(raw).__name__})")
    if value is None:
        return 0.0, "invalid", _clip(f"returned {_short_repr(raw)} (not a finite number within +-{MAX_ABS_REWARD:g})")
    return value, "ok", ""


# -- building the reward in a worker -------------------------------------------------------------------


def load_user_fn(spec: str) -> Callable:
    """'module:function' -> the function; ValueError naming what is wrong."""
    module_name, _, attr = spec.partition(":")
    if not module_name or not attr:
        raise ValueError(f"reward.user_fn must look like 'module:function', got {spec!r}")
    try:
        module = importlib.import_module(module_name)
    except ImportError as err:
        raise ValueError(f"reward.user_fn {spec!r}: cannot import module {module_name!r} ({err})") from None
    fn = getattr(module, attr, None)
    if not callable(fn):
        raise ValueError(f"reward.user_fn {spec!r}: module {module_name!r} has no callable {attr!r}")
    return fn


def build_call(kind: str, user_fn: str = "") -> Callable[[str, str, str, dict | None], object]:
    """The reward of ``kind`` as call(prompt, completion, answer, meta) -> raw value (imports what it needs)."""
    if kind == "user":
        fn = load_user_fn(user_fn)
        return lambda prompt, completion, answer, meta: fn(prompt=prompt, completion=completion, answer=answer)
    if kind not in BUILTIN_FUNCTIONS:
        raise ValueError(f"reward kind {kind!r} unknown; known: {', '.join(KINDS)}")
    module = importlib.import_module(BUILTIN_MODULE)
    module.warm_up(kind)  # its imports now, not within the first call's deadline
    builtin = getattr(module, BUILTIN_FUNCTIONS[kind])
    Example = module.Example  # noqa: N806 - the rewards module's own (dfpo.trainer.llm.tasks'): this file imports only the standard library

    return lambda prompt, completion, answer, meta: builtin(prompt, completion, Example(prompt, answer, meta or {}))


# -- framing -------------------------------------------------------------------------------------------


def _write_all(fd: int, body: bytes) -> None:
    view = memoryview(struct.pack(">I", len(body)) + body)
    while view:
        view = view[os.write(fd, view) :]


def _read_frame(stream) -> bytes | None:
    """One frame's body from a blocking binary stream; None at EOF."""
    head = stream.read(4)
    if len(head) < 4:
        return None
    body = stream.read(struct.unpack(">I", head)[0])
    return body if len(body) == struct.unpack(">I", head)[0] else None


def _take_frames(buf: bytearray) -> list[bytes]:
    """The complete frames at the start of ``buf`` (removed from it)."""
    out = []
    while len(buf) >= 4:
        (n,) = struct.unpack_from(">I", buf)
        if len(buf) < 4 + n:
            break
        out.append(bytes(buf[4 : 4 + n]))
        del buf[: 4 + n]
    return out


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
    """True while a child process of this worker runs (the ones that ended are reaped)."""
    while True:
        try:
            pid, _ = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return False
        if pid == 0:
            return True


def _die_with_parent(parent_pid: int) -> None:
    """SIGKILL this worker when the parent dies (Linux); exit now if it already has."""
    if sys.platform.startswith("linux"):
        try:
            import ctypes

            ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGKILL, 0, 0, 0)  # 1 = PR_SET_PDEATHSIG
        except (OSError, AttributeError):
            pass
    if os.getppid() != parent_pid:
        os._exit(1)


def _send(fd: int, *message) -> None:
    _write_all(fd, json.dumps(message).encode())


def _serve(inp, out_fd: int, call: Callable, soft_s: float) -> None:
    """Answer tasks until EOF (the parent closed the pipe or died) or until a call leaves something running."""
    threads_at_start, children_at_start = _thread_count(), _has_running_children()
    while (frame := _read_frame(inp)) is not None:
        prompt, completion, answer, meta = pickle.loads(frame)
        try:
            value, status, detail = _timed(lambda: call(prompt, completion, answer, meta), soft_s)  # noqa: B023 - called at once
        except _SoftDeadline:  # the timer went off between the call and disarming it
            value, status, detail = 0.0, "timeout", "no result within reward.timeout_s (interrupted in its worker)"
        recycle = _thread_count() > threads_at_start or (not children_at_start and _has_running_children())
        _send(out_fd, "done", value, status, detail, recycle)
        if recycle:
            return  # the parent kills this process group, with the threads and processes the reward left


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
    _die_with_parent(init["parent_pid"])
    sys.path[:] = init["sys_path"]
    try:
        call = build_call(init["kind"], init["user_fn"])
    except BaseException as err:  # noqa: BLE001 - whatever importing the reward raises is reported, not printed
        _send(out_fd, "failed", _clip(str(err)) if isinstance(err, ValueError) else describe_error(err))
        return
    _send(out_fd, "ready")
    _serve(inp, out_fd, call, init["soft_s"])


# -- the parent's side ---------------------------------------------------------------------------------


@dataclass(eq=False)
class _Worker:
    proc: subprocess.Popen
    started: float
    ready: bool = False
    task: int | None = None
    deadline: float = math.inf
    buf: bytearray = field(default_factory=bytearray)


def _kill(proc: subprocess.Popen) -> None:
    """SIGKILL the worker's process group (the worker and what its reward forked), then reap the worker."""
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):  # the group is gone: the worker was reaped and left nothing
        pass
    for stream in (proc.stdin, proc.stdout):
        try:
            stream.close()
        except OSError:
            pass
    try:
        proc.wait(timeout=KILL_WAIT_S)
    except subprocess.TimeoutExpired:  # stuck in the kernel; SIGKILL is pending, nothing more to do
        pass


def _kill_all(workers: list[_Worker], owner_pid: int) -> None:
    """Kill the workers, unless called in a forked copy of their parent (its exit hooks must not kill them)."""
    while workers and os.getpid() == owner_pid:
        _kill(workers.pop().proc)


def describe_exit(returncode: int | None) -> str:
    """'exit code 7' or 'killed by SIGSEGV'."""
    if returncode is None:
        return "exit code unknown"
    if returncode < 0:
        try:
            return f"killed by {signal.Signals(-returncode).name}"
        except ValueError:
            return f"killed by signal {-returncode}"
    return f"exit code {returncode}"


class RewardPool:
    """Up to ``workers`` processes computing one reward ``kind`` (built-in by name, or 'user' with its
    'module:function'); each call has ``timeout_s``. The first worker is ready when the constructor returns
    (ValueError when the reward cannot be built, e.g. a user module that does not import); the others start
    meanwhile. ``close()`` (or leaving a ``with`` block, or interpreter exit) kills every worker.
    One batch at a time: ``run`` is not meant to be called from several threads at once."""

    def __init__(
        self, kind: str, user_fn: str = "", *, workers: int = 0, timeout_s: float = 5.0, startup_timeout_s: float = STARTUP_TIMEOUT_S
    ):
        if kind not in KINDS:
            raise ValueError(f"reward kind {kind!r} unknown; known: {', '.join(KINDS)}")
        check_pool_settings(timeout_s, workers)
        self.kind, self.user_fn, self.timeout_s = kind, user_fn, float(timeout_s)
        self.size = workers or default_workers()
        self.startup_timeout_s = startup_timeout_s
        self._workers: list[_Worker] = []
        self._start_errors: list[str] = []
        self._closed = False
        self._finalizer = weakref.finalize(self, _kill_all, self._workers, os.getpid())
        try:
            self.wait_ready(1)
        except BaseException:
            self.close()
            raise

    def __enter__(self) -> RewardPool:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def close(self) -> None:
        """Kill every worker (and what their rewards forked) and reap them; the pool cannot be used after."""
        self._closed = True
        self._finalizer()

    def wait_ready(self, count: int | None = None) -> None:
        """Start workers and wait until ``count`` of them (default all) are ready; ValueError on a start failure."""
        count = self.size if count is None else count
        self._start_errors.clear()
        self._fill()
        while sum(w.ready for w in self._workers) < count:
            self._collect([], deque())
            if self._start_errors:
                raise ValueError(self._start_errors[0])
            self._fill()

    def pids(self) -> list[int]:
        """Process ids of the live workers (for tests and diagnostics)."""
        return [w.proc.pid for w in self._workers]

    def run(self, tasks: list[Task]) -> list[Outcome]:
        """One outcome per task, in order. A call still running at timeout_s has its worker killed."""
        if self._closed:
            raise RuntimeError("this RewardPool is closed")
        results: list[Outcome | None] = [None] * len(tasks)
        todo = deque(range(len(tasks)))
        self._start_errors.clear()
        try:
            while todo or any(w.task is not None for w in self._workers):
                self._fill()
                self._dispatch(tasks, todo, results)
                self._collect(results, todo)
        except BaseException:
            for w in [w for w in self._workers if w.task is not None]:
                self._discard(w)  # interrupted: their results would belong to no batch
            raise
        self._fill()  # replacements start now and are ready for the next batch
        return results  # type: ignore[return-value] - every slot is filled when the loop ends

    # -- internals --------------------------------------------------------------------------------

    def _spawn(self) -> _Worker:
        proc = subprocess.Popen(
            [sys.executable, "-P", os.path.abspath(__file__)],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            bufsize=0,
            start_new_session=True,
        )
        worker = _Worker(proc, time.monotonic())
        init = {"sys_path": list(sys.path), "parent_pid": os.getpid(), "kind": self.kind, "user_fn": self.user_fn}
        init["soft_s"] = SOFT_DEADLINE_SHARE * self.timeout_s
        try:
            _write_all(proc.stdin.fileno(), pickle.dumps(init))
        except OSError:
            pass  # it died at once: its pipe reports EOF and _collect counts a start failure
        return worker

    def _fill(self) -> None:
        while len(self._workers) < self.size:
            try:
                self._workers.append(self._spawn())
            except OSError as err:  # cannot fork now: go on with the workers there are
                self._start_errors.append(f"cannot start a reward worker: {err}")
                return

    def _dispatch(self, tasks: list[Task], todo: deque[int], results: list[Outcome | None]) -> None:
        for w in list(self._workers):
            if not todo:
                return
            if not w.ready or w.task is not None:
                continue
            i = todo.popleft()
            try:
                body = pickle.dumps(tasks[i])
            except Exception as err:  # noqa: BLE001 - e.g. an example's meta that does not pickle
                results[i] = (0.0, "error", _clip(f"{type(err).__name__}: the example could not be sent to a worker ({err})"))
                continue
            try:
                _write_all(w.proc.stdin.fileno(), body)
            except OSError:  # the idle worker died (e.g. its starting thread ended): the task waits for another
                todo.appendleft(i)
                self._discard(w)
                continue
            w.task, w.deadline = i, time.monotonic() + self.timeout_s

    def _collect(self, results: list[Outcome | None], todo: deque[int]) -> None:
        """Wait at most POLL_S (or until the next deadline) for the workers, then handle what happened."""
        now = time.monotonic()
        next_deadline = min((w.deadline for w in self._workers), default=math.inf)
        poller = select.poll()
        by_fd = {w.proc.stdout.fileno(): w for w in self._workers}
        for fd in by_fd:
            poller.register(fd, select.POLLIN)
        for fd, _ in poller.poll(1000 * min(POLL_S, max(0.0, next_deadline - now))):
            w = by_fd[fd]
            data = os.read(fd, 65536)
            if not data:
                self._lost(w, results, todo)
                continue
            w.buf += data
            for frame in _take_frames(w.buf):
                self._handle(w, json.loads(frame), results, todo)
        now = time.monotonic()
        for w in list(self._workers):
            if w.task is not None and w.proc.poll() is not None:  # died, its pipe held open by a child
                self._lost(w, results, todo)
            elif w.task is not None and now >= w.deadline:
                results[w.task] = (0.0, "timeout", f"no result within reward.timeout_s={self.timeout_s:g} (worker killed)")
                self._discard(w)
            elif not w.ready and now - w.started > self.startup_timeout_s:
                self._start_failed(w, f"a reward worker was not ready after {self.startup_timeout_s:g} s (killed)", results, todo)
        self._start_errors_to_tasks(results, todo)

    def _handle(self, w: _Worker, message: list, results: list[Outcome | None], todo: deque[int]) -> None:
        if w not in self._workers:
            return
        if message[0] == "ready":
            w.ready = True
        elif message[0] == "failed":
            self._start_failed(w, message[1], results, todo)
        elif message[0] == "done" and w.task is not None:
            _, value, status, detail, recycle = message
            results[w.task] = (float(value), status, detail)
            w.task, w.deadline = None, math.inf
            if recycle:
                self._discard(w)

    def _lost(self, w: _Worker, results: list[Outcome | None], todo: deque[int]) -> None:
        """A worker whose pipe closed or whose process ended."""
        if w not in self._workers:
            return
        self._discard(w)
        how = describe_exit(w.proc.returncode)
        if w.task is not None:
            results[w.task] = (0.0, "error", f"WorkerDied: the reward's worker process ended ({how}); it was replaced")
        elif not w.ready:
            self._start_failed(w, f"a reward worker ended before it was ready ({how})", results, todo)

    def _start_failed(self, w: _Worker, message: str, results: list[Outcome | None], todo: deque[int]) -> None:
        if w in self._workers:
            self._discard(w)
        self._start_errors.append(message)

    def _start_errors_to_tasks(self, results: list[Outcome | None], todo: deque[int]) -> None:
        """While no worker is ready, each start failure fails one waiting call: a batch ends even if no worker
        ever starts. With a ready worker the batch goes on (the failed one is started again)."""
        if any(w.ready for w in self._workers):
            self._start_errors.clear()
            return
        while todo and self._start_errors:
            results[todo.popleft()] = (0.0, "error", _clip(f"WorkerStartFailed: {self._start_errors.pop(0)}"))

    def _discard(self, w: _Worker) -> None:
        self._workers.remove(w)
        _kill(w.proc)


if __name__ == "__main__":
    worker_main()
