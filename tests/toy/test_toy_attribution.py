"""Honest attribution in the toy: per-objective labels, matched controls in the prediction table,
the standard ablation and the ratio-spread sweep."""

from __future__ import annotations

import json

import numpy as np
import pytest

from dfpo.cli import main
from dfpo.toy.report import auto_notes, comparison_pairs, paired_verdict, prediction_checks
from dfpo.toy.train import ToyConfig, validate

pytestmark = pytest.mark.usefixtures("one_thread")

ABLATION_LABELS = (
    "gspo",
    "dfpo_min",
    "gspo_noclip",
    "dfpo_min:stopgrad=score",
    "gspo:eps_low=0.2:eps_high=0.2",
    "dfpo_min:eps_low=0.2:eps_high=0.2",
)


def test_each_dfpo_label_is_paired_with_its_matched_control_and_with_plain_gspo():
    pairs = {(p.method, p.baseline): list(p.unmatched) for p in comparison_pairs(ABLATION_LABELS, ToyConfig())}
    assert pairs[("dfpo_min", "gspo")] == []
    assert pairs[("dfpo_min:stopgrad=score", "gspo_noclip")] == []
    assert pairs[("dfpo_min:stopgrad=score", "gspo")] == ["clip", "eps_low", "eps_high"]
    assert pairs[("dfpo_min:eps_low=0.2:eps_high=0.2", "gspo:eps_low=0.2:eps_high=0.2")] == []
    # an unmatched baseline other than plain gspo is left out: it would only repeat the confound
    assert ("dfpo_min:stopgrad=score", "gspo:eps_low=0.2:eps_high=0.2") not in pairs
    assert ("dfpo_min", "gspo_noclip") not in pairs


def test_a_difference_against_an_unmatched_baseline_is_not_attributed_to_dfpo():
    """Synthetic per-seed values: score-form DFPO beats gspo by a wide margin and ties gspo_noclip."""
    seeds = 8
    rng = np.random.default_rng(0)
    noise = rng.normal(0, 0.001, seeds)
    summary = {
        "gspo": {"final_reward": np.full(seeds, 0.80) + noise},
        "gspo_noclip": {"final_reward": np.full(seeds, 0.95) + noise},
        "dfpo_min:stopgrad=score": {"final_reward": np.full(seeds, 0.95) + noise + rng.normal(0, 1e-4, seeds)},
    }
    rows = [line for line in prediction_checks(summary, ToyConfig()) if line.startswith("| Prediction 3")]
    by_baseline = {line.split(" | ")[2]: line for line in rows}
    assert "not attributable (reproduced against an unmatched baseline)" in by_baseline["gspo"]
    assert "| no: clip, eps_low, eps_high |" in by_baseline["gspo"]
    assert "negligible" in by_baseline["gspo_noclip"] and "| yes |" in by_baseline["gspo_noclip"]


def test_without_a_baseline_the_check_says_so():
    assert "no check" in prediction_checks({"dfpo_min": {"final_reward": np.ones(3)}}, ToyConfig())[0]


@pytest.mark.parametrize(
    "objectives, message",
    [
        (("gspo", "gspo"), "must not repeat a label"),
        (("dfpo_min:stopgrad=sideways",), "stopgrad must be one of"),
        (("dfpo_min:bogus=1",), "unknown component 'bogus'"),
    ],
)
def test_bad_labels_fail_in_validation(objectives, message):
    with pytest.raises(ValueError, match=message):
        validate(ToyConfig(objectives=objectives))


def test_run_with_labels_writes_them_to_every_output(tmp_path, capsys):
    out = tmp_path / "run"
    code = main(
        [
            "toy",
            "run",
            "--objectives",
            "gspo_noclip,dfpo_min:stopgrad=score",
            "--seeds",
            "2",
            "--steps",
            "3",
            "--out",
            str(out),
            "--no-plots",
        ]
    )
    assert code == 0
    names = {json.loads(line)["objective"] for line in (out / "metrics.jsonl").read_text().splitlines()}
    assert names == {"gspo_noclip", "dfpo_min:stopgrad=score"}
    summary = (out / "summary.md").read_text()
    assert "| dfpo_min:stopgrad=score | gspo_noclip | yes |" in summary


def test_ablate_runs_the_standard_ablation_in_one_command(tmp_path, capsys):
    out = tmp_path / "ablate"
    assert main(["toy", "ablate", "--seeds", "2", "--steps", "3", "--out", str(out), "--no-plots"]) == 0
    names = {json.loads(line)["objective"] for line in (out / "metrics.jsonl").read_text().splitlines()}
    assert set(ABLATION_LABELS) <= names and "dfpo_min:clip=none" in names


