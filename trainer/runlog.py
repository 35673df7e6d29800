"""The logs of a run folder (JSONL flushed per line, TensorBoard, wandb) and how a run stops on a signal.

The folder's layout and its checks are in ``run_folder``; checkpoints in ``checkpoint``. On several processes
rank 0 alone writes the folder.
"""

from __future__ import annotations

import _thread
import json
import math
import os
import signal
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path

from ..core.files import WriteFailed, describe_write_error, write_text_atomic
from .launch import PARENT_DEATH
from .layout import RunDir


def finite_only(metrics: dict) -> tuple[dict, list[str]]:
    """Drop non-finite numbers (NaN never reaches a log); return (clean, dropped keys)."""
    clean, dropped = {}, []
    for k, v in metrics.items():
        if isinstance(v, float) and not math.isfinite(v):
            dropped.append(k)
        else:
            clean[k] = v
    return clean, dropped


class JsonlLog:
    """Append-only JSONL, one flushed line per record; ``truncate`` keeps records with key <= limit."""

    def __init__(self, path: Path):
        self.path = path
        try:
            self._fh = open(path, "a", encoding="utf-8")
        except OSError as err:
            raise WriteFailed(f"cannot open {describe_write_error(path, err)}") from None

    def write(self, record: dict) -> None:
        try:
            self._fh.write(json.dumps(record, sort_keys=True) + "\n")
            self._fh.flush()
        except OSError as err:  # a full disk: a torn last line at worst, which every reader skips
            raise WriteFailed(
                f"writing {describe_write_error(self.path, err)}; the last checkpoint is kept. Free space, then continue with: "
                f"dfpo train --resume {self.path.parent}"
            ) from None

    def close(self) -> None:
        self._fh.close()

    @staticmethod
    def truncate(path: Path, keep) -> None:
        """Rewrite ``path`` atomically with only the records for which ``keep(record)`` holds."""
        if not path.exists():
            return
        kept = [json.dumps(rec, sort_keys=True) for rec in JsonlLog.read(path) if keep(rec)]
        write_text_atomic(path, "".join(line + "\n" for line in kept))

    @staticmethod
    def read(path: Path) -> list[dict]:
        """The records of a JSONL file; lines that are not a JSON object (cut by a kill) are skipped. Lines end at
        "\\n" only: U+2028 or NEL inside a string is text, not a line break."""
        if not path.exists():
            return []
        out = []
        for line in path.read_text(encoding="utf-8", errors="replace").split("\n"):
            try:
                rec = json.loads(line)
            except json.JSONDecodeError:
                continue
            if isinstance(rec, dict):
                out.append(rec)
        return out


class NullLog:
    """A JsonlLog that writes nothing (the logs of every process but rank 0)."""

    def write(self, record: dict) -> None:
        pass

    def close(self) -> None:
        pass


class Scalars:
    """TensorBoard (and wandb when asked and installed) scalar sink."""

    def __init__(self, run_dir: Path, tensorboard: bool, wandb_project: str, purge_step: int | None, config: dict):
        self.tb = None
        self.wandb = None
        if tensorboard:
            try:
                from torch.utils.tensorboard import SummaryWriter

                self.tb = SummaryWriter(str(RunDir(run_dir).tensorboard), purge_step=purge_step)
            except ImportError:
                raise ValueError(
                    "log.tensorboard = true needs the tensorboard package (pip install tensorboard), or set it false"
                ) from None
        if wandb_project:
            try:
                import wandb
            except ImportError:
                raise ValueError(
                    f'log.wandb_project = {wandb_project!r} but wandb is not installed; pip install wandb or set it to ""'
                ) from None
            self.wandb = wandb.init(project=wandb_project, dir=str(run_dir), config=config, resume="allow", id=run_dir.name)

    def log(self, metrics: dict, step: int) -> None:
        nums = {k: v for k, v in metrics.items() if isinstance(v, (int, float)) and not isinstance(v, bool)}
        if self.tb is not None:
            for k, v in nums.items():
                self.tb.add_scalar(k, v, step)
            self.tb.flush()
        if self.wandb is not None:
            self.wandb.log(nums, step=step)

    def close(self) -> None:
        if self.tb is not None:
            self.tb.close()
        if self.wandb is not None:
            self.wandb.finish()


def missing_steps(rows: list[dict], last: int) -> list[int]:
    """Steps 1..last that have no line in a metrics log (lost to a crash)."""
    have = {r.get("step") for r in rows}
    return [s for s in range(1, last + 1) if s not in have]


PROGRESS_EVERY_S = 30.0
"""Without a progress bar (``--quiet``, or ``log.progress = false``): at most one progress line this often, during
the training steps and the tiny preset's warm-up."""


