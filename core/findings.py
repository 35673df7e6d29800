"""The findings ledger: every sentence this project writes about its own experiments, generated from stored tables.

The claims ledger (``dfpo.theory``) checks the paper's claims; this one checks ours. A **finding** is a record:

- ``id`` and ``topic`` (a noun phrase: what the finding is about, never a claim);
- ``rows``: the table rows it reads, each an experiment's stored evidence (``docs/attribution/data/NAME.json``),
  a method, a control, a metric (and for a sweep the knob's value), with the verdict it must have on each seed set
  (``expect``: discovery, confirmation);
- ``conclusion`` (optional): one typed sentence that the rows support. It holds no number (numbers come from the
  tables) and words that claim "no change" need every row negligible on both sets (``conclusion_problems``).

A row's verdict is read off the interval of its paired difference (``dfpo.core.stats``; the censoring-aware
median interval for steps to a threshold; a mean's interval cut to the values the metric can take, ``BOUNDS``),
Bonferroni-adjusted over the rows the summary reads from that row's own experiment on that seed set
(``Summary.families``: one family per experiment), against a margin of 2% of the
control's level: ``negligible`` (the interval lies within the margin), ``lower`` / ``higher`` (it excludes 0),
``inconclusive`` (neither). Each verdict pair maps to one fixed phrasing (``phrase``):

- negligible on both sets -> "METRIC: no change larger than X% of the control" (X: the widest bound of both);
- lower (higher) on both -> "METRIC lower (higher): m% [lo%, hi%]" (the confirmation set relative to the control's
  level; the discovery set's in brackets after it; a metric of either sign, ``SIGNED``, in its own units with the
  control's mean beside it);
- inconclusive on either set, the other not contradicting it -> "METRIC: not shown either way";
- two different claims -> "METRIC: did not replicate (discovery: V1; confirmation: V2)".

The evidence formats are those of ``dfpo toy run/ablate`` (a per-seed summary per label), ``dfpo toy spread``
(per-seed values per knob value) and ``dfpo compare`` (compare.json); ``paired_values`` reads each. numpy only.
Another kind of table (a probe of drift per objective) adds an adapter in ``paired_values`` and its metrics in
``METRICS``; a row with ``control = ""`` compares the method's values with 0.
"""

from __future__ import annotations

import dataclasses
import json
import math
import re
import tomllib
from collections import Counter
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from . import stats

SETS = ("discovery", "confirmation")
WORDS = ("lower", "higher", "negligible", "inconclusive")
MARGIN = stats.NEGLIGIBLE

