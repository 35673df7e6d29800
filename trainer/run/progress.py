"""What a training run says while it runs: what it is doing, for how long, and how long the rest should take.

A SmolLM2-135M step takes 16 s on an idle 2-core CPU and 100 to 300 s on a busy one, and its evaluation of 32
prompts about 270 s; a bar that only moves when a step ends sat at 0/50 for 569 s, then estimated 7 h 45 min, the
step-0 evaluation counted as step 1. So ``Progress`` keeps:

1. the current activity (``begin``: "step 5 of 50", "the evaluation at step 0") and its stage (``stage``: the
   rollouts, the optimiser steps), with when it began;
2. the seconds of finished training steps and of evaluations apart: the seconds per step are the recent steps'
   (``RECENT_STEPS``), evaluations left out, and the time left counts each at its own rate (``time_left``);
3. a heartbeat thread that says a line whenever ``every_s`` seconds passed without one (a bar that moves counts
   as one, ``shown``), so the run is never silent longer than that, whatever one call takes.

Standard library only: the first signal's line (``stop_messages``) reads it from the signal watcher thread.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable

RECENT_STEPS = 5
"""The finished steps the seconds per step average over: the latest ones, so a machine that got busier shows."""


def duration(seconds: float) -> str:
    """``seconds`` as a person reads it at a glance: '0.4 s', '45 s', '4 min 10 s', '7 h 45 min'."""
    if seconds < 9.95:
        return f"{max(0.0, seconds):.1f} s"
    s = round(seconds)
    if s < 60:
        return f"{s} s"
    if s < 3600:
        m, r = divmod(s, 60)
        return f"{m} min {r} s" if r else f"{m} min"
    h, r = divmod(s, 3600)
    return f"{h} h {r // 60} min" if r >= 60 else f"{h} h"


def mean_recent(seconds: list[float], n: int = RECENT_STEPS) -> float | None:
    """The mean of the last ``n`` of ``seconds`` (None when there are none)."""
    recent = seconds[-n:]
    return sum(recent) / len(recent) if recent else None


def evals_left(done: int, steps: int, every: int) -> int:
    """Evaluations still to run once step ``done`` of ``steps`` has finished: one before each later step ``s + 1``
    with ``s % every == 0`` (the loop's rule, from ``s = done``), and the final one; 0 without evaluations."""
    if every <= 0:
        return 0
    return sum(1 for s in range(done, steps) if s % every == 0) + 1


def time_left(steps_left: int, evals: int, step_s: float | None, eval_s: float | None) -> float | None:
    """Seconds the rest of the run should take: ``steps_left`` steps at ``step_s`` each and ``evals`` evaluations at
    ``eval_s`` each (0 while none was timed); None before any step was timed."""
    if step_s is None:
        return None
    return steps_left * step_s + evals * (eval_s or 0.0)


class Progress:
    """The run's current activity and its clocks, and the heartbeat (see the module docstring)."""

    def __init__(self, write: Callable[[str], None], *, every_s: float, clock: Callable[[], float] = time.monotonic):
        self.write = write
        """Writes one line (the trainer's: through the bar's writer when a bar is drawn)."""
        self.every_s, self.clock = every_s, clock
        self.activity, self.detail, self.stage = "start-up", "", ""
        self.since = clock()
        self.step_seconds: list[float] = []
        self.eval_seconds: list[float] = []
        self.note = ""
        """Said at the end of every heartbeat line (the run stopping once the step ends)."""
        self._last = clock()
        self._lock = threading.Lock()
        self._quit = threading.Event()
        self._thread: threading.Thread | None = None

    # -- what the run is doing ------------------------------------------------------------------

    def begin(self, activity: str, detail: str = "") -> None:
        """``activity`` starts now ("step 5 of 50"); ``detail`` is said with it in the heartbeat lines."""
        self.activity, self.detail, self.stage, self.since = activity, detail, "", self.clock()

    def seconds_in(self) -> float:
        """Seconds since the current activity began."""
        return self.clock() - self.since

    def step_done(self, seconds: float) -> None:
        self.step_seconds.append(seconds)

    def eval_done(self, seconds: float) -> None:
        self.eval_seconds.append(seconds)

    def step_s(self) -> float | None:
        """The recent steps' mean seconds, evaluations left out (None before the first step ends)."""
        return mean_recent(self.step_seconds)

    def eval_s(self) -> float | None:
        """The last evaluation's seconds (None before the first ends)."""
        return self.eval_seconds[-1] if self.eval_seconds else None

    # -- lines ----------------------------------------------------------------------------------

    def say(self, line: str) -> None:
        """Write ``line``; it counts as the latest line (the heartbeat waits ``every_s`` from now)."""
        with self._lock:
            self.write(line)
            self._last = self.clock()

    def shown(self) -> None:
        """Something the user sees moved (the bar after a step): the heartbeat waits ``every_s`` from now."""
        self._last = self.clock()

    def due(self) -> bool:
        """Whether ``every_s`` seconds passed since the latest line."""
        return self.clock() - self._last >= self.every_s

    def heartbeat_line(self) -> str:
        """'dfpo train: step 5 of 50, 1 min 2 s so far (now: the optimiser steps); recent steps took 35 s'."""
        detail = f" ({self.detail})" if self.detail else ""
        stage = f" (now: {self.stage})" if self.stage else ""
        step_s = self.step_s()
        recent = f"; recent steps took {duration(step_s)}" if step_s is not None and self.activity.startswith("step") else ""
        note = f"; {self.note}" if self.note else ""
        return f"dfpo train: {self.activity}{detail}, {duration(self.seconds_in())} so far{stage}{recent}{note}"

    # -- the heartbeat thread -------------------------------------------------------------------

    def start_heartbeat(self) -> None:
        """Say ``heartbeat_line`` whenever ``every_s`` seconds passed without a line, until ``stop_heartbeat``
        (nothing when ``every_s`` is not positive: then every step's line is due anyway)."""
        if self.every_s <= 0 or self._thread is not None:
            return
        self._quit.clear()
        self._thread = threading.Thread(target=self._beat, name="dfpo-heartbeat", daemon=True)
        self._thread.start()

    def _beat(self) -> None:
        tick = min(1.0, self.every_s / 4)
        while not self._quit.wait(tick):
            if self.due():
                try:
                    self.say(self.heartbeat_line())
                except Exception:  # noqa: BLE001 - a stream closed under the run: the run goes on without its heartbeat
                    return

    def stop_heartbeat(self) -> None:
        if self._thread is None:
            return
        self._quit.set()
        self._thread.join(timeout=5)
        self._thread = None