def test_spread_sweep_reports_the_measured_spread_and_paired_effects(tmp_path, capsys):
    out = tmp_path / "spread"
    code = main(
        ["toy", "spread", "--knob", "inner_steps", "--values", "1,4", "--seeds", "3", "--steps", "4", "--out", str(out), "--no-plots"]
    )
    assert code == 0
    rows = json.loads((out / "spread.json").read_text())
    assert [r["inner_steps"] for r in rows] == [1.0, 4.0]
    assert rows[0]["spread"] < 1e-7 < rows[1]["spread"]  # K = 1 is on-policy: every s_i = 1
    # K = 1: ratio 1 everywhere, every transform is the identity: no paired difference at all
    assert rows[0]["method/final_reward"] == pytest.approx(rows[0]["baseline/final_reward"], abs=1e-6)
    summary = (out / "summary.md").read_text()
    assert "| 1 | 0.0000 |" in summary
    # 4 steps: no seed reaches kappa, so every steps value is censored and no median is printed as a number
    assert summary.count("| median unknown (censored), no interval (n = 3 seeds: a sign-test interval of the median at level") == 2
    assert "[-inf, inf]" not in summary


def test_spread_refuses_an_unmatched_pair_and_a_bad_knob(tmp_path, capsys):
    assert (
        main(
            [
                "toy",
                "spread",
                "--baseline",
                "gspo",
                "--method",
                "dfpo_min:stopgrad=score",
                "--values",
                "1",
                "--seeds",
                "2",
                "--steps",
                "2",
                "--out",
                str(tmp_path / "a"),
            ]
        )
        == 2
    )
    assert "not a matched control" in capsys.readouterr().err
    assert main(["toy", "spread", "--knob", "steps", "--values", "1", "--out", str(tmp_path / "b")]) == 2
    assert "--knob must be one of" in capsys.readouterr().err


# ----- multiplicity and replication on a second seed set -----


def test_the_prediction_table_adjusts_every_interval_for_the_checks_it_shows():
    """Every check in the table uses the interval at level 1 - 0.05/m, m = the number of checks shown."""
    diff = np.array([-1.0, -1.3, -0.6, -1.1, -0.2])  # alone reproduced (t-interval [-1.386, -0.294]), not after m = 6
    base = np.full(5, 10.0)
    keys = ("steps_to_kappa", "jitter2_reward", "final_reward", "tax_kl_cum", "tax_at_kappa", "final_equiv_entropy")
    summary = {"gspo": {k: base for k in keys}, "dfpo_min": {k: base + diff for k in keys}}
    lines = prediction_checks(summary, ToyConfig())
    assert lines[0].startswith(
        "Intervals: 95% Student-t interval over seeds, Bonferroni-adjusted for the 6 intervals of this table (each at level 0.9917); "
        "for the censored outcomes (steps_to_kappa, tax_at_kappa) the median paired difference with its sign-test interval"
    )
    assert "or where the seeds are too few for a sign test and every run of both sides reached kappa the same t-interval" in lines[0]
    tax = next(line for line in lines if line.startswith("| Prop. 3.1: DFPO pays less"))
    word, (mean, lo, hi) = paired_verdict(diff, -1, 10.0, tests=6)
    assert word == "inconclusive" and tax.endswith("| inconclusive |") and f"{mean:+.3g} [{lo:+.3g}, {hi:+.3g}]" in tax
    steps = next(line for line in lines if line.startswith("| Prediction 1"))
    # every run reached kappa: the steps are numbers, so they get the t-interval of the mean (a sign test of 5 seeds would
    # bound nothing at level 0.9917: P(all 5 below) = 1/32)
    assert f"| {mean:+.3g} [{lo:+.3g}, {hi:+.3g}] " in steps and "median" not in steps
    reached = {"reached": np.array([True, True, True, True, False])}  # one seed of dfpo_min never reached kappa
    censored_summary = {"gspo": summary["gspo"], "dfpo_min": {**summary["dfpo_min"], **reached}}
    steps = next(line for line in prediction_checks(censored_summary, ToyConfig()) if line.startswith("| Prediction 1"))
    assert "| median -1, no interval (n = 5 seeds: a sign-test interval of the median at level 0.9917 needs >= 8) " in steps


def _toy(argv, tmp_path, name):
    out = tmp_path / name
    code = main(["toy", *argv, "--steps", "2", "--out", str(out), "--no-plots"])
    return code, out


def _per_seed(out, key="reward", step=1):
    rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    return {(r["objective"], r["seed"]): r[key] for r in rows if r["step"] == step}


