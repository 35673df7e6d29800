"""SIGINT and SIGTERM to ``dfpo train`` before its own signal handling starts, and after it has ended.

The trainer's handling (``runlog.StopSignals``: stop at once during start-up, after the step once training) is
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
(``--nproc``) only rank 0 prints. Standard library only: it is imported before anything else.
"""

from __future__ import annotations

import atexit
import contextlib
import os
import signal
import sys
import threading
from collections.abc import Iterator
from typing import NoReturn

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
    from .launch import LAUNCHER_PID_ENV  # deferred: its imports are not needed before the end

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
