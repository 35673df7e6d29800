"""The paper's predictions checked in a toy run: each DFPO variant against each of its controls, paired over seeds.

A *control* is a sequence-level objective without an in-group transform (gspo, gspo_noclip, gspo with
overrides). It is a **trust-region-matched control** of a method when they share the clip range and
stop-gradient form (the score form counts as no clipping), aggregation, advantage scale, token mask, KL
weight and learning rate (``dfpo.core.loss.unmatched_components`` and the run label's ``@lr``). It is a
**step-size-matched control** when it is that control at a learning rate calibrated so that its effective
step matches the method's (``ToyConfig.step_matched``, written by ``--match-step``): the method then
differs from it in nothing but the in-group transform *and* no longer in step size. Plain ``gspo`` is also
shown when unmatched (the comparison a reader would make), with the verdict "not attributable".

Intervals (``dfpo.core.stats``), Bonferroni-adjusted over every check of the table: the Student-t interval
of the mean paired difference; for a censored outcome (steps to the threshold, the tax paid to reach it)
the median paired difference with its censoring-aware sign-test interval, or where the seeds are too few
for a sign test at the table's level and every run reached the threshold the t-interval of the mean
(``stats.paired_outcome_interval``).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ..core import stats
from ..core.labels import parse_run_label
from ..core.loss import objective_from_label, unmatched_components

# Predictions of the paper, as (summary key, direction of DFPO - GSPO, what the paper says).
PREDICTIONS = [
    ("steps_to_kappa", -1, "Prediction 1 (eq 19): DFPO reaches the reward threshold in fewer steps"),
    ("jitter2_reward", -1, "Prediction 2 (eq 21): DFPO's reward curve jitters less"),
    ("final_reward", +1, "Prediction 3 (eq 22): DFPO's final reward is higher"),
    ("tax_kl_cum", -1, "Prop. 3.1: DFPO pays less learning tax (drift at reward-irrelevant template rows)"),
    ("tax_at_kappa", -1, "Prop. 3.1 at matched progress: DFPO pays less tax to reach the reward threshold"),
    ("final_equiv_entropy", +1, "Cor. 3.2: DFPO keeps more entropy over the equivalent correct answers"),
]

CENSORED = ("steps_to_kappa", "tax_at_kappa")
"""Summary keys whose value for a run that never reached kappa is a lower bound (its ``reached`` is False)."""

NEGLIGIBLE = stats.NEGLIGIBLE
"""A paired difference whose adjusted interval lies within this fraction of the baseline's level is negligible."""

CLAIMS = ("reproduced", "contradicted", "negligible")
"""Verdict words that state something (and so must replicate on a second seed set)."""


def run_lr(label: str, config) -> float:
    """The learning rate a label trains at: its own ``@lr`` or the run's."""
    lr = parse_run_label(label).lr
    return lr if lr is not None else float(getattr(config, "lr", 0.0))


def _spec(label: str, config):
    return objective_from_label(parse_run_label(label).objective, **dict(getattr(config, "overrides", {}) or {}))


@dataclass(frozen=True)
class Pair:
    """A method and one of its controls: ``unmatched`` lists what differs beyond the transform; ``step_matched``
    says the control's learning rate was calibrated to the method's effective step."""

    method: str
    baseline: str
    unmatched: tuple[str, ...]
    step_matched: bool = False

    def match_text(self, config=None) -> str:
        if self.unmatched:
            return "no: " + ", ".join(self.unmatched)
        if self.step_matched:
            criterion = getattr(config, "match_step", "") or "effective step"
            return f"yes, and step size (lr {run_lr(self.baseline, config):.4g} calibrated on {criterion})"
        return "yes"


