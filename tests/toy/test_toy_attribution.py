"""Honest attribution in the toy: per-objective labels, matched controls in the prediction table,
the standard ablation and the ratio-spread sweep."""

from __future__ import annotations

import json

import numpy as np
import pytest

from dfpo.cli import main
from dfpo.toy.report import comparison_pairs, prediction_checks
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
    pairs = {(m, b): u for m, b, u in comparison_pairs(ABLATION_LABELS, ToyConfig())}
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
    assert rows[0]["final_reward"][0] == pytest.approx(0.0, abs=1e-6)
    assert "| 1 | 0.0000 |" in (out / "summary.md").read_text()


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
