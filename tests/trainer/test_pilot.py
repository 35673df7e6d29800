"""`dfpo pilot` (issue 58): four gates read from a control run's logs (pass@1 in [0.15, 0.5], template share >= 0.5,
whole-group shared positions >= 8 a step, weight spread >= 1e-2 with 4 optimiser steps per rollout); a gate whose
metric was not logged says "not measured" and does not pass; the result is stored as JSON and shown as markdown."""

from __future__ import annotations

import json
import statistics
from types import SimpleNamespace

import pytest
from tiny_run import FORMAT_REWARD_SETS, TEMPLATE_TASK_SETS

from dfpo.trainer import pilot
from dfpo.trainer.config import apply_overrides, config_from_dict

pytestmark = pytest.mark.usefixtures("one_thread")


def _evals(avg=0.3, template=0.9):
    row = {"step": 0, "eval/avg@2": avg, "eval/pass@2": 0.5}
    if template is not None:
        row["eval/template"] = template
    return [row, {"step": 5, "eval/avg@2": 0.9, "eval/template": 0.1}]


def _metrics(shared=(9, 10, 8, 12, 11), spread=(0.02, 0.03, 0.01, 0.05, 0.04), key="shared/whole_group_positions"):
    rows = [{"step": s + 1, key: v, "weights/spread": w} for s, (v, w) in enumerate(zip(shared, spread))]
    return rows + [{"step": 6, key: 0, "weights/spread": 0.0}]  # a step after the fifth is not read


def _verdicts(evals, metrics):
    return [g.verdict for g in pilot.gates(evals, metrics)]


def test_a_recipe_that_meets_every_bound_passes_all_four():
    found = pilot.gates(_evals(), _metrics())
    assert [g.verdict for g in found] == ["pass"] * 4
    assert [g.value for g in found] == [0.3, 0.9, 10, 0.03]  # medians over steps 1-5 only
    assert found[0].key == "eval/avg@2" and found[2].key == "shared/whole_group_positions"


@pytest.mark.parametrize("avg, verdict", [(0.15, "pass"), (0.5, "pass"), (0.149, "fail"), (0.51, "fail"), (0.0, "fail"), (1.0, "fail")])
def test_pass_at_1_must_lie_in_its_closed_interval(avg, verdict):
    assert _verdicts(_evals(avg=avg), _metrics())[0] == verdict


def test_each_lower_bound_is_inclusive_and_a_value_under_it_fails():
    assert _verdicts(_evals(template=0.5), _metrics())[1] == "pass"
    assert _verdicts(_evals(template=0.49), _metrics())[1] == "fail"
    assert _verdicts(_evals(), _metrics(shared=(8, 8, 7, 9, 8)))[2] == "pass"
    assert _verdicts(_evals(), _metrics(shared=(0, 9, 7, 9, 7)))[2] == "fail"  # median 7
    assert _verdicts(_evals(), _metrics(spread=(0.0, 0.01, 0.01, 0.2, 0.0)))[3] == "pass"
    assert _verdicts(_evals(), _metrics(spread=(0.0, 0.009, 0.02, 0.2, 0.0)))[3] == "fail"


def test_a_metric_that_was_not_logged_is_not_measured_never_a_number():
    """No eval/template (a task without a template), no whole-group count and no weights/spread in the log, no
    step-0 evaluation: each gate says why in one sentence, holds no value, and the recipe does not pass."""
    found = pilot.gates(_evals(template=None), [{"step": s} for s in range(1, 6)])
    assert [g.verdict for g in found] == ["pass", "not measured", "not measured", "not measured"]
    assert all(g.value is None for g in found[1:])
    assert found[1].sentence() == (
        "template share: not measured (the step-0 evaluation holds no eval/template: the task has no answer template "
        "(data.task = 'sum_template' has))."
    )
    assert found[2].sentence() == (
        "whole-group shared positions a step: not measured (no step 1-5 of the control run logged "
        "shared/whole_group_positions or diag/shared_positions)."
    )
    assert found[3].why_unmeasured == "no step 1-5 of the control run logged weights/spread"
    none = pilot.gates([], [])
    assert none[0].verdict == "not measured" and "no step-0 evaluation" in none[0].sentence()
    assert pilot.gates([{"step": 0, "eval/avg@2": float("nan")}], [])[0].verdict == "not measured"


