"""The README's main job, ``dfpo toy ablate --task family --seeds 8``: its 42-check table can decide what it shows.

At the table's Bonferroni level (1 - 0.05/42) a sign-test interval of a median needs 11 seeds, so at 8 every
steps-to-kappa and tax-at-kappa row printed [-inf, inf] (issue 45, item 8). A row whose runs all reached kappa now
gets the t-interval of the mean paired difference; a row with a censored run keeps the median and says in one
sentence why it has no interval."""

from __future__ import annotations

import math
import re
import shlex
from pathlib import Path

import numpy as np
import pytest

from dfpo.cli import main
from dfpo.core.findings import SETS, read_ledger, row_verdict
from dfpo.toy.checks import CENSORED, censored, checks
from dfpo.toy.folder import read_config, read_metrics
from dfpo.toy.report import summarise

pytestmark = pytest.mark.usefixtures("one_thread")

ROOT = Path(__file__).resolve().parents[2]
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


def _readme_main_job(out) -> list[str]:
    """The README's main-job toy command (its first code block), as dfpo's argv with ``--out`` moved to ``out``."""
    readme = (ROOT / "README.md").read_text()
    block = readme.split("```bash", 1)[1].split("```", 1)[0]
    (command,) = re.findall(r"dfpo (toy ablate [^\\\n&]*)", block)
    argv = shlex.split(command)
    argv[argv.index("--out") + 1] = str(out)
    return argv


@pytest.mark.slow
def test_the_readmes_main_job_decides_the_readmes_headline(tmp_path, capsys):
    """The README's own toy command at its 8 seeds: every row of the headline finding (the first of "What we found",
    read from the stored 16- and 32-seed tables) is bounded in the main job's table and gets the README's verdict, and no
    other row of the standard ablation that the README reads states a different claim (only 'inconclusive' may differ)."""
    out = tmp_path / "toy-demo"
    argv = _readme_main_job(out)
    assert argv[:2] == ["toy", "ablate"] and argv[argv.index("--seeds") + 1] == "8"
    assert main(argv) == 0
    config, _ = read_config(out)
    summary = summarise(read_metrics(out), config.kappa)
    tests = len(checks(summary, config))
    as_lists = {label: {k: np.asarray(v).tolist() for k, v in row.items()} for label, row in summary.items()}
    demo = {"name": "demo", "kind": "toy-run", "title": "main job", "sets": {s: {"summary": as_lists} for s in SETS}}
    ledger, _ = read_ledger(ROOT / "docs" / "attribution")
    readme = [f for f in ledger if "readme" in f.summaries]
    rows = [(f, r) for f in readme for r in f.rows if r.experiment == "toy-ablate-family" and {r.method, r.control} <= set(summary)]
    headline = [r for f, r in rows if f.id == readme[0].id]
    assert len(headline) >= 4
    for r in headline:
        v = row_verdict(demo, "confirmation", r, tests=tests)
        assert math.isfinite(v.interval.low) and math.isfinite(v.interval.high), r
        assert v.word == r.expect[1], (r, v.word)
    for _, r in rows:
        word = row_verdict(demo, "confirmation", r, tests=tests).word
        assert word in (r.expect[1], "inconclusive"), (r, word)


def test_one_seed_prints_no_interval_and_says_why(tmp_path, capsys):
    """Before: one seed's levels printed their whole support as the interval ('0.710 [0.000, 1.000]', '+0.22 [-inf, +inf]')."""
    out = tmp_path / "one"
    assert main(["toy", "run", "--objectives", "gspo,dfpo_min", "--seeds", "1", "--steps", "5", "--no-plots", "--out", str(out)]) == 0
    text = (out / "summary.md").read_text()
    assert "inf" not in text and "[0.000, 1.000]" not in text
    assert "A level marked '(no interval)' has none (n = 1 seed: a Student-t interval needs >= 2 seeds)." in text
    assert "no interval (n = 1 seed: a sign-test interval of the median at level" in text