METRICS: dict[str, str] = {
    # toy (dfpo toy run / ablate / spread)
    "steps_to_kappa": "steps to the reward threshold (median)",
    "final_reward": "final expected reward",
    "mean_reward": "mean expected reward over training",
    "jitter2_reward": "reward jitter (Jitter2, eq 20)",
    "tax_kl_cum": "learning tax (cumulative KL at template rows, Prop. 3.1)",
    "tax_kl_init": "KL to the initial policy at template rows",
    "tax_at_kappa": "tax paid to reach the threshold (median)",
    "final_equiv_entropy": "entropy over equivalent correct answers",
    "final_entropy": "sequence entropy",
    "asym": "Asym (eq 23, on the effective coefficients)",
    "residual_rel": "shared-token residual (eq 2)",
    "clip_frac": "clipped fraction",
    "update_norm": "update norm per rollout batch",
    # LLM (dfpo compare)
    "eval": "final eval accuracy (avg@k)",
    "reward_last10": "train reward (last 10 steps)",
    "jitter2": "train-reward jitter (Jitter2, eq 20)",
    "entropy_last10": "rollout entropy (last 10 steps)",
    "residual": "shared-token residual (eq 2)",
    "tax_kl": "learning-tax proxy (KL of pi_init to the policy at the eval prompts' own positions, which never get a gradient, "
    "not at Prop. 3.1's shared completion contexts; pi_init's top 256 tokens and one bin for the rest, final eval)",
    "equiv_entropy": "entropy over the surface forms of equivalent correct answers (last 10 steps)",
    "shared_events": "shared events per step (eq 2, mean over steps)",
    "residual_length": "length part of the shared-token residual (eq 2's residual due to the 1/length aggregation weight, mean over "
    "steps; negative where the weights shrink the residual)",
    "cpu_s": "CPU seconds of the run's last dfpo train process",
    "reward_rise5": "train-reward rise (mean of the last 5 steps minus that of the first 5)",
    "template_kl": "learning tax (KL of pi_init to the policy at the answer template's positions, teacher-forced, final eval; Prop. 3.1)",
    "greedy_eval": "greedy eval accuracy (final eval)",
    "shared_whole": "positions a whole group shares per step (mean over steps)",
    "residual_whole": "shared-token residual at the positions a whole group shares (eq 2)",
    "weights_spread": "in-group spread of the sequence weights (mean over steps)",
}
"""What each metric is called in a sentence."""
BOUNDS: dict[str, stats.Bounds] = {
    "eval": (0.0, 1.0),  # a share of correct completions
    "entropy_last10": (0.0, None),
    "residual": (0.0, 1.0),  # sum_S abs(sum c) / sum_S sum abs(c)
    "tax_kl": (0.0, None),  # a KL (the coarsened one too)
    "equiv_entropy": (0.0, math.log(3)),  # entropy in nats of three forms
    "shared_events": (0.0, None),  # a count
    "residual_length": (None, 1.0),  # the residual (<= 1) less a non-negative part; negative when unequal weights shrink it
    "cpu_s": (0.0, None),
    "update_norm": (0.0, None),  # a norm
    "reward_rise5": (-1.0, 1.0),  # a difference of two mean rewards in [0, 1]
    "template_kl": (0.0, None),
    "greedy_eval": (0.0, 1.0),
    "shared_whole": (0.0, None),
    "residual_whole": (0.0, 1.0),
    "weights_spread": (0.0, None),
}
"""The values a dfpo compare outcome can take: a row's interval is cut to them (``cut_interval``), which keeps its coverage
(the true mean lies inside) and never shows an impossible end."""
CAVEATS: dict[tuple[str, str], tuple[tuple[str, ...], str]] = {
    ("compare", "asym"): ((), "computed on the weights after the transform, which Min-Replace equalises: lower by construction"),
    ("compare", "residual_length"): (
        ("dfpo_min", "length_aware=true"),
        "length-aware Min-Replace makes each member's weight / length equal across its group, the inequality this part "
        "measures: lower by construction",
    ),
}
"""A caveat a metric's phrase carries in a kind of evidence: (what the method's label must all hold for it to apply,
none for every method; the caveat)."""
SIGNED = ("residual_length",)
"""Metrics that take either sign, with a control mean that can lie near 0: a change relative to that mean would divide
by it ("-258.6% of a 0.054 control"), so their changes are printed in the metric's own units beside the control's mean."""
CENSORED = ("steps_to_kappa", "tax_at_kappa")


@dataclass(frozen=True)
class Row:
    """One table row a finding reads, and the verdict it must have on (discovery, confirmation)."""

    experiment: str
    method: str
    control: str
    metric: str
    expect: tuple[str, str]
    condition: str = ""
    """For a sweep: the knob's value ('lr=1'); '' for a single table."""

    def key(self) -> tuple[str, str, str, str, str]:
        return (self.experiment, self.condition, self.method, self.control, self.metric)


@dataclass(frozen=True)
class Finding:
    id: str
    topic: str
    rows: tuple[Row, ...]
    summaries: tuple[str, ...] = ("readme", "attribution")
    conclusion: str = ""


@dataclass(frozen=True)
class Verdict:
    """A row's verdict on one seed set: the word, the interval and the control's level it is relative to."""

    word: str
    interval: object
    level: float | None
    absolute: bool = False
    """Printed in the metric's own units beside the control's level, never relative to it (``SIGNED``)."""

    def relative(self) -> tuple[float, float, float] | None:
        """(center, low, high) in % of the control's level; None without a level or for an absolute verdict."""
        if self.absolute or self.level is None or abs(self.level) <= 1e-12:
            return None
        return tuple(100 * v / abs(self.level) for v in self.interval.as_tuple())