def test_the_shared_gate_reads_the_loss_cores_count_first_then_the_trainers_diagnostic():
    both = [r | {"diag/shared_positions": 0} for r in _metrics()]
    assert pilot.gates(_evals(), both)[2].key == "shared/whole_group_positions"
    only_diag = _metrics(key="diag/shared_positions")
    gate = pilot.gates(_evals(), only_diag)[2]
    assert (gate.key, gate.value, gate.verdict) == ("diag/shared_positions", 10, "pass")


def _config(*sets):
    return config_from_dict(apply_overrides({}, list(sets)))


def test_the_pilot_refuses_a_recipe_without_4_optimiser_steps_per_rollout_in_one_sentence():
    with pytest.raises(ValueError, match=r"prompts_per_step=8 / optim.minibatch_groups=1 gives 8; set optim.minibatch_groups=2$"):
        pilot.check_pilot_config(_config("rollout.prompts_per_step=8", "optim.minibatch_groups=1"))
    with pytest.raises(ValueError, match=r"gives 2; choose rollout.prompts_per_step and optim.minibatch_groups so that they give 4$"):
        pilot.check_pilot_config(_config("rollout.prompts_per_step=6", "optim.minibatch_groups=3"))
    pilot.check_pilot_config(_config("rollout.prompts_per_step=4", "optim.minibatch_groups=1"))
    pilot.check_pilot_config(_config("rollout.prompts_per_step=4", "optim.minibatch_groups=2", "optim.epochs=2"))


def test_the_table_names_each_gate_and_the_decision():
    cfg = _config("objective.name=gspo", "rollout.prompts_per_step=4", "optim.minibatch_groups=1")
    result = pilot.pilot_result(cfg, _evals(template=None), _metrics(), None)
    table = pilot.pilot_table(result)
    assert "| template share | not measured | >= 0.5 | `eval/template` | not measured |" in table
    assert "| pass@1 | 0.3 | in [0.15, 0.5] | `eval/avg@2` | pass |" in table
    assert table.splitlines()[0] == "Pilot of gspo (5 steps, 4 optimiser steps per rollout):"
    assert table.splitlines()[-1] == "Not usable for a comparison: template share did not pass."
    assert not result["passed"]
    assert pilot.pilot_table(pilot.pilot_result(cfg, _evals(), _metrics(), None)).endswith(
        "All four gates pass: the recipe may be used for a comparison."
    )
    json.dumps(result)  # stored as JSON as it is


def test_a_stored_pilot_that_is_not_one_is_refused_in_one_sentence(tmp_path):
    for text, why in (("{", "not a readable JSON file"), ('{"gates": [1]}', "not a pilot result"), ("[]", "not a pilot result")):
        path = tmp_path / "p.json"
        path.write_text(text)
        with pytest.raises(ValueError, match=why):
            pilot.read_pilot(path)
    with pytest.raises(ValueError, match="no such file"):
        pilot.read_pilot(tmp_path / "missing.json")


def test_show_trains_nothing_and_refuses_training_flags():
    args = SimpleNamespace(show="x.json", config="c.toml", set=None, objective=None, out="runs/pilot")
    with pytest.raises(ValueError, match="--show prints a stored pilot and trains nothing; drop --config"):
        pilot.pilot_command(args)
    with pytest.raises(ValueError, match="dfpo pilot needs --config FILE"):
        pilot.pilot_command(SimpleNamespace(show=None, config=None, set=None, objective=None, out="runs/pilot"))


SETS = [
    *TEMPLATE_TASK_SETS,
    "warmup.steps=2",
    "warmup.batch_size=4",
    "rollout.prompts_per_step=4",
    "rollout.group_size=4",
    "rollout.max_new_tokens=4",
    *FORMAT_REWARD_SETS,
    "optim.minibatch_groups=1",
    "eval.k=2",
    "log.tensorboard=false",
    "threads=1",
]


