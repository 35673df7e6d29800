"""Two Ctrl-C during a step lose no finished step, and each is answered at once (issue 57, item 1).

Before: the first SIGINT printed nothing while the step finished (35 s here, 100 to 300 s for a SmolLM2 step on a
busy machine); a second one stopped "at once during step 5, which is lost", and with train.save_every = 1000 the run
resumed from step 3: finished step 4 was gone and the message did not say so. Now the first signal says at once what
the run will do, about how long it takes and what a second one costs; a second one writes the checkpoint of the last
finished step while the weights are still its own (and a first one that comes before the step's optimiser steps has
it written before them), or says exactly which finished steps are lost. A signal during an evaluation stops it at
once: it is no part of the training state and runs again on resume.
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st
from tiny_run import timeless_records, train_command

from dfpo.cli import main
from dfpo.trainer.run.layout import RunDir
from dfpo.trainer.run.signals import PARENT_DEATH, StoppedAtOnce, StopSignals, watcher_action
from dfpo.trainer.run.stop_messages import StopPoint, first_signal_line, resume_step_after_a_second_signal, stopped_at_once_line
from dfpo.trainer.stages.rollout import RolloutStage
from dfpo.trainer.stages.update import UpdateStage

sys.path.insert(0, str(Path(__file__).parent))
from test_llm_e2e import TINY  # noqa: E402

STEPS = 4
SETS = [*TINY, f"train.steps={STEPS}", "train.save_every=1000", "eval.every=2"]
"""The tiny run with no checkpoint between step 0 and the last: a stop loses every finished step it does not save."""


def _argv(run: Path, *extra: str) -> list[str]:
    return ["train", "--quiet", *[arg for s in [*SETS, f"run_dir={run}", *extra] for arg in ("--set", s)]]


def _resume(run: Path) -> int:
    return main(["train", "--quiet", "--resume", str(run)])


def _checkpoint_step(run: Path) -> int:
    return json.loads((run / RunDir.CHECKPOINT_META).read_text())["step"]


def _logged_steps(run: Path) -> list[int]:
    return [json.loads(line)["step"] for line in (run / RunDir.METRICS).read_text().splitlines()]


def _sigint_in(monkeypatch, cls, step: int, times: int, method: str = "run") -> None:
    """``cls.<method>`` sends SIGINT to this process ``times`` times as it starts on training step ``step``, pausing
    after each so that the handler runs and the watcher thread says its line."""
    original = getattr(cls, method)

    def wrapped(self, at, *args, **kwargs):
        if at == step:
            for _ in range(times):
                os.kill(os.getpid(), signal.SIGINT)
                time.sleep(0.3)
        return original(self, at, *args, **kwargs)

    monkeypatch.setattr(cls, method, wrapped)


@pytest.fixture(scope="module")
def uninterrupted(tmp_path_factory) -> Path:
    """The run of SETS from start to end, never stopped."""
    run = tmp_path_factory.mktemp("uninterrupted") / "run"
    assert main(_argv(run)) == 0
    return run


def _same_as_uninterrupted(run: Path, uninterrupted: Path) -> None:
    for log in (RunDir.METRICS, RunDir.EVALS, RunDir.SAMPLES):
        assert timeless_records(run / log) == timeless_records(uninterrupted / log), log


def _stop_lines(err: str) -> list[str]:
    return [line for line in err.splitlines() if line.startswith("dfpo: SIGINT")]


@pytest.mark.parametrize(
    "second",
    ["rollout", "update"],
    ids=["second-signal-in-the-rollouts", "second-signal-in-the-optimiser-steps"],
)
def test_two_sigints_in_a_step_keep_the_last_finished_step_and_the_resume_matches_an_uninterrupted_run(
    tmp_path, capsys, monkeypatch, uninterrupted, second
):
    """Both signals during step 3 (the first in its rollouts): the checkpoint of step 2 is on disk afterwards (written
    at the second signal, or before the optimiser steps once the first had come), the first line promised exactly
    that, and resuming from it gives the logs of a run never stopped (the checkpoint holds step 2's state, RNGs and
    prompt order included)."""
    run = tmp_path / "run"
    if second == "rollout":
        _sigint_in(monkeypatch, RolloutStage, 3, times=2)
    else:
        _sigint_in(monkeypatch, RolloutStage, 3, times=1)
        _sigint_in(monkeypatch, UpdateStage, 3, times=1)
    assert main(_argv(run)) == 130
    err = capsys.readouterr().err
    first, stopped = _stop_lines(err)
    assert re.fullmatch(
        r"dfpo: SIGINT: the run stops once step 3 ends \((in about|it has run) .+\), and writes the checkpoint of step 3; "
        r"SIGINT again stops it at once and loses step 3's work so far \(it then resumes from step 2\)",
        first,
    ), first
    assert stopped == (
        "dfpo: SIGINT again: stopped at once during step 3, which is lost (it runs again on resume); no finished step is "
        f"lost: the checkpoint of step 2, the last finished one, is on disk; resume with: dfpo train --resume {run}"
    )
    assert "Traceback" not in err
    assert _checkpoint_step(run) == 2 and _logged_steps(run) == [1, 2]
    monkeypatch.undo()
    assert _resume(run) == 0
    _same_as_uninterrupted(run, uninterrupted)


def test_two_sigints_in_the_optimiser_steps_name_every_finished_step_they_lose(tmp_path, capsys, monkeypatch):
    """Both signals once step 3's optimiser steps have begun: step 2's weights are being changed, so its checkpoint
    cannot be written any more; the first line says the cost (steps 1 to 2 besides step 3) and the second says what
    was lost and where the run resumes (step 0, the checkpoint on disk)."""
    run = tmp_path / "run"
    _sigint_in(monkeypatch, UpdateStage, 3, times=2)
    assert main(_argv(run)) == 130
    err = capsys.readouterr().err
    first, stopped = _stop_lines(err)
    assert first.endswith(
        "SIGINT again stops it at once and loses step 3's work so far and the finished steps 1 to 2 (it then resumes from step 0)"
    ), first
    assert stopped == (
        "dfpo: SIGINT again: stopped at once during step 3; lost: step 3 and the finished steps 1 to 2; the checkpoint on "
        f"disk is step 0's, the run resumes from it: resume with: dfpo train --resume {run}"
    )
    assert _checkpoint_step(run) == 0


def _watcher_late_by(monkeypatch, seconds: float) -> None:
    """The signal watcher reads every signal ``seconds`` late, as on a busy machine where it waits for a core: the
    main thread has stopped the evaluation and left the block by then (CI, 2026-12-07)."""
    watch = StopSignals._watch

    def late(self, read_fd):
        delayed_read, delayed_write = os.pipe()

        def pump():
            while data := os.read(read_fd, 64):
                time.sleep(seconds)
                os.write(delayed_write, data)
            os.close(delayed_write)

        threading.Thread(target=pump, daemon=True).start()
        try:
            watch(self, delayed_read)
        finally:
            os.close(delayed_read)

    monkeypatch.setattr(StopSignals, "_watch", late)


@pytest.mark.parametrize("watcher_late_s", [0.0, 1.0], ids=["watcher-on-time", "watcher-late"])
def test_a_sigint_during_an_evaluation_stops_it_at_once_and_loses_nothing(tmp_path, capsys, monkeypatch, uninterrupted, watcher_late_s):
    """The evaluation after step 2 (SmolLM2's takes about 270 s) is not waited for: the first signal stops it, a line
    says so before the checkpoint of step 2 is written, and the evaluation runs again on resume (one row of it in
    eval.jsonl). A watcher that reads the signal late says nothing more."""
    run = tmp_path / "run"
    if watcher_late_s:
        _watcher_late_by(monkeypatch, watcher_late_s)
    _sigint_in(monkeypatch, RolloutStage, 2, times=1, method="evaluate")
    assert main(_argv(run)) == 130
    err = capsys.readouterr().err
    assert _stop_lines(err) == [
        "dfpo: SIGINT: the evaluation at step 2 stopped at once; writing the checkpoint of step 2, then stopping",
        "dfpo: SIGINT: stopped at once during the evaluation at step 2, after step 2, checkpoint of step 2 written (the "
        f"evaluation at step 2 runs again on resume); resume with: dfpo train --resume {run}",
    ]
    assert _checkpoint_step(run) == 2
    assert [json.loads(line)["step"] for line in (run / RunDir.EVALS).read_text().splitlines()] == [0]
    monkeypatch.undo()
    assert _resume(run) == 0
    _same_as_uninterrupted(run, uninterrupted)


def test_a_real_dfpo_train_answers_the_first_sigint_at_once_and_keeps_the_last_finished_step_at_the_second(tmp_path):
    """The issue's case on a real ``dfpo train`` process (steps of about 2 s: a reward that sleeps 0.2 s per call on
    one worker), no checkpoint between step 0 and the last: the first SIGINT gets its line within seconds, not at
    the end of the step; the second ends the run with 130, and the checkpoint on disk is the last finished step's."""
    run = tmp_path / "run"
    sets = [
        *SETS,
        "train.steps=400",
        "eval.every=0",
        "reward.kind=user",
        'reward.user_fn="reward_fixtures:sleeps_then_one"',
        "reward.workers=1",
    ]
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(Path(__file__).parent), os.environ.get("PYTHONPATH", "")]))
    proc = subprocess.Popen(train_command(run, sets), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
    lines: list[tuple[float, str]] = []
    reader = threading.Thread(target=lambda: lines.extend((time.monotonic(), line.rstrip("\n")) for line in proc.stderr), daemon=True)
    reader.start()
    try:
        metrics, deadline = run / RunDir.METRICS, time.monotonic() + 300
        while time.monotonic() < deadline and not (metrics.is_file() and metrics.read_text().count("\n") >= 2):
            time.sleep(0.02)
        time.sleep(0.3)  # step 3 under way (its rewards take about 1.6 s)
        sent = time.monotonic()
        proc.send_signal(signal.SIGINT)
        while time.monotonic() < sent + 10 and not any(line.startswith("dfpo: SIGINT:") for _, line in lines):
            time.sleep(0.02)
        proc.send_signal(signal.SIGINT)
        proc.wait(timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()
    reader.join(timeout=10)
    said = [(t - sent, line) for t, line in lines if line.startswith("dfpo: SIGINT")]
    assert proc.returncode == 130, lines
    assert len(said) == 2, lines
    (answered_after, first), (_, stopped) = said
    assert answered_after < 5, said  # the watcher thread answers; the step is not waited for
    assert "the run stops once step" in first and "SIGINT again stops it at once" in first, first
    kept = _checkpoint_step(run)
    assert kept == _logged_steps(run)[-1] >= 2  # no finished step lost
    assert f"no finished step is lost: the checkpoint of step {kept}, the last finished one, is on disk" in stopped, stopped
    assert not any("Traceback" in line for _, line in lines)


# ----------------------------------------------------------------------------- the lines, for any point of a run


@st.composite
def stop_points(draw) -> StopPoint:
    finished = draw(st.integers(0, 50))
    in_step = draw(st.booleans())
    keeps = draw(st.booleans())
    checkpoint = draw(st.one_of(st.none(), st.integers(0, finished))) if not keeps else draw(st.integers(0, finished))
    return StopPoint(
        step_now=finished + in_step,
        finished=finished,
        checkpoint=checkpoint,
        keeps_checkpoints=keeps,
        savable=draw(st.booleans()),
        evaluating=not in_step and draw(st.booleans()),
        seconds_in=draw(st.floats(0, 1e5)),
        step_s=draw(st.one_of(st.none(), st.floats(0.01, 1e4))),
    )


@given(stop_points())
def test_a_stop_line_says_no_finished_step_is_lost_only_when_the_last_finished_checkpoint_is_on_disk(p):
    """Invariant: the line after a stop at once claims that no finished step is lost exactly when the checkpoint on
    disk is the last finished step's; otherwise it names the checkpoint's step and the finished steps after it."""
    line = stopped_at_once_line(signal.SIGINT, p, "runs/x")
    assert "\n" not in line
    if p.checkpoint is None:
        assert "no checkpoint" in line
    elif p.checkpoint == p.finished:
        assert "no finished step is lost" in line and f"the checkpoint of step {p.finished}," in line
    else:
        assert "no finished step is lost" not in line
        lost = f"step {p.finished}" if p.checkpoint + 1 == p.finished else f"steps {p.checkpoint + 1} to {p.finished}"
        assert f"the finished {lost};" in line and f"step {p.checkpoint}'s" in line


@given(stop_points())
def test_the_first_line_names_the_step_a_second_signal_would_resume_from(p):
    """Invariant: the first signal's line is one line, and (for a run that keeps checkpoints) names the step a second
    signal would leave the run to resume from: the last finished one when its checkpoint is on disk or can still be
    written, else the checkpoint's."""
    line = first_signal_line(signal.SIGINT, p)
    assert "\n" not in line and line.startswith("SIGINT: the run stops")
    if p.keeps_checkpoints:
        assert f"(it then resumes from step {resume_step_after_a_second_signal(p)})" in line
        assert ("the finished step" in line) == (resume_step_after_a_second_signal(p) < p.finished)
    else:
        assert "cannot be resumed" in line


# ----------------------------------------------------------------------------- StopSignals' new parts


def test_at_once_stops_on_the_first_signal_and_on_one_recorded_before():
    with StopSignals(immediate=False) as stop:
        with pytest.raises(StoppedAtOnce), stop.at_once():
            os.kill(os.getpid(), signal.SIGINT)
            time.sleep(1)
        assert stop.immediate is False  # training again after the block
    with StopSignals(immediate=False) as stop:
        stop.signum = signal.SIGTERM  # a first signal recorded before the block
        with pytest.raises(StoppedAtOnce), stop.at_once():
            pytest.fail("the block must not run")


def test_once_handled_a_stop_is_not_delivered_again_but_a_new_signal_still_stops():
    """The redelivery (for a stop a finaliser swallowed) would cut short the checkpoint the way out writes."""
    with StopSignals(immediate=False) as stop:
        stop.signum = signal.SIGINT
        with pytest.raises(StoppedAtOnce):
            os.kill(os.getpid(), signal.SIGINT)
            time.sleep(1)
        stop.handled()
        time.sleep(3 * StopSignals.REDELIVER_S)  # no StoppedAtOnce here
        with pytest.raises(StoppedAtOnce):
            os.kill(os.getpid(), signal.SIGINT)
            time.sleep(1)


def test_the_first_signal_of_training_is_answered_by_the_watcher_once():
    said = []
    with StopSignals(immediate=False) as stop:
        stop.first_words = said.append
        os.kill(os.getpid(), signal.SIGTERM)
        deadline = time.monotonic() + 5
        while not said and time.monotonic() < deadline:
            time.sleep(0.01)
        assert said == [signal.SIGTERM] and stop.signum == signal.SIGTERM


@pytest.mark.parametrize("signum", [signal.SIGINT, signal.SIGTERM])
def test_a_signal_the_main_thread_already_stopped_at_once_is_never_announced_as_a_first_signal(signum):
    """The watcher may read an evaluation's signal only after the main thread stopped the evaluation at once and left
    the block that made signals immediate (CI, 2026-12-07: an extra "the run stops now" line); it says nothing then."""
    assert watcher_action(signum, immediate=False, seen=False, taken=True) is None
    assert watcher_action(signum, immediate=False, seen=False, taken=False) == "first words"
    assert watcher_action(signum, immediate=True, seen=False, taken=False) == "stop"
    assert watcher_action(signum, immediate=False, seen=True, taken=True) == "stop"
    assert watcher_action(PARENT_DEATH, immediate=False, seen=True, taken=False) is None
