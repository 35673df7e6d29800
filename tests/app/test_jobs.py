"""Background jobs of the explorer (``dfpo.app.jobs``): a real toy run stops within one step when
cancelled, by the Stop button or when nobody watches it any more."""

from __future__ import annotations

import threading
import time

import pytest

from dfpo.app import data, jobs

LONG = data.ToySettings(task="tenplusten", labels=("gspo", "dfpo_min"), steps=2000, seeds=2, group_size=4, inner_steps=1)


def _wait(cond, timeout=60.0):
    deadline = time.monotonic() + timeout
    while not cond():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.02)


def test_run_toy_ticks_once_per_training_step():
    """tick's count moves by one per training step over all objectives and ends at the total."""
    settings = data.ToySettings(task="tenplusten", labels=("gspo", "grpo_fix"), steps=3, seeds=2, group_size=4, inner_steps=1)
    ticks = []
    result = data.run_toy(settings, lambda label, done, total: ticks.append((label, done, total)))
    steps = [(label, done) for label, done, _ in ticks]
    assert ("gspo", 0) in steps and ("grpo_fix", 3) in steps  # before each objective
    assert [d for _, d, _ in ticks if d] == [1, 2, 3, 3, 4, 5, 6] and {t for *_, t in ticks} == {6}
    assert set(result.curves) == {"gspo", "grpo_fix"} and result.curves["gspo"]["reward"].shape == (3, 2)


def test_cancel_stops_a_real_toy_run_within_a_step():
    board = jobs.JobBoard()
    job = board.watch(LONG, "session", lambda tick: data.run_toy(LONG, tick), LONG.total_steps)
    _wait(lambda: job.progress.done >= 3)
    board.release(LONG, "session")  # the Stop button: the only watcher lets go
    job.thread.join(timeout=10)
    assert not job.thread.is_alive()
    p = job.progress
    assert p.state == jobs.CANCELLED and p.done < LONG.total_steps
    done = p.done
    time.sleep(0.3)
    assert job.progress.done == done  # no step after the stop


def test_a_job_nobody_polls_cancels_itself_after_the_grace_period():
    now = [0.0]
    ticks = threading.Event()
    release = threading.Event()

    def work(tick):
        for i in range(10_000):
            tick("x", i, 10_000)
            ticks.set()
            release.wait(0.01)
        return "finished"

    job = jobs.Job(work, 10_000, grace=5.0, clock=lambda: now[0])
    job.poll("tab")
    job.start()
    ticks.wait(5)
    now[0] = 4.0
    job.poll("tab")  # still watched
    now[0] = 9.5  # 5.5 s since the last poll: Streamlit's Stop or a closed tab
    job.thread.join(timeout=10)
    assert job.progress.state == jobs.CANCELLED


def test_a_job_watched_by_two_sessions_survives_one_stop_and_other_settings_cancel_it():
    board = jobs.JobBoard()
    job = board.watch(LONG, "a", lambda tick: data.run_toy(LONG, tick), LONG.total_steps)
    board.watch(LONG, "b", lambda tick: pytest.fail("started twice"), LONG.total_steps)
    _wait(lambda: job.progress.done >= 2)
    board.release(LONG, "a")
    time.sleep(0.3)
    assert job.running  # b still watches it
    other = data.ToySettings(task="tenplusten", labels=("gspo",), steps=2, seeds=1, group_size=4, inner_steps=1)
    new = board.watch(other, "b", lambda tick: data.run_toy(other, tick), other.total_steps)  # b chose other settings
    job.thread.join(timeout=10)
    assert job.progress.state == jobs.CANCELLED
    new.thread.join(timeout=60)
    assert new.progress.state == jobs.DONE and set(new.progress.result.curves) == {"gspo"}


def test_an_error_in_the_work_is_kept_for_the_page():
    job = jobs.Job(lambda tick: (tick("gspo", 0, 5), 1 / 0), 5).start()
    job.thread.join(timeout=10)
    assert job.progress.state == jobs.FAILED and isinstance(job.progress.error, ZeroDivisionError)


def test_a_cancelled_toy_run_keeps_what_finished_as_its_result():
    """Before the fix a stopped run's finished steps were thrown away; now the job's result holds their curves and
    each objective's summary over the steps it ran (the paper's predictions wait for a finished run)."""
    settings = data.ToySettings(task="tenplusten", labels=("gspo", "dfpo_min", "grpo_fix"), steps=10, seeds=2, group_size=4, inner_steps=1)
    board = jobs.JobBoard()
    job = board.watch(settings, "session", lambda tick: data.run_toy(settings, tick), settings.total_steps)
    _wait(lambda: job.progress.done >= settings.steps + 3)  # the first objective done, the second begun
    board.release(settings, "session")
    p = job.wait(10)
    assert p.state == jobs.CANCELLED
    curves, second = p.result.curves, p.done - settings.steps
    assert list(curves) == ["gspo", "dfpo_min"]  # grpo_fix never started
    assert curves["gspo"]["reward"].shape == (settings.steps, settings.seeds)
    assert curves["dfpo_min"]["reward"].shape == (second, settings.seeds)  # every step that finished, no more
    assert p.result.summary.startswith(f"Stopped early: gspo 10 of 10 steps, dfpo_min {second} of 10 steps.")
    assert "| gspo |" in p.result.summary and "Prediction 1" not in p.result.summary


def test_a_run_stopped_before_its_first_step_has_no_partial_result():
    settings = data.ToySettings(task="tenplusten", labels=("gspo",), steps=3, seeds=1, group_size=4, inner_steps=1)

    def stop_at_once(label, done, total):
        raise jobs.Cancelled

    with pytest.raises(jobs.Cancelled) as stopped:
        data.run_toy(settings, stop_at_once)
    assert stopped.value.partial is None


def test_a_watcher_let_go_cancels_the_job_unless_it_polls_again_in_time():
    """An interrupted script run lets go with a short delay: a rerun that polls again keeps the job (before, Streamlit's
    Stop left it running for the whole 5 s grace), and nobody polling cancels it after the delay."""
    now = [0.0]
    going = threading.Event()

    def work(tick):
        for i in range(100_000):
            tick("x", i, 100_000)
            going.set()
            time.sleep(0.001)
        return "finished"

    job = jobs.Job(work, 100_000, grace=5.0, clock=lambda: now[0])
    job.poll("tab")
    job.start()
    going.wait(5)
    job.let_go("tab", within=1.0)
    now[0] = 0.5
    job.poll("tab")  # the rerun took over: watched for a full grace again
    now[0] = 1.5
    time.sleep(0.05)
    assert job.running
    job.let_go("tab", within=1.0)
    now[0] = 3.0  # nobody polled within 1 s: Streamlit's Stop
    assert job.wait(10).state == jobs.CANCELLED
