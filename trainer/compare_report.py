"""What ``dfpo compare`` prints: paired differences with their intervals, levels, per-seed tables, warnings, a figure.

Everything here is a pure function of the comparison's document (``compare.json``: the labels, pairs, seeds and
every run's outcomes), so the attribution page re-renders a comparison from its stored evidence.

Intervals (``dfpo.core.stats``), Bonferroni-adjusted over every interval of the paired table: the Student-t
interval of the mean paired difference, and for steps to kappa (censored for a run that never reaches kappa:
its value, the run's length + 1, is a lower bound) the median paired difference with its censoring-aware
sign-test interval. Levels: means over seeds, and for steps the Kaplan-Meier median ('>=' where censoring
leaves it open). A censored value is printed '>=N' and never enters a mean.
"""

from __future__ import annotations

import csv
import io
import math
import re
from pathlib import Path

import numpy as np

from ..core import stats
from .run.machine import recorded_machine

# (key in the per-run record, column title, format of a difference)
OUTCOMES = (
    ("eval", "final eval avg@k", "{:+.3f}"),
    ("reward_last10", "train reward, last 10 steps", "{:+.3f}"),
    ("steps_to_kappa", "steps to kappa (10-step mean; median, censoring-aware)", "{:+.1f}"),
    ("jitter2", "Jitter2 eq 20 of the train reward", "{:+.2e}"),
    ("entropy_last10", "rollout entropy, last 10 steps", "{:+.3f}"),
    ("residual", "shared-token residual eq 2 (mean over steps)", "{:+.3f}"),
    ("clip_frac", "clipped fraction (mean over steps)", "{:+.3f}"),
    ("asym", "Asym eq 23 (mean over steps, post-transform weights)", "{:+.2e}"),
    (
        "tax_kl",
        "learning-tax proxy: KL(pi_init || pi) at the eval prompts' own positions (no gradient reaches them), final eval",
        "{:+.2e}",
    ),
    ("equiv_entropy", "entropy over equivalent correct answers, last 10 steps", "{:+.3f}"),
    ("shared_events", "shared events eq 2 per step (mean over steps)", "{:+.1f}"),
    ("residual_length", "length part of the residual, eq 67's 1/|y_i| (mean over steps)", "{:+.3f}"),
    ("update_norm", "update norm per step (log.update_norm; mean over steps)", "{:+.2e}"),
    ("reward_rise5", "train reward rise: last 5 steps minus first 5", "{:+.3f}"),
    ("cpu_s", "CPU seconds of the run's last dfpo train process", "{:+.0f}"),
    ("template_kl", "learning tax: KL(pi_init || pi) at the template's positions, teacher-forced, final eval (Prop. 3.1)", "{:+.2e}"),
    ("greedy_eval", "greedy eval accuracy, final eval (eval.greedy)", "{:+.3f}"),
    ("shared_whole", "positions a whole group shares, per step (mean over steps)", "{:+.1f}"),
    ("residual_whole", "eq 2 residual at the positions a whole group shares (mean over steps)", "{:+.3f}"),
    ("coef_whole", "coefficient mass sum |d loss / d log pi| at the positions a whole group shares (mean over steps)", "{:+.2e}"),
    ("weights_spread", "in-group spread of the sequence weights (weights/spread; mean over steps)", "{:+.2e}"),
)
VALUE_FORMATS = {
    "eval": "{:.4f}",
    "reward_last10": "{:.4f}",
    "steps_to_kappa": "{:.0f}",
    "jitter2": "{:.3g}",
    "entropy_last10": "{:.4f}",
    "residual": "{:.4f}",
    "clip_frac": "{:.4f}",
    "asym": "{:.4g}",
    "tax_kl": "{:.4g}",
    "equiv_entropy": "{:.4f}",
    "shared_events": "{:.1f}",
    "residual_length": "{:.4f}",
    "update_norm": "{:.4g}",
    "reward_rise5": "{:.4f}",
    "cpu_s": "{:.0f}",
    "template_kl": "{:.4g}",
    "greedy_eval": "{:.4f}",
    "shared_whole": "{:.1f}",
    "residual_whole": "{:.4f}",
    "coef_whole": "{:.4g}",
    "weights_spread": "{:.4g}",
}
"""How a per-seed value is printed."""
CENSORED = ("steps_to_kappa",)
"""Outcomes whose value for a run that never reached kappa is a lower bound (``kappa_reached`` 0)."""

