"""The drift page: it opens on inputs that draw something, every empty or zero cell has a generated sentence, the seeds
shown are the seeds chosen, the optimiser state's part is shown where a document records it (and said missing where
not), and a bad folder is one sentence."""

from __future__ import annotations

import base64
import json
import math
import re
from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("streamlit")
from streamlit.testing.v1 import AppTest  # noqa: E402

from dfpo.app import drift  # noqa: E402
from dfpo.app.cli import RUNS_ENV  # noqa: E402
from dfpo.app.runs import drift_notes  # noqa: E402
from dfpo.toy.param_drift import default_probe_config, probe_toy  # noqa: E402
from dfpo.trainer.run.layout import RunDir  # noqa: E402

APP = Path(__file__).resolve().parents[2] / "app"


@pytest.fixture(autouse=True)
def _no_stored_documents(tmp_path_factory, monkeypatch):
    """The page as an installed wheel shows it (no docs/probe/), unless a test stores documents itself."""
    monkeypatch.setattr(drift, "STORED", tmp_path_factory.mktemp("no-stored"))


def _page(seeds: float | None = 2.0) -> AppTest:
    at = AppTest.from_file(str(APP / "page_drift.py"), default_timeout=300)
    if seeds is not None:
        at.session_state["drift_seeds"] = seeds
    at.run()
    assert not at.exception, [e.value for e in at.exception]
    return at


def _doc(momentum: bool = False, error_ratio: float | None = None) -> dict:
    records = []
    for o, vals in (("gspo", [1.0, 1.2, 0.9]), ("dfpo_min", [0.5, 0.6, 0.4])):
        for s, v in enumerate(vals):
            r = {"seed": s, "objective": o, "kind": "shared", "events": 3, "coef": 0.1, "direct": 0.1, "cross": v, "measured": v}
            r.update(error=0.01, cross_share=0.9)
            if momentum:
                r.update(momentum=0.3 * v, decay=0.0, momentum_share=0.2, error_ratio=0.01 if error_ratio is None else error_ratio)
            records.append(r)
            records.append({"seed": s, "objective": o, "kind": "equivalent", "events": 0})  # as dfpo probe writes a kind it found none of
    return {"objectives": ["gspo", "dfpo_min"], "controls": {"dfpo_min": "gspo"}, "seeds": [0, 1, 2], "records": records}


def _charts(at: AppTest) -> list[dict]:
    return [json.loads(chart.proto.spec) for chart in at.get("plotly_chart")]


def _ys(spec: dict) -> list[float]:
    out = []
    for trace in spec["data"]:
        y = trace.get("y")
        if isinstance(y, dict) and "bdata" in y:
            y = np.frombuffer(base64.b64decode(y["bdata"]), dtype=y["dtype"]).tolist()
        out += [v for v in y or [] if v is not None]
    return out


def _notes(at: AppTest) -> str:
    return "\n".join(m.value for m in at.markdown)


def _every_blank_is_explained(at: AppTest, frame) -> None:
    """Every row with an empty (None/NaN) or all-zero cell names notes, and each named note is shown on the page."""
    shown = _notes(at)
    for _, row in frame.iterrows():
        cells = [v for k, v in row.items() if k not in ("objective", "events", "note")]
        blank = any(v is None or (isinstance(v, float) and math.isnan(v)) or v == 0 for v in cells)
        if blank:
            assert row.get("note"), f"{row['objective']} {row['events']}: an empty or zero cell without a note"
        for n in filter(None, str(row.get("note", "")).split(", ")):
            assert f"\n{n}. " in "\n" + shown, f"note {n} is not shown"


