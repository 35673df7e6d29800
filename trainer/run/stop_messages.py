"""What a training run says when SIGINT or SIGTERM stops it: the first signal's line, said at once, and what a stop
at once (a second signal) leaves behind. Both say which step the run would resume from and what is lost.

A first SIGINT once printed nothing while the step finished (35 s, or 100 to 300 s for a SmolLM2 step on a busy
machine), so users pressed again; the second press then said "step 5 is lost, resume from step 3" without saying
that finished step 4 was lost too. ``first_signal_line`` says what the run will do, about how long it takes and what
a second signal costs; ``stopped_at_once_line`` names every step lost. Both read a ``StopPoint``, which the trainer
builds from its state (``Trainer.stop_point``). Standard library only (said from the signal watcher thread).
"""

from __future__ import annotations

import signal
from dataclasses import dataclass

from .progress import duration


@dataclass(frozen=True)
class StopPoint:
    """Where a training run stands when a signal comes."""

    step_now: int
    """The training step being run (``finished + 1`` inside a step), or ``finished`` between steps."""
    finished: int
    """The last finished training step (its metrics logged)."""
    checkpoint: int | None
    """The step of the checkpoint on disk; None when there is none (train.save_every = 0)."""
    keeps_checkpoints: bool
    """The run writes checkpoints while it trains (train.save_every > 0), so a stop after a step writes one."""
    savable: bool
    """A stop at once can still write the checkpoint of ``finished``: the weights and the optimiser still hold it
    (the step under way has not begun its optimiser steps) and the run is on one process."""
    evaluating: bool
    """An evaluation is under way (one after step ``finished``); a signal stops it at once."""
    seconds_in: float
    """Seconds since the step (or evaluation) under way began."""
    step_s: float | None
    """The recent steps' mean seconds, evaluations left out; None before the first step ended."""


def steps_text(first: int, last: int) -> str:
    """'step 4' or 'steps 4 to 6'."""
    return f"step {first}" if first == last else f"steps {first} to {last}"


def _when(p: StopPoint) -> str:
    """When the step under way should end, judged by the recent steps."""
    if p.step_s is None:
        return f"it has run {duration(p.seconds_in)}; no step has finished yet to time it by"
    if p.seconds_in < p.step_s:
        return f"in about {duration(p.step_s - p.seconds_in)}: recent steps took {duration(p.step_s)}"
    return f"it has run {duration(p.seconds_in)}, recent steps took {duration(p.step_s)}"


def resume_step_after_a_second_signal(p: StopPoint) -> int | None:
    """The step a second signal would leave the run to resume from: the last finished one when its checkpoint is on
    disk or can still be written, else the checkpoint's (None: no checkpoint at all)."""
    if p.checkpoint == p.finished or (p.savable and p.keeps_checkpoints):
        return p.finished
    return p.checkpoint


def first_signal_line(signum: int, p: StopPoint) -> str:
    """The line said the moment the first signal of training arrives: what the run does now, about how long it
    takes, and what a second signal costs."""
    name = signal.Signals(signum).name
    if p.step_now > p.finished:
        head = f"{name}: the run stops once step {p.step_now} ends ({_when(p)})"
    else:
        head = f"{name}: the run stops now, after step {p.finished}"
    if not p.keeps_checkpoints:
        return f"{head}; it writes no checkpoint (train.save_every = 0), so it cannot be resumed; {name} again stops it at once"
    head += f", and writes the checkpoint of step {p.step_now}"
    resumes = resume_step_after_a_second_signal(p)
    if resumes is None:
        return f"{head}; {name} again stops it at once, and then it cannot be resumed (no checkpoint on disk)"
    lost = [f"step {p.step_now}'s work so far"] if p.step_now > p.finished else []
    if resumes < p.finished:
        lost.append(f"the finished {steps_text(resumes + 1, p.finished)}")
    cost = f"loses {' and '.join(lost)}" if lost else "loses no finished step"
    return f"{head}; {name} again stops it at once and {cost} (it then resumes from step {resumes})"


def stopped_at_once_line(signum: int, p: StopPoint, run_dir) -> str:
    """What a stop at once during training leaves: where it stopped, every step lost, and how to go on."""
    name = signal.Signals(signum).name
    if p.step_now > p.finished:
        where = f"during step {p.step_now}"
    elif p.evaluating:
        where = f"during the evaluation after step {p.finished}"
    else:
        where = f"after step {p.finished}"
    head = f"{name}{'' if p.evaluating else ' again'}: stopped at once {where}"
    if p.checkpoint is None:
        return (
            f"{head}; the run has no checkpoint (train.save_every = 0): start it again with the same command (it starts from "
            "step 0 in the same folder)"
        )
    resume = f"resume with: dfpo train --resume {run_dir}"
    again = " (it runs again on resume)" if p.step_now > p.finished or p.evaluating else ""
    if p.checkpoint >= p.finished:
        lost = f", which is lost{again}" if p.step_now > p.finished else again
        return f"{head}{lost}; no finished step is lost: the checkpoint of step {p.finished}, the last finished one, is on disk; {resume}"
    lost = [f"step {p.step_now}"] if p.step_now > p.finished else []
    lost.append(f"the finished {steps_text(p.checkpoint + 1, p.finished)}")
    return f"{head}; lost: {' and '.join(lost)}; the checkpoint on disk is step {p.checkpoint}'s, the run resumes from it: {resume}"
