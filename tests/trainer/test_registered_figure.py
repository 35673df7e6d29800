"""The picture of a registered experiment (issue 58 item 7): one panel per row, drawn from the stored tables."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import numpy as np
import pytest

from dfpo.core import registration as reg
from dfpo.trainer.registered_figure import plot_registered, registered_figure, row_differences

ROWS = [
    dict(method="m", control="c", metric="eval", paper="higher", hypothesis="higher", margin=0.02, margin_kind="absolute", primary=True),
    dict(method="m", control="c", metric="tax_kl", paper="lower", hypothesis="none", margin=0.1, margin_kind="relative"),
]


def registration():
    return reg.load_registration(
        {
            "experiment": "x",
            "title": "X",
            "family_alpha": 0.05,
            "sets": [{"name": "x-a", "first_seed": 0, "seeds": 5}, {"name": "x-b", "first_seed": 10, "seeds": 5}],
            "command": "dfpo compare --first-seed {first_seed} --out runs/{name}",
            "rows": ROWS,
        }
    )


def stored(shift: float = 0.3):
    rng = np.random.default_rng(0)
    sets = {}
    for name, first in (("x-a", 0), ("x-b", 10)):
        records = {"c": {}, "m": {}}
        for i in range(5):
            c = {"eval": 0.5 + 0.05 * rng.standard_normal(), "tax_kl": 0.01 + 0.001 * rng.standard_normal()}
            records["c"][str(first + i)] = c
            records["m"][str(first + i)] = {"eval": c["eval"] + shift + 0.01 * rng.standard_normal(), "tax_kl": c["tax_kl"]}
        sets[name] = {"doc": {"records": records}}
    t = datetime(2026, 12, 1, tzinfo=UTC)
    return {
        "registering_commit": "abcdef1234",
        "registered_at": t.isoformat(),
        "data_started": (t + timedelta(hours=1)).isoformat(),
        "registered_rows": [["m", "c", "eval"], ["m", "c", "tax_kl"]],
        "sets": sets,
    }


def test_each_panel_draws_the_stored_paired_differences_of_its_row_on_every_set():
    r, doc = registration(), stored()
    results = reg.evaluate_stored(r, doc)
    diffs = row_differences(r, doc, results[0])
    assert len(diffs) == 2 and all(d.shape == (5,) for d in diffs)
    assert np.allclose([d.mean() for d in diffs], [v.interval.mean for v in results[0].per_set])  # the sentence's numbers
    fig = registered_figure(r, doc, {"eval": "final eval", "tax_kl": "tax"})
    try:
        titles = [ax.get_title() for ax in fig.axes]
        assert len(titles) == 2  # one panel per row, no blank panel
        assert "final eval (primary): higher" in titles[0].replace("\n", " ")
        assert f"tax: {results[1].word}" in titles[1].replace("\n", " ")
    finally:
        import matplotlib.pyplot as plt

        plt.close(fig)


def test_the_picture_is_a_png(tmp_path):
    path = tmp_path / "x-rows.png"
    plot_registered(registration(), stored(), {}, path)
    assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_a_missing_value_is_refused_in_one_sentence_not_drawn():
    doc = stored()
    del doc["sets"]["x-b"]["doc"]["records"]["m"]["12"]
    with pytest.raises(ValueError, match="a value is missing or not finite"):
        registered_figure(registration(), doc, {})
