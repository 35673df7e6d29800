"""``dfpo compare``: paired seeds on the LLM trainer, statistics by hand, matched-control flags."""

from __future__ import annotations

import json

import numpy as np
import pytest

from dfpo.cli import main
from dfpo.toy.metrics import bootstrap_ci
from dfpo.trainer.llm.compare import make_plan, paired_table, read_run, run_dir, train_command


def _write_run(path, eval_avg, rewards, steps_to_kappa, clip=(0.1, 0.2), asym=0.5):
    path.mkdir(parents=True)
    summary = {
        "final_eval": {"step": len(rewards), "eval/avg@4": eval_avg, "eval/pass@4": 1.0},
        "reward/steps_to_kappa_ma10": steps_to_kappa,
    }
    (path / "summary.json").write_text(json.dumps(summary))
    rows = [
        {"step": i + 1, "reward/mean": r, "clip/frac_low": clip[0], "clip/frac_high": clip[1], "weights/asym": asym}
        for i, r in enumerate(rewards)
    ]
    (path / "metrics.jsonl").write_text("\n".join(json.dumps(r) for r in rows) + "\n")


def test_read_run_takes_the_final_eval_the_last_ten_rewards_and_censors_steps(tmp_path):
    rewards = [0.0] * 5 + [0.1 * i for i in range(10)]  # last ten: 0.0 .. 0.9, mean 0.45
    _write_run(tmp_path / "a", 0.375, rewards, None, clip=(0.1, 0.25), asym=0.5)
    rec = read_run(tmp_path / "a")
    assert rec == pytest.approx({"eval": 0.375, "reward_last10": 0.45, "steps_to_kappa": 15.0, "clip_frac": 0.35, "asym": 0.5})


def test_paired_table_reports_the_mean_paired_difference_and_its_bootstrap_interval():
    base = {s: {"eval": 0.30 + 0.01 * s, "reward_last10": 0.5, "steps_to_kappa": 50.0, "clip_frac": 0.2, "asym": 1.0} for s in range(4)}
    diffs = [0.02, 0.04, 0.00, 0.02]  # mean 0.02, every seed's own baseline subtracted
    method = {s: dict(base[s], eval=base[s]["eval"] + d) for s, d in enumerate(diffs)}
    (line,) = [
        x for x in paired_table({"gspo": base, "dfpo_min": method}, "gspo", {"gspo": [], "dfpo_min": []}) if x.startswith("| dfpo_min")
    ]
    mean, lo, hi = bootstrap_ci(np.array(diffs))
    assert mean == pytest.approx(0.02)
    assert f"| {mean:+.3f} [{lo:+.3f}, {hi:+.3f}]" in line and "| yes |" in line
    assert line.count("+0.000 [+0.000, +0.000]") == 2  # reward and clip fraction: no difference


def test_an_unmatched_pair_is_flagged_with_the_components_that_differ():
    base = {s: {"eval": 0.3, "reward_last10": 0.5, "steps_to_kappa": 50.0, "clip_frac": 0.2, "asym": 1.0} for s in range(3)}
    lines = paired_table(
        {"gspo": base, "dfpo_min:stopgrad=score": base}, "gspo", {"gspo": [], "dfpo_min:stopgrad=score": ["clip", "eps_low", "eps_high"]}
    )
    assert "| NO: differs in clip, eps_low, eps_high |" in lines[-1]


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


def test_end_to_end_two_seeds_write_the_table_and_the_plot_and_resume(tmp_path, capsys):
    out = tmp_path / "cmp"
    argv = [
        "compare",
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
    assert "| dfpo_min | yes |" in text and (out / "compare.png").stat().st_size > 1000
    assert main(argv) == 0  # second time: every run is skipped
    assert capsys.readouterr().out.count("done before, skipped") == 4
