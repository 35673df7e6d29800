"""probe.png: per event kind and objective, the four parts of the first-order prediction and the measured change,
means over seeds with their 95% Student-t intervals, from the document probe.json holds.
"""

from __future__ import annotations

from pathlib import Path

from ...core import stats
from ...core.drift_tables import KINDS, values
from ...core.probe import OLD_RULE, document_rule

PLOT_PARTS = (("direct", "tab:blue"), ("cross", "tab:orange"), ("momentum", "tab:purple"), ("decay", "tab:gray"), ("measured", "tab:green"))
"""probe.png's bars per objective: the four parts of the first-order prediction and the measured change."""
LOG_SPAN = 10.0
"""probe.png uses a log axis when the largest bar is more than this many times the smallest non-zero one."""


def bar_stats(doc: dict, label: str, kind: str, figure: str) -> tuple[float, float, float, int]:
    """(mean over seeds, lower and upper whisker length, seeds) of one bar: the 95% Student-t interval over seeds,
    its lower end cut at 0 (the figures are absolute values, never below 0); whiskers 0 for fewer than 2 seeds."""
    vals = list(values(doc, label, kind, figure).values())
    if not vals:
        return 0.0, 0.0, 0.0, 0
    iv = stats.paired_interval(vals)
    if iv.n < 2:
        return iv.mean, 0.0, 0.0, iv.n
    return iv.mean, iv.mean - max(iv.low, 0.0), iv.high - iv.mean, iv.n


def panel_layout(doc: dict, kind: str) -> dict:
    """What one panel of probe.png draws: ``bars`` {figure: [bar_stats per objective]}, ``drawn`` [(figure, colour)],
    ``log`` (the bars span more than ``LOG_SPAN``), ``counts`` (seeds each objective's bars hold), ``notes`` (the
    panel's sentences: parts 0 in every seed or absent, objectives without such events, whiskers cut by the log axis)."""
    labels = doc["objectives"]
    bars = {figure: [bar_stats(doc, label, kind, figure) for label in labels] for figure, _ in PLOT_PARTS}
    zero = [f for f, rows in bars.items() if any(r[3] for r in rows) and all(r[0] == 0 for r in rows)]
    missing = [f for f, rows in bars.items() if not any(r[3] for r in rows)]
    drawn = [(f, c) for f, c in PLOT_PARTS if f not in zero and f not in missing]
    heights = [r[0] for f, _ in drawn for r in bars[f] if r[0] > 0]
    log = bool(heights) and max(heights) > LOG_SPAN * min(heights)
    counts = [max((bars[f][i][3] for f, _ in drawn), default=0) for i in range(len(labels))]
    notes = [f"abs {f}: 0 in every seed, not drawn" for f in zero] + [f"abs {f}: not in this document" for f in missing]
    if any(n == 0 for n in counts):
        notes.append("0 seeds: no such event under that objective")
    if any(n == 1 for n in counts):
        notes.append("1 seed: no whisker (an interval needs 2 seeds)")
    if log and any(r[0] - r[1] <= 0 for f, _ in drawn for r in bars[f] if r[3] >= 2):
        notes.append("a whisker down to the bottom edge: its interval reaches 0")
    return {"bars": bars, "drawn": drawn, "log": log, "counts": counts, "notes": notes}


def empty_reason(doc: dict, kind: str) -> str:
    """Why a panel of probe.png has no bar (shown in the panel)."""
    seeds = len(doc["seeds"])
    if kind == "shared":
        who = "every completion of a group" if document_rule(doc) == OLD_RULE else "two or more completions of a group"
        return f"no group shared a token\n({who}, same prefix)\nin the batches of {seeds} seeds"
    return f"no group held two correct answers\nwith different tokens\nin the batches of {seeds} seeds"


KIND_TITLES = {"shared": "shared (context, token) events", "equivalent": "equivalent answers' log-odds"}
"""probe.png's panel title per event kind."""
PANEL_INCHES = 6.5
"""The width of one panel of probe.png."""
TITLE = (
    "one optimiser step from one point, per objective: bars are means over seeds, whiskers the 95% Student-t interval over seeds (cut at 0)"
)


def drawn_kinds(doc: dict) -> list[str]:
    """The event kinds probe.png draws a panel for: those some objective has figures of, in ``KINDS`` order."""
    return [kind for kind in KINDS if any(values(doc, label, kind, "direct") for label in doc["objectives"])]