def test_the_seed_option_picks_disjoint_seed_sets(tmp_path, capsys):
    """--seed draws every run's initial noise and samples: a second --seed shares no run with the first, the same --seed repeats them."""
    runs = {}
    for name, seed in (("a", "0"), ("a_again", "0"), ("b", "1")):
        code, out = _toy(["run", "--task", "family", "--objectives", "gspo", "--seeds", "4", "--seed", seed], tmp_path, name)
        assert code == 0
        runs[name] = _per_seed(out)
    a, b = list(runs["a"].values()), list(runs["b"].values())
    assert runs["a"] == runs["a_again"]  # the same seed set, the same runs
    assert len(set(a)) == 4 and not set(a) & set(b)  # no run of the second set equals any run of the first
    assert "seed set --seed 1" in (tmp_path / "b" / "summary.md").read_text()


def test_ablate_with_a_discovery_set_shows_both_verdicts_and_whether_they_replicate(tmp_path, capsys):
    code, first = _toy(["ablate", "--task", "family", "--seeds", "3", "--seed", "0"], tmp_path, "first")
    assert code == 0
    code, second = _toy(["ablate", "--task", "family", "--seeds", "4", "--seed", "1", "--discovery", str(first)], tmp_path, "second")
    assert code == 0
    text = (second / "summary.md").read_text()
    assert "| verdict (--seed 1, 4 seeds) | verdict on the discovery set (--seed 0, 3 seeds) | replicated? |" in text
    row = next(line for line in text.splitlines() if line.startswith("| Prediction 3") and "| dfpo_min | gspo |" in line)
    assert row.rstrip(" |").rsplit("| ", 1)[1] in ("yes", "no", "n/a")


@pytest.mark.parametrize(
    "extra, message",
    [
        (["--seed", "0"], "used the same --seed 0: the same seeds are no replication"),
        (["--seed", "1", "--lr", "0.3"], "is another experiment: it differs in lr (0.5 there, 0.3 here)"),
    ],
)
def test_a_discovery_set_must_be_the_same_experiment_on_other_seeds(tmp_path, capsys, extra, message):
    code, first = _toy(["ablate", "--task", "family", "--seeds", "2", "--seed", "0"], tmp_path, "first")
    assert code == 0
    code, second = _toy(["ablate", "--task", "family", "--seeds", "2", "--discovery", str(first), *extra], tmp_path, "second")
    assert code == 2 and message in capsys.readouterr().err
    assert not second.exists()  # refused before any training or output


def test_spread_with_a_discovery_set_adds_the_replication_table(tmp_path, capsys):
    argv = ["spread", "--task", "family", "--knob", "inner_steps", "--values", "1,4", "--seeds", "3"]
    code, first = _toy([*argv, "--seed", "0"], tmp_path, "first")
    assert code == 0
    rows = json.loads((first / "spread.json").read_text())
    assert len(rows[1]["method/final_reward"]) == len(rows[1]["reached/baseline"]) == 3  # per-seed values and censoring kept
    code, second = _toy([*argv, "--seed", "1", "--discovery", str(first)], tmp_path, "second")
    assert code == 0
    text = (second / "summary.md").read_text()
    assert "Replication: discovery set --seed 0 (3 seeds, 8 cells) and this set --seed 1 (3 seeds)" in text
    assert "| inner_steps | effect | discovery set | this set | replicated? |" in text
    code, _ = _toy([*argv, "--seed", "0", "--discovery", str(first)], tmp_path, "third")
    assert code == 2 and "used the same --seed 0" in capsys.readouterr().err


def test_notes_say_what_the_clipped_fraction_counts_and_that_length_aware_min_takes_smaller_steps():
    seeds = np.ones(4)
    summary = {
        "gspo": {"tax_kl_cum": seeds, "clip_frac": np.full(4, 0.32)},
        "dfpo_min:stopgrad=score": {"tax_kl_cum": seeds, "clip_frac": np.zeros(4)},
        "dfpo_min:stopgrad=score:length_aware=true": {"tax_kl_cum": seeds, "clip_frac": np.zeros(4)},
    }
    notes = auto_notes(ToyConfig(task="family"), summary)
    clip = next(n for n in notes if n.startswith("- gspo clips"))
    assert "clips 32% of its sequences on average over the inner steps" in clip and "the first inner step, at ratio 1, clips none" in clip
    (shrunk,) = [n for n in notes if "length-aware Min-Replace" in n]
    assert shrunk.startswith("- dfpo_min:stopgrad=score:length_aware=true: ") and "not attributable to cancellation alone" in shrunk
    del summary["dfpo_min:stopgrad=score:length_aware=true"]
    assert not any("length-aware" in n for n in auto_notes(ToyConfig(task="family"), summary))
