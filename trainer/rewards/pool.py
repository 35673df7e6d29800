"""Reward calls in worker processes that can be killed: a bounded pool, started once and reused.

This is the parent's side (``RewardPool``); each worker is a fresh interpreter running ``worker.py``,
whose docstring describes the protocol and what a worker does for itself (a subreaper, its memory cap, why it
asks to be replaced). Standard library only, like the worker.

Choices:
1. Workers are fresh interpreters started by ``subprocess`` (fork + exec, as multiprocessing's ``spawn``;
   never a plain fork of a process holding torch threads), each in its own session, so a terminal's Ctrl-C
   (sent to the foreground group) does not reach them; they ignore SIGINT too. The parent decides.
   multiprocessing's spawn would also re-import the parent's main module in every worker.
2. A worker is killed with everything its reward started, whatever session that made (``process_tree``):
   the worker is stopped, its descendants (kept in its tree by the subreaper) killed until none is left, then
   the worker. A worker that died on its own left orphans to init: they are found by the environment marker
   every worker's process inherits (``worker.MARKER_VARIABLE``, one value per worker) and killed when
   its death is noticed; ``close()`` and the exit hook kill every process marked for the pool.
3. Two deadlines per call. The worker's interval timer interrupts a call at ``SOFT_DEADLINE_SHARE * timeout_s``
   (sleeps, waits, Python loops and sympy stop there and the worker is kept: a math-verify worker's restart
   costs its sympy imports). A call still running at ``timeout_s`` (the timer swallowed, or C code holding
   the GIL such as a catastrophic regex) has its worker killed; a new worker is started. Both are timeouts.
4. Every frame a worker writes is checked (``parse_frame``; a reward runs in the worker and can write on its
   pipe): a bad one is a reward error (``BadWorkerFrame``) of the call it came with, and its worker is
   replaced. One that comes with no call is counted too (``take_stray_errors``). The run goes on.
5. Parent death: a worker gets SIGKILL when its parent dies (``PR_SET_PDEATHSIG``; it works while the reward
   holds the GIL, where a watchdog thread would not); an idle worker also exits on EOF of its stdin.
   Caveats: PDEATHSIG follows the *thread* that started the worker (start the pool from a thread that
   lives as long as it, e.g. the main thread; a worker killed this way is replaced and counted only if it
   was computing); processes a still-running reward started outlive a parent that dies without running
   Python's exit hooks (SIGKILL, or SIGTERM with no handler); ``close()`` and the exit hook end them in
   every other case.
6. The parent never blocks without a timeout: it polls the workers' pipes for at most ``POLL_S`` at a
   time; Python signal handlers run at once (PEP 475 retries the poll after them), and a handler that
   raises ends the batch and kills the workers that were computing.
7. A worker is replaced after a call when it says so (memory, threads or processes left running, its
   standard streams closed), after ``max_tasks_per_worker`` calls (as multiprocessing's ``maxtasksperchild``;
   0 = never), and when it dies (``os._exit``, a signal: the call scores 0 as an error naming the exit code).
   A worker replaced for its memory is reported once per pool (``take_notices``), naming the reward.
"""

from __future__ import annotations

import json
import math
import os
import pickle
import secrets
import select
import signal
import struct
import subprocess
import sys
import time
import weakref
from collections import deque
from dataclasses import dataclass, field

from . import process_tree
from . import worker as worker_module
from .worker import (
    DETAIL_CHARS,
    EXIT_PIPES_CLOSED,
    KINDS,
    MARKER_VARIABLE,
    MAX_ABS_REWARD,
    MAX_FRAME_BYTES,
    SOFT_DEADLINE_SHARE,
    STATUSES,
    Outcome,
    check_user_fn,
    clip,
    write_frame,
)

STARTUP_TIMEOUT_S = 120.0
"""A worker that is not ready (interpreter up, reward imported) after this long is killed (a start failure)."""
POLL_S = 0.1
"""The longest the parent waits in one poll: signal handlers and deadlines are never further away."""
EXIT_GRACE_S = 1.0
"""How long a worker whose pipe closed gets to exit on its own (its exit code tells why) before it is killed."""
KILL_WAIT_S = 5.0
"""How long the parent waits to reap a worker it killed (SIGKILL takes effect at once unless it is stuck in the kernel)."""
DEFAULT_MEMORY_LIMIT_MB = 4096
"""Each worker's memory cap by default (reward.memory_limit_mb): far above a math-verify worker's ~300 MiB."""
MIN_MEMORY_LIMIT_MB = 64
"""The smallest cap accepted: an interpreter alone needs ~15 MiB, a reward's imports more."""

