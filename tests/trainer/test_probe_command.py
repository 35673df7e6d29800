"""``dfpo probe``: inputs refused before any work, matched controls, the tables from a stored document, and tiny
end-to-end runs from the built-in preset and from a run folder's checkpoint (which it leaves untouched)."""

from __future__ import annotations

import hashlib
import json
import math
import sys
from pathlib import Path

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from tiny_run import TINY_MODEL_SETS

from dfpo.cli import main
from dfpo.core.drift_tables import comparisons, summary_table
from dfpo.trainer.probe import one_seed, seeds
from dfpo.trainer.probe import plan as probe_plan
from dfpo.trainer.probe.command import write_outputs
from dfpo.trainer.probe.figure import PANEL_INCHES, absent_kinds_line, bar_stats, drawn_kinds, empty_reason, panel_layout
from dfpo.trainer.probe.plan import make_plan, matched_controls
from dfpo.trainer.probe.report import render_markdown

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
    ],
)
def test_bad_input_is_refused_before_any_work(tmp_path, change, message):
    with pytest.raises(ValueError, match=message):
        _plan(tmp_path, **change)


@pytest.mark.parametrize(
    ("argv", "sentence"),
    [
        (["--bogus"], "--bogus is not an option of dfpo probe"),
        (["--seeds", "2", "--bogus", "x"], "--bogus, x are not options of dfpo probe"),
    ],
)
def test_an_unknown_option_is_refused_in_one_line_under_dfpo_probes_usage(capsys, argv, sentence):
    """`dfpo probe --bogus` names --bogus as not an option of dfpo probe, under dfpo probe's usage (not dfpo's)."""
    with pytest.raises(SystemExit) as exit_:
        main(["probe", *argv])
    err = capsys.readouterr().err
    assert exit_.value.code == 2 and err.startswith("usage: dfpo probe ")
    assert err.strip().splitlines()[-1] == f"dfpo probe: error: {sentence}; dfpo probe --help lists its options"
    assert err.count("error") == 1


def test_dfpo_probe_takes_by_default_as_many_seeds_as_its_tables_need(tmp_path, monkeypatch):
    """Without --seeds the probe runs MIN_SEEDS seeds, the fewest whose tables draw no too-few-seeds warning (it ran 4
    and warned that fewer than 8 were too few); the command line it records names that number."""
    from dfpo.core.drift_tables import MIN_SEEDS
    from dfpo.trainer.probe import command

    planned = []
    monkeypatch.setattr(command, "probe_command", lambda plan, quiet: planned.append(plan) or "")
    assert main(["probe", "--out", str(tmp_path / "out")]) == 0
    assert planned[0].seeds == tuple(range(MIN_SEEDS)) and f"--seeds {MIN_SEEDS} " in planned[0].command
    doc = _doc({"gspo": [1.0] * MIN_SEEDS, "dfpo_min": [0.5] * MIN_SEEDS})
    assert "seeds (fewer than" not in render_markdown(doc)


def test_a_label_reading_an_input_the_probe_does_not_compute_is_refused(tmp_path, monkeypatch):
    monkeypatch.setattr(probe_plan, "PROBE_INPUTS", ("entropy", "rollout_logp"))  # as if the probe had no reference
    with pytest.raises(ValueError, match=r"'online_ipo' reads ref_logp \(ipo_beta=0.1.*which the probe does not compute"):
        _plan(tmp_path, objectives="gspo,online_ipo")


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
    assert [r for s in (0, 1) for r in json.loads((out / "seeds" / f"seed{s}.json").read_text())["records"]] == doc["records"]


def test_a_probe_stopped_part_way_goes_on_at_the_next_seed_and_refuses_a_seed_of_other_settings(tmp_path, monkeypatch):
    """Each seed is stored as it ends; the same probe again reads it instead of probing it, and a stored seed of other
    settings, or one that is not a stored seed, is refused naming its file before anything is probed."""
    probed = []

    def fake_probe_seed(plan, seed, say):
        probed.append(seed)
        if seed == 1 and len(probed) == 2:
            raise KeyboardInterrupt  # the first run dies in its second seed
        return [{"seed": seed, "objective": "gspo", "kind": "shared", "events": 3}]

    monkeypatch.setattr(seeds, "probe_seed", fake_probe_seed)
    plan = _plan(tmp_path)
    with pytest.raises(KeyboardInterrupt):
        seeds.run_probe(plan)
    said = []
    doc = seeds.run_probe(plan, said.append)
    assert probed == [0, 1, 1] and [r["seed"] for r in doc["records"]] == [0, 1]  # seed 0 once, seed 1 again
    assert said[0].startswith("dfpo probe: seed 0 (1/2): probed before, read from") and said[1] == "dfpo probe: seed 1 (2/2)"
    seed0 = Path(plan.out) / "seeds" / "seed0.json"
    with pytest.raises(ValueError, match=r"seed0.json was probed with other settings or code \(max_events differ\)"):
        seeds.run_probe(_plan(tmp_path, max_events=5))
    seed0.write_text('{"seed": 0, "records": []}')
    with pytest.raises(ValueError, match=r"seed0.json is not a stored seed of dfpo probe: move it away to probe seed 0 again"):
        seeds.run_probe(plan)
    assert probed == [0, 1, 1]  # nothing was probed by the refused runs


