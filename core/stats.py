"""Paired-difference statistics shared by the toy lab and ``dfpo compare``: one interval, one
multiplicity correction, one verdict rule. numpy only (no torch), so the LLM trainer imports it cheaply.

Interval: Student-t on the paired differences d_s = method_s - baseline_s over seeds,
mean(d) +- t_{1 - a/2, n-1} sd(d) / sqrt(n). Exact when the differences are normal, close to
nominal for moderately skewed ones from n ~ 10, and deterministic (no resampling seed). It is
chosen over the percentile bootstrap because that one under-covers at small n: it uses the
plug-in sd (divisor n) and normal-like tails, so at n = 6 a nominal 95% interval covers about
88% of the time (``tests/core/test_stats.py`` measures both). BCa and studentized bootstraps
fix that only partly at n < 10 and need thousands of resamples per cell.

Multiplicity: Bonferroni-adjusted intervals. A table that shows m intervals computes each at
level 1 - (1 - level) / m, so all m cover together with probability >= level (simultaneous
coverage), and a cell is marked, or a verdict says "reproduced"/"contradicted", only when its
adjusted interval excludes 0. Bonferroni rather than Holm because Holm's step-down gives
adjusted p-values, not an interval per cell, and the tables print intervals; the price is a
little power.

Verdict (a prediction with a direction +1/-1, a baseline mean and a relative margin):
"negligible" when the adjusted interval lies inside +-margin * |baseline mean| (the data rule
out any effect larger than the margin, in either direction), else "reproduced"/"contradicted"
when it lies wholly on the predicted/opposite side of 0, else "inconclusive".

Bounded quantities (a KL, an entropy, a fraction): ``mean_interval`` clips the Student-t interval to
the quantity's support. The mean lies in the support, so the clipped interval covers exactly when the
unclipped one does (same coverage), and it never reports a negative KL. Plot bands are the same
intervals at each step (``mean_band``).

Censored outcomes (steps to a threshold that some runs never reach, the tax paid to reach it): a
censored value c says only that the true value is >= c, so it never enters a mean. A level is the
Kaplan-Meier median with a Brookmeyer-Crowley interval (the times where the log-log pointwise
interval of the survival curve contains 1/2; ``km_median``), printed ``>=c`` where censoring leaves
it open. A paired comparison (``paired_outcome_interval``) is the median of the per-seed differences
with its sign-test interval (order statistics of a Binomial(n, 1/2), ``paired_censored_interval``): a
pair with a censored side only bounds its difference (method observed m, baseline censored at c:
d <= m - c), and the interval takes the conservative end of each bound, so it covers at least as often
as the uncensored sign-test interval (distribution-free, no normality). It is used for every value of
such a column, censored or not, so a column has one estimand, wherever it can bound: at level 1 - a
the sign test bounds nothing below n = log2(2 / a) seeds (11 at 0.9988, the level of a 42-row table).
With fewer seeds, a row whose pairs are all uncensored gets the Student-t interval of the mean
difference (it bounds from n = 2); each row says which ("median" marks the sign test), and an
interval that cannot be bounded (a censored row with too few seeds) says why in one sentence
(``unbounded_reason``) instead of printing [-inf, inf].

The Student-t distribution function is Abramowitz & Stegun 26.7.3-26.7.4 (closed form for an
integer number of degrees of freedom, which is all a paired interval needs), inverted by
bisection; the normal quantile inverts ``math.erf`` the same way; no scipy.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

NEGLIGIBLE = 0.02
"""Default margin of "negligible": a fraction of the baseline's mean."""

VERDICTS = ("reproduced", "contradicted", "negligible", "inconclusive")


