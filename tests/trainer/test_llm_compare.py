"""``dfpo compare``: paired seeds on the LLM trainer, statistics by hand, matched-control flags,
per-seed output, warnings, and resuming without deleting anything."""

from __future__ import annotations

import hashlib
import json
import math
import os
import shlex
import sys
from pathlib import Path

import pytest
import torch

from dfpo.cli import main
from dfpo.trainer import compare as C
from dfpo.trainer.compare import make_plan, read_run, run_dir, train_command
from dfpo.trainer.compare_report import pair_intervals, paired_table
from dfpo.trainer.config import config_to_dict, config_to_toml
from dfpo.trainer.run.folder import run_identity, write_mark
from dfpo.trainer.run.layout import RunDir

sys.path.insert(0, str(Path(__file__).parent))
from test_llm_resume import SETS  # noqa: E402


def _write_run(path, eval_avg, rewards, steps_to_kappa, clip=(0.1, 0.2), asym=0.5):
    path.mkdir(parents=True)
    summary = {
        "final_eval": {"step": len(rewards), "eval/avg@4": eval_avg, "eval/pass@4": 1.0},
        "reward/steps_to_kappa_ma10": steps_to_kappa,
    }
    (path / RunDir.SUMMARY).write_text(json.dumps(summary))
    rows = [
        {"step": i + 1, "reward/mean": r, "clip/frac_low": clip[0], "clip/frac_high": clip[1], "weights/asym": asym}
        for i, r in enumerate(rewards)
    ]
    (path / RunDir.METRICS).write_text("\n".join(json.dumps(r) for r in rows) + "\n")


def test_read_run_takes_the_final_eval_the_last_ten_rewards_and_censors_steps(tmp_path):
    rewards = [0.0] * 5 + [0.1 * i for i in range(10)]  # last ten: 0.0 .. 0.9, mean 0.45
    _write_run(tmp_path / "a", 0.375, rewards, None, clip=(0.1, 0.25), asym=0.5)
    rec = read_run(tmp_path / "a")
    nan = float("nan")
    expected = {"eval": 0.375, "reward_last10": 0.45, "steps_to_kappa": 16.0, "kappa_reached": 0.0, "clip_frac": 0.35, "asym": 0.5}
    expected |= {"jitter2": nan, "entropy_last10": nan, "residual": nan}  # not in these logs: n/a, never 0
    expected |= {"tax_kl": nan, "equiv_entropy": nan, "shared_events": nan, "residual_length": nan, "cpu_s": nan, "update_norm": nan}
    expected |= {"reward_rise5": 0.7}  # last five 0.5 .. 0.9 (mean 0.7) minus the first five 0.0
    expected |= {"template_kl": nan, "greedy_eval": nan, "shared_whole": nan, "residual_whole": nan, "weights_spread": nan}
    expected |= {"coef_whole": nan}
    assert rec == pytest.approx(expected, nan_ok=True)  # censored: the run's 15 steps + 1, a lower bound


def test_read_run_takes_the_template_tax_the_greedy_eval_and_the_whole_group_diagnostics(tmp_path):
    """The final eval's eval/template_kl and eval/greedy_acc; diag/shared_positions, diag/shared_residual_whole and
    weights/spread averaged over the steps that logged them (issue 58's stage-1 outcomes)."""
    _write_run(tmp_path / "a", 0.5, [0.5] * 4, 3)
    summary = json.loads((tmp_path / "a" / RunDir.SUMMARY).read_text())
    summary["final_eval"] |= {"eval/template_kl": 0.004, "eval/greedy_acc": 0.3125}
    (tmp_path / "a" / RunDir.SUMMARY).write_text(json.dumps(summary))
    rows = [json.loads(line) for line in (tmp_path / "a" / RunDir.METRICS).read_text().splitlines()]
    for i, r in enumerate(rows):
        r["diag/shared_positions"] = 8 + i
        r["weights/spread"] = 0.01 * (i + 1)
        r["diag/shared_coef_whole"] = 0.0 if i else 2.0
        if i < 2:
            r["diag/shared_residual_whole"] = 0.5 * i
    (tmp_path / "a" / RunDir.METRICS).write_text("\n".join(json.dumps(r) for r in rows) + "\n")
    rec = read_run(tmp_path / "a")
    assert (rec["template_kl"], rec["greedy_eval"]) == (0.004, 0.3125)
    assert rec["shared_whole"] == pytest.approx(9.5) and rec["residual_whole"] == pytest.approx(0.25)
    assert rec["weights_spread"] == pytest.approx(0.025) and rec["coef_whole"] == pytest.approx(0.5)


def test_the_reward_rise_needs_two_windows_that_do_not_overlap():
    rows = [{"reward/mean": r} for r in (0.0, 0.2, 0.4, 0.6, 0.8, 1.0)]
    assert C.reward_rise(rows, 3) == pytest.approx(0.6) and math.isnan(C.reward_rise(rows[:5], 3))