MIN_SEEDS = 8
"""Fewer paired seeds than this draw a warning: the interval is wide and leans on near-normal differences."""

Records = dict[str, dict[int, dict[str, float]]]
"""{label: {seed: read_run's record}}"""


def _values(records: Records, label: str, key: str, seeds) -> np.ndarray:
    return np.array([records[label][s].get(key, math.nan) for s in seeds], dtype=float)


def _censored(records: Records, label: str, seeds) -> np.ndarray:
    return np.array([not records[label][s].get("kappa_reached", 1.0) for s in seeds], dtype=bool)


def pair_interval(records: Records, method: str, baseline: str, key: str, *, tests: int):
    """The interval of method - baseline over the paired seeds; None where an outcome is missing for some seed."""
    seeds = sorted(records[baseline])
    m, b = _values(records, method, key, seeds), _values(records, baseline, key, seeds)
    if np.isnan(m).any() or np.isnan(b).any():
        return None
    if key in CENSORED:
        return stats.paired_censored_interval(m, _censored(records, method, seeds), b, _censored(records, baseline, seeds), tests=tests)
    return stats.paired_interval(m - b, tests=tests)


def outcomes_of(records: Records) -> tuple:
    """The ``OUTCOMES`` some record holds: a comparison stored before an outcome existed shows no column for it (a record
    read now holds every outcome, NaN where its logs have none, and shows it as n/a)."""
    held = {key for by_seed in records.values() for record in by_seed.values() for key in record}
    return tuple(o for o in OUTCOMES if o[0] in held)


def pair_intervals(records: Records, pairs) -> dict:
    """(method, baseline, outcome) -> interval, each Bonferroni-adjusted over every interval of the table."""
    cells = [(m, b, key) for m, b in pairs for key, _, _ in outcomes_of(records)]
    available = [c for c in cells if pair_interval(records, *c, tests=1) is not None]
    tests = len(available) or 1
    return {c: (pair_interval(records, *c, tests=tests) if c in available else None) for c in cells}


def match_text(matched: dict, method: str, baseline: str) -> str:
    kind = matched.get(f"{method} - {baseline}", [])
    if kind == ["step size"]:
        return "yes, and step size"
    return "yes" if not kind else "NO: differs in " + ", ".join(kind)


def paired_table(records: Records, pairs, matched: dict, intervals: dict) -> list[str]:
    """Markdown: per (method, control) pair and outcome, the paired difference [adjusted 95% CI]; * where it excludes 0."""
    outcomes = outcomes_of(records)
    lines = ["| method - control | matched control? | " + " | ".join(t for _, t, _ in outcomes) + " |", "|---" * (len(outcomes) + 2) + "|"]
    for m, b in pairs:
        cells = []
        for key, _, fmt in outcomes:
            ci = intervals[(m, b, key)]
            cells.append("n/a" if ci is None else stats.interval_text(ci, fmt) + (" *" if ci.excludes_zero else ""))
        lines.append(f"| {m} - {b} | {match_text(matched, m, b)} | " + " | ".join(cells) + " |")
    return lines


def level_cell(records: Records, label: str, key: str) -> str:
    seeds = sorted(records[label])
    values = _values(records, label, key, seeds)
    if np.isnan(values).any():
        return "n/a"
    if key in CENSORED:
        return stats.km_median(values, _censored(records, label, seeds)).text("{:.0f}")
    return f"{float(values.mean()):.4g}"


def level_table(records: Records) -> list[str]:
    """Markdown: per label, each outcome's level over seeds (what the differences are differences of)."""
    outcomes = outcomes_of(records)
    lines = ["| objective | " + " | ".join(t for _, t, _ in outcomes) + " |", "|---" * (len(outcomes) + 1) + "|"]
    for label in records:
        lines.append(f"| {label} | " + " | ".join(level_cell(records, label, key) for key, _, _ in outcomes) + " |")
    return lines