EVENTS = ["rollout.prompts_per_step=4", "rollout.group_size=4", "rollout.max_new_tokens=3"]
"""The probe's own tiny preset (100 warm-start steps) on 4 groups of 4: small, and its groups share tokens."""
READS_REF_OR_SAMPLER = ("online_ipo", "grpo:beta=0.04", "dapo:rollout_correction=token_mask")


def test_labels_reading_the_reference_or_the_sampler_give_finite_figures(tmp_path):
    plan = _plan(tmp_path, objectives=",".join(READS_REF_OR_SAMPLER), sets=EVENTS)
    doc = seeds.run_probe(plan)
    shared = [r for r in doc["records"] if r["kind"] == "shared"]
    assert {(r["seed"], r["objective"]) for r in shared} == {(s, o) for s in (0, 1) for o in READS_REF_OR_SAMPLER}
    assert all(r["events"] > 0 for r in shared)  # the figures below are of real events
    figures = [r[k] for r in shared for k in ("coef", "direct", "cross", "measured", "error")]
    assert all(math.isfinite(v) for v in figures)
    assert "pi_ref: the starting policy" in render_markdown(doc) and "pi_rollout: the sampler's" in render_markdown(doc)


def test_the_reference_is_the_starting_policy_and_pi_old_the_sampler(tmp_path, monkeypatch):
    from dfpo.trainer.config import config_from_dict, config_to_dict
    from dfpo.trainer.stages.old_logp import batch_logp
    from dfpo.trainer.tasks import load_splits

    seen = {}
    sample, step = one_seed.sample_rollout, one_seed.probe_step

    def record_rollout(*args):
        seen["rollout"], seen["old_logp"] = sample(*args)
        return seen["rollout"], seen["old_logp"]

    def record_batch(score, optimizer, batch, spec, **kw):
        seen.setdefault("batches", []).append(batch)
        return step(score, optimizer, batch, spec, **kw)

    monkeypatch.setattr(one_seed, "sample_rollout", record_rollout)
    monkeypatch.setattr(one_seed, "probe_step", record_batch)
    plan = _plan(tmp_path, objectives="grpo:beta=0.04,gspo", move_steps=2)
    one_seed.probe_seed(plan, 3, lambda msg: None)
    rollout, batches = seen["rollout"], seen["batches"]
    assert len(batches) == 4  # two move steps, then each label's step
    cfg = config_from_dict({**config_to_dict(plan.config), "seed": 3})
    train, _ = load_splits(cfg.data, cfg.seed)
    start = one_seed.build_start(plan, cfg, train, lambda msg: None, with_ref=False)  # seed 3's policy, built again
    expected, _ = batch_logp(start.model, rollout.batch, start.device, 64)  # (B, T) log pi_start of the sampled tokens
    for batch in batches:  # every step reads the starting policy as pi_ref, the move steps' moves notwithstanding
        assert torch.equal(batch.ref_logp, expected) and torch.equal(batch.rollout_logp, rollout.sampler_logp)
    assert torch.equal(seen["old_logp"], rollout.sampler_logp)  # rollout.old_logp=auto, HF engine, float32: the trainer's pi_old
    mask = rollout.batch.mask
    assert bool(mask.any()) and torch.allclose(expected[mask], seen["old_logp"][mask], atol=1e-4)  # pi_ref = pi_old at the start


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
    labels = "gspo,dfpo_min,grpo:beta=0.04"  # a KL term: the run's reference model is loaded too
    assert main(["probe", "--run", cfg.run_dir, "--objectives", labels, "--seeds", "2", "--out", str(out), "--quiet"]) == 0
    assert _tree_digest(Path(cfg.run_dir)) == before
    doc = json.loads((out / "probe.json").read_text())
    assert doc["run"] == cfg.run_dir and len(doc["records"]) == 12
    assert f"pi_ref: the reference model of {cfg.run_dir}" in (out / "probe.md").read_text()


