"""RUN_DIR/curves.png of an LLM run: drawn from logs read tolerantly, with nothing from the folder drawn as markup."""

from __future__ import annotations

import json
import math

import pytest

from dfpo.trainer.curves import PANELS, rolling_mean, series, write_curves
from dfpo.trainer.run.layout import RunDir

PNG = b"\x89PNG\r\n\x1a\n"


def _run_folder(path, steps: int = 12, objective: str = "dfpo_min"):
    path.mkdir(parents=True)
    lines = [json.dumps({"step": s, "reward/mean": s / steps, "loss/policy": 0.1 * s, "grad/norm": 1.0}) for s in range(1, steps + 1)]
    (path / RunDir.METRICS).write_text("\n".join(lines) + '\n{"step": 13, "reward/me')  # the torn line a kill leaves
    (path / RunDir.EVALS).write_text(
        json.dumps({"step": 0, "eval/avg@4": 0.25}) + "\n" + json.dumps({"step": 12, "eval/avg@4": 0.5}) + "\n"
    )
    (path / RunDir.CONFIG).write_text(f"[objective]\nname = '{objective}'\n")
    return path


def test_a_series_keeps_finite_numbers_by_step_and_the_last_line_of_a_step():
    records = [
        {"step": 2, "reward/mean": 0.5},
        {"step": 1, "reward/mean": 0.1},
        {"step": 2, "reward/mean": 0.7},  # a resumed run logged step 2 again
        {"step": 3, "reward/mean": "0.9"},
        {"step": 4, "reward/mean": math.nan},
        {"step": 5, "reward/mean": True},
        {"step": "6", "reward/mean": 0.2},
        {"step": 7},
    ]
    assert series(records, "reward/mean") == ([1, 2], [0.1, 0.7])


def test_the_rolling_mean_averages_what_there_is_at_the_start():
    assert rolling_mean([1.0, 3.0, 5.0, 7.0], 2) == [1.0, 2.0, 4.0, 6.0]
    assert rolling_mean([], 10) == []


def test_the_curves_of_a_run_are_a_png_beside_its_logs(tmp_path):
    run = _run_folder(tmp_path / "run")
    path = write_curves(run)
    assert path == run / RunDir.CURVES and path.read_bytes()[:8] == PNG
    assert not [p.name for p in run.iterdir() if p.name.endswith(".tmp")]


@pytest.mark.parametrize("name", [r"$\notacommand{x}$", r"$\frac{a}{b}", "a_b^c $x$"])
def test_nothing_from_the_folder_is_drawn_as_markup(tmp_path, name):
    """Matplotlib's mathtext would parse '$...$' in the folder's or the objective's name (and fail on unknown commands)."""
    run = _run_folder(tmp_path / name, objective=name)
    assert write_curves(run).read_bytes()[:8] == PNG


def test_a_folder_without_a_logged_step_is_named(tmp_path):
    with pytest.raises(ValueError, match=r"no training step in metrics.jsonl yet"):
        write_curves(tmp_path)
    assert not (tmp_path / RunDir.CURVES).exists()


def test_every_panel_is_a_metric_the_trainer_logs():
    from dfpo.core.metric_registry import lookup

    for key, _ in PANELS:
        lookup(key)  # KeyError for a key nobody logs
