"""SIGINT and SIGTERM to ``dfpo train``, all of it: before the trainer's own handling, that handling, and after it.

The trainer's handling (``StopSignals``, below: stop at once during start-up, after the step once training) is
installed once torch and the config are loaded, a second or more after the program starts. ``dfpo.cli.main``
installs this module's handler as the first thing ``dfpo train`` does, before any heavy import, and it answers
every signal outside ``StopSignals``:

1. Before the trainer's handling: nothing exists yet (no file written, no process started), so the program
   prints one line and exits at once with the shell's status (130 for SIGINT, 143 for SIGTERM), without
   unwinding: an exception raised in the middle of importing torch or transformers can be swallowed, or turned
   into another error by the library being imported, and would end in a traceback.
2. While ``held()`` (a file being written before the trainer's handling starts: ``--resume --restore-config``)
   a signal waits for the end of the block, so no temporary file is left behind.
3. After the trainer's handling (the run's outcome ``decided``, its message printed): a further signal ends the
   program at once with that outcome's status, so two SIGTERMs 100 ms apart still exit 143; in the interpreter's
   last teardown, where Python would put the default action back (exit -15), the signals are ignored instead.

What no program can answer: a signal in the interpreter's own start (Python and its site-packages, about 40 ms
on an idle machine), before any code of dfpo runs, has the operating system's default effect.

Only the main thread can install handlers; in any other thread this module does nothing. On several processes
(``--nproc``) only rank 0 prints. Standard library only: it is imported before anything else, which is why the
two names a rank of ``--nproc`` shares with the launcher (``LAUNCHER_PID_ENV``, ``PARENT_DEATH``) are defined here
and ``launch`` imports them.
"""

from __future__ import annotations

import _thread
import atexit
import contextlib
import os
import signal
import sys
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import NoReturn

LAUNCHER_PID_ENV = "DFPO_LAUNCHER_PID"
"""Set to the launcher's PID in every rank that ``dfpo train --nproc`` starts (``launch.rank_environment``)."""
PARENT_DEATH = signal.SIGHUP
"""The signal a rank of ``dfpo train --nproc`` asks the kernel for when its launcher dies (``PR_SET_PDEATHSIG``).
Not SIGTERM: the kernel sends it again each time the rank is handed to another thread of the dying launcher, and
repeated SIGTERMs mean "stop at once"; repeated SIGHUPs count as one "stop after the step"."""

SIGNALS = (signal.SIGINT, signal.SIGTERM)


def start_up_message(signum: int) -> str:
    """What a signal that ends the program before its first step says (the trainer's handling says the same)."""
    name = signal.Signals(signum).name
    return f"{name} during start-up: stopped before the first training step; start it again with the same command"


class ExitOnSignal:
    """The handler of SIGINT and SIGTERM outside the trainer's own handling (see the module docstring)."""

    def __init__(self, *, speak: bool = True):
        self.speak = speak
        """Whether this process prints the start-up line (rank 0 only)."""
        self.status: int | None = None
        """The exit status once the run's outcome is decided; None during start-up."""
        self.held_signal: int | None = None
        self._holding = False
        self._old: dict[int, object] = {}

    def install(self) -> None:
        for sig in SIGNALS:
            self._old.setdefault(sig, signal.signal(sig, self.handle))

    def uninstall(self) -> None:
        for sig, handler in self._old.items():
            signal.signal(sig, handler)
        self._old.clear()

    def decided(self, status: int) -> None:
        """The run's outcome is decided (its message printed): from now on a signal exits with ``status``, and this
        handler takes the signals back at once (a second signal must not interrupt the way out)."""
        self.status = status
        if threading.current_thread() is threading.main_thread():
            for sig in SIGNALS:
                signal.signal(sig, self.handle)

    @contextlib.contextmanager
    def held(self) -> Iterator[None]:
        """Inside the block a signal only waits; it ends the program when the block is left."""
        self._holding = True
        try:
            yield
        finally:
            self._holding = False
        if self.held_signal is not None:
            self.exit(self.held_signal)

    def handle(self, signum: int, frame) -> None:
        if self._holding:
            self.held_signal = self.held_signal or signum
            return
        self.exit(signum)

    def exit(self, signum: int) -> None:
        """End the process now: the start-up line (before the outcome is decided), the output flushed, the status."""
        for stream in (sys.stdout, sys.stderr):
            with contextlib.suppress(Exception):  # a stream the handler interrupted may refuse a reentrant call
                stream.flush()
        if self.status is None and self.speak:  # written to the descriptor: no buffer the signal may have interrupted
            with contextlib.suppress(OSError):
                os.write(2, f"dfpo: {start_up_message(signum)}\n".encode())
        os._exit(self.status if self.status is not None else 128 + signum)


