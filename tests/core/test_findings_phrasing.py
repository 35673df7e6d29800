"""dfpo.core.findings on synthetic evidence: the fixed phrasing of each verdict pair, censored rows, conclusions that
the rows must support, bad records, rows against zero. (The ledger's own records: tests/test_findings.py.)"""

from __future__ import annotations

import math

import numpy as np
import pytest

from dfpo.core import stats
from dfpo.core.findings import SETS, Finding, Row, Summary, Verdict, conclusion_problems, load_findings, phrase, render_findings

# ----- the fixed phrasings -------------------------------------------------------------------------------------


def _verdict(word: str, center: float, low: float, high: float, level: float = 100.0) -> Verdict:
    return Verdict(word, stats.Interval(center, low, high, 16, 0.95, 1), level)


def test_negligible_on_both_sets_reads_no_change_larger_than_the_widest_bound():
    text = phrase("steps", (_verdict("negligible", 0.1, -1.2, 1.4), _verdict("negligible", -0.2, -1.81, 0.5)))
    assert text == "steps: no change larger than 1.9% of the control"
    exact = phrase("steps", (_verdict("negligible", 0, 0, 0), _verdict("negligible", 0, 0, 0)))
    assert exact == "steps: no change larger than 0.1% of the control"  # a bound, never "larger than 0.0%"


def test_inconclusive_reads_not_shown_either_way():
    assert phrase("tax", (_verdict("inconclusive", 0.4, -1.8, 2.5), _verdict("inconclusive", 0.1, -3, 3))) == "tax: not shown either way"
    one = phrase("tax", (_verdict("lower", -9, -17, -2), _verdict("inconclusive", -3, -8, 2)))
    assert one == "tax: not shown either way; lower on the discovery set only"
    assert "no change" not in phrase("tax", (_verdict("negligible", 0, -1, 1), _verdict("inconclusive", 0, -3, 3)))


def test_an_effect_on_both_sets_reads_with_its_intervals_and_a_disagreement_did_not_replicate():
    both = phrase("steps", (_verdict("higher", 9.7, 1, 19.9), _verdict("higher", 7.1, 4.4, 9.8)))
    assert both == "steps higher: +7.1% [+4.4%, +9.8%] (discovery set: +9.7% [+1.0%, +19.9%])"
    split = phrase("steps", (_verdict("higher", 9.7, 1, 19.9), _verdict("lower", -3.8, -8.5, -0.9)))
    assert split.startswith("steps: did not replicate (discovery: higher +9.7%")


def test_a_censored_row_never_averages_a_censored_value():
    """Method reached at step 50, control never in 150 steps: the row is 'lower', read off bounds, not off 50 - 151."""
    ev = {
        "name": "x",
        "kind": "toy-run",
        "title": "T",
        "sets": {
            s: {
                "summary": {
                    "m": {"steps_to_kappa": [50.0] * 8, "reached": [True] * 8},
                    "c": {"steps_to_kappa": [151.0] * 8, "reached": [False] * 8},
                }
            }
            for s in SETS
        },
    }
    row = Row("x", "m", "c", "steps_to_kappa", ("lower", "lower"))
    summary = Summary("t", [Finding("f", "T", (row,))], {"x": ev})
    (d, c) = summary.verdicts[row.key()]
    assert d.word == "lower" and c.level is None and math.isinf(c.interval.low)  # the control's median is never reached
    assert "not shown" not in render_findings(summary) and "-101" in render_findings(summary)


def test_a_conclusion_with_a_number_or_an_unsupported_no_change_is_refused():
    rows = (Row("x", "m", "c", "tax_kl_cum", ("inconclusive", "negligible")),)
    assert conclusion_problems(Finding("a", "T", rows, conclusion="Tax is 3% lower.")) == [
        "a: the conclusion holds a number; numbers come from the tables",
        "a: the conclusion names an effect, but no row has the same effect on both sets",
    ]
    assert conclusion_problems(Finding("b", "T", rows, conclusion="DFPO trains as GSPO (eq 49).")) == [
        "b: the conclusion says no change, but not every row is negligible on both sets"
    ]


