"""PNG curves of a toy run: one figure per metric of PLOTS and an overview, each curve the mean over seeds with
the same 95% Student-t interval the summary table gives (``dfpo.core.stats.mean_band``, clipped to the metric's
support: a KL's band never goes below 0)."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from ..core import stats
from . import layout

PLOTS = {
    "reward": ("reward", "expected reward E[R]"),
    "tax": ("tax/kl_cum", "learning tax: cumulative KL at template rows"),
    "equiv_entropy": ("equiv/entropy", "entropy over the equivalent correct answers (nats)"),
    "asym": ("asym", "Asym (eq 23): within-group Var of w_i A_i (rolling mean, 10 steps)"),
}
YLABELS = {"reward": "E[R]", "tax/kl_cum": "cumulative KL", "equiv/entropy": "entropy (nats)", "asym": "Asym"}
SMOOTH = {"asym": 10}
"""Metrics drawn as a trailing rolling mean (window in steps): per-step values are very noisy."""
BOUNDS: dict[str, stats.Bounds] = {"reward": (0.0, 1.0), "tax/kl_cum": (0.0, None), "equiv/entropy": (0.0, None), "asym": (0.0, None)}
"""The support of each plotted metric: its band is clipped to it, as the table's interval is."""
STYLES = ("-", "--", ":", "-.")
OVERLAP = 0.005
"""Two mean curves overlap on an axis when they are nowhere further apart than this fraction of the axis's data range
(half a percent: about a pixel and a half of a 300-pixel axis)."""


def overlap_groups(panels: list[dict[str, np.ndarray]], tol: float = OVERLAP) -> list[list[str]]:
    """The labels whose mean curves (``{label: (steps,) array}`` per panel) overlap on every panel, in the order given.

    A label joins the first group whose first label's curve lies within ``tol`` times the panel's data range of its own
    at every step of every panel; otherwise it starts a group. A figure whose legend lists seven runs but shows two
    curves says so with one legend entry per group (``legend_entries``)."""
    labels = list(panels[0]) if panels else []
    spans = []
    for panel in panels:
        values = np.concatenate([np.ravel(v) for v in panel.values()]) if panel else np.zeros(1)
        spans.append(float(np.ptp(values[np.isfinite(values)])) if np.isfinite(values).any() else 0.0)
    groups: list[list[str]] = []
    for label in labels:
        for group in groups:
            if all(
                np.array_equal(panel[group[0]], panel[label]) or float(np.nanmax(np.abs(panel[group[0]] - panel[label]))) <= tol * span
                for panel, span in zip(panels, spans)
            ):
                group.append(label)
                break
        else:
            groups.append([label])
    return groups


def legend_label(group: list[str], panels: list[dict[str, np.ndarray]], width: int = 70) -> str:
    """One legend entry's text: the label, or for overlapping runs every label with '(identical curves overlap)' when
    their curves are equal at every step, else '(curves overlap: within 0.5% of the axis)'; wrapped at ``width``."""
    import textwrap

    if len(group) == 1:
        return group[0]
    same = all(np.array_equal(panel[group[0]], panel[other]) for panel in panels for other in group[1:])
    note = "identical curves overlap" if same else f"curves overlap: within {OVERLAP:.1%} of the axis"
    return textwrap.fill(", ".join(group) + f" ({note})", width)


def plot_curves(results: dict[str, dict[str, np.ndarray]], out: Path, title: str) -> list[Path]:
    """One PNG per metric of PLOTS (a curve per objective, band = the 95% Student-t interval over seeds, as in the
    summary table) and an overview."""
    import matplotlib  # deferred: only the PNG writer needs it (~0.3 s), and it must get the Agg backend first

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    written = []
    keys = [(fname, key, label) for fname, (key, label) in PLOTS.items() if all(key in h for h in results.values())]
    colors = plt.get_cmap("tab10")

    def draw(ax, key, label) -> tuple[dict, dict[str, np.ndarray]]:
        """Draw every label's curve of ``key``; return (label -> its line, label -> its mean curve (steps,))."""
        lines, means = {}, {}
        for i, (name, h) in enumerate(results.items()):
            y = h[key]  # (steps, S)
            window = SMOOTH.get(key, 1)
            if window > 1 and y.shape[0] >= window:
                c = np.cumsum(np.vstack([np.zeros((1, y.shape[1])), y]), axis=0)
                y = np.vstack([c[1:window] / np.arange(1, window)[:, None], (c[window:] - c[:-window]) / window])
            x = np.arange(1, y.shape[0] + 1)
            mean, low, high = stats.mean_band(y, bounds=BOUNDS.get(key, (None, None)))  # (steps,) each
            (lines[name],) = ax.plot(x, mean, color=colors(i % 10), label=name, lw=1.6, ls=STYLES[i % len(STYLES)])
            means[name] = mean
            if y.shape[1] > 1:  # one seed has no interval
                ax.fill_between(x, low, high, color=colors(i % 10), alpha=0.2, lw=0)
        ax.set_xlabel("step (rollout batch)")
        ax.set_ylabel(YLABELS.get(key, key), fontsize=9)
        ax.grid(alpha=0.3)
        return lines, means

    def legend(fig, lines: dict, panels: list[dict[str, np.ndarray]], fontsize: float):
        """One entry per group of overlapping curves, its handle every member's line drawn over each other."""
        groups = overlap_groups(panels)
        handles = [tuple(lines[name] for name in group) if len(group) > 1 else lines[group[0]] for group in groups]
        return legend_below(fig, handles, [legend_label(group, panels) for group in groups], fontsize=fontsize)

    for fname, key, label in keys:
        fig, ax = plt.subplots(figsize=(7, 4.2), dpi=110, layout="constrained")
        lines, means = draw(ax, key, label)
        ax.set_title(f"{title}\n{label}", fontsize=10)
        legend(fig, lines, [means], fontsize=8)
        path = out / f"{fname}.png"
        fig.savefig(path)
        plt.close(fig)
        written.append(path)
    if keys:
        fig, axes = plt.subplots(2, 2, figsize=(12, 8), dpi=100, layout="constrained")
        drawn = []
        for ax, (_, key, label) in zip(axes.flat, keys):
            drawn.append(draw(ax, key, label))
            ax.set_title(label, fontsize=10)
        for ax in list(axes.flat)[len(keys) :]:
            ax.axis("off")
        legend(fig, drawn[0][0], [means for _, means in drawn], fontsize=9)  # a group overlaps on every panel
        fig.suptitle(f"{title} (band: 95% Student-t interval over seeds)", fontsize=11)
        path = out / layout.OVERVIEW
        fig.savefig(path)
        plt.close(fig)
        written.append(path)
    return written


def legend_below(fig, handles, labels, *, fontsize: float, max_columns: int = 6):
    """A legend under the axes of ``fig`` (a constrained layout makes room for it), in as many columns as fit
    the figure's width: a row of long labels (``dfpo_min:eps_low=0.2:eps_high=0.2``) ran off the canvas and was cut."""
    renderer = fig.canvas.get_renderer()
    for ncol in range(min(len(labels), max_columns), 0, -1):
        legend = fig.legend(handles, labels, loc="outside lower center", ncol=ncol, fontsize=fontsize)
        if ncol == 1 or legend.get_window_extent(renderer).width <= 0.98 * fig.bbox.width:
            return legend
        legend.remove()
    return None
