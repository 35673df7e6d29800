"""Response time of the explorer's interactive pages once warm, driven through Streamlit's AppTest.

    python benchmarks/app_latency.py [--repeats 5]

For pages 1 (cancellation by hand), 2 (atlas) and 4 (claims ledger): the first run (cold: imports,
caches filled), then the median time of one interaction re-run, repeated. Target: under 300 ms.
AppTest runs the script in-process without a browser, so network and rendering are not included.
"""

from __future__ import annotations

import argparse
import statistics
import time
from pathlib import Path

from streamlit.testing.v1 import AppTest

APP = Path(__file__).resolve().parents[1] / "app"


def _timed(fn) -> float:
    t0 = time.perf_counter()
    fn()
    return time.perf_counter() - t0


def interactions():
    """(page, description, set-up of the AppTest, the interaction to time: at -> None)."""
    objectives = ["gspo", "dfpo_min"]
    return [
        ("cancel", "switch the objective", lambda at, i: at.selectbox(key="objective").set_value(objectives[i % 2]).run()),
        ("cancel", "move the shared log-ratio slider", lambda at, i: at.slider(key="shared").set_value(0.05 * (i % 10)).run()),
        (
            "atlas",
            "filter the objectives",
            lambda at, i: at.multiselect(key="atlas_objectives").set_value(["gspo", "dfpo_min", "grpo_fix"][: 1 + i % 3]).run(),
        ),
        ("ledger", "filter by verdict", lambda at, i: at.multiselect(key="ledger_verdicts").set_value([["fails"], ["holds"]][i % 2]).run()),
        ("ledger", "search", lambda at, i: at.text_input(key="ledger_search").set_value(["eq-55", "stapo"][i % 2]).run()),
    ]


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--repeats", type=int, default=5)
    args = p.parse_args()
    print(f"{'page':8s} {'interaction':36s} {'cold s':>8s} {'warm median ms':>15s} {'max ms':>8s}  target 300 ms")
    worst = 0.0
    for page, what, act in interactions():
        at = AppTest.from_file(str(APP / f"page_{page}.py"), default_timeout=300)
        cold = _timed(at.run)
        times = [_timed(lambda i=i, act=act, at=at: act(at, i)) for i in range(args.repeats)]
        assert not at.exception, [e.value for e in at.exception]
        med, top = statistics.median(times) * 1e3, max(times) * 1e3
        worst = max(worst, med)
        print(f"{page:8s} {what:36s} {cold:8.2f} {med:15.0f} {top:8.0f}  {'ok' if med < 300 else 'SLOW'}")
    print(f"slowest warm interaction (median): {worst:.0f} ms")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