def _value(record: dict[str, float], key: str) -> str:
    value = record.get(key, math.nan)
    if not math.isfinite(value):
        return "n/a"
    text = VALUE_FORMATS[key].format(value)
    return ">=" + text if key in CENSORED and not record.get("kappa_reached", 1.0) else text


def _difference(records: Records, m: str, b: str, s: int, key: str, fmt: str) -> str:
    """One seed's paired difference; for a censored outcome a bound ('<=x', '>=x') or '?' (both censored)."""
    rm, rb = records[m][s], records[b][s]
    d = rm.get(key, math.nan) - rb.get(key, math.nan)
    if not math.isfinite(d):
        return "n/a"
    if key in CENSORED:
        cm, cb = not rm.get("kappa_reached", 1.0), not rb.get("kappa_reached", 1.0)
        if cm and cb:
            return "?"
        if cb:
            return "<=" + fmt.format(d)
        if cm:
            return ">=" + fmt.format(d)
    return fmt.format(d)


def per_seed_tables(records: Records, pairs) -> list[str]:
    """Markdown: one table per outcome, a row per seed with every label's value and each pair's difference."""
    baseline_seeds = sorted(next(iter(records.values())))
    lines = []
    for key, title, fmt in outcomes_of(records):
        lines += [
            f"{title}:",
            "",
            "| seed | " + " | ".join(records) + " | " + " | ".join(f"{m} - {b}" for m, b in pairs) + " |",
            "|---" * (1 + len(records) + len(pairs)) + "|",
        ]
        for s in baseline_seeds:
            values = [_value(records[label][s], key) for label in records]
            diffs = [_difference(records, m, b, s, key, fmt) for m, b in pairs]
            lines.append(f"| {s} | " + " | ".join(values) + " | " + " | ".join(diffs) + " |")
        lines.append("")
    return lines


def per_seed_csv(records: Records) -> str:
    """CSV text: label, seed, every outcome and kappa_reached, one row per run."""
    buf = io.StringIO()
    w = csv.writer(buf, lineterminator="\n")
    keys = [key for key, _, _ in OUTCOMES] + ["kappa_reached"]
    w.writerow(["label", "seed", *keys])
    for label, by_seed in records.items():
        for s in sorted(by_seed):
            w.writerow([label, s, *[f"{by_seed[s].get(k, float('nan')):.6g}" for k in keys]])
    return buf.getvalue()


def warnings_for(records: Records) -> list[str]:
    """Why the table may mislead: fewer than MIN_SEEDS paired seeds; runs that never reached kappa."""
    out = []
    n = len(next(iter(records.values())))
    if n < MIN_SEEDS:
        out.append(
            f"warning: only {n} paired seeds (fewer than {MIN_SEEDS}): the intervals are wide and rest on the paired differences "
            f"being close to normal; run --seeds {MIN_SEEDS} or more before reading a difference."
        )
    censored = [
        f"{label} seed {s}" for label, by_seed in records.items() for s in sorted(by_seed) if not by_seed[s].get("kappa_reached", 1.0)
    ]
    if censored:
        total = sum(len(v) for v in records.values())
        out.append(
            f"warning: {len(censored)} of {total} runs never reached kappa ({', '.join(censored)}): their steps to kappa is censored "
            "(printed >=N, the run's length + 1, a lower bound); it enters no mean: the steps column gives Kaplan-Meier medians and "
            "the median paired difference with a censoring-aware interval."
        )
    return out


def _hours(seconds: float) -> str:
    return f"{seconds / 3600:.1f} h" if seconds >= 360 else f"{seconds:.0f} s"