class Every:
    """``due()`` is True at most once per ``seconds`` of ``clock`` (monotonic), counted from construction: the rate
    of the progress lines printed without a bar."""

    def __init__(self, seconds: float, clock: Callable[[], float] = time.monotonic):
        self.seconds, self.clock = seconds, clock
        self.last = clock()

    def due(self) -> bool:
        now = self.clock()
        if now - self.last < self.seconds:
            return False
        self.last = now
        return True


def process_age_s() -> float:
    """Seconds since this process started, as the operating system records it (Linux: the start time in
    /proc/self/stat against /proc/uptime, both in 10 ms ticks since boot), so the interpreter's start and every
    import count, as in ``/usr/bin/time``'s elapsed time. Without /proc: since ``dfpo.cli`` was imported."""
    try:
        with open("/proc/self/stat", encoding="ascii") as fh:
            start_ticks = int(fh.read().rsplit(")", 1)[1].split()[19])  # field 22, starttime; the name may hold spaces
        with open("/proc/uptime", encoding="ascii") as fh:
            uptime = float(fh.read().split()[0])
        return max(0.0, uptime - start_ticks / os.sysconf("SC_CLK_TCK"))
    except (OSError, ValueError, IndexError):
        from ..cli import IMPORTED_AT

        return time.monotonic() - IMPORTED_AT


class TrainingInterrupted(Exception):
    """SIGINT or SIGTERM stopped the run after a step; a checkpoint of that step was written."""

    def __init__(self, signum: int, step: int, run_dir: Path):
        self.signum, self.step, self.run_dir = signum, step, run_dir
        name = signal.Signals(signum).name
        super().__init__(f"{name}: stopped after step {step}, checkpoint written; resume with: dfpo train --resume {run_dir}")

    @property
    def exit_code(self) -> int:
        return 128 + self.signum  # the shell's convention: 130 for SIGINT, 143 for SIGTERM


class StoppedAtOnce(BaseException):
    """A signal stopped the program where it was: during start-up (nothing trained yet), or a second signal during
    a step (that step is lost; the last checkpoint stays). A BaseException, like KeyboardInterrupt, so that no
    ``except Exception`` in between swallows it; cleanup in ``finally`` blocks runs."""

    def __init__(self, signum: int):
        self.signum = signum
        super().__init__(signal.Signals(signum).name)

    @property
    def exit_code(self) -> int:
        return 128 + self.signum


def stop_beneath(err: BaseException) -> StoppedAtOnce | None:
    """The ``StoppedAtOnce`` that ``err`` was raised from or while handling (its cause or context, at any depth), or
    None. Python can wrap the stop on its way up: 3.11 turns an exception raised inside ``__set_name__`` (a signal
    that lands while a class is made, as in an import of transformers) into a RuntimeError caused by it."""
    seen: set[int] = set()
    while err is not None and id(err) not in seen:
        if isinstance(err, StoppedAtOnce):
            return err
        seen.add(id(err))
        err = err.__cause__ or err.__context__
    return None


