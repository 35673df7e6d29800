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

The Student-t distribution function is Abramowitz & Stegun 26.7.3-26.7.4 (closed form for an
integer number of degrees of freedom, which is all a paired interval needs), inverted by
bisection; no scipy.
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
    """' (+x% [lo%, hi%])': the interval relative to the baseline's mean; '' when that mean is 0."""
    if abs(baseline) <= 1e-12:
        return ""
    m, lo, hi = (100 * v / abs(baseline) for v in interval.as_tuple())
    return f" ({m:+.1f}% [{lo:+.1f}%, {hi:+.1f}%])"


def interval_note(tests: int, level: float = 0.95) -> str:
    """One sentence saying how a table's intervals were computed."""
    if tests == 1:
        return f"{level:.0%} Student-t interval over seeds"
    return (
        f"{level:.0%} Student-t interval over seeds, Bonferroni-adjusted for the {tests} intervals of this table "
        f"(each at level {bonferroni_level(level, tests):.4g})"
    )
