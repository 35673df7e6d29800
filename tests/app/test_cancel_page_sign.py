"""Page 1 says what its bars are (issue 57): d loss / d log pi of the shared token in each completion, so a completion
with A > 0 (green) draws a bar below 0, as the loss core computes it."""

from __future__ import annotations

import base64
import json
from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("streamlit")
from streamlit.testing.v1 import AppTest  # noqa: E402

APP = Path(__file__).resolve().parents[2] / "app"
GREEN, RED = "#2ca02c", "#d62728"


def _plain(value) -> list:
    """A trace's y as a list (plotly sends a numpy array base64-encoded)."""
    if isinstance(value, dict) and "bdata" in value:
        return np.frombuffer(base64.b64decode(value["bdata"]), dtype=value["dtype"]).tolist()
    return value


def test_the_coefficient_chart_says_its_bars_are_d_loss_d_log_pi_and_green_bars_are_below_zero():
    at = AppTest.from_file(str(APP / "page_cancel.py"), default_timeout=300).run()
    assert not at.exception, [e.value for e in at.exception]
    at.text_input(key="rewards").set_value("1, 0, 0, 0")
    at.text_input(key="lengths").set_value("6, 6, 6, 6")
    at.slider(key="scale").set_value(0.0).run()  # GSPO with every ratio 1: nothing clipped
    spec = json.loads(at.get("plotly_chart")[0].proto.spec)
    layout = spec["layout"]
    assert "d loss / d log pi" in layout["title"]["text"] and "d loss / d log pi" in layout["yaxis"]["title"]["text"]
    bar = spec["data"][0]
    ys = _plain(bar["y"])
    colours = bar["marker"]["color"]
    assert colours == [GREEN, RED, RED, RED]
    assert ys[0] < 0 < min(ys[1:])  # the rewarded completion pushes the shared token up: a negative derivative
    assert any("d loss / d log pi" in c.value and "A > 0" in c.value for c in at.caption)