_active: ExitOnSignal | None = None


def _is_rank0() -> bool:
    return os.environ.get("RANK", "0").strip() in ("", "0")


@contextlib.contextmanager
def exit_on_signal(*, for_the_process: bool = False) -> Iterator[ExitOnSignal | None]:
    """The handler installed for the block; None outside the main thread. ``for_the_process`` (the ``dfpo`` program
    itself): it stays installed after the block, through the interpreter's shutdown, so that a signal then still
    exits with the run's status; else the previous handlers are back after the block (a call from Python)."""
    global _active
    if threading.current_thread() is not threading.main_thread() or _active is not None:
        yield _active
        return
    _active = ExitOnSignal(speak=_is_rank0())
    _active.install()
    if for_the_process:
        atexit.register(_ignore_in_the_last_teardown)  # registered first, so it runs after every other exit function
    try:
        yield _active
    finally:
        if not for_the_process:
            _active.uninstall()
            _active = None


def _ignore_in_the_last_teardown() -> None:
    """The interpreter's last teardown (after the exit functions) puts every Python-handled signal back to the
    operating system's default, which would end the process with -15 instead of its status; an ignored signal is
    left as it is. Nothing of dfpo runs any more, so a signal then has nothing to stop."""
    for sig in SIGNALS:
        signal.signal(sig, signal.SIG_IGN)


def end_of_program(status: int) -> NoReturn:
    """End the ``dfpo`` program with ``status``. A rank of ``dfpo train --nproc`` ends as multiprocessing's children
    do: its exit functions run, its output is flushed, and the process exits at once, without the interpreter's and
    the C++ libraries' teardown. Its run is complete by then (checkpoint, logs and message written, the process group
    left), and that teardown can only end it otherwise: on CI a rank whose run had finished was once aborted there
    ("terminate called without an active exception", exit 134), a C++ thread of the collectives destroyed while
    still joinable. Any other process raises SystemExit as usual."""
    if not os.environ.get(LAUNCHER_PID_ENV):
        raise SystemExit(status)
    atexit._run_exitfuncs()
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(Exception):
            stream.flush()
    os._exit(status)


def decided(status: int) -> None:
    """``ExitOnSignal.decided`` of the installed handler (nothing when none is installed)."""
    if _active is not None:
        _active.decided(status)


def held() -> contextlib.AbstractContextManager:
    """``ExitOnSignal.held`` of the installed handler (a plain block when none is installed)."""
    return _active.held() if _active is not None else contextlib.nullcontext()


class TrainingInterrupted(Exception):
    """SIGINT or SIGTERM stopped the run after a step, or at once ``during`` an evaluation after it (which runs
    again on resume); a checkpoint of that step was written (``checkpointed``), or none for a run that writes none
    during training (train.save_every = 0)."""

    def __init__(self, signum: int, step: int, run_dir: Path, *, checkpointed: bool = True, during: str = ""):
        self.signum, self.step, self.run_dir = signum, step, run_dir
        name = signal.Signals(signum).name
        where = f"stopped at once during {during}, after step {step}" if during else f"stopped after step {step}"
        if checkpointed:
            again = f" ({during} runs again on resume)" if during else ""
            super().__init__(f"{name}: {where}, checkpoint of step {step} written{again}; resume with: dfpo train --resume {run_dir}")
        else:
            super().__init__(
                f"{name}: {where}; the run writes no checkpoint (train.save_every = 0), so it cannot be "
                "resumed: start it again with the same command (it starts from step 0 in the same folder)"
            )

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


