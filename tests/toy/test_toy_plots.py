"""The toy's PNG curves show every label of their legend: nothing is cut at the canvas's edge."""

from __future__ import annotations

import numpy as np
import pytest

pytest.importorskip("matplotlib")
import matplotlib.figure  # noqa: E402

from dfpo.toy.cli import ABLATION  # noqa: E402
from dfpo.toy.plots import OVERLAP, legend_label, overlap_groups  # noqa: E402
from dfpo.toy.report import PLOTS, plot_curves  # noqa: E402


def _results(labels, steps: int = 12, seeds: int = 3) -> dict[str, dict[str, np.ndarray]]:
    rng = np.random.default_rng(0)
    return {label: {key: rng.random((steps, seeds)) for key, _ in PLOTS.values()} for label in labels}


@pytest.mark.parametrize("labels", [ABLATION, ("gspo", "dfpo_min")], ids=["the ablation's seven labels", "two short labels"])
def test_every_legend_of_the_toy_plots_lies_within_its_png(tmp_path, monkeypatch, labels):
    """Before the fix overview.png put the ablation's labels on one row wider than the figure: the last read '...eps_high=0'."""
    seen = []
    savefig = matplotlib.figure.Figure.savefig

    def measure_then_save(fig, path, *args, **kwargs):
        savefig(fig, path, *args, **kwargs)  # draws the figure: every extent is final
        renderer = fig.canvas.get_renderer()
        legends = fig.legends + [ax.get_legend() for ax in fig.axes if ax.get_legend() is not None]
        seen.append((path.name, [legend.get_window_extent(renderer) for legend in legends], fig.bbox))

    monkeypatch.setattr(matplotlib.figure.Figure, "savefig", measure_then_save)
    written = plot_curves(_results(labels), tmp_path, "toy family (sampled), G=8, K=4, sgd lr=0.5, 3 seeds")
    assert [name for name, *_ in seen] == [p.name for p in written] and "overview.png" in [p.name for p in written]
    for name, extents, canvas in seen:
        assert len(extents) == 1, name
        box = extents[0]
        assert canvas.x0 <= box.x0 and box.x1 <= canvas.x1 and canvas.y0 <= box.y0 and box.y1 <= canvas.y1, (name, box, canvas)


def test_overlapping_curves_are_grouped_from_the_data():
    """Two curves overlap on a panel when they are nowhere further apart than 0.5% of its data range; a group must overlap on every panel."""
    x = np.linspace(0.0, 1.0, 50)  # every panel's data range is 1 (from 0 to 1)
    near = x + 0.9 * OVERLAP  # within the tolerance everywhere
    far = x + 3 * OVERLAP
    panel = {"a": x, "b": x.copy(), "c": near, "d": far}
    assert overlap_groups([panel]) == [["a", "b", "c"], ["d"]]
    other = {"a": x, "b": x.copy(), "c": x[::-1], "d": far}  # c departs from a on a second panel
    assert overlap_groups([panel, other]) == [["a", "b"], ["c"], ["d"]]
    assert legend_label(["a", "b"], [panel, other]) == "a, b (identical curves overlap)"
    assert legend_label(["a", "c"], [panel]) == "a, c (curves overlap: within 0.5% of the axis)"
    assert legend_label(["d"], [panel]) == "d"


def test_a_legend_says_which_runs_overlap(tmp_path, monkeypatch):
    """Before: the ablation's PNGs listed 7 runs in the legend and showed 2 curves. Identical runs now share one entry
    that says so, computed from the data; distinct runs keep their own."""
    results = _results(["gspo", "dfpo_min", "gspo_noclip"])
    results["dfpo_min"] = {key: v.copy() for key, v in results["gspo"].items()}  # a run identical to gspo
    texts = []
    savefig = matplotlib.figure.Figure.savefig

    def read_legend_then_save(fig, path, *args, **kwargs):
        texts.append((path.name, [t.get_text() for legend in fig.legends for t in legend.get_texts()]))
        savefig(fig, path, *args, **kwargs)

    monkeypatch.setattr(matplotlib.figure.Figure, "savefig", read_legend_then_save)
    plot_curves(results, tmp_path, "toy")
    assert len(texts) == len(PLOTS) + 1
    for name, labels in texts:
        assert labels == ["gspo, dfpo_min (identical curves overlap)", "gspo_noclip"], name