def comparison_pairs(labels, config) -> list[Pair]:
    """Each DFPO label with each of its controls in the run (trust-region-matched, step-size-matched) and with
    plain ``gspo`` when that one is not matched. A control at another learning rate is a control only of the
    method it was calibrated for (``config.step_matched``)."""
    specs = {o: _spec(o, config) for o in labels}  # a label's own @lr is read by run_lr
    step_matched = dict(getattr(config, "step_matched", {}) or {})
    methods = [o for o, sp in specs.items() if sp.transform != "none"]
    baselines = [o for o, sp in specs.items() if sp.transform == "none" and sp.ratio_level == "sequence"]
    pairs = []
    for m in methods:
        for b in baselines:
            calibrated = m in step_matched.get(b, "").split(",")
            unmatched = list(unmatched_components(specs[m], specs[b]))
            if run_lr(m, config) != run_lr(b, config) and not calibrated:
                unmatched.append("lr")
            if not unmatched or b == "gspo":
                pairs.append(Pair(m, b, tuple(unmatched), calibrated and not unmatched))
    return pairs


def censored(row: dict) -> np.ndarray:
    """Which seeds of a summary row never reached kappa (their censored values are lower bounds); none without ``reached``."""
    values = next(iter(row.values()))
    return ~np.asarray(row["reached"], bool) if "reached" in row else np.zeros(np.shape(values), bool)


def control_kinds(labels, config) -> dict[str, list[str]]:
    """'METHOD - CONTROL' -> what differs beyond the in-group transform, for every ordered pair of labels: [] (a
    trust-region-matched control), ['step size'] (a step-size-matched one), or the components (and 'lr') that differ."""
    specs = {o: _spec(o, config) for o in labels}
    step_matched = dict(getattr(config, "step_matched", {}) or {})
    out = {}
    for m in labels:
        for b in labels:
            if m == b:
                continue
            calibrated = m in step_matched.get(b, "").split(",")
            differ = list(unmatched_components(specs[m], specs[b]))
            if run_lr(m, config) != run_lr(b, config) and not calibrated:
                differ.append("lr")
            out[f"{m} - {b}"] = ["step size"] if calibrated and not differ else differ
    return out


def paired_difference(method: dict, baseline: dict, key: str, *, tests: int = 1):
    """The interval of method - baseline for one summary key over paired seeds: the Student-t ``Interval`` of the mean,
    or for a censored key the median's ``CensoredInterval`` (sign test), the t-interval of the mean where the seeds are
    too few for the sign test and every run reached kappa (``dfpo.core.stats.paired_outcome_interval``)."""
    if key in CENSORED:
        return stats.paired_outcome_interval(method[key], censored(method), baseline[key], censored(baseline), tests=tests)
    return stats.paired_interval(np.asarray(method[key], float) - np.asarray(baseline[key], float), tests=tests)


def baseline_level(baseline: dict, key: str, interval=None) -> float | None:
    """What 'negligible' is relative to: the baseline's mean, or for a censored key compared by its median
    (``interval`` a ``CensoredInterval``, or not given) its Kaplan-Meier median (None when it never reached kappa on
    half its seeds)."""
    if key in CENSORED and not isinstance(interval, stats.Interval):
        return stats.km_median(baseline[key], censored(baseline)).median
    return float(np.mean(baseline[key]))


def paired_verdict(
    diff: np.ndarray, direction: int, baseline: float | None = None, *, tests: int = 1
) -> tuple[str, tuple[float, float, float]]:
    """The verdict of ``dfpo.core.stats.verdict`` on the Student-t interval of a paired difference,
    Bonferroni-adjusted over ``tests``: 'negligible (within 2% of the baseline)', 'reproduced',
    'contradicted' or 'inconclusive'; 'negligible (no difference on any seed)' when every difference is 0."""
    interval = stats.paired_interval(diff, tests=tests)
    return judge(interval, direction, baseline, no_difference=bool(np.allclose(diff, 0, atol=1e-12))), interval.as_tuple()


def judge(interval, direction: int, baseline: float | None, *, unmatched=(), no_difference: bool = False) -> str:
    """The verdict words of a table cell: stats.verdict, 'negligible (within 2% ...)', 'not attributable (...)'."""
    if no_difference:
        return "negligible (no difference on any seed)"
    word = stats.verdict(interval, direction, baseline, NEGLIGIBLE)
    if word == "negligible":
        return f"negligible (within {NEGLIGIBLE:.0%} of the baseline)"
    if unmatched and word in ("reproduced", "contradicted"):
        return f"not attributable ({word} against an unmatched baseline)"
    return word