def absent_kinds_line(doc: dict) -> str:
    """probe.png's line under its title naming each event kind it draws no panel for, and why; "" when it draws both."""
    drawn = drawn_kinds(doc)
    return "; ".join(f"no panel of {KIND_TITLES[k]}: {empty_reason(doc, k).replace(chr(10), ' ')}" for k in KINDS if k not in drawn)


def _draw_panel(ax, doc: dict, kind: str) -> None:
    """One panel: the bars of ``panel_layout(doc, kind)`` per objective, its axis, its notes and its legend."""
    labels = doc["objectives"]
    layout = panel_layout(doc, kind)
    bars, drawn, log, counts, notes = (layout[k] for k in ("bars", "drawn", "log", "counts", "notes"))
    ax.set_title(KIND_TITLES[kind], fontsize=10)
    width = 0.8 / max(1, len(drawn))
    for j, (figure, color) in enumerate(drawn):
        rows = bars[figure]
        xs = [i + (j - (len(drawn) - 1) / 2) * width for i in range(len(labels))]
        err = [[r[1] for r in rows], [r[2] for r in rows]]
        ax.bar(xs, [r[0] for r in rows], width, yerr=err, color=color, label=f"abs {figure}", capsize=2)
    if log:
        from matplotlib.ticker import FuncFormatter, NullFormatter

        ax.set_yscale("log")
        ax.yaxis.set_major_formatter(FuncFormatter(lambda v, _: f"{v:g}"))  # plain numbers: no mathtext
        ax.yaxis.set_minor_formatter(NullFormatter())
    ticks = [f"{lb.replace(':', chr(10))}\n{n} of {len(doc['seeds'])} seeds" for lb, n in zip(labels, counts)]
    ax.set_xticks(range(len(labels)), ticks, fontsize=8)  # a label's overrides one a line, then the seeds its bars hold
    scale = "log scale" if log else "linear scale"
    ax.set_ylabel(f"mean abs change of log pi per event ({scale})", fontsize=8)
    ax.grid(axis="y", alpha=0.3)
    if notes:  # headroom above the whiskers for them
        low, high = ax.get_ylim()
        ax.set_ylim(low, high * 6 if log else high * 1.25)
        box = {"facecolor": "white", "alpha": 0.85, "edgecolor": "none"}
        ax.text(0.99, 0.98, "\n".join(notes), ha="right", va="top", fontsize=7, transform=ax.transAxes, bbox=box)
    ax.legend(fontsize=7, loc="upper left")


def _draw_no_events(ax, doc: dict) -> None:
    """The one panel of a document without any event: why each kind has none."""
    text = "\n\n".join(f"{KIND_TITLES[k]}:\n{empty_reason(doc, k)}" for k in KINDS)
    ax.set_title("no event to draw", fontsize=10)
    ax.text(0.5, 0.5, text, ha="center", va="center", fontsize=9, transform=ax.transAxes)
    ax.set_xticks([])
    ax.set_yticks([])


def plot(doc: dict, path: Path) -> None:
    """probe.png: a panel per event kind with figures (a kind without any is named under the title, with why), in it
    abs direct / cross / momentum / decay / measured per objective, mean over seeds with its 95% interval cut at 0,
    the number of seeds under each objective; a log axis when the bars span more than ``LOG_SPAN``; a part that is
    0 in every seed is named in the panel instead of drawn. A document without any event gets one panel saying why."""
    import textwrap

    import matplotlib  # deferred: only this writer needs it, with the Agg backend

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    kinds = drawn_kinds(doc)
    panels = max(1, len(kinds))
    with plt.rc_context({"text.usetex": False, "text.parse_math": False}):  # labels are never markup
        fig, axes = plt.subplots(1, panels, figsize=(PANEL_INCHES * panels, 4.8), dpi=100, layout="constrained", squeeze=False)
        for ax, kind in zip(axes[0], kinds):
            _draw_panel(ax, doc, kind)
        if not kinds:
            _draw_no_events(axes[0][0], doc)
        lines = [TITLE, absent_kinds_line(doc) if kinds else ""]
        fig.suptitle("\n".join(textwrap.fill(line, 80 * panels) for line in lines if line), fontsize=9)
        tmp = path.with_name(f".{path.name}.tmp")
        try:
            fig.savefig(tmp, format="png")
            tmp.replace(path)
        finally:
            tmp.unlink(missing_ok=True)
            plt.close(fig)
