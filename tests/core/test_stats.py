"""The shared paired-difference statistics (dfpo.core.stats): Student-t interval, Bonferroni
adjustment, verdict words, and why the percentile bootstrap was replaced; intervals of bounded quantities,
plot bands, and censored outcomes (Kaplan-Meier medians, censoring-aware paired intervals) with their coverage."""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from dfpo.core.stats import (
    CensoredInterval,
    Interval,
    binomial_cdf,
    bonferroni_level,
    interval_note,
    interval_text,
    kaplan_meier,
    km_median,
    mean_band,
    mean_interval,
    normal_quantile,
    paired_censored_interval,
    paired_interval,
    relative,
    sign_test_rank,
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
    assert paired_verdict(np.zeros(4), -1)[0] == "negligible (no difference on any seed)"  # identical runs: no change at all
    assert paired_verdict(np.array([0.01, 0.012, 0.009, 0.011]), +1, 1.0)[0] == "negligible (within 2% of the baseline)"


def test_replicated_asks_for_the_same_claim_on_both_seed_sets():
    assert replicated("reproduced", "reproduced") == "yes"
    assert replicated("negligible (within 2% of the baseline)", "negligible (within 2% of the baseline)") == "yes"
    assert replicated("reproduced", "inconclusive") == "no"
    assert replicated("not attributable (reproduced against an unmatched baseline)", "reproduced") == "no"
    assert replicated("inconclusive", "inconclusive") == "n/a"
    assert replicated("negligible (no difference on any seed)", "negligible (within 2% of the baseline)") == "yes"


def test_relative_interval_and_the_note():
    ci = Interval(-0.5, -1.0, 0.25, 8, 0.95, 4)
    assert relative(ci, 10.0) == " (-5.0% [-10.0%, +2.5%])"
    assert relative(ci, 0.0) == ""
    assert interval_note(1) == "95% Student-t interval over seeds"
    assert "Bonferroni-adjusted for the 4 intervals of this table (each at level 0.9875)" in interval_note(4)


# --- bounded quantities, plot bands, censored outcomes ---------------------------------------------------------------


def test_normal_quantile_matches_the_printed_tables():
    assert normal_quantile(0.975) == pytest.approx(1.959963985, abs=1e-8)
    assert normal_quantile(0.5) == pytest.approx(0.0, abs=1e-10)
    assert normal_quantile(0.05) == pytest.approx(-1.644853627, abs=1e-8)


def test_an_interval_of_a_non_negative_quantity_never_goes_below_zero_and_covers_as_often():
    """A KL of a few seeds near 0: the t-interval crosses 0; clipped at the bound, it covers whenever the t-interval does."""
    rng = np.random.default_rng(3)
    draws = rng.lognormal(-6, 1.5, (2000, 4))  # skewed, non-negative, mean exp(-6 + 1.125)
    true = math.exp(-6 + 1.5**2 / 2)
    plain = [paired_interval(x) for x in draws]
    clipped = [mean_interval(x, bounds=(0, None)) for x in draws]
    assert any(ci.low < 0 for ci in plain)
    assert all(ci.low >= 0 for ci in clipped)
    assert [ci.low <= true <= ci.high for ci in plain] == [ci.low <= true <= ci.high for ci in clipped]


def test_a_plot_band_is_the_tables_interval_at_every_step():
    rng = np.random.default_rng(4)
    curves = rng.gamma(0.5, 0.01, (50, 3))  # (steps, seeds), non-negative
    mean, low, high = mean_band(curves, bounds=(0, None))
    for t in range(50):
        ci = mean_interval(curves[t], bounds=(0, None))
        assert (mean[t], low[t], high[t]) == pytest.approx((ci.mean, ci.low, ci.high), abs=1e-15)
    assert low.min() >= 0


def test_kaplan_meier_without_censoring_is_the_empirical_survival_and_its_median_the_sample_median():
    times = np.array([5.0, 3.0, 9.0, 3.0, 7.0, 12.0])
    events, surv, _ = kaplan_meier(times)
    assert events.tolist() == [3.0, 5.0, 7.0, 9.0, 12.0]
    assert surv == pytest.approx([np.mean(times > t) for t in events])
    assert km_median(times).median == np.median(times)
    assert km_median([4.0, 1.0, 3.0]).median == 3.0


def test_kaplan_meier_pinned_with_censoring():
    # times 2, 3+, 4, 5+, 6 (+ = censored): S = 4/5 at 2, 4/5 * 2/3 at 4, 0 at 6; median 6 (first S <= 1/2)
    events, surv, greenwood = kaplan_meier([2, 3, 4, 5, 6], [False, True, False, True, False])
    assert events.tolist() == [2.0, 4.0, 6.0]
    assert surv == pytest.approx([0.8, 0.8 * 2 / 3, 0.0])
    assert greenwood[:2] == pytest.approx([1 / (5 * 4), 1 / (5 * 4) + 1 / (3 * 2)])
    assert km_median([2, 3, 4, 5, 6], [False, True, False, True, False]).median == 6.0


def test_a_median_censoring_leaves_open_prints_greater_or_equal_and_is_no_number():
    never = km_median([151.0] * 8, [True] * 8)
    assert never.median is None and never.low is None and never.high is None
    assert never.text("{:.0f}") == ">=151 [>=151, >=151] (0/8 reached)"
    some = km_median([10.0, 20.0, 30.0, 151.0, 151.0], [False, False, False, True, True])
    assert some.median == 30.0 and some.high is None
    assert some.text("{:.0f}") == "30 [10, >=151] (3/5 reached)"


def test_kaplan_meier_median_interval_covers_at_least_nominally_under_censoring():
    """Brookmeyer-Crowley (log-log) interval of the median of exponential times censored at 150, 600 simulated tables."""
    rng = np.random.default_rng(7)
    for n in (8, 16, 32):
        cover = 0
        for _ in range(600):
            t = np.ceil(rng.exponential(100, n))
            censored = t > 150
            est = km_median(np.where(censored, 151.0, t), censored)
            low = est.low if est.low is not None else 151.0
            high = est.high if est.high is not None else math.inf
            cover += low <= 70 <= high  # the median of ceil(T), T ~ Exp(mean 100): ceil(69.3)
        assert cover / 600 >= 0.93, (n, cover / 600)


def test_sign_test_rank_is_the_textbook_one():
    assert sign_test_rank(16, 0.95) == 4  # [x_(4), x_(13)], coverage 0.979
    assert 1 - 2 * binomial_cdf(3, 16) == pytest.approx(0.97873, abs=1e-5)
    assert sign_test_rank(8, 1 - 0.05 / 42) == 0  # no interval of 8 values reaches that level: the whole line
    assert sign_test_rank(32, 1 - 0.05 / 42) == 7


def test_paired_censored_interval_without_censoring_is_the_sign_test_interval_of_the_differences():
    d = np.arange(16.0)
    ci = paired_censored_interval(d, None, np.zeros(16), None)
    assert (ci.center, ci.low, ci.high, ci.censored_pairs) == (7.5, 3.0, 12.0, 0)
    assert interval_text(ci, "{:+.1f}") == "median +7.5 [+3.0, +12.0]"


def test_a_censored_pair_only_bounds_its_difference():
    """The method reached the threshold at step 50 on 8 seeds, the baseline never did in 150 steps: each difference is
    <= 50 - 151; the median is printed as a bound, never as the number 50 - 151."""
    ci = paired_censored_interval([50.0] * 8, [False] * 8, [151.0] * 8, [True] * 8)
    assert ci.center_low == -math.inf and ci.center_high == -101.0 and ci.low == -math.inf and ci.high == -101.0
    assert ci.excludes_zero and interval_text(ci, "{:+.0f}") == "median <=-101 [-inf, -101]"
    both = paired_censored_interval([151.0] * 4, [True] * 4, [151.0] * 4, [True] * 4)
    assert (both.low, both.high) == (-math.inf, math.inf) and not both.excludes_zero


@settings(max_examples=60, deadline=None)
@given(
    st.lists(st.tuples(st.integers(1, 40), st.integers(1, 40)), min_size=6, max_size=24),
    st.integers(10, 40),
)
def test_censoring_never_narrows_the_paired_interval(pairs, horizon):
    """Censoring values at a horizon only widens the sign-test interval of the true differences."""
    m, b = np.array(pairs, dtype=float).T
    truth = paired_censored_interval(m, None, b, None)
    mc, bc = m > horizon, b > horizon
    cens = paired_censored_interval(np.where(mc, horizon + 1.0, m), mc, np.where(bc, horizon + 1.0, b), bc)
    assert cens.low <= truth.low and cens.high >= truth.high
    assert cens.center_low <= truth.center <= cens.center_high


def test_paired_censored_interval_covers_at_least_nominally():
    """Median difference of paired times censored at 150 (both arms), 600 simulated tables per n."""
    rng = np.random.default_rng(11)
    for n in (8, 16, 32):
        cover = 0
        for _ in range(600):
            d = rng.normal(1.0, 3.0, n)
            m = rng.exponential(100, n)
            b = m - d
            mc, bc = m > 150, b > 150
            ci = paired_censored_interval(np.where(mc, 151.0, m), mc, np.where(bc, 151.0, b), bc)
            cover += ci.low <= 1.0 <= ci.high
        assert cover / 600 >= 0.94, (n, cover / 600)
    assert isinstance(ci, CensoredInterval)