def test_a_record_with_an_unknown_metric_or_verdict_is_refused_naming_it():
    with pytest.raises(ValueError, match="unknown metric 'speed'"):
        load_findings(
            {
                "finding": [
                    {"id": "a", "topic": "T", "rows": [{"experiment": "x", "method": "m", "metric": "speed", "expect": "lower/lower"}]}
                ]
            }
        )
    with pytest.raises(ValueError, match="expect must be two of"):
        load_findings(
            {"finding": [{"id": "a", "topic": "T", "rows": [{"experiment": "x", "method": "m", "metric": "asym", "expect": "better"}]}]}
        )


def test_a_row_against_zero_is_a_one_sample_interval():
    """A probe table (issue 28) compares a quantity with 0: control = ''."""
    values = np.linspace(0.9, 1.1, 16).tolist()
    ev = {"name": "p", "kind": "toy-run", "title": "P", "sets": {s: {"summary": {"m": {"asym": values}}} for s in SETS}}
    row = Row("p", "m", "", "asym", ("higher", "higher"))
    summary = Summary("t", [Finding("f", "P", (row,))], {"p": ev})
    assert [v.word for v in summary.verdicts[row.key()]] == ["higher", "higher"] and not summary.mismatches()


def _steps_evidence(seeds: dict[str, int]) -> dict:
    """Steps of a method 2 to 4 below its control's 50 on every seed, every run reaching the threshold."""
    sets = {}
    for s, n in seeds.items():
        m = [48.0 - (i % 3) for i in range(n)]
        sets[s] = {
            "summary": {"m": {"steps_to_kappa": m, "reached": [True] * n}, "c": {"steps_to_kappa": [50.0] * n, "reached": [True] * n}}
        }
    return {"name": "x", "kind": "toy-run", "title": "T", "sets": sets}


def test_a_seed_set_too_small_for_the_median_reads_the_mean_and_says_so():
    """5 uncensored seeds at 95%: a sign test needs 6, so the row reads the t-interval of the mean (bounded), and its
    phrase says 'mean' where the ledger's metric name says 'median'; a set of 16 keeps the median."""
    row = Row("x", "m", "c", "steps_to_kappa", ("lower", "lower"))
    small = Summary("t", [Finding("f", "T", (row,))], {"x": _steps_evidence({"discovery": 5, "confirmation": 5})})
    assert all(isinstance(v.interval, stats.Interval) and math.isfinite(v.interval.low) for v in small.verdicts[row.key()])
    assert [v.word for v in small.verdicts[row.key()]] == ["lower", "lower"]
    assert "steps to the reward threshold (mean) lower" in render_findings(small) and "(median)" not in render_findings(small)
    level = small.verdicts[row.key()][0].level
    assert level == 50.0  # relative to the control's mean, as the interval is of the mean
    mixed = Summary("t", [Finding("f", "T", (row,))], {"x": _steps_evidence({"discovery": 5, "confirmation": 16})})
    assert isinstance(mixed.verdicts[row.key()][1].interval, stats.CensoredInterval)
    assert "(mean on the discovery set, median on the confirmation set)" in render_findings(mixed)


def test_a_row_it_cannot_bound_says_why_instead_of_inf():
    """8 censored pairs at 95% / 42 rows: no sign-test interval; the phrase names the seeds it would need."""
    pair = (Verdict("lower", stats.paired_censored_interval([50.0] * 8, [False] * 7 + [True], [60.0] * 8, None, tests=42), 60.0),) * 2
    text = phrase("steps", (pair[0], pair[1]))
    assert "inf" not in text and "no interval (n = 8 seeds: a sign-test interval of the median at level 0.9988 needs >= 11)" in text


def test_an_absolute_verdict_reads_in_the_metrics_own_units_beside_the_control_mean():
    """A metric of either sign (SIGNED) is never a percent of its control's mean, which can lie near 0."""
    pair = tuple(Verdict("lower", stats.Interval(-0.139, -0.194, -0.084, 8, 0.95, 52), 0.0537, absolute=True) for _ in range(2))
    assert pair[0].relative() is None
    text = phrase("length part", pair)
    assert (
        text
        == "length part lower: -0.139 [-0.194, -0.084] (control mean +0.0537) (discovery set: -0.139 [-0.194, -0.084] (control mean +0.0537))"
    )
    small = tuple(Verdict("negligible", stats.Interval(1e-4, -2e-4, 3e-4, 8, 0.95, 1), 0.05, absolute=True) for _ in range(2))
    assert phrase("length part", small) == "length part: no change larger than 0.0003 (control means +0.05, +0.05)"
    assert "%" not in phrase("length part", small)