def load_findings(raw: Mapping) -> list[Finding]:
    """Findings from a parsed TOML document (``[[finding]]`` tables); ValueError naming the first bad field."""
    out = []
    for item in raw.get("finding", []):
        rows = []
        for r in item.get("rows", []):
            expect = tuple(str(r.get("expect", "")).split("/"))
            if len(expect) != 2 or any(w not in WORDS for w in expect):
                raise ValueError(f"finding {item.get('id')!r}: expect must be two of {WORDS} as 'a/b', got {r.get('expect')!r}")
            if r.get("metric") not in METRICS:
                raise ValueError(f"finding {item.get('id')!r}: unknown metric {r.get('metric')!r}; known: {', '.join(METRICS)}")
            rows.append(Row(r["experiment"], r["method"], r.get("control", ""), r["metric"], expect, str(r.get("condition", ""))))
        out.append(
            Finding(
                item["id"], item["topic"], tuple(rows), tuple(item.get("summaries", ("readme", "attribution"))), item.get("conclusion", "")
            )
        )
    ids = [f.id for f in out]
    if len(set(ids)) != len(ids):
        raise ValueError(f"finding ids repeat: {sorted({i for i in ids if ids.count(i) > 1})}")
    return out


# ----- reading a row's paired values out of stored evidence --------------------------------------------------------


def _toy_side(summary: Mapping, label: str, metric: str) -> tuple[np.ndarray, np.ndarray]:
    row = summary[label]
    values = np.asarray(row[metric], float)
    reached = np.asarray(row.get("reached", [True] * values.size), bool)
    return values, (~reached if metric in CENSORED else np.zeros(values.size, bool))


def paired_values(evidence: Mapping, which: str, row: Row) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """(method values, method censored, control values, control censored), each (seeds,), of ``row`` on a seed set."""
    kind, data = evidence["kind"], evidence["sets"][which]
    try:
        if kind == "toy-run":
            m, mc = _toy_side(data["summary"], row.method, row.metric)
            if not row.control:
                return m, mc, np.zeros_like(m), np.zeros_like(mc)
            return (*_toy_side(data["summary"], row.method, row.metric), *_toy_side(data["summary"], row.control, row.metric))
        if kind == "toy-spread":
            knob = data["setup"]["knob"]
            (cell,) = [r for r in data["rows"] if f"{knob}={r[knob]:g}" == row.condition]
            side = {data["setup"]["method"]: "method", data["setup"]["baseline"]: "baseline"}
            out = []
            for label in (row.method, row.control):
                values = np.asarray(cell[f"{side[label]}/{row.metric}"], float)
                reached = np.asarray(cell[f"reached/{side[label]}"], bool)
                out += [values, ~reached if row.metric in CENSORED else np.zeros(values.size, bool)]
            return tuple(out)
        if kind == "compare":
            records = data["doc"]["records"]
            seeds = sorted(records[row.method], key=int)
            out = []
            for label in (row.method, row.control) if row.control else (row.method,):
                values = np.array([records[label][s].get(row.metric, math.nan) for s in seeds], float)
                reached = np.array([bool(records[label][s].get("kappa_reached", 1.0)) for s in seeds])
                out += [values, ~reached if row.metric in CENSORED else np.zeros(values.size, bool)]
            if not row.control:  # against 0, as for the toy tables
                out += [np.zeros_like(out[0]), np.zeros_like(out[1])]
            return tuple(out)
    except (KeyError, ValueError) as err:
        raise ValueError(f"{evidence.get('name')} ({which}) has no row {row.key()}: {err}") from None
    raise ValueError(f"{evidence.get('name')}: unknown kind of evidence {kind!r}")


def cut_interval(ci: stats.Interval, bounds: stats.Bounds, *, paired: bool) -> stats.Interval:
    """``ci`` cut to what its mean can be: a metric's own ``bounds`` (a row against 0), or for a difference of two values
    in [lo, hi] the range [lo - hi, hi - lo] (a side unbounded: no cut)."""
    low, high = bounds
    if paired:
        low, high = (low - high, high - low) if low is not None and high is not None else (None, None)

    def clip(v: float) -> float:
        return min(max(v, -math.inf if low is None else low), math.inf if high is None else high)

    return dataclasses.replace(ci, low=clip(ci.low), high=clip(ci.high))