def cost_lines(cost: dict | None) -> list[str]:
    """What the comparison's cells cost and what they ran on (``experiment_cost``), as one paragraph; none for a
    comparison stored before dfpo recorded it."""
    if not cost:
        return []
    cells = cost["cells"]
    made = f"{cells['compared']} compared" + (f", {cells['calibration']} calibration" if cells["calibration"] else "")
    timed = cost["timed_cells"]
    seconds = (
        f"{_hours(cost['wall_s'])} wall and {_hours(cost['cpu_s'])} CPU summed over the {timed} cells that recorded both "
        "(each cell's last dfpo train process)"
        if timed
        else "no cell recorded its wall and CPU seconds"
    )

    def counted(counts: dict[str, int], shown) -> str:
        return "; ".join(f"{shown(line)} ({n} cell{'s' if n != 1 else ''})" for line, n in counts.items())

    machines = counted(cost["machines"], recorded_machine)
    codes = f" Trained by: {counted(cost['codes'], _fingerprints)}." if cost.get("codes") else ""
    return [f"Cost: {sum(cells.values())} cells ({made}); {seconds}. Machine: {machines}.{codes}", ""]


def _fingerprints(text: str) -> str:
    """A stored 'source ...' line as it may be shown: its hex fingerprints and words only."""
    return text if re.fullmatch(r"(source [0-9a-f]{12}( then [0-9a-f]{12})*|no source recorded)", text) else "an unreadable record"


def render_compare(doc: dict, *, warnings: list[str] | None = None) -> list[str]:
    """The lines of compare.md (without its figure) from the comparison's document."""
    records: Records = {label: {int(s): r for s, r in by_seed.items()} for label, by_seed in doc["records"].items()}
    pairs = [tuple(p) for p in doc["pairs"]]
    intervals = pair_intervals(records, pairs)
    tests = sum(ci is not None for ci in intervals.values())
    seeds = doc["seeds"]
    warnings = warnings_for(records) if warnings is None else warnings
    notes = [c["sentence"] for c in doc.get("calibrations", [])]
    return [
        f"# {len(seeds)} paired seeds ({seeds[0]}..{seeds[-1]}), config {doc['config']}"
        + (f", --set {' '.join(doc['sets'])}" if doc["sets"] else ""),
        "",
        *cost_lines(doc.get("cost")),
        *[f"**{text}**" for text in warnings],
        *([""] if warnings else []),
        f"Paired difference per seed (method - control), mean [{stats.interval_note(tests)}]; for steps to kappa the median paired "
        "difference with its censoring-aware sign-test interval at the same level; * where the interval excludes 0.",
        "Steps to kappa: first step whose 10-step mean train reward reaches eval.kappa; a run that never does is censored (>=N).",
        "Asym is computed on the weights after the in-group transform: a transform that equalises the weights lowers it by construction.",
        "",
        *paired_table(records, pairs, doc["matched"], intervals),
        "",
        *([*notes, ""] if notes else []),
        "Levels over seeds (means; steps: Kaplan-Meier median [95% interval] and how many runs reached kappa):",
        "",
        *level_table(records),
        "",
        "Per seed (>=N: censored, the run never reached kappa in its N - 1 steps; a censored pair's difference is a bound or ?):",
        "",
        *per_seed_tables(records, pairs),
    ]


def pair_differences(records: Records, method: str, baseline: str, key: str) -> np.ndarray:
    """The per-seed differences ``method - baseline`` of one outcome that the figure draws as points: finite ones,
    and for a censored outcome only the pairs where neither run was censored (a bound is not a difference)."""
    seeds = sorted(records[baseline])
    d = _values(records, method, key, seeds) - _values(records, baseline, key, seeds)
    if key in CENSORED:
        d = d[~(_censored(records, method, seeds) | _censored(records, baseline, seeds))]
    return d[np.isfinite(d)]


def _finite_interval(ci) -> bool:
    return ci is not None and all(math.isfinite(v) for v in ci.as_tuple())


def drawable_outcomes(records: Records, pairs, intervals: dict) -> list[tuple[str, str]]:
    """(key, title) of each outcome of ``OUTCOMES`` that some pair has something to draw for: a finite interval or a
    finite per-seed difference. The others (an outcome no run logged, steps to kappa where every run is censored)
    get no panel."""
    return [
        (key, title)
        for key, title, _ in outcomes_of(records)
        if any(_finite_interval(intervals[(m, b, key)]) or pair_differences(records, m, b, key).size for m, b in pairs)
    ]


