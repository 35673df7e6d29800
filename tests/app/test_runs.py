"""Run folders as the Training runs page reads them (``dfpo.app.runs``): paths, both kinds of run
folder, bad log lines, incremental reading, smoothing."""

from __future__ import annotations

import json
import os
from pathlib import Path

import numpy as np
import pytest

from dfpo.app import runs as R
from dfpo.toy import layout as toy_layout
from dfpo.trainer.run.layout import RunDir


def trainer_run(folder: Path, lines: list[str], config: str = "seed = 0\n[optim]\nlr = 0.001\n") -> Path:
    folder.mkdir(parents=True)
    (folder / RunDir.CONFIG).write_text(config)
    (folder / RunDir.METRICS).write_text("".join(line + "\n" for line in lines))
    return folder


def test_relative_and_home_paths_become_absolute(tmp_path, monkeypatch):
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    assert R.resolve_folder("runs", cwd=tmp_path) == tmp_path / "runs"
    assert R.resolve_folder("  ./a/../runs ", cwd=tmp_path) == tmp_path / "runs"
    assert R.resolve_folder("~/runs", cwd=Path("/elsewhere")) == tmp_path / "home" / "runs"
    assert R.resolve_folder("/abs/runs", cwd=tmp_path) == Path("/abs/runs")


def test_bad_step_lines_are_skipped_and_counted_and_nonfinite_values_left_out(tmp_path):
    lines = [
        '{"step": 1, "loss": 0.5}',
        '{"step": NaN, "loss": 0.4}',
        '{"step": 1e400, "loss": 0.4}',  # json reads 1e400 as inf
        '{"step": "3", "loss": 0.3}',
        '{"step": true, "loss": 0.3}',
        '{"loss": 0.3}',
        "[1, 2]",
        '{"step": 4, "loss": 0.25, "kl": NaN, "grad": Infinity}',
        '{"step": 5, "loss": 0.2}',
    ]
    log = R.MetricLog(trainer_run(tmp_path / "a", lines) / RunDir.METRICS)
    log.refresh()
    assert log.bad_lines == 6 and log.nonfinite == 2
    steps, values = log.curve("loss")
    np.testing.assert_array_equal(steps, [1, 4, 5])
    np.testing.assert_array_equal(values, [0.5, 0.25, 0.2])
    assert log.keys() == {"loss"}


def test_a_log_is_read_incrementally_and_again_when_replaced(tmp_path):
    path = trainer_run(tmp_path / "a", [json.dumps({"step": i, "loss": 1.0 / i}) for i in range(1, 101)]) / RunDir.METRICS
    log = R.MetricLog(path)
    assert log.refresh() and log.lines_read == 100
    assert not log.refresh() and log.lines_read == 100  # unchanged: nothing read
    with open(path, "a") as f:
        f.write('{"step": 101, "loss": 0.5}\n{"step": 102, "lo')  # the last line is still being written
    assert log.refresh() and log.lines_read == 101  # only the new complete line
    assert log.bad_lines == 1 and len(log.curve("loss")[0]) == 101  # the torn tail counted, not committed
    with open(path, "a") as f:
        f.write('ss": 0.25}\n')
    log.refresh()
    assert log.lines_read == 102 and log.bad_lines == 0
    np.testing.assert_array_equal(log.curve("loss")[1][-2:], [0.5, 0.25])
    tmp = path.with_suffix(".tmp")  # a resumed run rewrites its log (a new file, fewer lines)
    tmp.write_text('{"step": 1, "loss": 9.0}\n')
    os.replace(tmp, path)
    log.refresh()
    assert log.lines_read == 1
    np.testing.assert_array_equal(log.curve("loss")[1], [9.0])


def test_a_final_line_without_newline_is_read_as_the_tail(tmp_path):
    path = tmp_path / "m.jsonl"
    path.write_text('{"step": 1, "x": 1.0}\n{"step": 2, "x": 3.0}')
    log = R.MetricLog(path)
    log.refresh()
    np.testing.assert_array_equal(log.curve("x")[1], [1.0, 3.0])
    assert log.bad_lines == 0