def test_the_default_inputs_draw_both_charts_and_explain_every_empty_cell():
    at = _page(seeds=None)  # the page's own defaults: family, DEFAULT_OBJECTIVES, 8 seeds
    assert at.selectbox(key="drift_task").value == "family" and at.number_input(key="drift_seeds").value == 8
    charts = _charts(at)
    assert len(charts) == 2 and all(_ys(c) and max(_ys(c)) > 0 for c in charts)
    assert all(c["layout"]["yaxis"]["type"] == "linear" and c["layout"]["yaxis"]["rangemode"] == "tozero" for c in charts)
    frame = at.dataframe[0].value
    assert set(frame["seeds"]) == {8}
    _every_blank_is_explained(at, frame)
    assert not at.info  # nothing replaced a chart


def test_a_bars_length_is_proportional_to_its_value(tmp_path):
    """Invariant: one bar's drawn length over another's is their values' ratio in the table (a linear axis from 0); a
    log axis drew a part two thirds the size of another as a sliver of it (issue 57)."""
    (tmp_path / "probe.json").write_text(json.dumps(_doc(momentum=True)))
    at = _page()
    at.text_input(key="drift_folder").set_value(str(tmp_path)).run()
    assert not at.exception
    shared = _charts(at)[-1]  # the folder's only chart: its document has no equivalent pair
    axis = shared["layout"]["yaxis"]
    assert axis["type"] == "linear" and axis["rangemode"] == "tozero"
    bars = {t["name"]: _ys({"data": [t]})[0] for t in shared["data"]}  # gspo's bar of each part
    frame = at.dataframe[1].value
    row = frame[(frame["objective"] == "gspo") & (frame["events"] == "shared")].iloc[0]
    assert bars["direct"] / bars["cross"] == pytest.approx(row["direct"] / row["cross"])
    assert bars["direct"] / bars["measured"] == pytest.approx(row["direct"] / row["measured"])


def test_the_seeds_shown_are_the_seeds_chosen_and_a_seed_without_events_is_named():
    """tenplusten, 8 seeds: seed 2's correct completions all read alike, so it has no equivalent pair (a fact of its
    rollouts, not a lost seed): the table shows 8 seeds, 7 with events, and a note names seed 2 and why."""
    at = _page(seeds=8.0)
    at.selectbox(key="drift_task").set_value("tenplusten").run()
    assert not at.exception
    frame = at.dataframe[0].value
    assert set(frame["seeds"]) == {8} and set(frame["seeds with events"]) == {7}
    assert "No equivalent pair in seed 2 of 8" in _notes(at) and "all read" in _notes(at)
    _every_blank_is_explained(at, frame)
    # no shared event on tenplusten: no chart and no rows of None, a sentence instead
    assert set(frame["events"]) == {"equivalent"}
    assert len(_charts(at)) == 1 and "No shared event in any of the 8 seeds" in at.info[0].value
    assert "differ at their first token" in at.info[0].value


def test_probe_toys_own_rows_count_the_seeds_chosen_apart_from_the_seeds_with_events():
    """The 7-of-8 of issue 45: ``ToyProbe.rows`` put the seeds with events under "seeds"."""
    rows = probe_toy(default_probe_config(task="tenplusten", seeds=8, objectives=("gspo_noclip",))).rows()
    equivalent = next(r for r in rows if r["events"] == "equivalent")
    assert (equivalent["seeds"], equivalent["seeds with events"]) == (8, 7)


def test_the_toy_task_changes_the_cross_term_across_prompts():
    at = _page()
    family = at.dataframe[0].value
    at.selectbox(key="drift_task").set_value("tenplusten").run()
    assert not at.exception
    tenplusten = at.dataframe[0].value
    assert not tenplusten.equals(family)
    at.multiselect(key="drift_objectives").set_value(["gspo"]).run()
    assert list(at.dataframe[0].value["objective"].unique()) == ["gspo"]


