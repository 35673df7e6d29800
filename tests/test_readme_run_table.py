"""The SmolLM2 run's sentences (README.md, docs/trainer.md) are generated from its stored table, never typed:
scripts/update_readme.py --store-run stores a run folder's figures, the blocks are rendered from the stored file, a
figure edited by hand makes --check fail, and nothing read from the stored file renders as markup."""

from __future__ import annotations

import json
import math
import re
import shutil

import pytest
from hypothesis import given
from hypothesis import strategies as st
from script_modules import ROOT, load_script

from dfpo.trainer.config import config_to_toml, load_config

UPDATE = load_script("scripts/update_readme.py")
STORED = UPDATE.RUN_TABLE


def _stored() -> dict:
    return json.loads(STORED.read_text())


def _fake_run(folder, steps: int = 8, note_steps: tuple[int, int] = (5, 8)):
    """A finished run folder of configs/smollm2-cpu.toml (run_dir and train.steps set) with made-up logs."""
    folder.mkdir()
    cfg = load_config(ROOT / "configs/smollm2-cpu.toml", [f"run_dir={folder}", f"train.steps={steps}"])
    (folder / "config.toml").write_text(config_to_toml(cfg))
    rows = [
        {
            "step": s,
            "reward/mean": s / (steps + 1),
            "entropy/rollout": 2.0 - s / 10,
            "forms/equation": s / 32,
            "forms/number": 0.0 if s != 3 else 1 / 32,
            "diag/shared_events": 10 + s,
            "diag/shared_positions": 0 if s < 4 else s,
            "time/step_s": 100.0 + s if s < note_steps[0] else 10.0 + s,
            "time/rollout_s": 4.0 + s,
            "time/update_s": 6.0,
            "loss/policy": 0.5,
        }
        for s in range(1, steps + 1)
    ]
    (folder / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    evals = [{"eval/avg@2": e / 10, "eval/pass@2": 1.0, "eval/tax_kl": e / 1000, "step": e} for e in (0, 4, 8)]
    (folder / "eval.jsonl").write_text("".join(json.dumps(r) + "\n" for r in evals))
    summary = {
        "kappa": 0.8,
        "reward/steps_to_kappa": None,
        "reward/steps_to_kappa_ma10": None,
        "wall_s_start_up": 50.0,
        "wall_s_process": 400.4,
        "cpu_s_process": 300.6,
    }
    (folder / "summary.json").write_text(json.dumps(summary))
    (folder / ".dfpo-run.json").write_text(json.dumps({"created": "2026-01-02T03:04:05+0000", "written_by": "dfpo train"}))
    return rows, evals


def test_the_generated_blocks_are_the_stored_tables():
    """README's and docs/trainer.md's blocks hold exactly what the stored table renders to."""
    readme = (ROOT / "README.md").read_text()
    trainer = (ROOT / "docs/trainer.md").read_text()
    assert UPDATE.smollm2_run() in readme
    assert UPDATE.smollm2_table() in trainer
    assert UPDATE.render(readme, ("smollm2_run",)) == readme
    assert UPDATE.render(trainer, ("smollm2_table",)) == trainer


def test_the_readme_figures_are_the_stored_runs():
    """The README's figures are the stored steps' and evaluations' (formatted), not typed."""
    stored = _stored()
    steps, evals = stored["steps"], stored["evals"]
    text = UPDATE.smollm2_run()
    assert f"train reward {steps[0]['reward/mean']:.2f} at step {steps[0]['step']}" in text
    assert f"{steps[-1]['reward/mean']:.2f} at step {steps[-1]['step']}" in text
    assert ", ".join(f"{e['eval/avg@2']:.2f}" for e in evals) in text
    idle = [s["time/step_s"] for s in steps if stored["idle_steps"][0] <= s["step"] <= stored["idle_steps"][1]]
    assert f"A step took {sorted(idle)[len(idle) // 2 - 1] / 2 + sorted(idle)[len(idle) // 2] / 2:.1f} s" in text


def _copies(tmp_path, monkeypatch):
    readme, trainer = tmp_path / "README.md", tmp_path / "trainer.md"
    shutil.copy(ROOT / "README.md", readme)
    shutil.copy(ROOT / "docs/trainer.md", trainer)
    monkeypatch.setattr(UPDATE, "FILES", {readme: ("smollm2_run",), trainer: ("smollm2_table",)})
    monkeypatch.setattr(UPDATE, "WHOLE", {})
    return readme, trainer


@pytest.mark.parametrize(
    ("page", "typed", "edited"),
    [
        ("README.md", "held-out avg@2 0.16,", "held-out avg@2 0.18,"),
        ("trainer.md", "| 15.9 (median of steps", "| 14.9 (median of steps"),
        ("trainer.md", "0.041 |", "0.031 |"),
    ],
)
def test_check_fails_when_a_generated_figure_is_edited_by_hand(tmp_path, monkeypatch, page, typed, edited):
    """--check passes on the pages as committed and fails, leaving the page as it is, once a figure is retyped."""
    readme, trainer = _copies(tmp_path, monkeypatch)
    assert UPDATE.main(["--check"]) == 0
    path = readme if page == "README.md" else trainer
    text = path.read_text()
    assert text.count(typed) == 1
    path.write_text(text.replace(typed, edited))
    assert UPDATE.main(["--check"]) == 1
    assert edited in path.read_text()
    assert UPDATE.main([]) == 0 and path.read_text() == text


def test_store_run_keeps_a_run_folders_figures(tmp_path):
    """--store-run stores every step's figures as the run logged them, the evaluations, the summary, the date and a
    command whose config is the run's; the rendered table states them."""
    rows, evals = _fake_run(tmp_path / "run")
    text = UPDATE._stored_text(tmp_path / "run", "5-8", "quiet")
    stored = json.loads(text)
    assert [s["reward/mean"] for s in stored["steps"]] == [r["reward/mean"] for r in rows]
    assert all("loss/policy" not in s for s in stored["steps"])
    assert stored["evals"] == [{k: e[k] for k in ("step", "eval/avg@2", "eval/tax_kl")} for e in evals]
    assert stored["command"] == f"dfpo train --config configs/smollm2-cpu.toml --set run_dir={tmp_path / 'run'} --set train.steps=8"
    assert stored["machine"].endswith(", quiet") and stored["idle_steps"] == [5, 8]
    path = tmp_path / "table.json"
    path.write_text(text)
    table = UPDATE.smollm2_table(path)
    assert "| held-out avg@2 at steps 0, 4, 8 | 0.00, 0.40, 0.80 |" in table
    assert "its 10-step mean did not reach 0.8" in table
    assert "steps 1-4 ran beside other work, 101 to 104 s" in table
    assert "0% on 7 of 8 steps, at most 3%" in table and "0 on 3 of 8 steps" in table
    assert "400 s wall (50 s of it start-up), 301 s CPU" in table
    assert "2026-01-02" in table
    readme = UPDATE.smollm2_run(path)
    assert "A step took 16.5 s with the cores otherwise idle (median of steps 5-8), after 50 s of start-up" in readme
    assert "so 10 steps and their evaluations do not fit in the main job's 3 minutes" in readme


def test_store_run_names_what_is_missing(tmp_path, capsys, monkeypatch):
    """A run folder without a figure the table needs, or a bad --idle-steps, is one sentence and exit status 2."""
    _fake_run(tmp_path / "run")
    monkeypatch.setattr(UPDATE, "RUN_TABLE", tmp_path / "out" / "table.json")
    assert UPDATE.main(["--store-run", str(tmp_path / "run"), "--idle-steps", "8-5"]) == 2
    assert "--idle-steps '8-5' is not FIRST-LAST" in capsys.readouterr().err
    metrics = tmp_path / "run" / "metrics.jsonl"
    metrics.write_text(metrics.read_text().replace('"forms/equation"', '"forms/other"'))
    assert UPDATE.main(["--store-run", str(tmp_path / "run"), "--idle-steps", "5-8"]) == 2
    err = capsys.readouterr().err
    assert "has no 'forms/equation'" in err and "Traceback" not in err and err.count("\n") == 1
    assert not (tmp_path / "out" / "table.json").exists()


def _with(field: str, value) -> str:
    stored = _stored()
    stored[field] = value
    return json.dumps(stored)


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("machine", "<img src=x onerror=alert(1)>"),
        ("machine", "2-core [link](http://x)"),
        ("machine", "two\nlines"),
        ("command", "dfpo train `rm -rf ~`"),
        ("command", "dfpo | table"),
        ("run", "runs/<b>x</b>"),
        ("created", "yesterday"),
        ("seed", "0"),
        ("seed", True),
        ("eval_k", None),
    ],
)
def test_a_stored_text_that_would_render_as_markup_is_refused(field, value):
    """Markup, a backtick, a bar or a newline in a stored text, or a number stored as text, is a ValueError naming the field."""
    with pytest.raises(ValueError, match=rf"{field} = .* is not"):
        UPDATE.load_run_table(_with(field, value))


