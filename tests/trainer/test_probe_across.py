"""log.param_drift across training, stored: the store keeps every probed step of a real run, and the sentence and the
figure are generated from the store alone."""

from __future__ import annotations

import json

import pytest
from test_llm_e2e import tiny_config

from dfpo.trainer.probe import across
from dfpo.trainer.run.layout import RunDir
from dfpo.trainer.train import Trainer


@pytest.fixture(scope="module")
def drift_runs(tmp_path_factory):
    """Two tiny runs (grpo, dfpo_min:stopgrad=score) of 3 steps, probed at steps 1 and 2."""
    out = []
    for name, extra in (("grpo", ()), ("dfpo_min", ("objective.overrides.stopgrad=score",))):
        folder = tmp_path_factory.mktemp(name)
        sets = ("train.steps=3", "log.param_drift=true", "log.param_drift_every=2", f"objective.name={name}", *extra)
        Trainer(tiny_config(folder, *sets), quiet=True).run()
        out.append(folder / "run")
    return out


def test_the_store_keeps_the_probed_steps_of_each_run_under_its_objective_label(drift_runs):
    doc = across.store(drift_runs, "dfpo train ...")
    assert list(doc["runs"]) == ["grpo", "dfpo_min:stopgrad=score"] and doc["command"] == "dfpo train ..."
    logged = [json.loads(line) for line in RunDir(drift_runs[0]).metrics.read_text().splitlines()]
    probed = [r["step"] for r in logged if "drift/shared_found" in r]
    assert [row["step"] for row in doc["runs"]["grpo"]["steps"]] == probed == [1, 2]
    first = next(r for r in logged if r["step"] == 1)
    assert doc["runs"]["grpo"]["steps"][0]["shared_found"] == first["drift/shared_found"]


def test_the_sentence_and_the_figure_come_from_the_stored_document(drift_runs, tmp_path):
    doc = json.loads(json.dumps(across.store(drift_runs, "cmd")))  # what a reader gets back from the JSON file
    found = across.found_per_step(doc)
    text = across.summary_sentence(doc)
    assert text.startswith(
        "`log.param_drift` in 2 training runs, one seed an objective (seed 0: no interval over seeds; `grpo`, "
        "`dfpo_min:stopgrad=score`; probed at steps 1, 2)"
    )
    assert f"(min {min(found):g}, max {max(found):g}, 4 probed steps)" in text
    across.plot(doc, tmp_path / "drift.png")
    assert (tmp_path / "drift.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_a_run_trained_without_param_drift_is_one_sentence(tmp_path, capsys):
    Trainer(tiny_config(tmp_path, "train.steps=1"), quiet=True).run()
    assert across.main(["store", str(tmp_path / "run"), "--command", "x", "--out", str(tmp_path / "d.json")]) == 2
    err = capsys.readouterr().err
    assert "no probed step" in err and "log.param_drift=true" in err and "Traceback" not in err
    assert not (tmp_path / "d.json").exists()