DIFFERENCE_COLUMNS = 4
"""Panels per row of compare.png."""
TITLE_WIDTH = 34
"""Characters per line of a panel title in compare.png (wrapped at words: a title never runs into its neighbour's)."""


def _pair_name(method: str, baseline: str, width: int = 30) -> str:
    """A pair's tick label: ``method - control`` on one line when short, else the control on a second line."""
    name = f"{method} - {baseline}"
    return name if len(name) <= width else f"{method}\n- {baseline}"


def difference_figure(doc: dict):
    """The figure of compare.png (see ``plot_differences``); the caller closes it."""
    import textwrap

    import matplotlib  # deferred: only the PNG writer needs it (~0.3 s), and it must get the Agg backend first

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.ticker import MaxNLocator

    records: Records = {label: {int(s): r for s, r in by_seed.items()} for label, by_seed in doc["records"].items()}
    pairs = [tuple(p) for p in doc["pairs"]]
    intervals = pair_intervals(records, pairs)
    panels = drawable_outcomes(records, pairs, intervals)
    names = [_pair_name(m, b) for m, b in pairs]
    columns = max(1, min(DIFFERENCE_COLUMNS, len(panels)))
    rows = max(1, math.ceil(len(panels) / columns))
    with plt.rc_context({"text.usetex": False, "text.parse_math": False}):  # labels from the command line are never markup
        fig, axes = plt.subplots(
            rows,
            columns,
            figsize=(3.4 * columns + 2.6, (0.32 * len(pairs) + 1.3) * rows + 0.8),
            dpi=110,
            squeeze=False,
            layout="constrained",
        )
        for ax in list(axes.flat)[len(panels) :]:
            fig.delaxes(ax)  # no blank panel after the last outcome
        for index, (ax, (key, title)) in enumerate(zip(axes.flat, panels)):
            for i, (m, b) in enumerate(pairs):
                ci = intervals[(m, b, key)]
                if _finite_interval(ci):  # an interval censoring leaves open is not drawn
                    center, low, high = ci.as_tuple()
                    ax.errorbar([center], [i], xerr=[[center - low], [high - center]], fmt="o", ms=4, capsize=3)
                d = pair_differences(records, m, b, key)
                ax.scatter(d, np.full(d.size, i) + 0.2, s=7, alpha=0.5, color="gray")
            ax.axvline(0, color="black", lw=0.8)
            ax.set_yticks(range(len(pairs)), names if index % columns == 0 else [""] * len(pairs), fontsize=7)
            ax.set_ylim(-0.6, len(pairs) - 0.4)
            ax.invert_yaxis()  # the table's first pair on top
            ax.set_title(textwrap.fill(title, TITLE_WIDTH), fontsize=8)
            ax.tick_params(axis="x", labelsize=7)
            ax.xaxis.set_major_locator(MaxNLocator(5))  # tick labels such as 0.0025 apart, never touching
            ax.grid(alpha=0.3, axis="x")
        left_out = [title for key, title, _ in outcomes_of(records) if key not in dict(panels)]
        if left_out:
            note = "not drawn (no finite difference in any pair): " + "; ".join(left_out)
            fig.supxlabel(textwrap.fill(note, 40 * columns), fontsize=7)
        fig.suptitle(
            textwrap.fill(
                f"paired differences over {len(doc['seeds'])} seeds (dot and bar: the table's estimate and Bonferroni-adjusted "
                "95% interval; gray: each seed's difference)",
                40 * columns,
            ),
            fontsize=9,
        )
    return fig


def plot_differences(doc: dict, path: Path) -> None:
    """compare.png: one panel per outcome that has something to draw (``drawable_outcomes``; the others are named
    under the figure), each pair's paired difference with the table's adjusted interval, and the seeds' differences."""
    import matplotlib.pyplot as plt

    fig = difference_figure(doc)
    try:
        fig.savefig(path)
    finally:
        plt.close(fig)


