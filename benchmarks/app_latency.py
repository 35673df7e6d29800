"""Response time of the explorer's pages, driven through Streamlit's AppTest.

    python benchmarks/app_latency.py [--repeats 5] [--log-mb 200] [--skip-toy] [--before REV] [--atlas-only]

0. The atlas page (2) per input change: a seed not seen before, a group count up or down, a new objective filter,
   each change timed as the rerun it causes (median and largest over ``--repeats`` changes of each kind). With
   ``--before REV`` the page as it was at git revision REV runs beside today's, change for change, in one table
   (REV's page script on today's library code; both start with empty caches). Target: 2 s.
1. Interactions of pages 1 (cancellation by hand), 2 (atlas) and 4 (claims ledger): the first run
   (cold: imports, caches filled), then the median time of one interaction re-run. Target: 300 ms.
2. Default page loads, as a new server process sees them: the toy lab and the claims ledger with
   nothing stored, then again with their results stored on disk (``dfpo.app.cache``; the process
   caches cleared in between). Target for a stored result: under 2 s.
3. The training-runs page on a run whose metrics.jsonl is ``--log-mb`` MB: the first load (the log
   parsed once) and a rerun (only what was appended is read). Target for the rerun: under 2 s.

AppTest runs the script in-process without a browser, so network and rendering are not included.
Caches go to a temporary folder, never ~/.cache.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import tempfile
import time
from pathlib import Path

import streamlit as st
from streamlit.testing.v1 import AppTest

APP = Path(__file__).resolve().parents[1] / "app"


def _timed(fn) -> float:
    t0 = time.perf_counter()
    fn()
    return time.perf_counter() - t0


def interactions():
    """(page, description, the interaction to time: (at, i) -> None)."""
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


def atlas_changes(repeats: int) -> list[tuple[str, list[tuple[str, float | list[str]]]]]:
    """(kind, the widget values to set, in turn) of part 0: every seed a new one, group counts that go up and down
    around the default 4, filters that never repeat the one before."""
    filters = [["gspo", "dfpo_min"], ["grpo", "dapo", "gspo"], ["grpo_fix"], ["cispo", "sapo", "gpg", "opsm"]]
    return [
        ("new seed", [("atlas_seed", float(100 + i)) for i in range(repeats)]),
        ("group count", [("atlas_groups", float(g)) for g in ([5, 6, 3, 7, 2, 8, 4] * repeats)[:repeats]]),
        ("objective filter", [("atlas_objectives", f) for f in (filters * repeats)[:repeats]]),
    ]


def _set(at: AppTest, key: str, value) -> None:
    (at.multiselect(key=key) if key == "atlas_objectives" else at.number_input(key=key)).set_value(value)


def atlas_latency(repeats: int, before: str | None, tmp: Path) -> float:
    """Part 0: each kind of change of the atlas page, today's page beside REV's; the median over every change today."""
    pages = {"today": APP / "page_atlas.py"}
    if before:
        old = tmp / "before" / "page_atlas.py"
        old.parent.mkdir(parents=True)
        try:
            source = subprocess.run(
                ["git", "show", f"{before}:app/page_atlas.py"], cwd=APP.parent, capture_output=True, text=True, check=True
            )
        except (OSError, subprocess.CalledProcessError) as err:
            raise SystemExit(
                f"--before {before!r}: git cannot show app/page_atlas.py at that revision ({str(getattr(err, 'stderr', None) or err).strip()})"
            ) from None
        old.write_text(source.stdout)
        pages = {f"before {before}": old, **pages}
    _new_process()
    apps, cold = {}, {}
    for label, path in pages.items():
        apps[label] = AppTest.from_file(str(path), default_timeout=900)
        cold[label] = _timed(apps[label].run)
    head = "".join(f" {label + ' median s':>22s} {'max s':>7s}" for label in pages)
    print(f"{'atlas page: one change':28s}{head}   target 2 s")
    print(f"{'first load (cold)':28s}" + "".join(f" {cold[label]:22.2f} {'':7s}" for label in pages))
    every = {label: [] for label in pages}
    for kind, steps in atlas_changes(repeats):
        times = {label: [] for label in pages}
        for i, (key, value) in enumerate(steps):
            order = list(pages) if i % 2 == 0 else list(pages)[::-1]  # alternate who goes first: a busy machine slows both
            for label in order:
                _set(apps[label], key, value)
                times[label].append(_timed(apps[label].run))
                assert not apps[label].exception, [e.value for e in apps[label].exception]
        row = "".join(f" {statistics.median(times[label]):22.2f} {max(times[label]):7.2f}" for label in pages)
        print(f"{kind:28s}{row}   {'ok' if statistics.median(times['today']) < 2 else 'SLOW'}", flush=True)
        for label in pages:
            every[label] += times[label]
    today = statistics.median(every["today"])
    row = "".join(f" {statistics.median(every[label]):22.2f} {max(every[label]):7.2f}" for label in pages)
    print(f"{'every change':28s}{row}   {'ok' if today < 2 else 'SLOW'}")
    if before:  # the same inputs at the end: both pages must show the same table
        tables = [apps[label].dataframe[0].value.to_dict("records") for label in pages]
        print("the two pages show " + ("the same table" if tables[0] == tables[1] else "DIFFERENT tables") + " at the last inputs")
    return today


def _new_process() -> None:
    """What a new server process starts with: no in-memory cache."""
    st.cache_data.clear()
    st.cache_resource.clear()


def _load(page: str) -> float:
    at = AppTest.from_file(str(APP / f"page_{page}.py"), default_timeout=900)
    seconds = _timed(at.run)
    assert not at.exception, [e.value for e in at.exception]
    return seconds


def _big_run(folder: Path, megabytes: float) -> int:
    """A trainer run folder whose metrics.jsonl holds about ``megabytes`` MB (40 metrics a line); its line count."""
    folder.mkdir(parents=True)
    (folder / "config.toml").write_text('seed = 0\n[objective]\nname = "gspo"\n')
    keys = [f"metric/{j:02d}" for j in range(40)]
    written, step = 0, 0
    with open(folder / "metrics.jsonl", "w") as f:
        while written < megabytes * 1e6:
            step += 1
            line = json.dumps({"step": step, "reward/mean": (step % 97) / 97, **{k: step * 1e-3 + j for j, k in enumerate(keys)}}) + "\n"
            written += f.write(line)
    return step


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--repeats", type=int, default=5)
    p.add_argument("--log-mb", type=float, default=200.0, help="size of the big metrics.jsonl of part 3 (default 200)")
    p.add_argument("--skip-toy", action="store_true", help="leave out the toy lab's cold load (tens of seconds)")
    p.add_argument("--before", metavar="REV", help="git revision whose atlas page part 0 times beside today's (e.g. HEAD~3)")
    p.add_argument("--atlas-only", action="store_true", help="run part 0 (the atlas page per change) and nothing else")
    args = p.parse_args()
    with tempfile.TemporaryDirectory(prefix="dfpo-app-latency-") as tmp:  # caches and the big log, removed at the end
        return measure(args, Path(tmp))


def measure(args: argparse.Namespace, tmp: Path) -> int:
    os.environ["DFPO_APP_CACHE"] = str(tmp / "cache")
    if args.repeats < 1:
        raise SystemExit(f"--repeats must be a whole number of at least 1, got --repeats {args.repeats}")
    atlas_latency(args.repeats, args.before, tmp)
    if args.atlas_only:
        return 0
    print()

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

    print(f"\n{'page':8s} {'default load in a new process':48s} {'s':>8s}")
    for page in ("ledger",) + (() if args.skip_toy else ("toy",)):
        os.environ["DFPO_APP_CACHE"] = str(tmp / f"cache-{page}")  # nothing stored yet
        _new_process()
        print(f"{page:8s} {'nothing stored (computed, then stored)':48s} {_load(page):8.2f}", flush=True)
        _new_process()
        stored = _load(page)
        print(f"{page:8s} {'result stored on disk':48s} {stored:8.2f}  {'ok' if stored < 2 else 'SLOW'}", flush=True)

    lines = _big_run(tmp / "runs" / "big", args.log_mb)
    os.environ["DFPO_APP_RUNS"] = str(tmp / "runs")
    _new_process()
    at = AppTest.from_file(str(APP / "page_runs.py"), default_timeout=900)
    first = _timed(at.run)
    rerun = _timed(at.run)
    with open(tmp / "runs" / "big" / "metrics.jsonl", "a") as f:
        f.write(json.dumps({"step": lines + 1, "reward/mean": 0.5}) + "\n")
    grown = _timed(at.run)
    assert not at.exception, [e.value for e in at.exception]
    size = (tmp / "runs" / "big" / "metrics.jsonl").stat().st_size / 1e6
    print(f"\nruns page, metrics.jsonl of {size:.0f} MB ({lines} lines): first load {first:.2f} s, rerun {rerun:.2f} s, "
          f"rerun after one more line {grown:.2f} s  {'ok' if max(rerun, grown) < 2 else 'SLOW'}")  # fmt: skip
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