def test_read_run_takes_the_tax_the_equivalent_answers_entropy_the_events_the_length_part_and_cpu_time(tmp_path):
    """The final eval's tax_kl; forms/equiv_entropy over the last 10 steps that logged it; diag/shared_events and
    diag/shared_residual_length over the steps that logged them; the summary's cpu_s_process."""
    _write_run(tmp_path / "a", 0.5, [0.5] * 12, 3)
    summary = json.loads((tmp_path / "a" / RunDir.SUMMARY).read_text())
    summary["final_eval"]["eval/tax_kl"] = 0.0125
    summary["cpu_s_process"] = 321.5
    (tmp_path / "a" / RunDir.SUMMARY).write_text(json.dumps(summary))
    rows = [json.loads(line) for line in (tmp_path / "a" / RunDir.METRICS).read_text().splitlines()]
    for i, r in enumerate(rows):  # steps 1..12: equiv entropy i on every step but the 12th; events on odd steps
        if i < 11:
            r["forms/equiv_entropy"] = float(i)
        if i % 2 == 0:
            r["diag/shared_events"] = i
            r["diag/shared_residual_length"] = 0.01 * i
    (tmp_path / "a" / RunDir.METRICS).write_text("\n".join(json.dumps(r) for r in rows) + "\n")
    rec = read_run(tmp_path / "a")
    assert rec["tax_kl"] == 0.0125 and rec["cpu_s"] == 321.5
    assert rec["equiv_entropy"] == pytest.approx(sum(range(2, 11)) / 9)  # steps 3..11 of the last ten (3..12)
    assert rec["shared_events"] == pytest.approx(5.0) and rec["residual_length"] == pytest.approx(0.05)  # i = 0, 2, .., 10


def test_paired_table_reports_the_mean_paired_difference_and_its_adjusted_t_interval():
    base = {s: {"eval": 0.30 + 0.01 * s, "reward_last10": 0.5, "steps_to_kappa": 50.0, "clip_frac": 0.2, "asym": 1.0} for s in range(4)}
    diffs = [0.02, 0.04, 0.00, 0.02]  # mean 0.02, sd 0.01633, every seed's own baseline subtracted
    method = {s: dict(base[s], eval=base[s]["eval"] + d) for s, d in enumerate(diffs)}
    records = {"gspo": base, "dfpo_min": method}
    pairs = [("dfpo_min", "gspo")]
    table = paired_table(records, pairs, {"dfpo_min - gspo": []}, pair_intervals(records, pairs))
    (line,) = [x for x in table if x.startswith("| dfpo_min")]
    # 5 intervals (the outcomes these records hold): each at level 1 - 0.05/5, t_{0.995, 3} = 5.841, half width 0.0477
    assert "| +0.020 [-0.028, +0.068] |" in line and "| yes |" in line
    assert line.count("+0.000 [+0.000, +0.000]") == 2  # reward and clip fraction: no difference
    # outcomes no record holds (a comparison stored before they existed) get no column; one held as NaN reads n/a
    assert line.count("|") == 5 + 3 and "n/a" not in line
    with_nan = {label: {s: dict(r, tax_kl=math.nan) for s, r in by_seed.items()} for label, by_seed in records.items()}
    (line,) = [
        x for x in paired_table(with_nan, pairs, {"dfpo_min - gspo": []}, pair_intervals(with_nan, pairs)) if x.startswith("| dfpo_min")
    ]
    assert line.count("| n/a ") == 1
    assert pair_intervals(records, pairs)[("dfpo_min", "gspo", "eval")].tests == 5
    # steps: a sign test of 4 pairs reaches no level 0.99, and the cell says so instead of printing [-inf, inf]
    assert "| median +0.0, no interval (n = 4 seeds: a sign-test interval of the median at level 0.99 needs >= 8) |" in line


def test_an_unmatched_pair_is_flagged_with_the_components_that_differ():
    base = {s: {"eval": 0.3, "reward_last10": 0.5, "steps_to_kappa": 50.0, "clip_frac": 0.2, "asym": 1.0} for s in range(3)}
    records = {"gspo": base, "dfpo_min:stopgrad=score": base}
    pairs = [("dfpo_min:stopgrad=score", "gspo")]
    matched = {"dfpo_min:stopgrad=score - gspo": ["clip", "eps_low", "eps_high"]}
    lines = paired_table(records, pairs, matched, pair_intervals(records, pairs))
    assert "| NO: differs in clip, eps_low, eps_high |" in lines[-1]
    plan = make_plan("gspo,dfpo_min:stopgrad=score,gspo@lr=0.001", None, 2, 0, "configs/tiny-cpu.toml", [], "runs/x")
    assert C.matched_components(plan) == {
        "dfpo_min:stopgrad=score - gspo": ["clip", "eps_low", "eps_high"],
        "gspo@lr=0.001 - gspo": ["lr"],
    }


