"""``dfpo toy run`` / ``dfpo toy sweep-g``: bad input fails fast with one clear line; a run writes its folder."""

from __future__ import annotations

import json
import time

import numpy as np
import pytest
import torch

from dfpo.cli import main
from dfpo.core.metrics import jitter2, steps_to
from dfpo.toy.metrics import kl_rows
from dfpo.toy.report import paired_verdict

pytestmark = pytest.mark.usefixtures("one_thread")


@pytest.mark.parametrize(
    "argv, message",
    [
        (["-G", "1"], "group_size must be >= 2, got 1"),
        (["-K", "0"], "inner_steps must be >= 1, got 0"),
        (["--lr", "0"], "lr must be > 0, got 0.0"),
        (["--mode", "both"], "mode must be one of sampled, exact; got 'both'"),
        (["--override", "eps_low=wide"], "eps_low takes a float value, got eps_low='wide'"),
        (["--override", "eps_low=-1"], "eps_low must be in [0, 1], got -1.0"),
        (["--task", "nope"], "unknown task='nope'"),
        (["--objectives", "gspo,nope"], "unknown objective='nope'"),
        (["--mode", "exact", "--objectives", "gspo", "--task", "family", "--task-opt", "k=6,distractors=9"], "too many for exact mode"),
        (["--task-opt", "width"], "--task-opt takes KEY=VALUE pairs"),
        (["--override", "eps_lo=0.1"], "unknown override"),
    ],
)
def test_bad_options_fail_before_any_compute(argv, message, tmp_path, capsys):
    start = time.perf_counter()
    code = main(["toy", "run", "--steps", "100000", "--out", str(tmp_path / "run"), *argv])
    err = capsys.readouterr().err
    assert code == 2
    assert err.startswith("dfpo: error: ") and message in err
    assert time.perf_counter() - start < 10  # 100000 steps would take far longer: nothing ran
    assert not (tmp_path / "run").exists()


def test_sweep_g_refuses_a_group_size_below_two(tmp_path, capsys):
    assert main(["toy", "sweep-g", "--gs", "1,4", "--out", str(tmp_path)]) == 2
    assert "--gs must list group sizes >= 2" in capsys.readouterr().err


def test_run_writes_metrics_summary_and_plots(tmp_path, capsys):
    out = tmp_path / "run"
    code = main(["toy", "run", "--objectives", "gspo,dfpo_min,grpo_fix", "--seeds", "2", "--steps", "6", "--out", str(out)])
    assert code == 0
    for name in (
        "config.json",
        "metrics.jsonl",
        "metrics_mean.csv",
        "summary.md",
        "reward.png",
        "tax.png",
        "equiv_entropy.png",
        "asym.png",
        "overview.png",
    ):
        assert (out / name).exists(), name
    lines = (out / "metrics.jsonl").read_text().splitlines()
    assert len(lines) == 3 * 2 * 6
    rec = json.loads(lines[0])
    assert {"objective", "seed", "step", "reward", "tax/kl_cum", "equiv/entropy", "asym", "clip/frac_high"} <= set(rec)
    summary = (out / "summary.md").read_text()
    assert "| gspo |" in summary and "Prediction 1" in summary and "Prop. 3.1" in summary
    assert (out / "reward.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert "nan" not in (out / "metrics_mean.csv").read_text().lower()


def test_sweep_g_writes_a_gain_table(tmp_path):
    out = tmp_path / "sweep"
    assert main(["toy", "sweep-g", "--gs", "2,4", "--seeds", "2", "--steps", "5", "--no-plots", "--out", str(out)]) == 0
    gains = json.loads((out / "gains.json").read_text())
    assert [g["G"] for g in gains] == [2, 4]
    assert "paper Table 4" in (out / "summary.md").read_text()
    assert "advantage scale): yes." in (out / "summary.md").read_text()
    out2 = tmp_path / "sweep-score"
    assert (
        main(
            [
                "toy",
                "sweep-g",
                "--gs",
                "2",
                "--method",
                "dfpo_min:stopgrad=score",
                "--seeds",
                "2",
                "--steps",
                "2",
                "--no-plots",
                "--out",
                str(out2),
            ]
        )
        == 0
    )
    assert "NO, they differ in clip, eps_low, eps_high" in (out2 / "summary.md").read_text()


# ----- summary statistics -----


def test_jitter2_is_zero_on_a_line_and_measures_curvature():
    assert jitter2(np.arange(10.0))[()] == 0.0
    assert jitter2(np.array([0.0, 1.0, 0.0, 1.0]))[()] == pytest.approx(2.0)  # |0 - 2 + 0| = |1 - 0 + 1| = 2


def test_steps_to_kappa_is_first_crossing_and_censors_misses():
    steps, reached = steps_to(np.array([[0.1, 0.5, 0.9, 0.95], [0.1, 0.2, 0.3, 0.4]]), 0.9)
    assert steps.tolist() == [3.0, 5.0] and reached.tolist() == [True, False]


def test_paired_verdicts():
    assert paired_verdict(np.array([-1.0, -1.2, -0.9, -1.1]), -1)[0] == "reproduced"
    assert paired_verdict(np.array([1.0, 1.2, 0.9, 1.1]), -1)[0] == "contradicted"
    assert paired_verdict(np.array([1.0, -1.2, 0.9, -1.1]), -1)[0] == "inconclusive"


def test_kl_rows_is_zero_for_equal_policies_and_positive_otherwise():
    a = torch.log_softmax(torch.randn(2, 3, 4), -1)
    rows = torch.tensor([True, False, True])
    assert torch.all(kl_rows(a, a, rows) == 0)
    b = torch.log_softmax(torch.randn(2, 3, 4), -1)
    assert torch.all(kl_rows(a, b, rows) > 0)


def test_every_toy_option_takes_its_default_and_help_from_toyconfig():
    """The CLI declares no default or help of its own: each ToyConfig field on the command line parses to
    the field's default, with the field's help text (lr's default follows the optimiser)."""
    import argparse
    import dataclasses

    from dfpo.core.settings import setting_of
    from dfpo.toy.cli import _add_common, _config
    from dfpo.toy.config import ADAM_LR, ToyConfig

    parser = argparse.ArgumentParser()
    _add_common(parser)
    args = parser.parse_args([])
    config = _config(args, ToyConfig().objectives, args.group_size)
    assert config == ToyConfig()
    helps = {a.dest: a.help for a in parser._actions}
    for f in dataclasses.fields(ToyConfig):
        if f.metadata.get("cli", True):
            assert setting_of(f).doc in helps[f.name], f.name
    adam = parser.parse_args(["--optimizer", "adam"])
    assert _config(adam, ("grpo",), 8).lr == ADAM_LR
