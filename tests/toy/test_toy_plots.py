"""The toy's PNG curves show every label of their legend: nothing is cut at the canvas's edge."""

from __future__ import annotations

import numpy as np
import pytest

pytest.importorskip("matplotlib")
import matplotlib.figure  # noqa: E402

from dfpo.toy.cli import ABLATION  # noqa: E402
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