def test_a_step_that_moves_nothing_is_explained_by_the_clip_from_the_data():
    """gspo first on family: its K - 1 earlier steps leave every ratio outside GSPO's clip range, so gspo's and
    dfpo_min's rows are exactly 0 and their note says so with the loss core's clip fractions."""
    table = drift.toy_table("family", ("gspo", "dfpo_min", "gspo_noclip"), 2)
    by = {(r["objective"], r["events"]): r for r in table.rows}
    for label in ("gspo", "dfpo_min"):
        note = table.notes[int(by[(label, "shared")]["note"]) - 1]
        assert by[(label, "shared")]["measured"] == 0.0 and note.startswith(f"{label}: every figure is exactly 0")
        assert "The clip is the cause, not cancellation" in note and "[1 - 0.0003, 1 + 0.0004]" in note
    assert by[("gspo_noclip", "shared")]["measured"] > 0 and by[("gspo_noclip", "shared")]["note"] == ""


@pytest.mark.parametrize("task,labels", [("family", ("gspo", "gspo_noclip", "dfpo_min")), ("tenplusten", ("dfpo_min", "grpo"))])
def test_the_rebuilt_probed_point_is_probe_toys(task, labels):
    """The page's note reads the coefficients of ``probed_point``: an objective's coefficients there are all 0 exactly
    when probe_toy's step moved none of its events (so the note cannot describe another point than the probe's)."""
    point = drift.probed_point(task, labels, 3)
    result = probe_toy(default_probe_config(task=task, objectives=labels, seeds=3))
    for label in labels:
        still = bool((point.coef[label] == 0).all())
        moved = [float(e.measured.abs().sum()) for e in result.shared[label] + result.pairs[label] if len(e)]
        assert still == (max(moved) == 0), label


def test_a_probe_folder_shows_its_tables_and_a_bad_one_one_sentence(tmp_path):
    (tmp_path / "good").mkdir()
    (tmp_path / "good" / "probe.json").write_text(json.dumps(_doc()))
    at = _page()
    at.text_input(key="drift_folder").set_value(str(tmp_path / "good")).run()
    assert not at.exception and len(at.dataframe) == 4
    verdicts = at.dataframe[2].value
    assert verdicts.loc[(verdicts["figure"] == "measured") & (verdicts["events"] == "shared"), "verdict"].item() == "reproduced"
    assert set(verdicts["events"]) == {"shared"}  # the document has no equivalent pair: no rows of None for them
    said = [e.value for e in [*at.info, *at.markdown] if "No equivalent pair for any objective" in e.value]
    assert len(said) == 1  # in the chart's place, once
    at.text_input(key="drift_folder").set_value(str(tmp_path / "missing")).run()
    assert not at.exception and "no probe\\.json in" in at.warning[0].value  # escaped: shown as text, not markup


def test_the_optimiser_state_is_shown_where_recorded_and_said_missing_where_not(tmp_path):
    for name, momentum in (("new", True), ("old", False)):
        (tmp_path / name).mkdir()
        (tmp_path / name / "probe.json").write_text(json.dumps(_doc(momentum=momentum)))
    at = _page()
    at.text_input(key="drift_folder").set_value(str(tmp_path / "new")).run()
    assert not at.exception
    frame = at.dataframe[1].value
    assert "momentum" in frame.columns and frame["momentum"].gt(0).all() and "not recorded" not in _notes(at)
    assert any(t["name"] == "momentum" for c in _charts(at) for t in c["data"])
    _every_blank_is_explained(at, frame)
    at.text_input(key="drift_folder").set_value(str(tmp_path / "old")).run()
    assert not at.exception
    frame = at.dataframe[1].value
    assert "momentum" not in frame.columns and "decay" not in frame.columns
    assert "momentum and decay: not recorded by this run" in _notes(at).replace("\\", "")
    assert not any(t["name"] == "momentum" for c in _charts(at) for t in c["data"])


def test_a_first_order_error_above_the_limit_is_flagged_next_to_the_table(tmp_path):
    (tmp_path / "probe.json").write_text(json.dumps(_doc(momentum=True, error_ratio=5.1)))
    at = _page()
    at.text_input(key="drift_folder").set_value(str(tmp_path)).run()
    assert not at.exception
    flags = [w.value.replace("\\", "") for w in at.warning]
    assert len(flags) == 2 and all("exceeds 0.5x the mean abs measured change on 3 of 3 seeds" in f for f in flags)
    assert flags[0].startswith("First-order error: under `gspo`")


