"""The time goal's verdicts from benchmarks/fused_head_split.py logs, one row per size, objective and floor, one column
per input set, and what the input sets say together.

    python benchmarks/fused_head_verdicts.py split.log [more.log ...]

Reads the lines fused_head_split.py prints (its header with the size and ``input set``, its ``goal`` lines, its
``reach`` line, listed under the objective ``floor_softmax``, and its ``--before REV`` lines, listed against
``before REV``); a size, input set, objective and floor run more than once keeps its last reading, in the order the
logs are given. Together: a decided verdict (``met``, ``missed``, ``faster``, ``slower``) where every input set's
reading says so, ``one input set`` where only one ran (a hypothesis until a second, disjoint set agrees), ``not shown
either way`` otherwise.
"""

from __future__ import annotations

import argparse
import re
import signal
import sys
from pathlib import Path
from typing import NamedTuple

sys.path.insert(0, str(Path(__file__).resolve().parent))
from fused_head import FLOORS, REACH  # noqa: E402 -- the goal lines' names, beside this script
from fused_head_split import WHERE  # noqa: E402

FLOOR_MODES = {name: mode for mode, name in FLOORS.items()}
"""A goal line's name of a floor -> its mode in benchmarks/fused_head.py."""

HEADER = re.compile(r"^B x T = (\d+) x (\d+), V = (\d+), .*; input set (\d+); CPU s$")
INTERVAL = r"\((\d+) rounds?: the median's (\d+)% interval ([\d.]+)x to ([\d.]+)x\)"
"""``fused_head.interval_note`` in its parentheses: rounds, coverage, low, high."""
GOAL = re.compile(
    rf"^(?:goal fused (\w+)|reach ({REACH})) <= [\d.]+x (.+){re.escape(WHERE)}: ([\d.]+)x, (met|missed|inconclusive) "
    rf"{INTERVAL}(?:; .*)?$"
)
BEFORE = re.compile(
    rf"^now against before fused (\w+) \(core/fused(?:\.py|/) at (\S+)\){re.escape(WHERE)}: ([\d.]+)x, "
    rf"(faster|slower|not shown either way) {INTERVAL}$"
)
DECIDED = ("met", "missed", "faster", "slower")
"""The verdicts that say something; the input sets say one together only where all of them say it."""


class Reading(NamedTuple):
    """One goal line's reading: the median ratio, its verdict, the median's interval and the rounds behind it."""

    x: str
    verdict: str
    low: str
    high: str
    rounds: str

    def cell(self) -> str:
        return f"{self.x}x {self.verdict} [{self.low}, {self.high}], {self.rounds} rounds"


def readings(lines: list[str]) -> dict[tuple, dict[int, Reading]]:
    """{(size, V, objective, floor mode): {input set: Reading}}, the last reading of each; the floor by its mode's
    name in benchmarks/fused_head.py (``floor``, ``floor_autograd``); the ``REACH`` row's line under the objective
    ``REACH`` (``floor_softmax``); a ``--before REV`` line against ``before REV``."""
    out: dict[tuple, dict[int, Reading]] = {}
    where = None
    for line in lines:
        if m := HEADER.match(line):
            B, T, V, seed = (int(x) for x in m.groups())
            where = (f"{B} x {T}", V), seed
        elif (m := GOAL.match(line)) and where is not None:
            objective, reach, floor, x, verdict, n, _, low, high = m.groups()
            (size, seed) = where
            out.setdefault((*size, objective or reach, FLOOR_MODES.get(floor, floor)), {})[seed] = Reading(x, verdict, low, high, n)
        elif (m := BEFORE.match(line)) and where is not None:
            objective, rev, x, verdict, n, _, low, high = m.groups()
            (size, seed) = where
            out.setdefault((*size, objective, f"before {rev}"), {})[seed] = Reading(x, verdict, low, high, n)
    return out


def together(cells: dict[int, Reading]) -> str:
    """What the input sets say together, from each reading's verdict."""
    verdicts = {cell.verdict for cell in cells.values()}
    if len(cells) == 1:
        return f"one input set: {verdicts.pop()}"
    if len(verdicts) == 1 and verdicts <= set(DECIDED):
        return verdicts.pop()
    return "not shown either way"


def table(found: dict[tuple, dict[int, Reading]]) -> list[str]:
    """Markdown rows: size, V, objective, floor, one column per input set, together."""
    seeds = sorted({s for cells in found.values() for s in cells})
    head = ["size", "V", "objective", "floor", *[f"input set {s}" for s in seeds], "together"]
    rows = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for (size, V, objective, floor), cells in found.items():
        row = [size, str(V), objective, floor, *[cells[s].cell() if s in cells else "not run" for s in seeds], together(cells)]
        rows.append("| " + " | ".join(row) + " |")
    return rows


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("logs", nargs="+", type=Path)
    args = p.parse_args(argv)
    lines = []
    for log in args.logs:
        if not log.is_file():
            p.error(f"no log at {log}: pass the files fused_head_split.py's output was saved to")
        lines += log.read_text(errors="replace").splitlines()
    found = readings(lines)
    if not found:
        p.error(f"no goal line of fused_head_split.py in {', '.join(map(str, args.logs))}")
    print("\n".join(table(found)))
    return 0


if __name__ == "__main__":
    signal.signal(signal.SIGPIPE, signal.SIG_DFL)  # piped into head: stop quietly when it closes
    sys.exit(main())
