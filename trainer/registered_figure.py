"""The picture of a registered experiment (issue 58 item 7): one panel per registered row (its outcome), the paired
difference method - control on each seed set, drawn from the stored tables the sentences are generated from.

In each panel a seed set is one line: its seeds' differences (gray dots), the row's interval at the experiment's
Bonferroni level (the point and bar ``dfpo.core.registration.registered_verdict`` reads), and the negligible margin
(a green band, in the outcome's units: a relative margin is a fraction of that set's control mean). The panel's
title names the outcome and the row's word over both sets, so the picture and the sentence cannot disagree.
"""

from __future__ import annotations

import math
import textwrap
from collections.abc import Mapping
from pathlib import Path

import numpy as np

from ..core.registration import Registration, RowResult, evaluate_stored, set_values

TITLE_WIDTH = 44


def row_differences(registration: Registration, stored: Mapping, result: RowResult) -> list[np.ndarray]:
    """(seeds,) method - control of one row, per seed set in the registration's order, from the stored tables."""
    out = []
    for s in registration.sets:
        doc, seeds = stored["sets"][s.name]["doc"], s.seed_list()
        out.append(
            set_values(doc, result.row.method, result.row.metric, seeds) - set_values(doc, result.row.control, result.row.metric, seeds)
        )
    return out


def registered_figure(registration: Registration, stored: Mapping, metric_names: Mapping[str, str]):
    """The figure (the caller closes it): one panel per registered row, one line per seed set."""
    import matplotlib  # deferred: only the PNG writer needs it, and it must get the Agg backend first

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.ticker import MaxNLocator

    results = evaluate_stored(registration, stored)
    names = [s.name for s in registration.sets]
    columns = min(3, len(results))
    rows = math.ceil(len(results) / columns)
    with plt.rc_context({"text.usetex": False, "text.parse_math": False}):  # labels are never markup
        fig, axes = plt.subplots(rows, columns, figsize=(4.2 * columns, 1.9 * rows + 0.9), dpi=110, squeeze=False, layout="constrained")
        for ax in list(axes.flat)[len(results) :]:
            fig.delaxes(ax)  # no blank panel after the last row
        for index, (ax, result) in enumerate(zip(axes.flat, results)):
            for i, (verdict, diff) in enumerate(zip(result.per_set, row_differences(registration, stored, result))):
                ax.fill_betweenx([i - 0.3, i + 0.3], -verdict.bound, verdict.bound, color="tab:green", alpha=0.15, lw=0)
                ax.scatter(diff, np.full(diff.size, i) + 0.2, s=7, alpha=0.5, color="gray")
                ci = verdict.interval
                ax.errorbar([ci.mean], [i], xerr=[[ci.mean - ci.low], [ci.high - ci.mean]], fmt="o", ms=4, capsize=3, color="tab:blue")
            ax.axvline(0, color="black", lw=0.8)
            ax.set_yticks(range(len(names)), names if index % columns == 0 else [""] * len(names), fontsize=7)
            ax.set_ylim(-0.6, len(names) - 0.4)
            ax.invert_yaxis()  # the first set on top
            row = result.row
            outcome = metric_names.get(row.metric, row.metric) + (" (primary)" if row.primary else "")
            ax.set_title(textwrap.fill(f"{row.method} - {row.control}, {outcome}: {result.word}", TITLE_WIDTH), fontsize=8)
            ax.tick_params(axis="x", labelsize=7)
            ax.xaxis.set_major_locator(MaxNLocator(5))
            ax.grid(alpha=0.3, axis="x")
        fig.suptitle(
            textwrap.fill(
                f"{registration.experiment}: method - control per seed (dots), its {registration.per_row_level:.1%} interval on "
                "each seed set (bar, Bonferroni over the rows), the negligible margin (green band)",
                110,
            ),
            fontsize=9,
        )
    return fig


def plot_registered(registration: Registration, stored: Mapping, metric_names: Mapping[str, str], path: Path) -> None:
    """Write ``registered_figure`` as a PNG at ``path``."""
    import matplotlib.pyplot as plt

    fig = registered_figure(registration, stored, metric_names)
    try:
        fig.savefig(path)
    finally:
        plt.close(fig)
