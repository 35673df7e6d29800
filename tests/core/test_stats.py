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
    paired_outcome_interval,
    relative,
    sign_test_min_seeds,
    sign_test_rank,
    student_t_cdf,
    student_t_quantile,
    unbounded_reason,
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


def _t_density_mass(q: float, df: int) -> float:
    """P(-q <= T <= q) by the trapezoid rule on Student's density, written out with math.gamma (independent of
    student_t_cdf's series)."""
    t = np.linspace(-q, q, 400_001)
    c = math.gamma((df + 1) / 2) / (math.sqrt(df * math.pi) * math.gamma(df / 2))
    f = c * (1 + t * t / df) ** (-(df + 1) / 2)
    return float(np.sum((f[1:] + f[:-1]) / 2 * np.diff(t)))


def test_uncensored_paired_outcomes_too_few_for_a_sign_test_get_the_t_interval_by_independent_arithmetic():
    """8 fixed pairs at the level of a 42-row table (a sign test needs 11): mean +- t sd / sqrt(n), t the value whose
    central mass under Student's density (a numerical integral) is 1 - 0.05/42; the first 5 pairs at 95% (a sign test
    needs 6) with t_{0.975, 4} = 2.776445105 from the printed tables."""
    method = np.array([52.0, 47.0, 55.0, 49.0, 43.0, 61.0, 50.0, 56.0])
    baseline = np.array([49.0, 48.0, 51.0, 48.0, 48.0, 52.0, 48.0, 50.0])
    d = method - baseline  # [3, -1, 4, 1, -5, 9, 2, 6]
    mean, sd = d.sum() / 8, math.sqrt(float(((d - d.sum() / 8) ** 2).sum()) / 7)
    ci = paired_outcome_interval(method, [False] * 8, baseline, [False] * 8, tests=42)
    assert isinstance(ci, Interval) and ci.mean == pytest.approx(2.375, abs=1e-12)
    q = (ci.high - mean) / (sd / math.sqrt(8))
    assert mean - ci.low == pytest.approx(ci.high - mean, abs=1e-12)
    assert _t_density_mass(q, 7) == pytest.approx(1 - 0.05 / 42, abs=1e-7)
    assert unbounded_reason(ci) == ""  # 8 seeds bound it; the sign test there would not
    five = paired_outcome_interval(method[:5], None, baseline[:5], None)
    m5 = d[:5].sum() / 5
    half = 2.776445105 * math.sqrt(float(((d[:5] - m5) ** 2).sum()) / 4) / math.sqrt(5)
    assert isinstance(five, Interval) and (five.low, five.high) == pytest.approx((m5 - half, m5 + half), abs=1e-7)
    # where the sign test reaches the level (8 seeds at 95%), the column keeps the median's distribution-free interval
    assert paired_outcome_interval(method, None, baseline, None) == paired_censored_interval(method, None, baseline, None)


def test_a_censored_pair_keeps_the_median_and_its_sign_test():
    """One run that never reached the threshold makes its difference a bound, not a number: the median's interval,
    here with too few seeds for it, and the cell says so."""
    method, baseline = np.arange(8.0) + 10, np.full(8, 10.0)
    cens = np.zeros(8, bool)
    cens[7] = True
    ci = paired_outcome_interval(method, cens, baseline, None, tests=42)
    assert isinstance(ci, CensoredInterval) and ci.censored_pairs == 1
    assert ci == paired_censored_interval(method, cens, baseline, None, tests=42)
    assert "no interval (n = 8 seeds" in interval_text(ci)
    with pytest.raises(ValueError, match="one method and one baseline value per seed"):
        paired_outcome_interval([1.0, 2.0], None, [1.0], None)


@settings(max_examples=60, deadline=None)
@given(
    st.lists(st.floats(-1e3, 1e3, allow_nan=False), min_size=2, max_size=10),
    st.floats(-1e3, 1e3, allow_nan=False),
    st.integers(42, 200),
)
def test_the_t_interval_contains_the_mean_and_shifts_with_the_differences(d, shift, tests):
    """Below the sign test's seeds, the interval of uncensored paired outcomes is finite, contains their mean difference, and adding c to every difference adds c to both ends."""
    d = np.array(d)
    ci = paired_outcome_interval(d, None, np.zeros(d.size), None, tests=tests)
    moved = paired_outcome_interval(d + shift, None, np.zeros(d.size), None, tests=tests)
    assert isinstance(ci, Interval) and ci.low <= ci.mean <= ci.high and math.isfinite(ci.low) and math.isfinite(ci.high)
    tol = 1e-9 * (1 + abs(shift) + float(np.abs(d).max()))
    assert moved.low == pytest.approx(ci.low + shift, abs=tol) and moved.high == pytest.approx(ci.high + shift, abs=tol)


def test_sign_test_min_seeds_is_where_the_rank_first_reaches_one():
    assert sign_test_min_seeds(0.95) == 6  # 2 / 2^6 = 0.031 <= 0.05 < 2 / 2^5
    assert sign_test_min_seeds(1 - 0.05 / 42) == 11  # the standard ablation's 42-row table: 2 / 2^11 = 0.00098 <= 0.00119
    for level in (0.9, 0.95, 0.99, 1 - 0.05 / 42):
        n = sign_test_min_seeds(level)
        assert sign_test_rank(n, level) == 1 and sign_test_rank(n - 1, level) == 0


def test_an_interval_that_cannot_be_bounded_says_why_in_one_sentence():
    """Before: 'median +0 [-inf, inf]' with no reason. 8 seeds, 42 rows: the sign test needs 11 seeds."""
    ci = paired_censored_interval(np.arange(8.0), [False] * 7 + [True], np.zeros(8), None, tests=42)
    why = "n = 8 seeds: a sign-test interval of the median at level 0.9988 needs >= 11"
    assert unbounded_reason(ci) == why
    assert interval_text(ci, "{:+.1f}") == f"median +3.5, no interval ({why})"
    assert "inf" not in interval_text(ci) and relative(ci, 10.0) == " (+35.0%)"
    one = paired_interval([2.0])
    assert interval_text(one, "{:+.1f}") == "+2.0, no interval (n = 1 seed: a Student-t interval needs >= 2 seeds)"
    # enough seeds, but every pair has both runs censored: the reason is the censoring, not the seed count
    both = paired_censored_interval([151.0] * 16, [True] * 16, [151.0] * 16, [True] * 16)
    assert unbounded_reason(both).startswith("16 of 16 pairs have a run that never reached the threshold")
    # an interval open on one side keeps its finite end (a one-sided bound is information)
    half = paired_censored_interval([50.0] * 8, [False] * 8, [151.0] * 8, [True] * 8)
    assert unbounded_reason(half) == "" and interval_text(half, "{:+.0f}") == "median <=-101 [-inf, -101]"
