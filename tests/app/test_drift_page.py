"""The drift page: the toy's inputs change what it shows, a probe folder's tables appear, a bad folder is one sentence."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

pytest.importorskip("streamlit")
from streamlit.testing.v1 import AppTest  # noqa: E402

from dfpo.app import drift  # noqa: E402

APP = Path(__file__).resolve().parents[2] / "app"


def _page() -> AppTest:
    at = AppTest.from_file(str(APP / "page_drift.py"), default_timeout=300)
    at.session_state["drift_seeds"] = 2.0
    at.run()
    assert not at.exception, [e.value for e in at.exception]
    return at


def _doc() -> dict:
    records = [
        {
            "seed": s,
            "objective": o,
            "kind": "shared",
            "events": 3,
            "coef": 0.1,
            "direct": 0.1,
            "cross": v,
            "measured": v,
            "cross_share": 0.9,
        }
        for o, vals in (("gspo", [1.0, 1.2, 0.9]), ("dfpo_min", [0.5, 0.6, 0.4]))
        for s, v in enumerate(vals)
    ]
    return {"objectives": ["gspo", "dfpo_min"], "controls": {"dfpo_min": "gspo"}, "seeds": [0, 1, 2], "records": records}


def test_the_toy_task_changes_the_cross_term_across_prompts():
    at = _page()
    tenplusten = at.dataframe[0].value
    at.selectbox(key="drift_task").set_value("family").run()
    assert not at.exception
    family = at.dataframe[0].value
    assert not tenplusten.equals(family)
    at.multiselect(key="drift_objectives").set_value(["gspo"]).run()
    assert list(at.dataframe[0].value["objective"].unique()) == ["gspo"]


def test_a_probe_folder_shows_its_tables_and_a_bad_one_one_sentence(tmp_path):
    (tmp_path / "good").mkdir()
    (tmp_path / "good" / "probe.json").write_text(json.dumps(_doc()))
    at = _page()
    at.text_input(key="drift_folder").set_value(str(tmp_path / "good")).run()
    assert not at.exception and len(at.dataframe) == 4
    verdicts = at.dataframe[2].value
    assert verdicts.loc[(verdicts["figure"] == "measured") & (verdicts["events"] == "shared"), "verdict"].item() == "reproduced"
    at.text_input(key="drift_folder").set_value(str(tmp_path / "missing")).run()
    assert not at.exception and "no probe\\.json in" in at.warning[0].value  # escaped: shown as text, not markup


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