def test_toy_run_folder_shows_each_objective_as_the_mean_over_its_seeds(tmp_path):
    from dfpo.cli import main

    out = tmp_path / "runs" / "toy-demo"
    assert main(["toy", "run", "--task", "tenplusten", "--objectives", "gspo,grpo_fix", "--seeds", "3", "--steps", "4", "--no-plots", "--out", str(out)]) == 0  # fmt: skip
    found, counts = R.runs_under([tmp_path / "runs"], {})
    assert counts == {tmp_path / "runs": 1}
    assert [r.name for r in found] == ["toy-demo: grpo_fix", "toy-demo: gspo"]
    run = next(r for r in found if r.series == "grpo_fix")
    run.folder.refresh()
    rows = [json.loads(line) for line in (out / toy_layout.METRICS).read_text().splitlines()]
    expected = [np.mean([r["reward"] for r in rows if r["objective"] == "grpo_fix" and r["step"] == s]) for s in (1, 2, 3, 4)]
    steps, values = run.curve("reward")
    np.testing.assert_array_equal(steps, [1, 2, 3, 4])
    np.testing.assert_allclose(values, expected, rtol=1e-12)
    assert "seed" not in run.keys() and "reward" in run.keys()
    assert run.config()["objective"] == "grpo_fix" and run.config()["task"] == "tenplusten"


def test_an_older_toy_run_shows_its_batch_reward_as_reward_mean(tmp_path):
    """Toy runs written before the toy took the trainer's names logged reward/mean as reward/sampled."""
    folder = tmp_path / "runs" / "old-toy"
    folder.mkdir(parents=True)
    (folder / toy_layout.CONFIG).write_text(json.dumps({"objectives": ["gspo"], "task": "tenplusten"}))
    rows = [{"objective": "gspo", "seed": s, "step": t, "reward/sampled": 0.1 * t + s, "reward": 0.5} for s in (0, 1) for t in (1, 2)]
    (folder / toy_layout.METRICS).write_text("".join(json.dumps(r) + "\n" for r in rows))
    (run,) = R.runs_under([tmp_path / "runs"], {})[0]
    run.folder.refresh()
    assert "reward/sampled" not in run.keys() and {"reward/mean", "reward"} <= run.keys()
    np.testing.assert_allclose(run.curve("reward/mean")[1], [0.6, 0.7])  # the mean over the two seeds


def test_runs_under_names_runs_by_root_and_keeps_ids_stable_when_a_root_is_added(tmp_path):
    trainer_run(tmp_path / "a" / "r1", ['{"step": 1, "x": 1}'])
    trainer_run(tmp_path / "b" / "r1", ['{"step": 1, "x": 2}'])
    trainer_run(tmp_path / "b" / "deep" / "r2", ['{"step": 1, "x": 3}'])
    registry: dict = {}
    one, _ = R.runs_under([tmp_path / "a"], registry)
    both, counts = R.runs_under([tmp_path / "a", tmp_path / "b"], registry)
    assert [r.name for r in one] == ["r1"]
    assert counts == {tmp_path / "a": 1, tmp_path / "b": 2}
    assert {r.name for r in both} == {str(tmp_path / "a" / "r1"), str(tmp_path / "b" / "r1"), "deep/r2"}  # same name twice: full paths
    assert one[0].id in {r.id for r in both}


def test_trailing_mean_pins_values():
    np.testing.assert_allclose(R.trailing_mean(np.array([1.0, 2.0, 3.0, 4.0, 10.0]), 3), [1.0, 1.5, 2.0, 3.0, 17 / 3])
    np.testing.assert_array_equal(R.trailing_mean(np.array([1.0, 5.0]), 1), [1.0, 5.0])


@pytest.mark.parametrize("text", ["{", "[]", "seed = "])
def test_a_config_that_does_not_parse_is_a_message(tmp_path, text):
    folder = trainer_run(tmp_path / "a", ['{"step": 1, "x": 1}'], config=text)
    with pytest.raises(ValueError, match="config.toml does not parse"):
        R.RunFolder(folder).config()


def test_decimate_keeps_the_extremes_of_a_long_curve_in_step_order():
    """At most max_points points, in step order, and the global low and high are among them."""
    x = np.arange(100_000, dtype=float)
    y = np.sin(x / 1000)
    y[51_234], y[77] = 9.0, -9.0  # spikes a stride would miss
    xs, ys = R.decimate(x, y, max_points=4000)
    assert len(xs) <= 4000 and np.all(np.diff(xs) > 0)
    assert {51_234.0, 77.0} <= set(xs) and ys.max() == 9.0 and ys.min() == -9.0
    short = np.arange(10, dtype=float)
    assert R.decimate(short, short, max_points=4000)[0] is short