class StopSignals:
    """SIGINT and SIGTERM for the whole of ``dfpo train``, start-up included.

    During start-up (``immediate`` True) a signal raises ``StoppedAtOnce`` at once: there is no step to finish.
    Once training (``training()``), the first signal is only recorded (``signum``): the loop finishes its step,
    writes a checkpoint and stops. A second signal raises ``StoppedAtOnce``: whoever sends it twice wants out now.
    Handlers are installed in the main thread only (elsewhere Python cannot); outside the block the previous
    handlers are back.

    Python ignores an exception raised while a finaliser (``__del__``, run by the garbage collector at any
    moment) is on the stack, and a handler that raises there would be lost: the run would go on training. So
    whenever the handler raises, a daemon thread delivers the same signal to the main thread again
    (``_thread.interrupt_main``) every ``REDELIVER_S`` seconds until the block is left; and Python's report of
    the ignored exception (``sys.unraisablehook``) is replaced, inside the block, by waking that thread at once
    (not by redelivering from the hook, which runs inside the finaliser too), so no "Exception ignored"
    traceback reaches the user.

    Python runs a handler only between bytecodes of the main thread, and one call into C can take minutes (the
    backward pass of a 0.6B model on a busy CPU: two SIGTERMs went unanswered for over two minutes). So the
    signals also reach a daemon thread through ``signal.set_wakeup_fd``, which the interpreter writes to at once
    whatever the main thread is doing: when a signal should stop the program at once (in start-up, or the second
    one in training) and the main thread has not taken it within ``GRACE_S`` seconds, that thread says
    ``last_words(signum)`` and ends the process with ``os._exit(128 + signum)``. Nothing is written then; what a
    hard stop leaves (the lock, a half-written temporary checkpoint) is what a SIGKILL leaves, which the next start
    or resume handles.
    """

    REDELIVER_S = 1.0
    GRACE_S = 3.0

    def __init__(self, *, immediate: bool = True):
        self.signum: int | None = None
        self.immediate = immediate
        self._old: dict = {}
        self._inside = False
        self._redelivering = False
        self._lock = threading.Lock()
        self._wake = threading.Event()
        self._old_unraisablehook = None
        self._taken = threading.Event()  # the main thread's handler has raised StoppedAtOnce
        self._wakeup_pipe: tuple[int, int] | None = None
        self._old_wakeup_fd = -1
        self.last_words: Callable[[int], None] = lambda signum: None
        """What the watcher says before it ends a process the main thread cannot stop (the caller sets it)."""

    def __enter__(self) -> StopSignals:
        self._inside = True
        self._old_unraisablehook = sys.unraisablehook
        sys.unraisablehook = self._unraisable
        if threading.current_thread() is threading.main_thread():
            for sig in (signal.SIGINT, signal.SIGTERM, PARENT_DEATH):
                self._old[sig] = signal.signal(sig, self._handle)
            self._watch_signals()
        return self

    def _watch_signals(self) -> None:
        """Every signal's number, written by the interpreter to a pipe the moment it arrives, read by a daemon thread
        that stops the process when the main thread cannot (see the class docstring)."""
        read_fd, write_fd = os.pipe()
        os.set_blocking(write_fd, False)
        self._wakeup_pipe = (read_fd, write_fd)
        self._old_wakeup_fd = signal.set_wakeup_fd(write_fd, warn_on_full_buffer=False)
        self._watcher = threading.Thread(target=self._watch, args=(read_fd,), name="dfpo-signal-watch", daemon=True)
        self._watcher.start()

    def _watch(self, read_fd: int) -> None:
        """The rule of ``_handle``, seen from outside the main thread: in start-up every stop signal stops at once; in
        training a stop signal after an earlier one does (PARENT_DEATH only ever asks for the end of the step)."""
        seen = False
        while data := os.read(read_fd, 64):  # b"" once the block is left and the pipe closed
            for signum in data:
                if signum not in (signal.SIGINT, signal.SIGTERM, PARENT_DEATH):
                    continue
                at_once = self.immediate or (seen and signum != PARENT_DEATH)
                seen = True
                if at_once:
                    self._stop_unless_taken(signum)

    def _stop_unless_taken(self, signum: int) -> None:
        """End the process with 128 + ``signum`` unless the main thread takes the stop within GRACE_S seconds."""
        if self._taken.wait(self.GRACE_S):
            return
        with self._lock:
            if not self._inside:
                return
        self.last_words(signum)
        sys.stderr.flush()
        os._exit(128 + signum)

    def training(self) -> StopSignals:
        """From now on the first signal waits for the end of the step."""
        self.immediate = False
        return self

    def _handle(self, signum, frame) -> None:
        if signum == PARENT_DEATH and not self.immediate:  # the kernel may send it once per launcher thread
            self.signum = self.signum or signum
            return
        if self.immediate or self.signum is not None:
            self.signum = signum
            self._taken.set()
            self._redeliver_until_left(signum)
            raise StoppedAtOnce(signum)
        self.signum = signum

    def _redeliver_until_left(self, signum: int) -> None:
        """Deliver ``signum`` to the main thread again every REDELIVER_S seconds while the block is not left (see the
        class docstring: a finaliser may have swallowed the exception)."""
        if self._redelivering:
            return
        self._redelivering = True

        def again() -> None:
            while True:
                self._wake.wait(self.REDELIVER_S)
                self._wake.clear()
                time.sleep(0.01)  # out of the finaliser that swallowed the stop
                with self._lock:
                    if not self._inside:
                        return
                    _thread.interrupt_main(signum)

        threading.Thread(target=again, name="dfpo-signal-redelivery", daemon=True).start()

    def _unraisable(self, unraisable) -> None:
        """A stop swallowed by a finaliser, alone or beneath the exception that wrapped it (``stop_beneath``): wake the
        redelivery thread instead of printing it."""
        if stop_beneath(unraisable.exc_value) is not None:
            self._wake.set()
        else:
            self._old_unraisablehook(unraisable)

    def __exit__(self, *exc) -> None:
        with self._lock:
            self._inside = False
        sys.unraisablehook = self._old_unraisablehook
        for sig, handler in self._old.items():
            signal.signal(sig, handler)
        if self._wakeup_pipe is not None:
            signal.set_wakeup_fd(self._old_wakeup_fd)
            read_fd, write_fd = self._wakeup_pipe
            os.close(write_fd)  # the watcher reads the end of the pipe and returns
            self._watcher.join(timeout=self.GRACE_S + 1)
            os.close(read_fd)
            self._wakeup_pipe = None