def row_verdict(evidence: Mapping, which: str, row: Row, *, tests: int) -> Verdict:
    """The verdict of ``row`` on one seed set, its interval Bonferroni-adjusted over ``tests``."""
    m, mc, b, bc = paired_values(evidence, which, row)
    if np.isnan(m).any() or np.isnan(b).any():
        raise ValueError(f"{evidence.get('name')} ({which}): {row.key()} has a missing value")
    if row.metric in CENSORED:  # the toy tables' interval: the median's sign test, or the mean's t-interval (too few seeds)
        ci = stats.paired_outcome_interval(m, mc, b, bc, tests=tests)
        level = None if not row.control else float(np.mean(b)) if isinstance(ci, stats.Interval) else stats.km_median(b, bc).median
    else:
        ci = cut_interval(stats.paired_interval(m - b, tests=tests), BOUNDS.get(row.metric, (None, None)), paired=bool(row.control))
        level = float(np.mean(b)) if row.control else None
    bound = MARGIN * abs(level) if level is not None else 0.0
    if -bound <= ci.low and ci.high <= bound:
        word = "negligible"
    elif ci.low > 0:
        word = "higher"
    elif ci.high < 0:
        word = "lower"
    else:
        word = "inconclusive"
    return Verdict(word, ci, level, absolute=row.metric in SIGNED)


@dataclass
class Summary:
    """Every finding one page shows, with the verdicts of all their rows on both seed sets.

    The multiplicity family is one experiment: ``families[e]`` is the number of distinct rows the summary reads from
    experiment ``e``, and each of its intervals is adjusted for all of them, to ``level_of(e)`` (issue 58: an effect
    counts only where both disjoint seed sets agree, each set at level 0.05 / R of its own experiment's R rows; one
    family across unrelated experiments made a new experiment's rows change old verdicts)."""

    name: str
    findings: list[Finding]
    evidence: Mapping[str, Mapping]
    verdicts: dict = field(default_factory=dict)

    def __post_init__(self) -> None:
        rows = {r.key(): r for f in self.findings for r in f.rows}
        self.families = dict(sorted(Counter(r.experiment for r in rows.values()).items()))
        for key, row in rows.items():
            if row.experiment not in self.evidence:
                raise ValueError(f"no stored evidence {row.experiment!r} (docs/attribution/data/{row.experiment}.json) for row {key}")
            tests = self.families[row.experiment]
            self.verdicts[key] = tuple(row_verdict(self.evidence[row.experiment], s, row, tests=tests) for s in SETS)

    def level_of(self, experiment: str) -> float:
        """Each interval's level in ``experiment``: 95% over that experiment's rows."""
        return stats.bonferroni_level(0.95, self.families[experiment])

    def mismatches(self) -> list[str]:
        """Every row whose verdicts are not what its finding expects, as 'finding: row: expected a/b, stored c/d'."""
        out = []
        for f in self.findings:
            for r in f.rows:
                got = tuple(v.word for v in self.verdicts[r.key()])
                if got != r.expect:
                    out.append(f"{f.id}: {r.key()}: expected {'/'.join(r.expect)}, the stored tables give {'/'.join(got)}")
        return out


# ----- phrasing --------------------------------------------------------------------------------------------------


def _pct(v: float) -> str:
    return stats.format_number(v, "{:+.1f}") + "%"


def _rel_text(v: Verdict) -> str:
    """The verdict's interval in % of the control's level, or in the metric's own units with the control's level beside
    it where it has one (an absolute verdict, or a level of 0)."""
    rel = v.relative()
    if rel is None:
        level = "" if v.level is None else f" (control mean {stats.format_number(v.level, '{:+.3g}')})"
        return stats.interval_text(v.interval, "{:+.3g}") + level
    c, lo, hi = rel
    why = stats.unbounded_reason(v.interval)
    return f"{_pct(c)}, no interval ({why})" if why else f"{_pct(c)} [{_pct(lo)}, {_pct(hi)}]"