def watcher_action(signum: int, *, immediate: bool, seen: bool, taken: bool) -> str | None:
    """What the signal watcher does with a stop signal it has just read: "stop" (end the process unless the main
    thread takes the stop), "first words" (answer the first signal of training) or None.

    ``taken``: the main thread has already raised the stop at once. The watcher reads the pipe when it gets a core,
    which on a busy machine can be after the main thread's handler stopped an evaluation at once and left the block
    that made signals immediate: that signal was answered by the stop, and saying "the run stops now ..." as well
    would announce a first signal that never waits (CI, 2026-12-07)."""
    if immediate or (seen and signum != PARENT_DEATH):
        return "stop"
    if taken or seen or signum == PARENT_DEATH:
        return None
    return "first words"


class StopSignals:
    """SIGINT and SIGTERM for the whole of ``dfpo train``, start-up included.

    During start-up (``immediate`` True) a signal raises ``StoppedAtOnce`` at once: there is no step to finish.
    Once training (``training()``), the first signal is only recorded (``signum``): the loop finishes its step,
    writes a checkpoint and stops. A second signal raises ``StoppedAtOnce``: whoever sends it twice wants out now.
    Inside ``at_once()`` (an evaluation, no part of the training state) the first signal raises it too. The first
    signal of training is answered at once by ``first_words`` (from the watcher thread below, so even while the main
    thread is inside a long call). Handlers are installed in the main thread only (elsewhere Python cannot); outside
    the block the previous handlers are back.

    Python ignores an exception raised while a finaliser (``__del__``, run by the garbage collector at any
    moment) is on the stack, and a handler that raises there would be lost: the run would go on training. So
    whenever the handler raises, a daemon thread delivers the same signal to the main thread again
    (``_thread.interrupt_main``) every ``REDELIVER_S`` seconds until the block is left; and Python's report of
    the ignored exception (``sys.unraisablehook``) is replaced, inside the block, by waking that thread at once
    (not by redelivering from the hook, which runs inside the finaliser too), so no "Exception ignored"
    traceback reaches the user. Once the main thread has caught the stop (``handled()``) the redelivery ends, so
    that it does not cut short the checkpoint the way out writes.

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
        self.first_words: Callable[[int], None] = lambda signum: None
        """What the watcher says the moment the first SIGINT or SIGTERM of training arrives, whatever the main thread
        is doing (the caller sets it: what the run will do, about how long it takes, what a second signal costs)."""
        self._redelivery = 0  # the generation of the redelivery thread; ``handled`` ends the current one

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
                action = watcher_action(signum, immediate=self.immediate, seen=seen, taken=self._taken.is_set())
                seen = True
                if action == "stop":
                    self._stop_unless_taken(signum)
                elif action == "first words":
                    self._say_first_words(signum)

    def _say_first_words(self, signum: int) -> None:
        """``first_words(signum)`` from the watcher; a failure there must not end the watcher (it still has to stop the
        process on a second signal)."""
        try:
            self.first_words(signum)
        except Exception:  # noqa: BLE001 - a line that cannot be said is no reason to lose the stop
            pass

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

    @contextlib.contextmanager
    def at_once(self) -> Iterator[None]:
        """Inside the block every signal stops at once (``StoppedAtOnce``), the first one too, and one recorded before
        the block stops it as it starts: for work that is no part of the training state (an evaluation), so that
        nothing finished is lost by stopping it."""
        was = self.immediate
        self.immediate = True
        try:
            if self.signum is not None:
                self._taken.set()
                raise StoppedAtOnce(self.signum)
            yield
        finally:
            self.immediate = was

    def handled(self) -> None:
        """The main thread holds the stop (it caught ``StoppedAtOnce`` and is on its way out, writing what it can):
        the signal is no longer delivered again (that would cut short a checkpoint written on the way out). A new
        signal still stops at once."""
        with self._lock:
            self._redelivery += 1
            self._redelivering = False

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
        with self._lock:
            if self._redelivering:
                return
            self._redelivering = True
            generation = self._redelivery

        def again() -> None:
            while True:
                self._wake.wait(self.REDELIVER_S)
                self._wake.clear()
                time.sleep(0.01)  # out of the finaliser that swallowed the stop
                with self._lock:
                    if not self._inside or self._redelivery != generation:  # left, or ``handled``
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
