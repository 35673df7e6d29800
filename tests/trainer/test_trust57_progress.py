"""No long silences, and a time-left estimate that does not count an evaluation as a step (issue 57, item 4).

Before: SmolLM2 from configs/smollm2-cpu.toml sat at 0/50 for 569 s while the step-0 evaluation (about 274 s, never
announced) and step 1 ran, then estimated 7 h 45 min because the evaluation counted as step 1. Now an evaluation is
announced (what it evaluates, how many prompts), a heartbeat says a line whenever ``logs.PROGRESS_EVERY_S`` seconds
(30) passed without one, and the estimate takes steps and evaluations each at its own rate.
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

from hypothesis import given
from hypothesis import strategies as st

from dfpo.trainer.run import logs as runlogs
from dfpo.trainer.run.progress import Progress, duration, evals_left, time_left
from dfpo.trainer.stages.rollout import RolloutStage
from dfpo.trainer.train import BAR_FORMAT, Trainer, bar_postfix, progress_line

sys.path.insert(0, str(Path(__file__).parent))
from test_llm_e2e import tiny_config  # noqa: E402

EVERY_S = 0.5
"""The heartbeat's period in these tests (30 s in a run)."""


def _slow(monkeypatch, method: str, seconds: float, at: set[int]) -> None:
    """``RolloutStage.<method>`` takes ``seconds`` more on the steps in ``at``: a SmolLM2 evaluation or step, shrunk."""
    original = getattr(RolloutStage, method)

    def slow(self, step, *args, **kwargs):
        if step in at:
            time.sleep(seconds)
        return original(self, step, *args, **kwargs)

    monkeypatch.setattr(RolloutStage, method, slow)


def _recorded_run(tmp_path, monkeypatch, *, quiet: bool) -> tuple[Trainer, list[tuple[float, str]], float, float]:
    """A tiny run of 3 steps, evaluations after steps 0 and 2 and at the end, the step-0 evaluation 3 s long and step 2
    3 s long; returns the trainer, every progress line with its time, and when the loop began and ended."""
    monkeypatch.setattr(runlogs, "PROGRESS_EVERY_S", EVERY_S)
    _slow(monkeypatch, "evaluate", 3.0, {0})
    _slow(monkeypatch, "run", 3.0, {2})
    trainer = Trainer(tiny_config(tmp_path, "train.steps=3", "eval.every=2", "train.save_every=1000"), quiet=quiet)
    lines: list[tuple[float, str]] = []
    trainer.progress.write = lambda line: lines.append((time.monotonic(), line))
    began = time.monotonic()
    trainer.run()
    return trainer, lines, began, time.monotonic()


def test_the_step_0_evaluation_is_announced_and_no_silence_lasts_longer_than_the_heartbeat(tmp_path, monkeypatch):
    """Default mode: the first line of the loop announces the step-0 evaluation (what, how many prompts); from the
    loop's start to its end no two lines are further apart than the heartbeat period (with a second of slack for a
    busy machine), through a 3 s evaluation and a 3 s step; the heartbeat names what runs."""
    trainer, lines, began, ended = _recorded_run(tmp_path, monkeypatch, quiet=False)
    texts = [line for _, line in lines]
    assert texts[0] == "dfpo train: evaluation at step 0: avg@2 and pass@2 on 4 held-out prompts x 2 samples"
    times = [began, *(t for t, _ in lines), ended]
    assert max(b - a for a, b in zip(times, times[1:])) < EVERY_S + 1.0, texts
    beats = [line for line in texts if " so far" in line]
    assert any(line.startswith("dfpo train: the evaluation at step 0 (4 held-out prompts x 2 samples), ") for line in beats), beats
    assert any(line.startswith("dfpo train: step 2 of 3, ") and "(now: the rollouts: sampling and scoring)" in line for line in beats), (
        beats
    )
    assert trainer.progress.activity == "the evaluation at step 3"