def _own_units_bound(pair: tuple[Verdict, Verdict]) -> str:
    """' larger than X' (the widest end of both intervals, in the metric's own units) for absolute verdicts; ''
    otherwise (a level of 0: the interval is exactly 0)."""
    if not all(v.absolute and v.level is not None for v in pair):
        return ""
    widest = max(abs(x) for v in pair for x in v.interval.as_tuple()[1:])
    return f" larger than {widest:.3g} (control means {', '.join(stats.format_number(v.level, '{:+.3g}') for v in pair)})"


def agreement(discovery: str, confirmation: str) -> str:
    """What a row's two verdict words say together: 'negligible' (on both sets), 'effect' (the same lower or higher on
    both), 'not shown' (inconclusive on either) or 'did not replicate' (two different conclusive words)."""
    if discovery == confirmation == "negligible":
        return "negligible"
    if discovery == confirmation and discovery in ("lower", "higher"):
        return "effect"
    if "inconclusive" in (discovery, confirmation):
        return "not shown"
    return "did not replicate"


def phrase(metric_name: str, pair: tuple[Verdict, Verdict]) -> str:
    """The fixed phrasing of a row's two verdicts (module docstring)."""
    d, c = pair
    kind = agreement(d.word, c.word)
    if kind == "negligible":
        widest = max(abs(x) for v in pair if v.relative() for x in v.relative()[1:]) if all(v.relative() for v in pair) else None
        rounded_up = max(math.ceil(widest * 10) / 10, 0.1) if widest is not None else None  # never "larger than 0.0%"
        bound = f" larger than {rounded_up:.1f}% of the control" if rounded_up is not None else _own_units_bound(pair)
        return f"{metric_name}: no change{bound}"
    if kind == "effect":
        return f"{metric_name} {c.word}: {_rel_text(c)} (discovery set: {_rel_text(d)})"
    if kind == "not shown":
        other = d.word if c.word == "inconclusive" else c.word
        where = "" if other == "inconclusive" else f"; {other} on the {'discovery' if d.word == other else 'confirmation'} set only"
        return f"{metric_name}: not shown either way{where}"
    return f"{metric_name}: did not replicate (discovery: {d.word} {_rel_text(d)}; confirmation: {c.word} {_rel_text(c)})"


def caveat_text(kind: str, row: Row) -> str:
    """The caveat (``CAVEATS``) ``row``'s metric carries in evidence of ``kind`` for its method; '' when none applies."""
    holds, caveat = CAVEATS.get((kind, row.metric), ((), ""))
    return caveat if all(part in row.method for part in holds) else ""


def control_text(evidence: Mapping, which: str, row: Row) -> str:
    """What kind of control ``row.control`` is for ``row.method``, from the stored tables' matched-control column."""
    if not row.control:
        return "against 0"
    matched = evidence["sets"][which].get("controls", {}).get(f"{row.method} - {row.control}")
    if matched is None:
        return f"against {row.control}"
    if matched == []:
        return f"against its trust-region-matched control {row.control}" + update_norm_text(evidence, row)
    if matched == ["step size"]:
        return f"against its step-size-matched control {row.control}" + update_norm_text(evidence, row)
    return f"against {row.control}, which differs in {', '.join(matched)}"


def update_norm_change(evidence: Mapping, which: str, row: Row) -> float | None:
    """The method's mean update norm per step relative to the control's, minus 1, on one seed set of a dfpo compare
    table (its ``update_norm`` column, ``log.update_norm``); None where a run did not record it."""
    if evidence["kind"] != "compare" or not row.control:
        return None
    m, _, c, _ = paired_values(evidence, which, dataclasses.replace(row, metric="update_norm"))
    if not (np.isfinite(m).all() and np.isfinite(c).all()) or float(np.mean(c)) <= 0:
        return None
    return float(np.mean(m)) / float(np.mean(c)) - 1


def update_norm_text(evidence: Mapping, row: Row) -> str:
    """', its mean update norm per step within N% of the method's (+a% on the confirmation set, +b% on the discovery
    set)': how closely a matched control's step size matches, from the stored tables (N the whole percent at or above
    the larger of the two); '' where the tables do not record update norms."""
    changes = {which: update_norm_change(evidence, which, row) for which in SETS}
    if any(v is None for v in changes.values()):
        return ""
    within = max(1, math.ceil(round(100 * max(abs(v) for v in changes.values()), 9)))
    return (
        f" (the method's mean update norm per step within {within}% of the control's: {_pct(100 * changes['confirmation'])} on the "
        f"confirmation set, {_pct(100 * changes['discovery'])} on the discovery set)"
    )


