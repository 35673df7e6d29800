"""``dfpo train --resume`` of a finished run changes no figure (issue 57, item 3).

Before: the refusal to start over a finished run advises ``--resume``, which then ran 0 steps and rewrote summary.json
(cpu_s_process 18.8 -> 5.6, wall_s_training_loop 11.2 -> 0.07); with train.save_final = false it would even have
trained every step since the last checkpoint again. Now it says so in one line and exits 0, touching nothing, as a
job script that resumes whatever it finds needs (a TRL/transformers ``Trainer`` resumed at its last step raises no
error either); ``--set train.steps=N`` with N larger still extends the run.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

from dfpo.cli import main
from dfpo.trainer.run.layout import RunDir
from dfpo.trainer.run.resume import finished_run_message
from dfpo.trainer.train import Trainer

sys.path.insert(0, str(Path(__file__).parent))
from test_llm_e2e import tiny_config  # noqa: E402


def _tree(folder: Path) -> dict[str, tuple[bytes, int]]:
    """Every file under ``folder`` with its bytes and modification time."""
    return {str(p.relative_to(folder)): (p.read_bytes(), p.stat().st_mtime_ns) for p in sorted(folder.rglob("*")) if p.is_file()}


@pytest.mark.parametrize(
    "extra",
    [(), ("train.save_every=1000", "train.save_final=false")],
    ids=["checkpoint-at-the-last-step", "checkpoint-at-step-0-only"],
)
def test_resume_of_a_finished_run_says_so_in_one_line_exits_0_and_touches_nothing(tmp_path, capsys, extra):
    """With its checkpoint at step 0 only (train.save_final = false), a resume would have trained both steps again,
    cutting the logs back to step 0 first; with the last step's, it ran no step and rewrote summary.json."""
    Trainer(tiny_config(tmp_path, *extra), quiet=True).run()
    run = tmp_path / "run"
    capsys.readouterr()
    before = _tree(run)
    assert main(["train", "--resume", str(run)]) == 0
    out, err = capsys.readouterr()
    assert out == ""
    assert err.splitlines() == [
        f"dfpo: --resume {run}: the run already finished its 2 steps, so nothing was trained and {run / RunDir.SUMMARY} is as "
        f"it was; to train it further: dfpo train --resume {run} --set train.steps=N (N > 2)"
    ]
    assert _tree(run) == before


def test_the_trainer_refuses_to_resume_a_finished_run_before_touching_it(tmp_path):
    Trainer(tiny_config(tmp_path), quiet=True).run()
    run = tmp_path / "run"
    before = _tree(run)
    with pytest.raises(ValueError, match="already finished its 2 steps"):
        Trainer(tiny_config(tmp_path), resume=True, quiet=True)
    assert _tree(run) == before


def test_a_finished_run_given_more_steps_still_resumes(tmp_path, capsys):
    Trainer(tiny_config(tmp_path), quiet=True).run()
    run = tmp_path / "run"
    assert main(["train", "--quiet", "--resume", str(run), "--set", "train.steps=3"]) == 0
    assert json.loads((run / RunDir.SUMMARY).read_text())["steps"] == 3


@pytest.mark.parametrize(
    "summary",
    [None, "", "{torn", "[1]", '{"steps": true}', '{"steps": 0}', '{"steps": "1"}'],
    ids=["none", "empty", "torn", "not-an-object", "a-bool", "fewer-steps", "a-string"],
)
def test_only_a_summary_of_exactly_those_steps_makes_a_run_finished(tmp_path, summary):
    """A run without a readable summary.json of ``steps`` steps has work left: the resume goes ahead as before (true
    is not the number 1 here, though Python says True == 1)."""
    if summary is not None:
        (tmp_path / RunDir.SUMMARY).write_text(summary)
    assert finished_run_message(tmp_path, 1) is None
    (tmp_path / RunDir.SUMMARY).write_text('{"steps": 1}')
    assert finished_run_message(tmp_path, 1) is not None


def test_a_checkpoint_of_an_older_dfpo_resumes_where_each_new_setting_holds_its_default(tmp_path):
    """A checkpoint written before eval.greedy existed resumes at eval.greedy's default, and is refused naming it
    when config.toml asks it on."""
    import dataclasses

    from dfpo.trainer.config import Config, config_to_dict
    from dfpo.trainer.run.resume import check_same_config

    saved = config_to_dict(Config())
    del saved["eval"]["greedy"]
    check_same_config(tmp_path, saved, Config())
    on = dataclasses.replace(Config(), eval=dataclasses.replace(Config().eval, greedy=True))
    with pytest.raises(ValueError, match=r"eval\.greedy \(None in the checkpoint, True in config\.toml\)"):
        check_same_config(tmp_path, saved, on)