def test_quiet_keeps_the_heartbeat_but_not_the_evaluation_lines(tmp_path, monkeypatch):
    _, lines, began, ended = _recorded_run(tmp_path, monkeypatch, quiet=True)
    texts = [line for _, line in lines]
    assert not any(": avg@2 and pass@2 on " in line or " done in " in line for line in texts), texts
    times = [began, *(t for t, _ in lines), ended]
    assert max(b - a for a, b in zip(times, times[1:])) < EVERY_S + 1.0, texts


def test_the_seconds_per_step_leave_the_evaluations_out(tmp_path, monkeypatch):
    """The 3 s step-0 evaluation is timed as an evaluation, never as a step; the estimate counts it at its own rate."""
    trainer, lines, _, _ = _recorded_run(tmp_path, monkeypatch, quiet=True)
    p = trainer.progress
    assert len(p.step_seconds) == 3 and len(p.eval_seconds) == 3  # steps 1-3; evaluations at 0, 2 and the end
    assert p.eval_seconds[0] >= 3.0 and p.step_seconds[0] < 3.0
    assert p.step_seconds[1] >= 3.0  # the slow step counts as a step


def test_the_smollm2_case_estimates_the_steps_at_their_own_rate():
    """configs/smollm2-cpu.toml: 50 steps, an evaluation every 10. After step 1 (16 s), with a 274 s step-0
    evaluation: 49 steps at 16 s and 5 evaluations at 274 s (after steps 10, 20, 30, 40 and the end), about 35 min,
    not 7 h 45 min."""
    p = Progress(lambda line: None, every_s=30.0)
    p.eval_done(274.0)
    p.step_done(16.0)
    assert p.step_s() == 16.0
    left = time_left(49, evals_left(1, 50, 10), p.step_s(), p.eval_s())
    assert evals_left(1, 50, 10) == 5 and left == 49 * 16 + 5 * 274
    assert bar_postfix(0.25, p.step_s(), left) == "reward=0.250, 16.0 s/step, ~35 min 54 s left"
    assert progress_line(1, 50, 0.25, 290.0, left).endswith("4 min 50 s in the training loop, about 35 min 54 s left")
    assert "{rate" not in BAR_FORMAT and "{remaining" not in BAR_FORMAT  # tqdm's own estimate counts the evaluation


@given(st.integers(0, 200), st.integers(1, 200), st.integers(0, 50))
def test_evals_left_counts_the_loops_evaluations_and_the_final_one(done, steps, every):
    """Invariant: the evaluations ``evals_left`` counts after step ``done`` are exactly those the loop still runs
    (one before step s + 1 for each s >= done with s % every == 0, and the final one); none without evaluations."""
    done = min(done, steps)
    loop = [s for s in range(done, steps) if every and s % every == 0]
    assert evals_left(done, steps, every) == (len(loop) + 1 if every else 0)


def test_the_heartbeat_says_a_line_after_each_silent_period_and_not_while_lines_come():
    lines: list[str] = []
    p = Progress(lines.append, every_s=0.2)
    p.begin("step 1 of 2", "")
    p.start_heartbeat()
    try:
        time.sleep(0.7)
        beats = len(lines)
        for _ in range(10):  # lines every 0.05 s: no heartbeat among them
            p.say("a step line")
            time.sleep(0.05)
    finally:
        p.stop_heartbeat()
    assert 2 <= beats <= 4, lines
    assert lines[:beats] == [line for line in lines[:beats] if line.startswith("dfpo train: step 1 of 2, ")]
    assert lines[beats:] == ["a step line"] * 10


def test_no_heartbeat_thread_without_a_positive_period():
    p = Progress(lambda line: None, every_s=0.0)
    p.start_heartbeat()
    assert p._thread is None


def test_duration_reads_at_a_glance():
    assert [duration(s) for s in (0.04, 3.26, 45, 250, 600, 27900, 7200)] == [
        "0.0 s",
        "3.3 s",
        "45 s",
        "4 min 10 s",
        "10 min",
        "7 h 45 min",
        "2 h",
    ]