def replicated(first: str, second: str) -> str:
    """'yes' when two seed sets give the same claim, 'no' when they differ, 'n/a' when neither claims anything."""
    claim = lambda v: next((w for w in CLAIMS if w in v), None)  # noqa: E731  'not attributable (reproduced ...)' claims 'reproduced'
    a, b = claim(first), claim(second)
    if a is None and b is None:
        return "n/a"
    return "yes" if a == b and ("not attributable" in first) == ("not attributable" in second) else "no"


@dataclass(frozen=True)
class Check:
    """One row of the prediction table, its interval adjusted over the table."""

    text: str
    key: str
    direction: int
    pair: Pair
    interval: object
    baseline: float | None
    verdict: str


def checks(summary: dict[str, dict[str, object]], config) -> list[Check]:
    """Every prediction for every pair of ``comparison_pairs``, each interval Bonferroni-adjusted over all of them."""
    todo = [
        (text, key, direction, pair)
        for key, direction, text in PREDICTIONS
        for pair in comparison_pairs(list(summary), config)
        if key in summary[pair.baseline] and key in summary[pair.method]
    ]
    rows = []
    for text, key, direction, pair in todo:
        m, b = summary[pair.method], summary[pair.baseline]
        ci = paired_difference(m, b, key, tests=len(todo))
        level = baseline_level(b, key, ci)
        same = key not in CENSORED or not bool(np.any(censored(m) | censored(b)))  # a censored pair's difference is unknown
        none = same and bool(np.allclose(np.asarray(m[key], float) - np.asarray(b[key], float), 0, atol=1e-12))
        rows.append(Check(text, key, direction, pair, ci, level, judge(ci, direction, level, unmatched=pair.unmatched, no_difference=none)))
    return rows


def _seed_set(config, n: int) -> str:
    return f"--seed {getattr(config, 'seed', '?')}, {n} seeds"


def prediction_checks(summary: dict[str, dict[str, object]], config=None, discovery=None) -> list[str]:
    """Markdown lines: each paper prediction checked for every DFPO variant against each of its controls.

    Only a matched control can reproduce or contradict a prediction; against an unmatched baseline the verdict
    reads "not attributable". ``discovery`` = (summary, config) of the same experiment on a disjoint seed set:
    its verdict stands beside each check, with 'replicated?' (the same claim on both sets)."""
    rows = checks(summary, config)
    if not rows:
        return ["(no check: needs a dfpo_* objective and a GSPO-family baseline (gspo, gspo_noclip) in the run)"]
    n = rows[0].interval.n
    earlier, d_n, d_config = {}, 0, None
    if discovery is not None:
        d_summary, d_config = discovery
        d_rows = checks(d_summary, d_config)
        earlier = {(r.text, r.pair.method, r.pair.baseline): r.verdict for r in d_rows}
        d_n = d_rows[0].interval.n if d_rows else 0
    head = (
        "| prediction | method | control | matched control? | paired difference (method - control) [adjusted CI] "
        f"(relative to the control) | verdict ({_seed_set(config, n)}) |"
    )
    lines = [
        f"Intervals: {stats.interval_note(len(rows))}; for the censored outcomes ({', '.join(CENSORED)}) the median paired "
        "difference with its sign-test interval at the same level, each censored pair bounding its difference, or where "
        "the seeds are too few for a sign test and every run of both sides reached kappa the same t-interval of the mean "
        "('median' marks the sign test).",
        "",
        head + (f" verdict on the discovery set ({_seed_set(d_config, d_n)}) | replicated? |" if discovery is not None else ""),
        "|---" * (6 + 2 * (discovery is not None)) + "|",
    ]
    for r in rows:
        rel = stats.relative(r.interval, r.baseline) if r.baseline is not None else ""
        line = f"| {r.text} | {r.pair.method} | {r.pair.baseline} | {r.pair.match_text(config)} | {stats.interval_text(r.interval)}{rel} | {r.verdict} |"
        if discovery is not None:
            before = earlier.get((r.text, r.pair.method, r.pair.baseline), "not checked")
            line += f" {before} | {replicated(before, r.verdict)} |"
        lines.append(line)
    return lines