def student_t_cdf(t: float, df: int) -> float:
    """P(T <= t) for Student's t with an integer ``df`` >= 1 (Abramowitz & Stegun 26.7.3-26.7.4)."""
    if int(df) != df or df < 1:
        raise ValueError(f"df must be an integer >= 1, got df={df!r}")
    df = int(df)
    if math.isinf(t):
        return 1.0 if t > 0 else 0.0
    theta = math.atan(abs(t) / math.sqrt(df))
    s, c = math.sin(theta), math.cos(theta)
    if df % 2 == 1:  # 26.7.3: A = (2/pi) (theta + sin(theta) (cos + 2/3 cos^3 + ... ))
        total, term = 0.0, c
        for k in range(1, (df - 1) // 2 + 1):  # terms cos^1 .. cos^(df-2)
            if k > 1:
                term *= c * c * (2 * k - 2) / (2 * k - 1)
            total += term
        a = 2 / math.pi * (theta + s * total) if df > 1 else 2 * theta / math.pi
    else:  # 26.7.4: A = sin(theta) (1 + 1/2 cos^2 + 1.3/(2.4) cos^4 + ...)
        total, term = 1.0, 1.0
        for k in range(1, df // 2):  # terms cos^2 .. cos^(df-2)
            term *= c * c * (2 * k - 1) / (2 * k)
            total += term
        a = s * total
    a = min(max(a, 0.0), 1.0)  # P(|T| <= |t|)
    return 0.5 + 0.5 * a if t >= 0 else 0.5 - 0.5 * a


def student_t_quantile(p: float, df: int) -> float:
    """The t with P(T <= t) = p, by bisection on ``student_t_cdf`` (absolute error < 1e-10)."""
    if not 0 < p < 1:
        raise ValueError(f"p must be in (0, 1), got p={p!r}")
    if p < 0.5:
        return -student_t_quantile(1 - p, df)
    lo, hi = 0.0, 1.0
    while student_t_cdf(hi, df) < p:
        lo, hi = hi, 2 * hi
    while hi - lo > 1e-10 * max(1.0, hi):
        mid = 0.5 * (lo + hi)
        lo, hi = (mid, hi) if student_t_cdf(mid, df) < p else (lo, mid)
    return 0.5 * (lo + hi)


def bonferroni_level(level: float, tests: int) -> float:
    """Per-interval level so that ``tests`` intervals cover together with probability >= ``level``."""
    if not 0 < level < 1:
        raise ValueError(f"level must be in (0, 1), got level={level!r}")
    if int(tests) != tests or tests < 1:
        raise ValueError(f"tests must be an integer >= 1, got tests={tests!r}")
    return 1 - (1 - level) / tests


@dataclass(frozen=True)
class Interval:
    """Mean paired difference over n seeds and its (Bonferroni-adjusted) Student-t interval."""

    mean: float
    low: float
    high: float
    n: int
    level: float  # the family level asked for (0.95)
    tests: int  # the number of intervals it is adjusted for

    @property
    def excludes_zero(self) -> bool:
        return self.low > 0 or self.high < 0

    def as_tuple(self) -> tuple[float, float, float]:
        return self.mean, self.low, self.high


def paired_interval(diff, *, level: float = 0.95, tests: int = 1) -> Interval:
    """Student-t interval of the mean of paired differences ``diff`` (n,), Bonferroni-adjusted over ``tests``.

    n = 1 gives the whole line (no interval can be had from one seed). A constant ``diff`` gives a
    zero-width interval at its value.
    """
    d = np.asarray(diff, dtype=float).ravel()
    if d.size == 0 or not np.all(np.isfinite(d)):
        raise ValueError(f"paired_interval needs finite values, got {d!r}")
    per = bonferroni_level(level, tests)
    mean = float(d.mean())
    if d.size == 1:
        return Interval(mean, -math.inf, math.inf, 1, level, int(tests))
    se = float(d.std(ddof=1)) / math.sqrt(d.size)
    half = student_t_quantile(1 - (1 - per) / 2, d.size - 1) * se
    return Interval(mean, mean - half, mean + half, int(d.size), level, int(tests))


def verdict(interval: Interval, direction: int, baseline: float | None = None, margin: float = NEGLIGIBLE) -> str:
    """'negligible' / 'reproduced' / 'contradicted' / 'inconclusive' from an adjusted interval.

    ``direction`` is the predicted sign of (method - baseline). Negligible: the interval lies inside
    +-margin * |baseline| (needs a baseline mean). A zero-width interval at 0 is negligible too.
    """
    if direction not in (-1, 1):
        raise ValueError(f"direction must be +1 or -1, got direction={direction!r}")
    bound = margin * abs(baseline) if baseline is not None else 0.0
    if -bound <= interval.low and interval.high <= bound:
        return "negligible"
    low, high = (interval.low, interval.high) if direction > 0 else (-interval.high, -interval.low)
    if low > 0:
        return "reproduced"
    if high < 0:
        return "contradicted"
    return "inconclusive"


def relative(interval: Interval, baseline: float) -> str:
    """' (+x% [lo%, hi%])': the interval relative to the baseline's mean; '' when that mean is 0; ' (+x%)' when
    no end of the interval is finite (``interval_text`` says why)."""
    if abs(baseline) <= 1e-12:
        return ""
    m, lo, hi = (100 * v / abs(baseline) for v in interval.as_tuple())
    if not (math.isfinite(lo) or math.isfinite(hi)):
        return f" ({m:+.1f}%)"
    return f" ({m:+.1f}% [{lo:+.1f}%, {hi:+.1f}%])"


def interval_note(tests: int, level: float = 0.95) -> str:
    """One sentence saying how a table's intervals were computed."""
    if tests == 1:
        return f"{level:.0%} Student-t interval over seeds"
    return (
        f"{level:.0%} Student-t interval over seeds, Bonferroni-adjusted for the {tests} intervals of this table "
        f"(each at level {bonferroni_level(level, tests):.4g})"
    )


def normal_quantile(p: float) -> float:
    """The z with P(Z <= z) = p for a standard normal, by bisection on ``math.erf`` (absolute error < 1e-12)."""
    if not 0 < p < 1:
        raise ValueError(f"p must be in (0, 1), got p={p!r}")
    lo, hi = -40.0, 40.0
    while hi - lo > 1e-12:
        mid = 0.5 * (lo + hi)
        lo, hi = (mid, hi) if 0.5 * (1 + math.erf(mid / math.sqrt(2))) < p else (lo, mid)
    return 0.5 * (lo + hi)


Bounds = tuple[float | None, float | None]
"""The support of a quantity: (low, high), None where it is unbounded; (0, None) for a KL or an entropy."""


def _clip(value: float, bounds: Bounds) -> float:
    low, high = bounds
    if low is not None:
        value = max(value, low)
    if high is not None:
        value = min(value, high)
    return value


def mean_interval(values, *, level: float = 0.95, tests: int = 1, bounds: Bounds = (None, None)) -> Interval:
    """Student-t interval of the mean of ``values`` (n,), clipped to the quantity's support ``bounds``.

    The true mean lies in the support, so clipping keeps the coverage of the t-interval exactly.
    """
    ci = paired_interval(values, level=level, tests=tests)
    return Interval(ci.mean, _clip(ci.low, bounds), _clip(ci.high, bounds), ci.n, level, ci.tests)


def mean_band(values, *, level: float = 0.95, bounds: Bounds = (None, None)):
    """(mean, low, high), each (steps,), of curves ``values`` (steps, S): at every step the interval of
    ``mean_interval`` (Student-t over the S seeds, clipped to ``bounds``), so a plot's band is the table's interval."""
    y = np.asarray(values, dtype=float)  # (steps, S)
    if y.ndim != 2 or not np.all(np.isfinite(y)):
        raise ValueError(f"mean_band needs finite (steps, seeds) values, got shape {y.shape}")
    mean = y.mean(1)  # (steps,)
    if y.shape[1] == 1:
        half = np.full_like(mean, math.inf)
    else:
        half = student_t_quantile(1 - (1 - level) / 2, y.shape[1] - 1) * y.std(1, ddof=1) / math.sqrt(y.shape[1])
    low, high = mean - half, mean + half
    if bounds[0] is not None:
        low, high = np.maximum(low, bounds[0]), np.maximum(high, bounds[0])
    if bounds[1] is not None:
        low, high = np.minimum(low, bounds[1]), np.minimum(high, bounds[1])
    return mean, low, high


def _censored(values, censored) -> tuple[np.ndarray, np.ndarray]:
    v = np.asarray(values, dtype=float).ravel()
    c = np.zeros(v.shape, bool) if censored is None else np.asarray(censored, dtype=bool).ravel()
    if v.size == 0 or v.shape != c.shape or not np.all(np.isfinite(v)):
        raise ValueError(f"censored values need finite values and one censoring flag each, got {v.size} values and {c.size} flags")
    return v, c


def kaplan_meier(times, censored=None) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Kaplan-Meier survival curve of ``times`` (n,) where ``censored`` (n,) marks a lower bound (true time >= value).

    Returns (event times, S(t) just after each, Greenwood's sum of d / (n (n - d)) at each), each (events,).
    A censored time equal to an event time is still at risk at that event (censored after it).
    """
    t, cens = _censored(times, censored)
    events = np.unique(t[~cens])
    surv, greenwood = np.ones(events.size), np.zeros(events.size)
    s, g = 1.0, 0.0
    for j, u in enumerate(events):
        at_risk = int(np.sum(t >= u))
        died = int(np.sum((t == u) & ~cens))
        s *= 1 - died / at_risk
        g = g + died / (at_risk * (at_risk - died)) if at_risk > died else math.inf
        surv[j], greenwood[j] = s, g
    return events, surv, greenwood


@dataclass(frozen=True)
class MedianEstimate:
    """Kaplan-Meier median of censored values and its Brookmeyer-Crowley interval; None where censoring leaves
    a value open (the median or a bound lies at or beyond ``horizon``, the largest censored value)."""

    median: float | None
    low: float | None
    high: float | None
    reached: int
    n: int
    horizon: float
    level: float

    def text(self, fmt: str = "{:.1f}") -> str:
        """'120.0 [98.0, >=151.0] (5/8 reached)': ``>=`` where censoring leaves the value open."""
        show = lambda v: fmt.format(v) if v is not None else ">=" + fmt.format(self.horizon)  # noqa: E731
        return f"{show(self.median)} [{show(self.low)}, {show(self.high)}] ({self.reached}/{self.n} reached)"


def km_median(times, censored=None, *, level: float = 0.95) -> MedianEstimate:
    """Kaplan-Meier median of ``times`` (``censored`` marks lower bounds) with the Brookmeyer-Crowley interval.

    Median: the first event time where S(t) <= 1/2 (the midpoint to the next event time where S is exactly 1/2,
    so uncensored values give the sample median). Interval: the event times whose pointwise log-log interval of
    S(t) (Greenwood's variance) contains 1/2, i.e. from the first time the lower curve is <= 1/2 to the first time
    the upper curve is <= 1/2.
    """
    t, cens = _censored(times, censored)
    events, surv, greenwood = kaplan_meier(t, cens)
    z = normal_quantile(1 - (1 - level) / 2)
    upper, lower = np.ones_like(surv), np.ones_like(surv)
    for j, (s, g) in enumerate(zip(surv, greenwood)):
        if s <= 0 or not math.isfinite(g):  # every run left at risk reached it: no later time is possible
            lower[j] = upper[j] = 0.0
        elif s >= 1:
            lower[j] = upper[j] = 1.0
        else:
            spread = z * math.sqrt(g) / abs(math.log(s))
            lower[j], upper[j] = s ** math.exp(spread), s ** math.exp(-spread)

    def first(curve) -> float | None:
        hit = np.flatnonzero(curve <= 0.5 + 1e-12)
        return float(events[hit[0]]) if hit.size else None

    median = first(surv)
    if median is not None:
        j = int(np.flatnonzero(events == median)[0])
        if abs(surv[j] - 0.5) <= 1e-12 and j + 1 < events.size:
            median = 0.5 * (median + float(events[j + 1]))
    horizon = float(t[cens].max()) if cens.any() else float(t.max())
    return MedianEstimate(median, first(lower), first(upper), int((~cens).sum()), int(t.size), horizon, level)


def binomial_cdf(k: int, n: int) -> float:
    """P(X <= k) for X ~ Binomial(n, 1/2), exact."""
    return sum(math.comb(n, i) for i in range(0, k + 1)) / 2**n if k >= 0 else 0.0


def sign_test_rank(n: int, level: float) -> int:
    """The k of the sign-test interval [x_(k), x_(n-k+1)] for a median at ``level`` (>= level coverage); 0 when no
    interval of n values reaches that level."""
    alpha = 1 - level
    k = 0
    while k < (n + 1) // 2 and binomial_cdf(k, n) <= alpha / 2:
        k += 1
    return k


@dataclass(frozen=True)
class CensoredInterval:
    """Median paired difference of a censored outcome with its sign-test interval.

    ``center_low`` and ``center_high`` bound the median of the true differences (equal when censoring leaves it
    determined); ``low`` / ``high`` may be infinite where censored pairs leave the interval open.
    """

    center_low: float
    center_high: float
    low: float
    high: float
    n: int
    level: float
    tests: int
    censored_pairs: int

    @property
    def excludes_zero(self) -> bool:
        return self.low > 0 or self.high < 0

    @property
    def center(self) -> float:
        """The median where determined, else its finite bound (the ``<=`` / ``>=`` of ``text``)."""
        if self.center_low == self.center_high or not math.isfinite(self.center_high):
            return self.center_low
        return self.center_high if not math.isfinite(self.center_low) else 0.5 * (self.center_low + self.center_high)

    def as_tuple(self) -> tuple[float, float, float]:
        return self.center, self.low, self.high


def paired_censored_interval(
    method, method_censored, baseline, baseline_censored, *, level: float = 0.95, tests: int = 1
) -> CensoredInterval:
    """Median of the paired differences (method - baseline) of a censored outcome and its sign-test interval,
    Bonferroni-adjusted over ``tests``. A censored value c means the true value is >= c, so a pair bounds its
    difference on one side (both censored: unbounded); the interval's ends are the k-th smallest lower bound and
    the k-th largest upper bound, which covers at least as often as the sign-test interval of the true differences.
    """
    m, mc = _censored(method, method_censored)
    b, bc = _censored(baseline, baseline_censored)
    if m.shape != b.shape:
        raise ValueError(f"paired values need one method and one baseline value per seed, got {m.size} and {b.size}")
    d = m - b
    low = np.where(mc, d, np.where(bc, -math.inf, d))  # method censored: d >= m - b; baseline censored: d <= m - b
    high = np.where(bc, d, np.where(mc, math.inf, d))
    both = mc & bc
    low, high = np.where(both, -math.inf, low), np.where(both, math.inf, high)
    k = sign_test_rank(d.size, bonferroni_level(level, tests))
    lo_sorted, hi_sorted = np.sort(low), np.sort(high)
    lo = float(lo_sorted[k - 1]) if k else -math.inf
    hi = float(hi_sorted[d.size - k]) if k else math.inf
    return CensoredInterval(
        float(np.median(low)),  # low holds finite and -inf values only, high finite and +inf: no NaN
        float(np.median(high)),
        lo,
        hi,
        int(d.size),
        level,
        int(tests),
        int((mc | bc).sum()),
    )


def paired_outcome_interval(
    method, method_censored, baseline, baseline_censored, *, level: float = 0.95, tests: int = 1
) -> Interval | CensoredInterval:
    """The interval of method - baseline over paired seeds (n,) of an outcome that may be censored (steps to a
    threshold): the median's censoring-aware sign-test ``CensoredInterval`` (``paired_censored_interval``:
    distribution-free, and a censored value is a bound, not a number to average) where its n seeds reach the
    Bonferroni-adjusted level (``sign_test_min_seeds``); with fewer seeds and no pair censored, every difference is a
    number and the Student-t ``Interval`` of their mean bounds it from n = 2 (``paired_interval``)."""
    m, mc = _censored(method, method_censored)
    b, bc = _censored(baseline, baseline_censored)
    if m.shape != b.shape:
        raise ValueError(f"paired values need one method and one baseline value per seed, got {m.size} and {b.size}")
    if not (mc | bc).any() and sign_test_rank(m.size, bonferroni_level(level, tests)) == 0:
        return paired_interval(m - b, level=level, tests=tests)
    return paired_censored_interval(m, mc, b, bc, level=level, tests=tests)


def sign_test_min_seeds(level: float) -> int:
    """The fewest values whose sign-test interval of a median reaches ``level``: the n with 2 / 2^n <= 1 - level."""
    n = 1
    while sign_test_rank(n, level) == 0:
        n += 1
    return n


def unbounded_reason(ci) -> str:
    """Why an interval is the whole line, in one sentence without a final stop ('' when an end is finite).

    A Student-t ``Interval`` of one seed has no spread to scale; a sign-test ``CensoredInterval`` needs
    ``sign_test_min_seeds`` seeds at its Bonferroni-adjusted level, or else enough pairs whose runs both reached
    the threshold."""
    if math.isfinite(ci.low) or math.isfinite(ci.high):
        return ""
    per = bonferroni_level(ci.level, ci.tests)
    if isinstance(ci, CensoredInterval):
        need = sign_test_min_seeds(per)
        if ci.n < need:
            return f"n = {ci.n} seed{'s' if ci.n != 1 else ''}: a sign-test interval of the median at level {per:.4g} needs >= {need}"
        return (
            f"{ci.censored_pairs} of {ci.n} pairs have a run that never reached the threshold, and a censored pair bounds its "
            "difference on one side only: too few bounded pairs on either side for the sign test"
        )
    return f"n = {ci.n} seed: a Student-t interval needs >= 2 seeds"


def format_number(value: float, fmt: str) -> str:
    """``fmt`` of a finite value; 'inf' / '-inf' otherwise (an interval censoring leaves open)."""
    return fmt.format(value) if math.isfinite(value) else ("inf" if value > 0 else "-inf")


def interval_text(ci, fmt: str = "{:+.3g}") -> str:
    """'mean [low, high]' of an ``Interval``; 'median m [low, high]' of a ``CensoredInterval``, with '<=m' / '>=m'
    where censoring leaves the median open on one side; 'm, no interval (why)' where no end is finite."""
    if isinstance(ci, CensoredInterval):
        if format_number(ci.center_low, fmt) == format_number(ci.center_high, fmt):
            center = format_number(ci.center_low, fmt)
        elif not math.isfinite(ci.center_low) and math.isfinite(ci.center_high):
            center = "<=" + format_number(ci.center_high, fmt)
        elif math.isfinite(ci.center_low) and not math.isfinite(ci.center_high):
            center = ">=" + format_number(ci.center_low, fmt)
        elif not math.isfinite(ci.center_low) and not math.isfinite(ci.center_high):
            center = "unknown (censored)"
        else:
            center = f"in [{format_number(ci.center_low, fmt)}, {format_number(ci.center_high, fmt)}]"
        head = f"median {center}"
    else:
        head = fmt.format(ci.mean)
    why = unbounded_reason(ci)
    if why:
        return f"{head}, no interval ({why})"
    return f"{head} [{format_number(ci.low, fmt)}, {format_number(ci.high, fmt)}]"