def test_a_document_before_error_ratio_gets_it_from_error_and_measured():
    doc = _doc()
    table = drift.doc_table(doc)
    gspo = next(r for r in table.rows if r["objective"] == "gspo")
    assert gspo["error_ratio"] == pytest.approx(np.mean([0.01 / v for v in (1.0, 1.2, 0.9)])) and table.flags == []
    for r in [r for r in doc["records"] if "measured" in r]:
        r["error"] = 0.6 * r["measured"]  # past the limit on every seed: flagged from error / measured
    assert len(drift.doc_table(doc).flags) == 2


def test_a_kind_no_seed_had_is_left_out_with_a_sentence_and_a_missing_seed_is_named():
    doc = _doc()
    doc["records"] = [r for r in doc["records"] if not (r["objective"] == "dfpo_min" and r["seed"] == 1)]
    table = drift.doc_table(doc)
    assert {(r["objective"], r["events"]) for r in table.rows} == {("gspo", "shared"), ("dfpo_min", "shared")}
    assert table.left_out == [
        "No equivalent pair for any objective in any of the document's 3 seeds: "
        + drift.WHAT_EVENT["equivalent"]
        + "; so the equivalent rows are left out of the table and chart."
    ]
    dfpo = next(r for r in table.rows if r["objective"] == "dfpo_min")
    assert dfpo["seeds"] == 3 and dfpo["seeds with events"] == 2
    assert "no shared event in seed 1 of 3" in table.notes[int(dfpo["note"]) - 1]


def test_a_run_logging_drift_says_what_its_cross_holds():
    keys = {"new": {"drift/shared_cross", "drift/shared_momentum"}, "old": {"drift/shared_cross"}}
    notes = drift_notes(keys, ["drift/shared_cross"])
    assert notes[0].startswith("drift/shared_cross is this batch's part only") and notes[0].endswith("(new).")
    assert notes[1].startswith("old: no drift/shared_momentum recorded by this run")
    assert drift_notes(keys, ["reward/mean"]) == []


def test_the_runs_page_says_what_a_runs_drift_cross_holds(tmp_path, monkeypatch):
    for name, parts in (("before", ("cross",)), ("after", ("cross", "momentum", "decay"))):
        folder = tmp_path / name
        folder.mkdir()
        (folder / RunDir.CONFIG).write_text('seed = 0\n\n[objective]\nname = "gspo"\n')
        lines = [json.dumps({"step": i + 1, **{f"drift/shared_{p}": 0.1 * (i + 1) for p in parts}}) for i in range(3)]
        (folder / RunDir.METRICS).write_text("\n".join(lines) + "\n")
    monkeypatch.setenv(RUNS_ENV, str(tmp_path))
    at = AppTest.from_file(str(APP / "page_runs.py"), default_timeout=300).run()
    at.multiselect(key="runs_metrics").set_value(["drift/shared_cross"]).run()
    assert not at.exception
    captions = [c.value.replace("\\", "") for c in at.caption]
    assert any(c.startswith("drift/shared_cross is this batch's part only") and c.endswith("(after).") for c in captions)
    assert any(c.startswith("before: no drift/shared_momentum recorded by this run") for c in captions)


def test_a_folder_whose_json_is_not_a_probe_document_is_refused(tmp_path):
    (tmp_path / "probe.json").write_text(json.dumps({"records": []}))
    with pytest.raises(ValueError, match="lacks objectives, controls, seeds"):
        drift.read_probe_folder(tmp_path)
    (tmp_path / "probe.json").write_text("{not json")
    with pytest.raises(ValueError, match="is not JSON"):
        drift.read_probe_folder(tmp_path)