# ----------------------------------------------------------------------------- issue 45: the split, the flag, probe.png


def _split_doc(ratio: float) -> dict:
    """A document after the momentum/decay split: parts spanning three orders, decay 0, one objective without pairs."""
    doc = _doc({"gspo": [1.0, 1.1, 0.9, 1.0], "dfpo_min": [0.5, 0.6, 0.4, 0.5]})
    for k, r in enumerate(doc["records"]):
        r.update(direct=1e-4 * (1 + k % 3), cross=0.02 + 0.05 * (k % 2), momentum=0.03, decay=0.0, error=0.01, error_ratio=ratio)
        r.update(direct_share=0.01, cross_share=0.45, momentum_share=0.54, decay_share=0.0, batch_cross_share=0.98)
    return doc


@settings(max_examples=40)
@given(st.lists(st.floats(0, 1e3, allow_nan=False), min_size=1, max_size=8))
def test_a_bar_of_absolute_values_never_reaches_below_zero(vals):
    """Invariant: mean - lower whisker >= 0 for any per-seed absolute values; the bar holds as many seeds as given."""
    doc = _doc({"gspo": vals})
    mean, low, high, n = bar_stats(doc, "gspo", "shared", "measured")
    assert n == len(vals) and low >= 0 and high >= 0 and mean - low >= -1e-12 * max(1.0, mean)


def test_probe_png_layout_logs_a_span_names_zero_parts_and_counts_seeds():
    doc = _split_doc(0.1)
    layout = panel_layout(doc, "shared")
    assert layout["log"]  # 1e-4 beside 0.07: orders of magnitude apart
    assert [f for f, _ in layout["drawn"]] == ["direct", "cross", "momentum", "measured"]
    assert "abs decay: 0 in every seed, not drawn" in layout["notes"] and layout["counts"] == [4, 4]
    assert not panel_layout(_doc({"gspo": [1.0, 1.1], "dfpo_min": [1.0, 1.2]}), "shared")["log"]  # bars within 10x: linear
    assert "1 seed: no whisker (an interval needs 2 seeds)" in panel_layout(_doc({"gspo": [1.0]}), "shared")["notes"]
    assert "no group held two correct answers" in empty_reason(doc, "equivalent") and "4 seeds" in empty_reason(doc, "equivalent")


def _png_width(path: Path) -> int:
    return int.from_bytes(path.read_bytes()[16:20], "big")  # the IHDR chunk's width


def test_probe_png_draws_only_the_panels_with_data_and_names_the_others(tmp_path):
    """A kind no objective has figures of gets no panel (the default add task holds no equivalent pairs: half of
    probe.png was empty); the line under the title names it and says why. A document without events gets one panel."""
    shared_only = _split_doc(0.1)
    both = _doc({"gspo": [1.0, 1.1], "dfpo_min": [0.5, 0.6]}, kinds=("shared", "equivalent"))
    none = _doc({"gspo": [1.0, 1.1], "dfpo_min": [0.5, 0.6]}, kinds=())
    assert drawn_kinds(shared_only) == ["shared"] and drawn_kinds(both) == ["shared", "equivalent"] and drawn_kinds(none) == []
    assert absent_kinds_line(shared_only) == (
        "no panel of equivalent answers' log-odds: no group held two correct answers with different tokens in the batches of 4 seeds"
    )
    assert absent_kinds_line(both) == ""
    widths = {}
    for name, doc in (("shared_only", shared_only), ("both", both), ("none", none)):
        write_outputs(doc, tmp_path / name)
        widths[name] = _png_width(tmp_path / name / "probe.png")
    assert widths == {"shared_only": PANEL_INCHES * 100, "both": 2 * PANEL_INCHES * 100, "none": PANEL_INCHES * 100}


def test_probe_md_names_shares_of_the_first_order_prediction_and_flags_a_large_error(tmp_path):
    calm, wild = render_markdown(_split_doc(0.1)), render_markdown(_split_doc(5.1))
    for md in (calm, wild):
        assert "of the first-order prediction" in md and "of the drift" not in md
        assert "| abs momentum | abs decay |" in md and "| cross of batch |" in md
    assert "First-order error" not in calm
    assert "Warning: First-order error: under `gspo`, for a shared token, mean abs(measured - predicted) exceeds 0.5x" in wild
    write_outputs(_split_doc(5.1), tmp_path)
    assert (tmp_path / "probe.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
