"""The README's main job, ``dfpo toy ablate --task family --seeds 8``: its 42-check table can decide what it shows.

At the table's Bonferroni level (1 - 0.05/42) a sign-test interval of a median needs 11 seeds, so at 8 every
steps-to-kappa and tax-at-kappa row printed [-inf, inf] (issue 45, item 8). A row whose runs all reached kappa now
gets the t-interval of the mean paired difference; a row with a censored run keeps the median and says in one
sentence why it has no interval."""

from __future__ import annotations

import math

import numpy as np
import pytest

from dfpo.cli import main
from dfpo.toy.checks import CENSORED, censored, checks
from dfpo.toy.folder import read_config, read_metrics
from dfpo.toy.report import summarise

pytestmark = pytest.mark.usefixtures("one_thread")

REASON = "no interval (n = 8 seeds: a sign-test interval of the median at level 0.9988 needs >= 11)"


def test_the_main_jobs_ablation_at_8_seeds_bounds_every_uncensored_row_and_says_why_not_elsewhere(tmp_path, capsys):
    """20 steps with kappa 0.6: the unclipped objectives reach it on every seed, gspo's trust region does not, so the
    table holds both kinds of censored-outcome row."""
    out = tmp_path / "demo"
    assert (
        main(["toy", "ablate", "--task", "family", "--seeds", "8", "--steps", "20", "--kappa", "0.6", "--no-plots", "--out", str(out)]) == 0
    )
    config, _ = read_config(out)
    summary = summarise(read_metrics(out), config.kappa)
    rows = [r for r in checks(summary, config) if r.key in CENSORED]
    assert len(checks(summary, config)) == 42 and len(rows) == 14
    uncensored = [r for r in rows if not (censored(summary[r.pair.method]) | censored(summary[r.pair.baseline])).any()]
    assert 0 < len(uncensored) < len(rows)  # both kinds occur, so each assertion below bites
    for r in rows:
        finite = math.isfinite(r.interval.low) and math.isfinite(r.interval.high)
        assert finite == (r in uncensored), (r.pair, r.key, r.interval)
    text = (out / "summary.md").read_text()
    assert "[-inf, inf]" not in text and "inf%" not in text
    lines = [line for line in text.splitlines() if line.startswith(("| Prediction 1", "| Prop. 3.1 at matched"))]
    assert len(lines) == 14
    for r, line in zip(rows, lines):
        assert (REASON in line) == (r not in uncensored) and ("median" in line) == (r not in uncensored), line
    steps = next(r for r in uncensored if r.key == "steps_to_kappa")
    m, b = (np.asarray(summary[label]["steps_to_kappa"]) for label in (steps.pair.method, steps.pair.baseline))
    assert steps.interval.mean == pytest.approx(float(np.mean(m - b)))  # the mean paired difference, not a median