Task = tuple[str, str, str, "dict | None"]
"""(prompt, completion, answer, meta) of one call; meta only for kinds that read it (reasoning_gym)."""


def default_workers() -> int:
    """min(8, CPU count): reward calls are short and CPU-bound; more workers than cores only adds memory."""
    return max(1, min(8, os.cpu_count() or 1))


def _is_int(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def check_pool_settings(timeout_s: float, workers: int, max_tasks_per_worker: int = 0, memory_limit_mb: int = 0) -> None:
    """ValueError naming the first setting that is out of its range, with the range."""
    if isinstance(timeout_s, bool) or not (isinstance(timeout_s, (int, float)) and 0 < timeout_s < math.inf):
        raise ValueError(f"reward.timeout_s must be a positive, finite number of seconds, got {timeout_s!r}")
    if not _is_int(workers) or workers < 0:
        raise ValueError(f"reward.workers must be an integer >= 0 (0 = min(8, CPU count) = {default_workers()} here), got {workers!r}")
    if not _is_int(max_tasks_per_worker) or max_tasks_per_worker < 0:
        raise ValueError(f"reward.max_tasks_per_worker must be an integer >= 0 (0 = no limit), got {max_tasks_per_worker!r}")
    if not _is_int(memory_limit_mb) or not (memory_limit_mb == 0 or memory_limit_mb >= MIN_MEMORY_LIMIT_MB):
        raise ValueError(f"reward.memory_limit_mb must be 0 (no cap) or an integer >= {MIN_MEMORY_LIMIT_MB} (MiB), got {memory_limit_mb!r}")


def describe_exit(returncode: int | None) -> str:
    """'exit code 7', 'killed by SIGSEGV', or what the worker's own exit code means."""
    if returncode is None:
        return "exit code unknown"
    if returncode == EXIT_PIPES_CLOSED:
        return f"exit code {returncode}: the reward closed its worker's pipes to the trainer, e.g. with os.closerange"
    if returncode < 0:
        try:
            return f"killed by {signal.Signals(-returncode).name}"
        except ValueError:
            return f"killed by signal {-returncode}"
    return f"exit code {returncode}"


# -- checking what a worker writes -----------------------------------------------------------------------


class BadFrame(ValueError):
    """A frame a worker wrote that is not a message of the protocol; its text completes 'a frame that is ...'."""


def take_frames(buf: bytearray):
    """Yield the complete frames' bodies at the start of ``buf`` (removed from it); BadFrame for a frame longer
    than MAX_FRAME_BYTES, as soon as its length is read (nothing of it is kept)."""
    while len(buf) >= 4:
        (n,) = struct.unpack_from(">I", buf)
        if n > MAX_FRAME_BYTES:
            raise BadFrame(f"{n} bytes long (at most {MAX_FRAME_BYTES})")
        if len(buf) < 4 + n:
            return
        body = bytes(buf[4 : 4 + n])
        del buf[: 4 + n]
        yield body


def _refuse_constant(name: str) -> None:
    raise ValueError(f"{name} is not JSON")


def _is_reward_value(value: object, status: object) -> bool:
    """A float the worker can have sent: finite, within +-MAX_ABS_REWARD, and 0 unless the call was ok."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return False
    return math.isfinite(value) and abs(value) <= MAX_ABS_REWARD and (status == "ok" or value == 0)


def _is_text(value: object) -> bool:
    return isinstance(value, str) and len(value) <= DETAIL_CHARS


def parse_frame(body: bytes) -> list:
    """A worker's message: ["ready"], ["failed", text] or ["done", call_id, value, status, detail, recycle], its
    types checked; BadFrame naming what is wrong (strict JSON: NaN and Infinity are not numbers here)."""
    try:
        message = json.loads(body, parse_constant=_refuse_constant)
    except (ValueError, RecursionError) as err:
        raise BadFrame(f"not JSON ({clip(str(err))[:80]})") from None
    match message:
        case ["ready"]:
            return message
        case ["failed", str()] if _is_text(message[1]):
            return message
        case ["done", str(), value, status, detail, recycle] if (
            status in STATUSES and _is_reward_value(value, status) and _is_text(detail) and _is_text(recycle)
        ):
            return message
    raise BadFrame(f"not a known message: {clip(repr(message))[:80]}")


# -- the parent's side ---------------------------------------------------------------------------------


@dataclass(eq=False)
class _Worker:
    proc: subprocess.Popen
    marker: str
    """The value of MARKER_VARIABLE in this worker's environment, inherited by every process it starts."""
    started: float
    ready: bool = False
    task: int | None = None
    call_id: str = ""
    deadline: float = math.inf
    calls: int = 0
    buf: bytearray = field(default_factory=bytearray)


def _kill(w: _Worker) -> None:
    """Kill the worker with everything its reward started (or, when it already died, what carries its marker),
    close its pipes and reap it."""
    alive = w.proc.poll() is None
    process_tree.kill_tree(w.proc.pid)
    for stream in (w.proc.stdin, w.proc.stdout):
        try:
            stream.close()
        except OSError:
            pass
    try:
        w.proc.wait(timeout=KILL_WAIT_S)
    except subprocess.TimeoutExpired:  # stuck in the kernel; SIGKILL is pending, nothing more to do
        pass
    if not alive:  # its orphans went to init: only the marker finds them
        process_tree.kill_marked(MARKER_VARIABLE, w.marker)


def _kill_all(workers: list[_Worker], owner_pid: int, pool_marker: str) -> None:
    """Kill the workers and every process marked for the pool, unless called in a forked copy of their parent
    (its exit hooks must not kill them)."""
    if os.getpid() != owner_pid:
        return
    while workers:
        _kill(workers.pop())
    process_tree.kill_marked(MARKER_VARIABLE, pool_marker, prefix=True)


class RewardPool:
    """Up to ``workers`` processes computing one reward ``kind`` (built-in by name, or 'user' with its
    'package.module:function' or 'path/to/file.py:function', a relative path read from the current directory when the
    pool is made); each call has ``timeout_s``. The first worker is ready when the constructor returns (ValueError
    when the reward cannot be built, e.g. a user module that does not import; a missing reward file is named before
    any worker starts); the others start meanwhile. ``close()`` (or leaving a ``with`` block, or interpreter exit) kills every worker.
    One batch at a time: ``run`` is not meant to be called from several threads at once."""

    def __init__(
        self,
        kind: str,
        user_fn: str = "",
        *,
        workers: int = 0,
        timeout_s: float = 5.0,
        max_tasks_per_worker: int = 0,
        memory_limit_mb: int = DEFAULT_MEMORY_LIMIT_MB,
        startup_timeout_s: float = STARTUP_TIMEOUT_S,
    ):
        if kind not in KINDS:
            raise ValueError(f"reward kind {kind!r} unknown; known: {', '.join(KINDS)}")
        if kind == "user":
            check_user_fn(user_fn)  # a file that is missing is named here, before any worker starts
        check_pool_settings(timeout_s, workers, max_tasks_per_worker, memory_limit_mb)
        self.kind, self.user_fn, self.timeout_s = kind, user_fn, float(timeout_s)
        self._base_dir = os.getcwd()
        """Where each worker reads a reward file's relative path from: the current directory when the pool was made,
        so that a worker started later (a replacement) loads the same file."""
        self.name = user_fn if kind == "user" else kind
        self.size = workers or default_workers()
        self.max_tasks_per_worker, self.memory_limit_mb = max_tasks_per_worker, memory_limit_mb
        self.startup_timeout_s = startup_timeout_s
        self._workers: list[_Worker] = []
        self._start_errors: list[str] = []
        self._stray_errors: list[str] = []
        self._notices: list[str] = []
        self._noticed: set[str] = set()
        self._marker, self._spawned = f"{os.getpid()}-{secrets.token_hex(8)}/", 0
        self._closed = False
        self._finalizer = weakref.finalize(self, _kill_all, self._workers, os.getpid(), self._marker)
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
        """Kill every worker (and what their rewards started) and reap them; the pool cannot be used after."""
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

    def take_stray_errors(self) -> list[str]:
        """Faults that came with no call (a bad frame from an idle worker), since the last time: reward errors too."""
        out, self._stray_errors[:] = list(self._stray_errors), []
        return out

    def take_notices(self) -> list[str]:
        """Workers replaced for what they became (their memory), each kind reported once per pool, since the last time."""
        out, self._notices[:] = list(self._notices), []
        return out

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
        self._spawned += 1
        marker = f"{self._marker}{self._spawned}"
        proc = subprocess.Popen(
            [sys.executable, "-P", worker_module.__file__],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            bufsize=0,
            start_new_session=True,
            env={**os.environ, MARKER_VARIABLE: marker},
        )
        worker = _Worker(proc, marker, time.monotonic())
        init = {"sys_path": list(sys.path), "parent_pid": os.getpid(), "kind": self.kind, "user_fn": self.user_fn}
        init |= {"soft_s": SOFT_DEADLINE_SHARE * self.timeout_s, "memory_limit_mb": self.memory_limit_mb, "base_dir": self._base_dir}
        try:
            write_frame(proc.stdin.fileno(), pickle.dumps(init))
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
            call_id = secrets.token_hex(8)
            try:
                body = pickle.dumps((call_id, *tasks[i]))
            except Exception as err:  # noqa: BLE001 - e.g. an example's meta that does not pickle
                results[i] = (0.0, "error", clip(f"{type(err).__name__}: the example could not be sent to a worker ({err})"))
                continue
            try:
                write_frame(w.proc.stdin.fileno(), body)
            except OSError:  # the idle worker died (e.g. its starting thread ended): the task waits for another
                todo.appendleft(i)
                self._discard(w)
                continue
            w.task, w.call_id, w.deadline = i, call_id, time.monotonic() + self.timeout_s

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
            try:
                for body in take_frames(w.buf):
                    if w in self._workers:
                        self._handle(w, parse_frame(body), results, todo)
            except BadFrame as bad:
                self._bad_frame(w, str(bad), results, todo)
        now = time.monotonic()
        for w in list(self._workers):
            if w.task is not None and w.proc.poll() is not None:  # died, its pipe held open by a child
                self._lost(w, results, todo)
            elif w.task is not None and now >= w.deadline:
                results[w.task] = (0.0, "timeout", f"no result within reward.timeout_s={self.timeout_s:g} (worker killed)")
                self._discard(w)
            elif not w.ready and now - w.started > self.startup_timeout_s:
                self._start_failed(w, f"a reward worker was not ready after {self.startup_timeout_s:g} s (killed)")
        self._start_errors_to_tasks(results, todo)

    def _handle(self, w: _Worker, message: list, results: list[Outcome | None], todo: deque[int]) -> None:
        """A checked message, in the state the worker is in; BadFrame when it does not fit that state."""
        if message[0] == "ready" and not w.ready:
            w.ready = True
        elif message[0] == "failed" and not w.ready:
            self._start_failed(w, message[1])
        elif message[0] == "done" and w.task is not None:
            _, call_id, value, status, detail, recycle = message
            if call_id != w.call_id:
                raise BadFrame("not the answer to the call it was given")
            results[w.task] = (float(value), status, detail)
            w.task, w.deadline, w.calls = None, math.inf, w.calls + 1
            if recycle.startswith("memory:"):
                why = recycle.removeprefix("memory: ")
                self._notice(
                    "memory", f"a worker of reward {self.name} was replaced: {why} (a reward that keeps memory from call to call?)"
                )
            if recycle or w.calls == self.max_tasks_per_worker:
                self._discard(w)
        else:
            raise BadFrame(f"a {message[0]!r} message from a worker that is {self._state(w)}")

    @staticmethod
    def _state(w: _Worker) -> str:
        return "computing a call" if w.task is not None else "idle" if w.ready else "starting"

    def _notice(self, kind: str, text: str) -> None:
        """Report ``text`` through take_notices, the first time only for each ``kind``."""
        if kind not in self._noticed:
            self._noticed.add(kind)
            self._notices.append(text)

    def _bad_frame(self, w: _Worker, reason: str, results: list[Outcome | None], todo: deque[int]) -> None:
        """A frame that fails the checks: an error of the worker's call (or of no call), and a new worker."""
        if w not in self._workers:
            return
        detail = clip(f"BadWorkerFrame: the worker of reward {self.name} wrote a frame that is {reason}; it was replaced")
        if w.task is not None:
            results[w.task] = (0.0, "error", detail)
        elif not w.ready:
            self._start_errors.append(detail)
        else:
            self._stray_errors.append(detail)
        self._discard(w)

    def _lost(self, w: _Worker, results: list[Outcome | None], todo: deque[int]) -> None:
        """A worker whose pipe closed or whose process ended."""
        if w not in self._workers:
            return
        try:
            w.proc.wait(timeout=EXIT_GRACE_S)  # its pipe closed: it is exiting, and its exit code says why
        except subprocess.TimeoutExpired:
            pass
        self._discard(w)
        how = describe_exit(w.proc.returncode)
        if w.task is not None:
            results[w.task] = (0.0, "error", clip(f"WorkerDied: the reward's worker process ended ({how}); it was replaced"))
        elif not w.ready:
            self._start_failed(w, f"a reward worker ended before it was ready ({how})")

    def _start_failed(self, w: _Worker, message: str) -> None:
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
            results[todo.popleft()] = (0.0, "error", clip(f"WorkerStartFailed: {self._start_errors.pop(0)}"))

    def _discard(self, w: _Worker) -> None:
        self._workers.remove(w)
        _kill(w)
