"""The shared paired-difference statistics (dfpo.core.stats): Student-t interval, Bonferroni
adjustment, verdict words, and why the percentile bootstrap was replaced."""

from __future__ import annotations

import math

import numpy as np
import pytest

from dfpo.core.stats import (
    Interval,
    bonferroni_level,
    interval_note,
    paired_interval,
    relative,
    student_t_cdf,
    student_t_quantile,
    verdict,
)
from dfpo.toy.report import paired_verdict, replicated


@pytest.mark.parametrize(
    "p, df, expected",  # printed tables of Student's t (e.g. NIST/SEMATECH e-Handbook 1.3.6.7.2)
    [
        (0.975, 1, 12.706204736),
        (0.975, 2, 4.302652730),
        (0.975, 3, 3.182446305),
        (0.975, 9, 2.262157163),
        (0.975, 15, 2.131449546),
        (0.975, 31, 2.039513446),
        (0.995, 2, 9.924843201),
        (0.95, 30, 1.697260887),
    ],
)
def test_student_t_quantiles_match_the_printed_tables(p, df, expected):
    assert student_t_quantile(p, df) == pytest.approx(expected, abs=1e-7)
    assert student_t_quantile(1 - p, df) == pytest.approx(-expected, abs=1e-7)
    assert student_t_cdf(expected, df) == pytest.approx(p, abs=1e-10)


def test_student_t_cdf_with_one_degree_of_freedom_is_the_cauchy_distribution():
    for t in (-3.0, -0.5, 0.0, 0.7, 10.0):
        assert student_t_cdf(t, 1) == pytest.approx(0.5 + math.atan(t) / math.pi, abs=1e-14)


def test_paired_interval_pinned_on_a_tiny_example():
    ci = paired_interval([1.0, 2.0, 3.0, 4.0])  # mean 2.5, sd 1.2910, t_{.975,3} = 3.1824
    assert (ci.mean, ci.low, ci.high, ci.n) == pytest.approx((2.5, 0.4457397432, 4.5542602568, 4), abs=1e-9)
    wide = paired_interval([1.0, 2.0, 3.0, 4.0], tests=3)  # each at level 1 - 0.05/3: t_{0.99167,3} = 4.8567
    assert (wide.low, wide.high) == pytest.approx((-0.6349587894, 5.6349587894), abs=1e-9)
    assert ci.excludes_zero and not wide.excludes_zero


def test_bonferroni_level_and_degenerate_inputs():
    assert bonferroni_level(0.95, 42) == pytest.approx(1 - 0.05 / 42)
    assert paired_interval([0.3, 0.3, 0.3]).as_tuple() == pytest.approx((0.3, 0.3, 0.3))  # no spread: zero width
    one = paired_interval([0.5])
    assert one.low == -math.inf and one.high == math.inf  # one seed gives no interval
    with pytest.raises(ValueError, match="finite values"):
        paired_interval([1.0, float("nan")])
    with pytest.raises(ValueError, match="tests must be an integer >= 1"):
        paired_interval([1.0, 2.0], tests=0)
    with pytest.raises(ValueError, match="p must be in"):
        student_t_quantile(1.0, 3)
    with pytest.raises(ValueError, match="df must be an integer"):
        student_t_cdf(1.0, 0)


def _percentile_bootstrap(values: np.ndarray, *, n_boot: int, seed: int, level: float = 0.95) -> tuple[float, float]:
    """The interval the toy reported before dfpo.core.stats: percentiles of the means of resampled seeds."""
    rng = np.random.default_rng(seed)
    means = values[rng.integers(0, values.size, size=(n_boot, values.size))].mean(-1)
    a = (1 - level) / 2
    return float(np.quantile(means, a)), float(np.quantile(means, 1 - a))


def test_student_t_interval_covers_near_nominal_at_small_n_where_the_percentile_bootstrap_under_covers():
    """Coverage of a nominal 95% interval for the mean of 5 normal paired differences, 1000 simulated tables."""
    rng = np.random.default_rng(20)
    draws = rng.normal(0.0, 1.0, (1000, 5))
    t_cover = np.mean([paired_interval(x).low <= 0 <= paired_interval(x).high for x in draws])
    boot = [_percentile_bootstrap(x, n_boot=500, seed=i) for i, x in enumerate(draws)]
    boot_cover = np.mean([lo <= 0 <= hi for lo, hi in boot])
    assert 0.93 <= t_cover <= 0.97  # exact 0.95 under normality; 1000 draws: s.e. 0.007
    assert boot_cover < 0.88  # plug-in sd and normal-like tails: about 0.81 at n = 5


@pytest.mark.parametrize(
    "interval, direction, baseline, expected",
    [
        ((-0.5, -0.9, -0.1), -1, 10.0, "reproduced"),
        ((-0.5, -0.9, -0.1), +1, 10.0, "contradicted"),
        ((-0.5, -0.9, +0.1), -1, 10.0, "inconclusive"),
        ((+0.05, -0.1, +0.15), +1, 10.0, "negligible"),  # inside +-2% of 10 = +-0.2
        ((+0.15, +0.1, +0.25), +1, 10.0, "reproduced"),  # significant, but the interval reaches past 0.2
        ((+0.15, +0.1, +0.19), +1, 10.0, "negligible"),  # significant and small: the margin rules out more
        ((0.0, 0.0, 0.0), +1, None, "negligible"),
    ],
)
def test_verdict_follows_from_the_interval(interval, direction, baseline, expected):
    assert verdict(Interval(*interval, n=8, level=0.95, tests=1), direction, baseline) == expected


def test_a_verdict_that_does_not_survive_the_correction_is_inconclusive():
    diff = np.array([-1.0, -1.3, -0.6, -1.1, -0.2])  # mean -0.84; alone t-interval [-1.386, -0.294]
    assert paired_verdict(diff, -1)[0] == "reproduced"
    word, (mean, lo, hi) = paired_verdict(diff, -1, tests=20)  # t_{1 - 0.05/40, 4} = 6.758
    assert word == "inconclusive" and (mean, lo, hi) == pytest.approx((-0.84, -2.168, +0.488), abs=1e-3)
    assert paired_verdict(np.zeros(4), -1)[0] == "inconclusive (no difference)"
    assert paired_verdict(np.array([0.01, 0.012, 0.009, 0.011]), +1, 1.0)[0] == "negligible (within 2% of the baseline)"


def test_replicated_asks_for_the_same_claim_on_both_seed_sets():
    assert replicated("reproduced", "reproduced") == "yes"
    assert replicated("negligible (within 2% of the baseline)", "negligible (within 2% of the baseline)") == "yes"
    assert replicated("reproduced", "inconclusive") == "no"
    assert replicated("not attributable (reproduced against an unmatched baseline)", "reproduced") == "no"
    assert replicated("inconclusive", "inconclusive (no difference)") == "n/a"


def test_relative_interval_and_the_note():
    ci = Interval(-0.5, -1.0, 0.25, 8, 0.95, 4)
    assert relative(ci, 10.0) == " (-5.0% [-10.0%, +2.5%])"
    assert relative(ci, 0.0) == ""
    assert interval_note(1) == "95% Student-t interval over seeds"
    assert "Bonferroni-adjusted for the 4 intervals of this table (each at level 0.9875)" in interval_note(4)