def mean_curve(curves: dict[str, dict], kind: str) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(steps, mean, standard error) over seeds of one label's ``kind`` curve (a name of ``CURVES``), at the
    steps every seed logged (a step some seed lacks is not averaged over fewer seeds; a seed without the curve leaves
    none)."""
    by_seed = [{int(step): value for step, value in curve.get(kind, [])} for curve in curves.values()]
    steps = sorted(set.intersection(*(set(points) for points in by_seed))) if by_seed else []
    values = np.array([[points[step] for step in steps] for points in by_seed], dtype=float).reshape(len(by_seed), len(steps))
    se = values.std(axis=0, ddof=1) / np.sqrt(len(by_seed)) if len(by_seed) > 1 else np.zeros(len(steps))
    return np.array(steps), values.mean(axis=0), se


CURVES = (
    ("reward", "metrics", "reward/mean", "train reward (reward/mean)"),
    ("eval", "evals", "eval/avg@", "held-out avg@k"),
    ("greedy_eval", "evals", "eval/greedy_acc", "greedy eval accuracy (eval/greedy_acc)"),
    ("template_kl", "evals", "eval/template_kl", "learning tax at the template's positions (eval/template_kl)"),
    ("tax_kl", "evals", "eval/tax_kl", "learning-tax proxy at the eval prompts' positions (eval/tax_kl)"),
    ("entropy", "metrics", "entropy/rollout", "rollout entropy (entropy/rollout)"),
    ("equiv_entropy", "metrics", "forms/equiv_entropy", "entropy over equivalent correct answers (forms/equiv_entropy)"),
)
"""(curve, log, key, panel title) of each curve ``compare.read_curve`` keeps, in drawing order: a key ending in '@'
is a prefix (``eval/avg@k`` for any k); a curve of the metrics log has a point every step, one of the evals log at
each evaluation."""
ALWAYS_KEPT = ("reward", "eval")
"""The curves a run keeps and a picture draws even where nothing was logged (every run logs both)."""
CURVE_TITLES = {name: title for name, _, _, title in CURVES}
CURVE_LOGS = {name: log for name, log, _, _ in CURVES}


def drawn_curves(doc: dict) -> list[str]:
    """The curves of ``CURVE_TITLES`` some label logged on every seed at one step at least (``ALWAYS_KEPT`` always)."""
    return [kind for kind in CURVE_TITLES if kind in ALWAYS_KEPT or any(mean_curve(c, kind)[0].size for c in doc["curves"].values())]


def plot_curves(doc: dict, path: Path) -> None:
    """One panel per curve the runs logged (``drawn_curves``): each label's mean over the seeds at each logged step (an
    evaluation's curve at each evaluation, step 0 included), with a band of one standard error across seeds."""
    import matplotlib  # deferred, as in plot_differences

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    seeds = doc["seeds"]
    kinds = drawn_curves(doc)
    cols = 2 if len(kinds) <= 4 else 3
    rows = -(-len(kinds) // cols)
    fig, grid = plt.subplots(rows, cols, figsize=(5.5 * cols, 4 * rows), dpi=110, squeeze=False)
    axes = grid.ravel()
    for ax, kind in zip(axes, kinds, strict=False):
        per_step = CURVE_LOGS[kind] == "metrics"
        for label, curves in doc["curves"].items():
            steps, mean, se = mean_curve(curves, kind)
            if steps.size:
                (line,) = ax.plot(steps, mean, marker=None if per_step else "o", ms=4, label=label)
                ax.fill_between(steps, mean - se, mean + se, alpha=0.15, color=line.get_color())
        ax.set_xlabel("step")
        ax.set_title(CURVE_TITLES[kind], fontsize=9)
        ax.grid(alpha=0.3)
    for ax in axes[len(kinds) :]:
        ax.set_visible(False)
    if axes[0].lines:
        axes[0].legend(fontsize=7)
    fig.suptitle(f"mean over {len(seeds)} seeds ({seeds[0]}..{seeds[-1]}), band: one standard error across seeds", fontsize=9)
    fig.tight_layout(rect=(0, 0, 1, 1 - 0.3 / fig.get_figheight()))  # room for the suptitle
    fig.savefig(path)
    plt.close(fig)