@pytest.mark.parametrize(
    "kwargs, message",
    [
        ({"objectives": "gspo"}, "at least two labels"),
        ({"objectives": "gspo,gspo"}, "repeats a label"),
        ({"objectives": "gspo,nope"}, "unknown objective='nope'"),
        ({"baseline": "grpo"}, "--baseline 'grpo' is not one of"),
        ({"seeds": 1}, "--seeds must be >= 2"),
        ({"sets": ["optim.lr"]}, "--set expects key=value"),
    ],
)
def test_bad_plans_fail_before_any_training(kwargs, message, tmp_path):
    args = {
        "objectives": "gspo,dfpo_min",
        "baseline": None,
        "seeds": 3,
        "first_seed": 0,
        "config": "configs/tiny-cpu.toml",
        "sets": [],
        "out": str(tmp_path),
    }
    args.update(kwargs)
    with pytest.raises(ValueError, match=message):
        make_plan(**args)


def test_a_label_becomes_objective_overrides_of_dfpo_train(tmp_path):
    plan = make_plan(
        "gspo_noclip,dfpo_min:stopgrad=score:length_aware=true", None, 2, 5, "configs/tiny-cpu.toml", ["train.steps=3"], str(tmp_path)
    )
    cmd = train_command(plan, "dfpo_min:stopgrad=score:length_aware=true", 6)
    sets = [cmd[i + 1] for i, x in enumerate(cmd) if x == "--set"]
    assert sets == [
        "train.steps=3",
        "seed=6",
        "objective.name=dfpo_min",
        f"run_dir={run_dir(plan, 'dfpo_min:stopgrad=score:length_aware=true', 6)}",
        "objective.overrides.stopgrad=score",
        "objective.overrides.length_aware=true",
    ]
    assert plan.seeds == (5, 6) and plan.baseline == "gspo_noclip"


@pytest.mark.slow
def test_end_to_end_two_seeds_write_the_table_and_the_plot_and_resume(tmp_path, capsys):
    out = tmp_path / "cmp"
    argv = [
        "compare",
        "--config",
        "configs/tiny-cpu.toml",
        "--objectives",
        "gspo,dfpo_min",
        "--seeds",
        "2",
        "--set",
        "train.steps=2",
        "--set",
        "model.sft_steps=2",
        "--set",
        "eval.every=2",
        "--set",
        "eval.k=2",
        "--out",
        str(out),
    ]
    assert main(argv) == 0
    text = (out / "compare.md").read_text()
    assert "| dfpo_min - gspo | yes |" in text and (out / "compare.png").stat().st_size > 1000
    assert "warning: only 2 paired seeds" in capsys.readouterr().err
    assert main(argv) == 0  # second time: every run is skipped
    assert capsys.readouterr().out.count("done before, skipped") == 4


# ----- per-seed output, warnings, resuming (fake finished runs: no training) -----


def _fake_plan(tmp_path, seeds=3, labels="gspo,dfpo_min"):
    return make_plan(labels, None, seeds, 10, "configs/tiny-cpu.toml", [], str(tmp_path / "cmp"))


def _mark_as(plan, path, label, seed):
    """The mark and config.toml dfpo train leaves in a run folder: the identity and the settings of the run of
    ``label`` and ``seed`` under ``plan``."""
    config = C.run_config(plan, label, seed)
    write_mark(path, checkpointed=True, identity=run_identity(config_to_dict(config)))
    (path / RunDir.CONFIG).write_text(config_to_toml(config))


def _fake_runs(plan, reached=lambda label, seed: True):
    """Finished run folders for every (label, seed): eval 0.30 + 0.01 seed (+0.02 for dfpo_min), 20 steps."""
    for label in plan.labels:
        for s in plan.seeds:
            bump = 0.02 if label == "dfpo_min" else 0.0
            _write_run(run_dir(plan, label, s), 0.30 + 0.01 * (s - 10) + bump, [0.5] * 20, 12 if reached(label, s) else None)
            _mark_as(plan, run_dir(plan, label, s), label, s)


def test_compare_prints_every_seed_of_every_outcome_and_writes_per_seed_csv(tmp_path):
    plan = _fake_plan(tmp_path, seeds=8)
    _fake_runs(plan)
    warned = []
    text = C.compare(plan, progress=lambda _: None, warn=warned.append).read_text()
    assert warned == [] and "warning" not in text  # 8 seeds, every run reached kappa
    assert "final eval avg@k:" in text and "| seed | gspo | dfpo_min | dfpo_min - gspo |" in text
    assert "| 13 | 0.3300 | 0.3500 | +0.020 |" in text  # seed 13: its own values and its paired difference
    assert text.count("| 17 |") == len(C.OUTCOMES)  # one per-seed table per outcome
    rows = (plan.out / "per_seed.csv").read_text().splitlines()
    assert rows[0] == (
        "label,seed,eval,reward_last10,steps_to_kappa,jitter2,entropy_last10,residual,clip_frac,asym,"
        "tax_kl,equiv_entropy,shared_events,residual_length,update_norm,reward_rise5,cpu_s,"
        "template_kl,greedy_eval,shared_whole,residual_whole,coef_whole,weights_spread,kappa_reached"
    )
    assert (
        rows[1] == "gspo,10,0.3,0.5,12,nan,nan,nan,0.3,0.5,nan,nan,nan,nan,nan,0,nan,nan,nan,nan,nan,nan,nan,1" and len(rows) == 1 + 2 * 8
    )  # rise 0: flat rewards
    doc = json.loads((plan.out / "compare.json").read_text())  # what the page re-renders the tables from
    assert C.render_compare(doc) == text.splitlines()[: len(C.render_compare(doc))]


