"""``dfpo probe``: inputs refused before any work, matched controls, the tables from a stored document, and tiny
end-to-end runs from the built-in preset and from a run folder's checkpoint (which it leaves untouched)."""

from __future__ import annotations

import hashlib
import json
import sys
from pathlib import Path

import pytest
from tiny_run import TINY_MODEL_SETS

from dfpo.cli import main
from dfpo.core.drift_tables import comparisons, summary_table
from dfpo.trainer.probe_command import make_plan, matched_controls, render_markdown

FAST = [*TINY_MODEL_SETS, "rollout.prompts_per_step=4", "rollout.group_size=4", "rollout.max_new_tokens=3"]


def _plan(tmp_path, **changes):
    kwargs = dict(
        objectives="gspo,dfpo_min",
        seeds=2,
        first_seed=0,
        config=None,
        sets=list(FAST),
        run=None,
        move_steps=1,
        max_events=4,
        out=str(tmp_path / "out"),
    )
    kwargs.update(changes)
    return make_plan(**kwargs)


def test_matched_controls_pair_each_transform_with_its_trust_region():
    labels = ["gspo", "dfpo_min", "gspo_noclip", "dfpo_min:stopgrad=score", "grpo"]
    assert matched_controls(labels) == {"dfpo_min": "gspo", "dfpo_min:stopgrad=score": "gspo_noclip"}
    assert matched_controls(["dfpo_min", "grpo"]) == {}  # no control at GSPO's clip range among the labels


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"objectives": "gspo,nope"}, "unknown objective='nope'"),
        ({"objectives": "gspo,gspo"}, "repeats a label"),
        ({"objectives": " , "}, "at least one objective label"),
        ({"seeds": 0}, "--seeds must be >= 1"),
        ({"move_steps": -1}, "--move-steps must be >= 0"),
        ({"max_events": 0}, "--max-events must be >= 1"),
        ({"sets": ["rollout.group_size=1"]}, "group_size"),
        ({"run": "somewhere", "sets": ["seed=1"]}, "drop --config and --set"),
        ({"objectives": "gspo,grpo:adv_scale=remax"}, r"'grpo:adv_scale=remax': the probe gives each label advantages of the"),
        ({"objectives": "grpo:adv_scale=gdpo"}, r"adv_scale='gdpo' reads more"),
        ({"objectives": "grpo:adv_scale=opo"}, r"adv_scale='opo' reads more"),
        ({"objectives": "gspo,online_ipo"}, r"'online_ipo' reads ref_logp \(ipo_beta=0.1.*which the probe does not compute"),
        ({"objectives": "grpo:beta=0.04"}, r"'grpo:beta=0.04' reads ref_logp"),
        ({"objectives": "dapo:rollout_correction=token_mask"}, r"reads rollout_logp"),
    ],
)
def test_bad_input_is_refused_before_any_work(tmp_path, change, message):
    with pytest.raises(ValueError, match=message):
        _plan(tmp_path, **change)


def test_an_output_path_that_is_a_file_is_refused(tmp_path):
    (tmp_path / "file").write_text("x")
    with pytest.raises(ValueError, match="--out"):
        _plan(tmp_path, out=str(tmp_path / "file"))


def test_a_run_folder_without_a_checkpoint_is_refused(tmp_path):
    with pytest.raises(ValueError, match="no such folder"):
        _plan(tmp_path, run=str(tmp_path / "missing"), sets=[])


def _doc(values: dict[str, list[float]], kinds=("shared",)) -> dict:
    records = [
        {"seed": s, "objective": label, "kind": kind, "events": 3, "direct": v / 2, "cross": v / 2, "measured": v, "coef": 0.1}
        for label, vals in values.items()
        for s, v in enumerate(vals)
        for kind in kinds
    ]
    return {
        "command": "dfpo probe",
        "objectives": list(values),
        "controls": {"dfpo_min": "gspo"},
        "seeds": list(range(len(next(iter(values.values()))))),
        "run": None,
        "move_steps": 1,
        "max_events": 4,
        "settings": {"model": "tiny", "task": "add", "prompts_per_step": 4, "group_size": 4, "lr": 3e-4, "max_grad_norm": 1.0},
        "records": records,
    }


def test_comparisons_read_the_paired_differences():
    doc = _doc({"gspo": [1.0, 1.1, 0.9, 1.0, 1.2, 0.8], "dfpo_min": [0.5, 0.6, 0.4, 0.5, 0.7, 0.3]})
    cells = {(c.kind, c.figure): c for c in comparisons(doc)}
    measured = cells[("shared", "measured")]
    assert measured.interval.mean == pytest.approx(-0.5) and measured.verdict == "reproduced"
    assert cells[("equivalent", "measured")].verdict == "too few seeds"
    assert measured.interval.tests == 3  # Bonferroni over the intervals the table shows (coef, measured, cross), not the empty cells
    md = render_markdown(doc)
    assert "| `dfpo_min` - `gspo` | shared | abs measured |" in md and "Warning: 6 seeds" in md
    assert "| `gspo` | equivalent | 0 |" in summary_table(doc)


def test_probe_end_to_end_writes_a_table_a_png_and_the_records(tmp_path, capsys):
    out = tmp_path / "probe"
    sets = [x for s in FAST for x in ("--set", s)]
    assert main(["probe", "--objectives", "gspo,dfpo_min", "--seeds", "2", "--move-steps", "1", "--out", str(out), "--quiet", *sets]) == 0
    text = capsys.readouterr().out
    assert "# Parameter-space drift probe" in text and "| `dfpo_min` - `gspo` |" in text
    doc = json.loads((out / "probe.json").read_text())
    assert doc["seeds"] == [0, 1] and doc["controls"] == {"dfpo_min": "gspo"}
    assert {(r["seed"], r["objective"], r["kind"]) for r in doc["records"]} == {
        (s, o, k) for s in (0, 1) for o in ("gspo", "dfpo_min") for k in ("shared", "equivalent")
    }
    assert (out / "probe.md").read_text() == text
    assert (out / "probe.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def _tree_digest(folder: Path) -> dict[str, str]:
    return {str(p.relative_to(folder)): hashlib.sha256(p.read_bytes()).hexdigest() for p in sorted(folder.rglob("*")) if p.is_file()}


@pytest.mark.slow
def test_probe_of_a_run_folder_reads_its_checkpoint_and_writes_nothing_there(tmp_path):
    sys.path.insert(0, str(Path(__file__).parent))
    from test_llm_e2e import tiny_config

    from dfpo.trainer.train import Trainer

    cfg = tiny_config(tmp_path, "train.steps=1")
    Trainer(cfg, quiet=True).run()
    before = _tree_digest(Path(cfg.run_dir))
    out = tmp_path / "probe"
    assert main(["probe", "--run", cfg.run_dir, "--objectives", "gspo,dfpo_min", "--seeds", "2", "--out", str(out), "--quiet"]) == 0
    assert _tree_digest(Path(cfg.run_dir)) == before
    doc = json.loads((out / "probe.json").read_text())
    assert doc["run"] == cfg.run_dir and len(doc["records"]) == 8