def test_dfpo_pilot_trains_the_control_five_steps_and_stores_and_shows_its_gates(tmp_path, capsys):
    """On the tiny model: OUT/control holds 5 steps evaluated at steps 0 and 5, OUT/pilot.json the four gates read
    from its logs (pass@1 and the template share of the step-0 eval, the medians of steps 1-5), the exit status says
    whether all four pass, and --show prints the same table from the file."""
    from dfpo.cli import main

    config = tmp_path / "recipe.toml"
    config.write_text("")
    out = tmp_path / "pilot"
    args = ["pilot", "--config", str(config), "--out", str(out), "--objective", "gspo"]
    for s in [*SETS, f'warmup.cache_dir="{tmp_path / "cache"}"', "train.steps=50"]:  # the pilot's own steps win
        args += ["--set", s]
    status = main(args)
    printed = capsys.readouterr().out
    result = json.loads((out / pilot.PILOT_FILE).read_text())
    assert status == (0 if result["passed"] else 1)
    assert result["objective"] == "gspo" and result["steps"] == 5 and result["updates_per_rollout"] == 4
    assert result["warmup_folder"] and result["warmup_folder"].startswith(str(tmp_path / "cache"))
    evals = [json.loads(line) for line in (out / "control" / "eval.jsonl").read_text().splitlines()]
    metrics = [json.loads(line) for line in (out / "control" / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in evals] == [0, 5] and [r["step"] for r in metrics] == [1, 2, 3, 4, 5]
    by_name = {g["name"]: g for g in result["gates"]}
    assert by_name["pass@1"]["value"] == evals[0]["eval/avg@2"]
    assert by_name["template share"]["value"] == evals[0]["eval/template"]
    for name, key in (
        ("weight spread in a group", "weights/spread"),
        ("whole-group shared positions a step", by_name["whole-group shared positions a step"]["key"]),
    ):
        logged = [r[key] for r in metrics if key in r]  # read from the log as it is: a median, or not measured
        assert by_name[name]["value"] == (statistics.median(logged) if logged else None), name
    assert printed.strip() == pilot.pilot_table(result)
    assert main(["pilot", "--show", str(out / pilot.PILOT_FILE)]) == 0
    assert capsys.readouterr().out.strip() == pilot.pilot_table(result)


def test_the_gates_on_the_control_cells_count_each_gate_over_the_cells_actually_run():
    """gates_over_cells: each gate read per cell as the pilot reads its run; passed and measured counted over the cells,
    the median over the measured ones; a cell that logged no step-0 eval is not measured there, never a number."""
    cells = [
        (_evals(avg=0.3), _metrics()),
        (_evals(avg=0.6), _metrics(shared=(2, 3, 4, 5, 6))),
        ([], _metrics(spread=(0.001,) * 5)),
    ]
    summary = {g["name"]: g for g in pilot.gates_over_cells(cells)}
    assert summary["pass@1"] == {
        "name": "pass@1",
        "bound": "in [0.15, 0.5]",
        "cells": 3,
        "measured": 2,
        "passed": 1,
        "median": pytest.approx(0.45),
    }
    shared = summary["whole-group shared positions a step"]
    assert (shared["passed"], shared["measured"], shared["median"]) == (2, 3, 10)
    spread = summary["weight spread in a group"]
    assert (spread["passed"], spread["median"]) == (2, 0.03)
    text = pilot.gates_sentence(list(summary.values()))
    assert "pass@1 in [0.15, 0.5] on 1 of 3 cells (median 0.45, not measured on 1)" in text
    assert "weight spread in a group >= 0.01 on 2 of 3 cells (median 0.03)" in text


def test_the_stored_experiment_reads_the_gates_from_the_control_its_pilot_trained(tmp_path):
    """scripts/attribution_data.py's control_gates: the cells of the stored pilot's objective (gspo_noclip for stage 1),
    each from its own eval.jsonl and metrics.jsonl; a seed with no cell is counted and not measured."""
    from script_modules import load_script

    data = load_script("scripts/attribution_data.py")
    cell = tmp_path / "gspo_noclip" / "seed0"
    cell.mkdir(parents=True)
    (cell / "eval.jsonl").write_text("\n".join(json.dumps(r) for r in _evals()) + "\n")
    (cell / "metrics.jsonl").write_text("\n".join(json.dumps(r) for r in _metrics()) + "\n")
    (tmp_path / "gspo_noclip__cancel-shared_whole" / "seed0").mkdir(parents=True)  # the other arm: never read
    reg = SimpleNamespace(pilot="docs/pilot/smollm2-template-stage1.json")
    summary = data.control_gates(reg, tmp_path, [0, 1])
    assert [(g["cells"], g["measured"], g["passed"]) for g in summary] == [(2, 1, 1)] * 4