def test_compare_warns_below_eight_seeds_and_on_censored_runs(tmp_path, capsys):
    plan = _fake_plan(tmp_path, seeds=3)
    _fake_runs(plan, reached=lambda label, seed: not (label == "dfpo_min" and seed == 11))
    text = C.compare(plan, progress=lambda _: None).read_text()
    err = capsys.readouterr().err
    for needle in ("warning: only 3 paired seeds (fewer than 8)", "warning: 1 of 6 runs never reached kappa (dfpo_min seed 11)"):
        assert needle in err and needle in text
    assert "| 11 | 12 | >=21 | >=+9.0 |" in text  # the censored run: a lower bound, and so its difference
    assert "| dfpo_min | 0.33 | 0.5 | 12 [12, >=21] (2/3 reached) |" in text  # the Kaplan-Meier median, never a mean (was 15)


def test_compare_says_what_its_cells_cost_and_what_they_ran_on_from_their_summaries(tmp_path):
    """The cost paragraph sums each cell's recorded wall and CPU seconds (calibration cells included) and counts its
    machine; a cell without the record is counted as not recorded, and a machine line that is not plain text is never
    shown."""
    from dfpo.trainer.run.code import source_sha256

    plan = _fake_plan(tmp_path, seeds=2)
    _fake_runs(plan)
    calibration = plan.out / "calibration" / "gspo" / "seed900"
    _write_run(calibration, 0.3, [0.5] * 20, 12)
    lines = {"gspo": "2-core AMD EPYC 7B13, 23.5 GiB", "dfpo_min": "<img src=x onerror=alert(1)>"}
    for label in plan.labels:
        for s in plan.seeds:
            path = RunDir(run_dir(plan, label, s)).summary
            summary = json.loads(path.read_text()) | {"wall_s_process": 1800.0, "cpu_s_process": 900.0, "machine": lines[label]}
            path.write_text(json.dumps(summary))
    cost = C.experiment_cost(plan)
    assert cost == {
        "cells": {"compared": 4, "calibration": 1},
        "timed_cells": 4,
        "wall_s": 7200.0,
        "cpu_s": 3600.0,
        "machines": {
            "2-core AMD EPYC 7B13, 23.5 GiB": 2,
            "unreadable (the summary's machine is not a plain line of text)": 2,
            "not recorded (trained before dfpo recorded the machine)": 1,
        },
        "codes": {f"source {source_sha256()[:12]}": 4, "no source recorded": 1},
    }
    text = C.compare(plan, progress=lambda _: None, warn=lambda _: None).read_text()
    assert (
        "Cost: 5 cells (4 compared, 1 calibration); 2.0 h wall and 1.0 h CPU summed over the 4 cells that recorded both "
        "(each cell's last dfpo train process). Machine: 2-core AMD EPYC 7B13, 23.5 GiB (2 cells); unreadable (the "
        "summary's machine is not a plain line of text) (2 cells); not recorded (trained before dfpo recorded the machine) "
        f"(1 cell). Trained by: source {source_sha256()[:12]} (4 cells); no source recorded (1 cell)." in text
    )
    assert "<img" not in text


