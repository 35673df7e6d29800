"""`dfpo train --set objective.name=LABEL` end to end (issue 57): the run trains the label's objective, and its
folder records the label: config.toml spelled out (preset and overrides), the mark's identity and summary.json."""

from __future__ import annotations

import json
import sys
import tomllib
from pathlib import Path

import pytest

from dfpo.cli import main
from dfpo.trainer.run.folder import read_mark
from dfpo.trainer.run.layout import RunDir

sys.path.insert(0, str(Path(__file__).parent))
from test_llm_e2e import TINY  # noqa: E402

LABEL = "dfpo_min:stopgrad=score"


@pytest.mark.slow  # 19 s on the shared 2-core machine: one whole dfpo train process (the label's parts are fast tests)
def test_dfpo_train_with_a_label_as_objective_name_trains_it_and_records_it(tmp_path, capsys):
    run = tmp_path / "run"
    sets = [*TINY, "train.steps=1", "eval.every=0", f"objective.name={LABEL}", f"run_dir={run}"]
    assert main(["train", "--quiet", *[arg for s in sets for arg in ("--set", s)]]) == 0
    summary = json.loads((run / RunDir.SUMMARY).read_text())
    assert summary["objective"] == LABEL and summary["steps"] == 1
    objective = tomllib.loads((run / RunDir.CONFIG).read_text())["objective"]
    assert objective == {"name": "dfpo_min", "overrides": {"stopgrad": "score"}}
    assert read_mark(run)["identity"]["objective"] == LABEL
    assert "Traceback" not in capsys.readouterr().err