def test_the_explorer_navigates_to_the_drift_page():
    at = AppTest.from_file(str(APP / "main.py"), default_timeout=300).run()
    at.switch_page("page_drift.py").run()
    assert not at.exception, [e.value for e in at.exception]
    assert at.title[0].value == "Parameter-space drift"


def test_probe_folders_under_the_runs_folders_are_offered_and_open(tmp_path, monkeypatch):
    """Every folder holding a probe.json up to two levels under the app's runs folders is offered, and picking one
    shows its tables as typing its path does."""
    for name in ("probe-smollm2", "nested/probe-tiny"):
        (tmp_path / name).mkdir(parents=True)
        (tmp_path / name / "probe.json").write_text(json.dumps(_doc()))
    (tmp_path / "not-a-probe").mkdir()
    assert drift.probe_folders([tmp_path]) == [tmp_path / "nested" / "probe-tiny", tmp_path / "probe-smollm2"]
    monkeypatch.setenv(RUNS_ENV, str(tmp_path))
    at = _page()
    assert at.selectbox(key="drift_found").options == ["(none)", str(tmp_path / "nested" / "probe-tiny"), str(tmp_path / "probe-smollm2")]
    at.selectbox(key="drift_found").set_value(str(tmp_path / "probe-smollm2")).run()
    assert not at.exception and len(at.dataframe) == 4


def _across(zero_first: bool = True) -> dict:
    steps = [
        {"step": 1, "shared_found": 4.0, "shared_direct": 0.0 if zero_first else 0.01, "shared_momentum": 0.0, "shared_measured": 0.0},
        {"step": 3, "shared_found": 11.0, "shared_direct": 0.004, "shared_momentum": 0.03, "shared_measured": 0.03},
    ]
    return {"command": "dfpo train --config configs/smollm2-cpu.toml", "runs": {"gspo": {"seed": 7000, "steps": steps}}}


def test_the_documents_docs_probe_stores_are_offered_and_open(tmp_path, monkeypatch):
    """A checkout's stored probe documents open as a probe folder does, and a stored log.param_drift document shows its
    generated sentence and one part per objective across training, with every point a log axis cannot draw named."""
    (tmp_path / "smollm2-discovery.json").write_text(json.dumps(_doc()))
    (tmp_path / "smollm2-drift.json").write_text(json.dumps(_across()))
    (tmp_path / "other.json").write_text(json.dumps({"not": "a probe"}))
    (tmp_path / "broken.json").write_text("{")
    assert drift.stored_documents(tmp_path) == ([tmp_path / "smollm2-discovery.json"], [tmp_path / "smollm2-drift.json"])
    monkeypatch.setattr(drift, "STORED", tmp_path)
    monkeypatch.setenv(RUNS_ENV, str(tmp_path / "no-runs"))
    at = _page()
    assert at.selectbox(key="drift_found").options == ["(none)", str(tmp_path / "smollm2-discovery.json")]
    plain = lambda: re.sub(r"\\(.)", r"\1", _notes(at))  # noqa: E731  the page's text with markdown_text's escapes undone
    assert "found a median of 7.5 shared events a probed step" in plain() and "Trained by: dfpo train --config" in plain()
    at.selectbox(key="drift_across_part").set_value("direct").run()
    assert not at.exception and _ys(_charts(at)[-1]) == [0.004]
    assert "Not drawn (0 or not logged, which a log axis cannot show): gspo step 1." in plain()
    at.selectbox(key="drift_found").set_value(str(tmp_path / "smollm2-discovery.json")).run()
    assert not at.exception and len(at.dataframe) == 4


def test_a_stored_drift_document_that_is_not_one_is_one_sentence(tmp_path):
    bad = _across()
    bad["runs"]["gspo"]["steps"][0]["step"] = "one"
    (tmp_path / "x.json").write_text(json.dumps(bad))
    with pytest.raises(ValueError, match=r"x\.json is not a stored log\.param_drift document"):
        drift.read_across(tmp_path / "x.json")