def test_compare_draws_each_labels_mean_reward_and_eval_curve_from_every_seed(tmp_path):
    """compare.json keeps every run's reward and eval curve (a value that is not a finite number left out) and
    curves.png draws their means over seeds; a step one seed lacks is not averaged over the others."""
    from dfpo.trainer.compare_report import mean_curve

    plan = _fake_plan(tmp_path, seeds=2)
    _fake_runs(plan)
    for label in plan.labels:
        for s in plan.seeds:
            evals = [{"step": 0, "eval/avg@4": 0.2, "eval/pass@4": 0.5}, {"step": 20, "eval/avg@4": 0.3 + (s - 10) / 10}]
            evals += [{"step": 30, "eval/avg@4": "n/a"}]
            (run_dir(plan, label, s) / RunDir.EVALS).write_text("\n".join(json.dumps(e) for e in evals) + "\n")
    with open(RunDir(run_dir(plan, "gspo", 11)).metrics, "a") as fh:
        fh.write(json.dumps({"step": 21, "reward/mean": 0.9}) + "\n")
    text = C.compare(plan, progress=lambda _: None, warn=lambda _: None).read_text()
    doc = json.loads((plan.out / "compare.json").read_text())
    gspo = doc["curves"]["gspo"]
    assert gspo["11"]["reward"][-1] == [21, 0.9] and len(gspo["11"]["reward"]) == 21
    assert gspo["10"]["eval"] == [[0, 0.2], [20, 0.3]]  # step 30's "n/a" is left out
    steps, mean, se = mean_curve(gspo, "reward")
    assert steps.tolist() == list(range(1, 21)) and mean.tolist() == [0.5] * 20 and se.tolist() == [0.0] * 20  # no step 21
    steps, mean, se = mean_curve(gspo, "eval")
    assert steps.tolist() == [0, 20] and mean == pytest.approx([0.2, 0.35]) and se == pytest.approx([0.0, 0.05])
    assert (plan.out / "curves.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and "![curves per outcome](curves.png)" in text


def test_every_outcome_a_run_logged_gets_its_curve_and_its_panel(tmp_path):
    """The learning tax at the template's positions, greedy accuracy and the entropy over equivalent answers are drawn
    where the runs logged them (issue 58: curves of A and B per outcome); a curve no run logged gets no panel."""
    from dfpo.trainer.compare_report import drawn_curves, mean_curve

    plan = _fake_plan(tmp_path, seeds=2)
    _fake_runs(plan)
    for label in plan.labels:
        for s in plan.seeds:
            evals = [{"step": 0, "eval/avg@2": 0.3, "eval/template_kl": 0.0, "eval/greedy_acc": 0.4}]
            evals += [{"step": 20, "eval/avg@2": 0.2, "eval/template_kl": 1e-4 * (s - 9), "eval/greedy_acc": 0.25}]
            (run_dir(plan, label, s) / RunDir.EVALS).write_text("\n".join(json.dumps(e) for e in evals) + "\n")
            with open(RunDir(run_dir(plan, label, s)).metrics, "a") as fh:
                fh.write(json.dumps({"step": 21, "reward/mean": 0.5, "forms/equiv_entropy": 0.1}) + "\n")
    C.compare(plan, progress=lambda _: None, warn=lambda _: None)
    doc = json.loads((plan.out / "compare.json").read_text())
    assert drawn_curves(doc) == ["reward", "eval", "greedy_eval", "template_kl", "equiv_entropy"]
    steps, mean, _ = mean_curve(doc["curves"]["gspo"], "template_kl")
    assert steps.tolist() == [0, 20] and mean == pytest.approx([0.0, 1.5e-4])
    assert "tax_kl" not in doc["curves"]["gspo"]["10"]  # never logged: no empty curve kept
    assert (plan.out / "curves.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_the_attribution_page_draws_each_sets_curves_from_the_stored_evidence_and_shows_them(tmp_path, monkeypatch):
    """scripts/attribution_data.py draws each seed set's curves from the stored compare.json (not from runs/), and
    docs/attribution.md shows each set's figure under its table."""
    from script_modules import load_script

    plan = _fake_plan(tmp_path, seeds=2)
    _fake_runs(plan)
    C.compare(plan, progress=lambda _: None, warn=lambda _: None)
    doc = json.loads((plan.out / "compare.json").read_text())
    sets = {
        which: {"command": "dfpo compare ...", "seed_set": "seeds 10..11, 2 seeds", "doc": doc} for which in ("discovery", "confirmation")
    }
    stored = {"name": "fake", "kind": "compare", "title": "fake", "sets": sets}
    data, page = load_script("scripts/attribution_data.py"), load_script("scripts/attribution_page.py")
    monkeypatch.setattr(data, "FIGURES", tmp_path)
    monkeypatch.setattr(page, "LEDGER", tmp_path)
    data.draw_curves(stored)
    assert sorted(f.name for f in tmp_path.glob("*.png")) == ["fake-confirmation-curves.png", "fake-discovery-curves.png"]
    text = page._compare_tables(stored)
    assert "![fake discovery set: reward and eval curves](attribution/fake-discovery-curves.png)" in text
    assert "![fake confirmation set: reward and eval curves](attribution/fake-confirmation-curves.png)" in text


def test_the_attribution_page_names_a_declared_machine_only_beside_cells_that_did_not_record_theirs(tmp_path):
    """A machine declared with an experiment is shown, as declared, where its cells predate the machine record, and
    vetted as any recorded machine line is; where every cell recorded it, the declaration is not shown."""
    from script_modules import load_script

    from dfpo.trainer.run.machine import NOT_RECORDED

    page = load_script("scripts/attribution_page.py")
    unrecorded = {"cost": {"machines": {NOT_RECORDED: 3, "2-core AMD EPYC, 23.5 GiB": 1}}}
    said = page.declared_machine({"machine": "2-core AMD EPYC, 23.5 GiB"}, unrecorded)
    assert said.startswith("The 3 cells that did not record their machine ran on, as the experiment declares") and "2-core AMD EPYC" in said
    assert "unreadable" in page.declared_machine({"machine": "<img src=x>"}, unrecorded)
    assert page.declared_machine({}, unrecorded) == ""
    assert page.declared_machine({"machine": "2-core AMD EPYC"}, {"cost": {"machines": {"2-core AMD EPYC": 4}}}) == ""


def test_run_one_resumes_a_run_with_a_checkpoint_and_never_deletes_a_folder(tmp_path, monkeypatch):
    plan = _fake_plan(tmp_path, seeds=2)
    calls = []
    monkeypatch.setattr(C, "run_watched", lambda cmd, tell, every_s: calls.append(cmd) or (0, ""))
    with_checkpoint, without = run_dir(plan, "gspo", 10), run_dir(plan, "dfpo_min", 10)
    for path in (with_checkpoint, without):
        path.mkdir(parents=True)
        (path / RunDir.CONFIG).write_text("seed = 10\n")
        (path / RunDir.METRICS).write_text('{"step": 1}\n')
    (with_checkpoint / RunDir.CHECKPOINT).write_bytes(b"ckpt")
    assert C.run_one(plan, "gspo", 10) == "compare: gspo seed 10: resumed"
    assert calls[-1][-4:] == ["train", "--resume", str(with_checkpoint), "--quiet"]
    assert C.run_one(plan, "dfpo_min", 10) == "compare: dfpo_min seed 10: trained"
    assert calls[-1] == train_command(plan, "dfpo_min", 10)  # dfpo train restarts its own folder, or refuses
    for path in (with_checkpoint, without):  # nothing was deleted here
        assert (path / RunDir.CONFIG).read_text() == "seed = 10\n" and (path / RunDir.METRICS).is_file()
    assert (with_checkpoint / RunDir.CHECKPOINT).read_bytes() == b"ckpt"


# ----- a folder holds the run of its label and seed, or nothing is run or reported -----


def test_a_run_of_another_label_planted_in_a_folder_is_refused_naming_both(tmp_path):
    """A dfpo_min run sitting in OUT/gspo/seed11 would be reported as gspo: compare checks each folder's identity
    before it resumes or reports anything."""
    plan = _fake_plan(tmp_path, seeds=2)
    _fake_runs(plan)
    _mark_as(plan, run_dir(plan, "gspo", 11), "dfpo_min", 11)
    with pytest.raises(ValueError, match=r"gspo/seed11 holds the run dfpo_min seed 11, not gspo seed 11.*nothing was run or reported"):
        C.compare(plan, progress=lambda _: None, warn=lambda _: None)
    assert not (plan.out / "compare.md").exists()


def test_a_run_of_another_config_is_refused_naming_the_config(tmp_path):
    plan = _fake_plan(tmp_path, seeds=2)
    _fake_runs(plan)
    other = make_plan("gspo,dfpo_min", None, 2, 10, "configs/tiny-cpu.toml", ["optim.lr=0.5"], str(tmp_path / "elsewhere"))
    _mark_as(other, run_dir(plan, "gspo", 10), "gspo", 10)
    with pytest.raises(ValueError, match=r"gspo/seed10 was trained with optim.lr=0.5, this command asks 0.0003: nothing was run"):
        C.compare(plan, progress=lambda _: None, warn=lambda _: None)
    _mark_as(plan, run_dir(plan, "gspo", 10), "gspo", 10)
    write_mark(run_dir(plan, "gspo", 10), checkpointed=True, identity=run_identity(config_to_dict(C.run_config(other, "gspo", 10))))
    with pytest.raises(  # config.toml as this command asks, the mark of another config: the identity still refuses it
        ValueError, match=r"gspo/seed10 holds a run of gspo seed 10 with another config \(config [0-9a-f]{12}, not [0-9a-f]{12}"
    ):
        C.compare(plan, progress=lambda _: None, warn=lambda _: None)


def test_a_folder_without_an_identity_is_refused(tmp_path):
    plan = _fake_plan(tmp_path, seeds=2)
    _fake_runs(plan)
    (run_dir(plan, "dfpo_min", 10) / RunDir.MARK).unlink()
    with pytest.raises(ValueError, match=r"dfpo_min/seed10 holds a run whose identity is unknown"):
        C.compare(plan, progress=lambda _: None, warn=lambda _: None)


def test_a_torn_metrics_line_is_named_by_file_and_line(tmp_path, capsys):
    plan = _fake_plan(tmp_path, seeds=2)
    _fake_runs(plan)
    metrics = run_dir(plan, "dfpo_min", 11) / RunDir.METRICS
    lines = metrics.read_text().splitlines()
    lines[2] = lines[2][:12]
    metrics.write_text("\n".join(lines) + "\n")
    argv = [
        "compare",
        "--config",
        "configs/tiny-cpu.toml",
        "--objectives",
        "gspo,dfpo_min",
        "--seeds",
        "2",
        "--first-seed",
        "10",
        "--out",
        str(plan.out),
    ]
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert f"dfpo: error: {metrics}:3: not a JSON object" in err, err


class _RunsCodeWhenUnpickled:
    def __init__(self, marker):
        self.marker = marker

    def __reduce__(self):
        return (os.system, (f"touch {shlex.quote(str(self.marker))}",))


@pytest.mark.slow
def test_a_planted_pickle_is_never_run_when_compare_resumes_a_run(tmp_path, capsys):
    """OUT/gspo/seed10 holds a real gspo run whose checkpoint.pt was replaced by a pickle that runs a command (with
    a matching checksum): compare resumes it, the resume refuses it naming the file, and compare stops with that
    one line."""
    config = tmp_path / "c.toml"
    config.write_text("")
    sets = [*SETS, "train.steps=2"]
    plan = make_plan("gspo,dfpo_min", None, 2, 10, str(config), sets, str(tmp_path / "cmp"))
    _fake_runs(plan)
    run = run_dir(plan, "gspo", 10)
    for name in (RunDir.SUMMARY, RunDir.METRICS, RunDir.MARK, RunDir.CONFIG):
        (run / name).unlink()
    assert main(train_command(plan, "gspo", 10)[3:]) == 0
    (run / RunDir.SUMMARY).unlink()  # interrupted before its end: compare resumes it
    marker = tmp_path / "code-ran"
    ckpt = run / RunDir.CHECKPOINT
    torch.save({"step": 2, "payload": _RunsCodeWhenUnpickled(marker)}, ckpt)
    meta = json.loads((run / RunDir.CHECKPOINT_META).read_text())
    meta.update(sha256=hashlib.sha256(ckpt.read_bytes()).hexdigest(), size=ckpt.stat().st_size)
    (run / RunDir.CHECKPOINT_META).write_text(json.dumps(meta))
    capsys.readouterr()
    argv = ["compare", "--objectives", "gspo,dfpo_min", "--seeds", "2", "--first-seed", "10", "--config", str(config)]
    argv += [x for s in sets for x in ("--set", s)] + ["--out", str(plan.out)]
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert not marker.exists()
    assert "Traceback" not in err and str(ckpt) in err and "gspo seed 10 failed" in err, err
    assert not (plan.out / "compare.md").exists()


# ----- step-size-matched controls -----


def test_a_label_with_its_own_learning_rate_sets_optim_lr(tmp_path):
    plan = make_plan("gspo_noclip,gspo_noclip@lr=2.5e-4", None, 2, 5, "configs/tiny-cpu.toml", [], str(tmp_path))
    cmd = train_command(plan, "gspo_noclip@lr=2.5e-4", 5)
    assert cmd[-2:] == ["--set", "optim.lr=0.00025"] and C.run_config(plan, "gspo_noclip@lr=2.5e-4", 5).optim.lr == 2.5e-4
    with pytest.raises(ValueError, match="lr must be a finite number > 0"):
        make_plan("gspo,gspo@lr=-1", None, 2, 5, "configs/tiny-cpu.toml", [], str(tmp_path))


def test_match_step_calibrates_the_control_on_disjoint_seeds_and_the_table_shows_both_controls(tmp_path, monkeypatch):
    """Stand-in for training: steps to kappa = 0.018 / lr for gspo_noclip, 66 for the score form (at lr 3e-4: 60)."""
    method = "dfpo_min:stopgrad=score"
    plan = make_plan(f"gspo_noclip,{method}", None, 8, 10, "configs/tiny-cpu.toml", [], str(tmp_path / "cmp"))
    assert C.default_match_methods(plan) == [method]

    def fake_run_all(plan, *, jobs, progress, **_):
        def record(label, seed):
            lr = C.parse_run_label(label).lr or 3e-4
            steps = 66.0 if label == method else 0.018 / lr
            return {"eval": 0.3, "reward_last10": 0.5, "steps_to_kappa": steps, "kappa_reached": 1.0, "clip_frac": 0.0, "asym": 0.1}

        return {label: {s: record(label, s) for s in plan.seeds} for label in plan.labels}

    monkeypatch.setattr(C, "run_all", fake_run_all)
    monkeypatch.setattr(C, "read_curve", lambda path: {"reward": [], "eval": []})  # no run folder: nothing logged
    with pytest.raises(ValueError, match="overlap the comparison's seeds"):
        C.step_matched_plan(plan, [method], seeds=(12, 13))
    matched = C.step_matched_plan(plan, [method], seeds=tuple(range(100, 108)), progress=lambda _: None)
    (cal,) = matched.calibrations
    assert abs(0.018 / cal.lr - 66) <= 0.02 * 66 and cal.seed_set == "seeds 100..107"
    control = cal.label
    assert matched.labels == ("gspo_noclip", method, control) and dict(matched.step_matched) == {control: method}
    assert C.comparison_pairs(matched) == [(method, "gspo_noclip"), (control, "gspo_noclip"), (method, control)]
    assert C.matched_components(matched) == {
        f"{method} - gspo_noclip": [],
        f"{control} - gspo_noclip": ["lr"],
        f"{method} - {control}": ["step size"],
    }
    text = C.compare(matched, progress=lambda _: None, warn=lambda _: None).read_text()
    assert f"| {method} - {control} | yes, and step size |" in text and f"| {method} - gspo_noclip | yes |" in text
    assert f"- {control} is gspo_noclip step-size-matched to {method}" in text
    again = C.calibrated_plan(
        make_plan(f"gspo_noclip,{method}", None, 8, 30, "configs/tiny-cpu.toml", [], str(tmp_path / "b")), matched.out / "compare.json"
    )
    assert again.labels == matched.labels and again.step_matched == matched.step_matched and again.calibrations == matched.calibrations
    with pytest.raises(ValueError, match="--calibration-from .*not the compare.json"):
        C.calibrated_plan(plan, tmp_path / "missing.json")


def _fake_calibration_runs(monkeypatch, record):
    """Training replaced by ``record(label, lr)``: every seed of a label gets the same outcomes."""

    def fake_run_all(plan, *, jobs, progress, **_):
        return {label: {s: record(label, C.parse_run_label(label).lr or 3e-4) for s in plan.seeds} for label in plan.labels}

    monkeypatch.setattr(C, "run_all", fake_run_all)


def test_steps_to_kappa_that_every_calibration_run_censors_is_refused_not_matched(tmp_path, monkeypatch):
    """A run that never reaches kappa counts its length + 1 whatever its step: matching on that matches nothing."""
    method = "dfpo_min:stopgrad=score"
    plan = make_plan(f"gspo_noclip,{method}", None, 8, 10, "configs/tiny-cpu.toml", [], str(tmp_path / "cmp"))
    _fake_calibration_runs(monkeypatch, lambda label, lr: {"steps_to_kappa": 13.0, "kappa_reached": 0.0})
    with pytest.raises(ValueError, match=r"no calibration run of dfpo_min:stopgrad=score reached .* use --match-step update"):
        C.step_matched_plan(plan, [method], seeds=(100, 101), progress=lambda _: None)


def test_match_step_update_calibrates_on_the_update_norm_and_every_run_logs_it(tmp_path, monkeypatch):
    """Stand-in: the control's update norm is 2000 * lr, the method's 0.5 (at lr 3e-4 the control's is 0.6)."""
    method = "dfpo_min:stopgrad=score"
    plan = make_plan(f"gspo_noclip,{method}", None, 8, 10, "configs/tiny-cpu.toml", [], str(tmp_path / "cmp"))
    _fake_calibration_runs(monkeypatch, lambda label, lr: {"update_norm": 0.5 if label == method else 2000 * lr})
    matched = C.step_matched_plan(plan, [method], seeds=(100, 101), criterion="update", progress=lambda _: None)
    (cal,) = matched.calibrations
    assert cal.criterion == "update" and abs(2000 * cal.lr - 0.5) <= 0.02 * 0.5 and cal.label in matched.labels
    assert C.UPDATE_NORM_SET in matched.sets and C.run_config(matched, method, 10).log.update_norm
    _fake_calibration_runs(monkeypatch, lambda label, lr: {"update_norm": math.nan})
    with pytest.raises(ValueError, match="logged no optim/update_norm"):
        C.step_matched_plan(plan, [method], seeds=(100, 101), criterion="update", progress=lambda _: None)


def test_a_control_that_already_takes_the_method_s_step_is_not_trained_twice(tmp_path, monkeypatch):
    """Within the tolerance at its own learning rate: no CONTROL@lr= label repeats the control's runs."""
    method = "dfpo_min:stopgrad=score"
    plan = make_plan(f"gspo_noclip,{method}", None, 8, 10, "configs/tiny-cpu.toml", [], str(tmp_path / "cmp"))
    _fake_calibration_runs(monkeypatch, lambda label, lr: {"update_norm": 0.6 if label == method else 2000 * lr})
    matched = C.step_matched_plan(plan, [method], seeds=(100, 101), criterion="update", progress=lambda _: None)
    (cal,) = matched.calibrations
    assert matched.labels == plan.labels and matched.step_matched == () and cal.lr == 3e-4
    assert C.calibration_sentence(matched, cal).startswith(f"- gspo_noclip at its own lr 0.0003 is also step-size-matched to {method}")
    out = tmp_path / "cmp" / C.CALIBRATION_FILE
    again = C.calibrated_plan(make_plan(f"gspo_noclip,{method}", None, 8, 30, "configs/tiny-cpu.toml", [], str(tmp_path / "b")), out)
    assert again.labels == plan.labels and again.calibrations == matched.calibrations and C.UPDATE_NORM_SET in again.sets


def test_the_calibration_is_written_before_any_reported_run_so_a_second_set_can_start(tmp_path, monkeypatch):
    method = "dfpo_min:stopgrad=score"
    plan = make_plan(f"gspo_noclip,{method}", None, 8, 10, "configs/tiny-cpu.toml", [], str(tmp_path / "cmp"))
    _fake_calibration_runs(monkeypatch, lambda label, lr: {"update_norm": 0.5 if label == method else 2000 * lr})
    matched = C.step_matched_plan(plan, [method], seeds=(100, 101), criterion="update", progress=lambda _: None)
    second = make_plan(f"gspo_noclip,{method}", None, 8, 30, "configs/tiny-cpu.toml", [], str(tmp_path / "b"))
    again = C.calibrated_plan(second, plan.out / C.CALIBRATION_FILE)
    assert again.labels == matched.labels and again.step_matched == matched.step_matched and again.calibrations == matched.calibrations
