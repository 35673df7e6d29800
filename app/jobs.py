"""Long computations of the explorer (the toy lab) in a background thread that can really be stopped.

A ``Job`` runs ``work(tick)`` in a daemon thread; ``work`` calls ``tick(label, done, total)`` after
every unit of work (a training step of the toy), and ``tick`` raises ``Cancelled`` once the job is
cancelled, so the thread stops within one unit and its CPU use with it. ``work`` may attach what it
finished to that exception as ``partial`` on its way out: a cancelled job keeps it as its result.

Pages watch jobs through a ``JobBoard`` shared by every browser session of the server: a session
``watch``es the job of its settings (starting it if needed) and polls it for progress. A job is
cancelled when the last session watching it lets go (``release``: the Stop button, or the session
chose other settings) or when no session has polled it for ``grace`` seconds (a closed tab). A
session whose script run was interrupted (Streamlit's own Stop, or a rerun that replaces it)
``let_go``es with a short delay instead: a rerun polls again within it and the job goes on, after
Streamlit's Stop nobody does and the job is cancelled. No Streamlit here: tests drive jobs directly.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Hashable
from dataclasses import dataclass

RUNNING, DONE, FAILED, CANCELLED = "running", "done", "failed", "cancelled"


class Cancelled(Exception):
    """Raised inside a job's thread by ``tick`` once the job is cancelled; ``partial`` is what the work
    finished, when it says (the job's result once cancelled)."""

    partial: object = None


@dataclass(frozen=True)
class Progress:
    """What a page shows of a job: its state, the work done, and the result or the error."""

    state: str
    done: int
    total: int
    label: str
    result: object = None
    error: BaseException | None = None

    @property
    def fraction(self) -> float:
        return min(1.0, self.done / self.total) if self.total else 0.0


Tick = Callable[[str, int, int], None]


class Job:
    """``work(tick)`` in a daemon thread; see the module docstring."""

    def __init__(self, work: Callable[[Tick], object], total: int, *, grace: float = 5.0, clock=time.monotonic):
        self._work, self._clock, self.grace = work, clock, grace
        self._cancel = threading.Event()
        self._lock = threading.Lock()
        self._watchers: dict[Hashable, float] = {}  # watcher -> when it counts as gone unless it polls again
        self._progress = Progress(RUNNING, 0, total, "starting")
        self.thread = threading.Thread(target=self._main, daemon=True, name="dfpo-app-job")

    def start(self) -> Job:
        self.thread.start()
        return self

    def _tick(self, label: str, done: int, total: int) -> None:
        with self._lock:
            self._progress = Progress(RUNNING, done, total, label)
            now = self._clock()
            stale = self._watchers and all(now > gone for gone in self._watchers.values())
        if stale:
            self._cancel.set()
        if self._cancel.is_set():
            raise Cancelled

    def _main(self) -> None:
        try:
            result = self._work(self._tick)
        except Cancelled as stop:
            self._finish(CANCELLED, result=stop.partial)
        except Exception as err:  # shown to the user by the page
            self._finish(FAILED, error=err)
        else:
            self._finish(DONE, result=result)

    def _finish(self, state: str, *, result=None, error=None) -> None:
        with self._lock:
            p = self._progress
            self._progress = Progress(state, p.done, p.total, p.label, result, error)

    def poll(self, watcher: Hashable) -> Progress:
        """The job's progress; ``watcher`` is marked as having looked now."""
        with self._lock:
            self._watchers[watcher] = self._clock() + self.grace
            return self._progress

    def let_go(self, watcher: Hashable, within: float) -> None:
        """``watcher`` counts as gone unless it polls again within ``within`` seconds (its script run was interrupted)."""
        with self._lock:
            if watcher in self._watchers:
                self._watchers[watcher] = min(self._watchers[watcher], self._clock() + within)

    def wait(self, timeout: float) -> Progress:
        """The progress once the job has ended, or after ``timeout`` seconds if it has not."""
        self.thread.join(timeout)
        return self.progress

    def release(self, watcher: Hashable) -> None:
        """``watcher`` stops watching; the job is cancelled when nobody watches it any more."""
        with self._lock:
            was_watching = self._watchers.pop(watcher, None) is not None
            nobody = not self._watchers
        if was_watching and nobody:
            self.cancel()

    def cancel(self) -> None:
        self._cancel.set()

    @property
    def progress(self) -> Progress:
        with self._lock:
            return self._progress

    @property
    def running(self) -> bool:
        return self.progress.state == RUNNING


class JobBoard:
    """The jobs of one server process, by key (the settings of the computation)."""

    def __init__(self, *, grace: float = 5.0):
        self.grace = grace
        self._jobs: dict[Hashable, Job] = {}
        self._lock = threading.Lock()

    def watch(self, key: Hashable, watcher: Hashable, work: Callable[[Tick], object], total: int) -> Job:
        """The job of ``key``, started with ``work`` unless one is running or has finished; ``watcher``
        lets go of any other job it watched (which is cancelled if nobody else watches it)."""
        with self._lock:
            job = self._jobs.get(key)
            if job is None or job.progress.state in (CANCELLED, FAILED):
                job = self._jobs[key] = Job(work, total, grace=self.grace)
                job.poll(watcher)
                job.start()
            others = [j for k, j in self._jobs.items() if k != key]
        for other in others:
            other.release(watcher)
        job.poll(watcher)
        return job

    def get(self, key: Hashable) -> Job | None:
        with self._lock:
            return self._jobs.get(key)

    def release(self, key: Hashable, watcher: Hashable) -> None:
        """``watcher`` lets go of the job of ``key`` (the Stop button)."""
        job = self.get(key)
        if job is not None:
            job.release(watcher)

    def forget(self, key: Hashable) -> None:
        """Drop a finished job once its result is kept elsewhere."""
        with self._lock:
            job = self._jobs.get(key)
            if job is not None and not job.running:
                del self._jobs[key]