def finding_sentences(summary: Summary, finding: Finding) -> list[str]:
    """One sentence per (experiment, condition, method, control) of the finding, its rows' phrases joined."""
    groups: dict[tuple, list[Row]] = {}
    for r in finding.rows:
        groups.setdefault((r.experiment, r.condition, r.method, r.control), []).append(r)
    out = []
    for (experiment, condition, method, _control), rows in groups.items():
        ev = summary.evidence[experiment]
        where = ev.get("title", experiment) + (f" at {condition}" if condition else "")
        phrases = []
        for r in rows:
            name = METRICS[r.metric]
            kinds = ["mean" if isinstance(v.interval, stats.Interval) else "median" for v in summary.verdicts[r.key()]]
            if "mean" in kinds:  # a seed set too small for the median's sign test, every run uncensored
                name = name.replace(
                    "(median)",
                    "(mean)" if kinds[0] == kinds[1] else f"({kinds[0]} on the discovery set, {kinds[1]} on the confirmation set)",
                )
            caveat = caveat_text(ev["kind"], r)
            phrases.append(phrase(name + (f" ({caveat})" if caveat else ""), summary.verdicts[r.key()]))
        out.append(f"{where}, `{method}` {control_text(ev, 'confirmation', rows[0])}: " + "; ".join(phrases) + ".")
    return out


def render_findings(summary: Summary, *, anchor_page: str = "") -> str:
    """Markdown list: each finding's topic, its generated sentences, and its conclusion when its rows support it."""
    lines = []
    for f in summary.findings:
        body = " ".join(finding_sentences(summary, f))
        supported = not any(m.startswith(f"{f.id}:") for m in summary.mismatches())
        conclusion = f" {f.conclusion}" if f.conclusion and supported and not conclusion_problems(f, summary) else ""
        lines.append(f"- **{f.topic}.**{conclusion} {body}")
    return "\n".join(lines)


def family_note(summary: Summary) -> str:
    """One sentence naming the summary's multiplicity family."""
    small, big = min(summary.families.values()), max(summary.families.values())
    span = f"{stats.bonferroni_level(0.95, small):.4g} for {small} rows" + (
        f" to {stats.bonferroni_level(0.95, big):.4g} for {big}" if big != small else ""
    )
    return (
        f"Every interval is over paired seeds and Bonferroni-adjusted, on each seed set, for the R rows these findings "
        f"read from its own experiment (level 1 - 0.05/R: {span}; {len(summary.families)} experiments, "
        f"{sum(summary.families.values())} rows); an effect counts only where both seed sets agree; the confirmation set's "
        f"numbers come first, the discovery set's in brackets. Negligible: within {MARGIN:.0%} of the control's level on both sets."
    )


def replication_sentence(summary: Summary, experiment: str) -> str:
    """One generated sentence on what replicated in ``experiment``: its rows with the same effect (lower or higher) on
    both seed sets, and how many of the others are negligible on both, not shown (inconclusive on a set) or did not
    replicate (two different conclusive words)."""
    rows = list({r.key(): r for f in summary.findings for r in f.rows if r.experiment == experiment}.values())
    words = {r.key(): tuple(v.word for v in summary.verdicts[r.key()]) for r in rows}
    kinds = [agreement(*words[r.key()]) for r in rows]
    effects = [(r, words[r.key()][0]) for r, kind in zip(rows, kinds) if kind == "effect"]
    others = {"negligible": "negligible on both sets", "not shown": "not shown either way", "did not replicate": "did not replicate"}
    tail = ", ".join(f"{kinds.count(kind)} {what}" for kind, what in others.items() if kinds.count(kind))
    where = summary.evidence[experiment].get("title", experiment)
    if not effects:
        return f"{where}, none of the {len(rows)} rows replicated an effect on both seed sets ({tail})."
    evidence_kind = summary.evidence[experiment]["kind"]

    def effect(r: Row, w: str) -> str:
        caveat = caveat_text(evidence_kind, r)
        return f"`{r.method}` {'against ' + (r.control or '0')}: {METRICS[r.metric].split(' (')[0]} {w}" + (
            f" ({caveat.rsplit(': ', 1)[-1]})" if caveat else ""
        )

    named = "; ".join(effect(r, w) for r, w in effects)
    return f"{where}, {len(effects)} of the {len(rows)} rows replicated an effect on both seed sets ({named})" + (
        f"; of the others, {tail}." if tail else "."
    )