@pytest.mark.parametrize("value", ["0.5", None, True, float("nan"), float("inf")])
def test_a_stored_figure_that_is_not_a_finite_number_is_refused(value):
    stored = _stored()
    stored["steps"][3]["reward/mean"] = value
    text = json.dumps(stored)  # NaN and Infinity are written as JSON's non-standard constants
    with pytest.raises(ValueError, match=r"steps\[3\]\['reward/mean'\] = .* is not a finite number"):
        UPDATE.load_run_table(text)


@given(st.text(max_size=80))
def test_an_accepted_machine_line_holds_no_markup(machine):
    """Every machine line the loader accepts holds no character that markdown or HTML reads as markup."""
    try:
        table = UPDATE.load_run_table(_with("machine", machine))
    except ValueError:
        return
    assert not re.search(r"[<>&`|*_\[\]\\!#\n]", table["machine"])


@given(st.floats(allow_nan=False, allow_infinity=False, min_value=-1e9, max_value=1e9))
def test_a_stored_figure_renders_as_a_number(value):
    """Whatever finite number a step holds, the table shows it as digits (a number formats as a number)."""
    stored = _stored()
    stored["steps"][0]["entropy/rollout"] = value
    table = UPDATE.load_run_table(json.dumps(stored))
    figures = UPDATE._figures(table)
    assert re.fullmatch(r"-?\d+\.\d\d", figures["entropy_head"].split(", ")[0])
    assert math.isclose(float(figures["entropy_head"].split(", ")[0]), value, abs_tol=0.005 + abs(value) * 1e-12)