def replication_sentences(summary: Summary) -> str:
    """``replication_sentence`` of every dfpo compare experiment (a language model's) the summary reads, one a line."""
    names = sorted({r.experiment for f in summary.findings for r in f.rows if summary.evidence[r.experiment]["kind"] == "compare"})
    return "\n".join(replication_sentence(summary, n) for n in names)


def summary_markdown(summary: Summary) -> str:
    """What a page shows of its findings: the multiplicity family, what replicated in each language-model experiment,
    then every finding's generated sentences."""
    replicated = replication_sentences(summary)
    return "\n\n".join(part for part in (family_note(summary), replicated, render_findings(summary)) if part)


# ----- what a conclusion may say ---------------------------------------------------------------------------------

NO_CHANGE = re.compile(r"\b(no change|unchanged|trains as|the same as|no effect|does not change|do not change)\b", re.I)
EFFECT = re.compile(r"\b(lower|higher|fewer|more|less|faster|slower|raises|lowers|reduces|increases)\b", re.I)
REFERENCE = re.compile(r"\b(eq|eqs|Prop\.|Cor\.|Thm\.|App\.|sec\.|Table)\s*[\dA-Z][\d.\-]*", re.I)


def conclusion_problems(finding: Finding, summary: Summary | None = None) -> list[str]:
    """Why a finding's conclusion is not supported by its rows' expected verdicts (empty when it is)."""
    text = finding.conclusion
    if not text:
        return []
    problems = []
    if re.search(r"\d", REFERENCE.sub("", text)):
        problems.append(f"{finding.id}: the conclusion holds a number; numbers come from the tables")
    words = [w for r in finding.rows for w in r.expect]
    if NO_CHANGE.search(text) and any(w != "negligible" for w in words):
        problems.append(f"{finding.id}: the conclusion says no change, but not every row is negligible on both sets")
    if EFFECT.search(text) and not any(r.expect[0] == r.expect[1] and r.expect[0] in ("lower", "higher") for r in finding.rows):
        problems.append(f"{finding.id}: the conclusion names an effect, but no row has the same effect on both sets")
    if re.search(r"\bnot shown\b|\binconclusive\b", text, re.I) and "inconclusive" not in words:
        problems.append(f"{finding.id}: the conclusion says not shown, but no row is inconclusive")
    return problems


def summaries(findings: Iterable[Finding], evidence: Mapping[str, Mapping], name: str) -> Summary:
    """The Summary of the findings shown on page ``name`` ('readme', 'attribution')."""
    return Summary(name, [f for f in findings if name in f.summaries], evidence)


REGISTERED_KIND = "registered-compare"
"""The kind scripts/attribution_data.py --registered gives a registered experiment's stored tables."""


def read_ledger(folder) -> tuple[list[Finding], dict[str, dict]]:
    """(findings, evidence by experiment name) from a folder holding findings.toml and data/NAME.json: the discovery and
    confirmation pairs the findings read; a registered experiment's tables (kind ``REGISTERED_KIND``) are left to
    ``dfpo.core.registration``, which judges them by their own registered rows."""
    folder = Path(folder)
    try:
        findings = load_findings(tomllib.loads((folder / "findings.toml").read_text(encoding="utf-8")))
    except tomllib.TOMLDecodeError as err:
        raise ValueError(f"{folder / 'findings.toml'}: not TOML ({err})") from None
    evidence = {}
    for path in sorted((folder / "data").glob("*.json")):
        try:
            doc = json.loads(path.read_text(encoding="utf-8"))
        except json.JSONDecodeError as err:
            raise ValueError(f"{path}: not JSON ({err})") from None
        if not (isinstance(doc, dict) and doc.get("kind") == REGISTERED_KIND):
            evidence[path.stem] = doc
    return findings, evidence
