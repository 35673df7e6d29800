"""Mutation testing: apply each hand-written mutant alone, run its tests, count the ones they kill.

    python scripts/mutation.py                 # every mutant of mutation/*.toml
    python scripts/mutation.py --part loss     # one part (loss, toy, theory, llm)
    python scripts/mutation.py --id asym-sample-variance
    python scripts/mutation.py --list          # what would run, without running it

A mutant is a plausible bug written down as data: a file, a piece of its source that occurs
exactly once, and the text that replaces it. Each is applied in place, the file is restored
afterwards (also on Ctrl-C), and the tests named for it run in a fresh pytest process. A mutant
is killed when pytest fails; it survives when pytest passes. A mutant whose ``find`` text is
missing or ambiguous is reported as stale (the code moved on) and counts as a failure of the
list, not as a kill. The exit status is 1 when a part falls below ``--target`` (default 90%)
or a mutant is stale.

Format of ``mutation/<name>.toml``::

    part = "loss"
    tests = ["tests/test_x.py"]        # default selection for this file's mutants
    [[mutant]]
    id = "asym-sample-variance"
    file = "core/loss/core.py"
    find = "exact source text"
    replace = "mutated text"
    why = "what bug this stands for"
    tests = ["tests/test_y.py"]        # optional, overrides the default
"""

from __future__ import annotations

import argparse
import dataclasses
import subprocess
import sys
import time
import tomllib
from collections import defaultdict
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
MUTANT_DIR = ROOT / "mutation"


@dataclasses.dataclass(frozen=True)
class Mutant:
    id: str
    part: str
    file: str
    find: str
    replace: str
    why: str
    tests: tuple[str, ...]


@dataclasses.dataclass(frozen=True)
class Outcome:
    mutant: Mutant
    status: str  # "killed", "survived", "stale", "timeout"
    seconds: float
    detail: str = ""


def load_mutants(directory: Path = MUTANT_DIR) -> list[Mutant]:
    """Every mutant of ``directory/*.toml``; raises ValueError naming the file and field on bad input."""
    mutants: list[Mutant] = []
    seen: set[str] = set()
    for path in sorted(directory.glob("*.toml")):
        data = tomllib.loads(path.read_text(encoding="utf-8"))
        part, default_tests = data.get("part"), data.get("tests", [])
        if not isinstance(part, str) or not part:
            raise ValueError(f"{path.name}: 'part' must be a non-empty string, got part={part!r}")
        for i, entry in enumerate(data.get("mutant", [])):
            missing = [k for k in ("id", "file", "find", "replace") if not isinstance(entry.get(k), str)]
            if missing:
                raise ValueError(f"{path.name}: mutant #{i} lacks string field(s) {missing}")
            if entry["id"] in seen:
                raise ValueError(f"{path.name}: duplicate mutant id={entry['id']!r}")
            if entry["find"] == entry["replace"]:
                raise ValueError(f"{path.name}: mutant id={entry['id']!r} replaces its text with itself")
            tests = tuple(entry.get("tests", default_tests))
            if not tests:
                raise ValueError(f"{path.name}: mutant id={entry['id']!r} names no tests and the file has no default")
            seen.add(entry["id"])
            mutants.append(Mutant(entry["id"], part, entry["file"], entry["find"], entry["replace"], entry.get("why", ""), tests))
    return mutants


def run_mutant(mutant: Mutant, *, timeout: float) -> Outcome:
    """Apply ``mutant`` in place, run its tests in a fresh process, restore the file."""
    path = ROOT / mutant.file
    if not path.is_file():
        return Outcome(mutant, "stale", 0.0, f"no file {mutant.file}")
    original = path.read_text(encoding="utf-8")
    count = original.count(mutant.find)
    if count != 1:
        return Outcome(mutant, "stale", 0.0, f"find text occurs {count} times in {mutant.file}")
    start = time.perf_counter()
    try:
        path.write_text(original.replace(mutant.find, mutant.replace), encoding="utf-8")
        cmd = [sys.executable, "-m", "pytest", "-x", "-q", "-p", "no:cacheprovider", "-m", "", *mutant.tests]
        proc = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired:
        return Outcome(mutant, "timeout", time.perf_counter() - start, "tests ran past the timeout (counted as killed)")
    finally:
        path.write_text(original, encoding="utf-8")
    seconds = time.perf_counter() - start
    if proc.returncode == 0:
        return Outcome(mutant, "survived", seconds)
    if proc.returncode in (1, 2):  # tests failed, or the module no longer imports
        last = [line for line in proc.stdout.splitlines() if line.startswith(("FAILED", "ERROR"))]
        return Outcome(
            mutant, "killed", seconds, last[0] if last else proc.stdout.strip().splitlines()[-1:][0] if proc.stdout.strip() else ""
        )
    return Outcome(mutant, "stale", seconds, f"pytest exit code {proc.returncode}: {proc.stdout.strip()[-300:]}")


def kill_rates(outcomes: list[Outcome]) -> dict[str, tuple[int, int]]:
    """Per part: (killed, counted), where timeouts count as killed and stale mutants are not counted."""
    rates: dict[str, list[int]] = defaultdict(lambda: [0, 0])
    for o in outcomes:
        if o.status == "stale":
            continue
        rates[o.mutant.part][1] += 1
        rates[o.mutant.part][0] += o.status in ("killed", "timeout")
    return {part: (k, n) for part, (k, n) in sorted(rates.items())}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--part", action="append", help="only this part (repeatable)")
    parser.add_argument("--id", action="append", help="only this mutant id (repeatable)")
    parser.add_argument("--list", action="store_true", help="list the mutants and exit")
    parser.add_argument("--timeout", type=float, default=600.0, help="seconds per mutant (default 600)")
    parser.add_argument("--target", type=float, default=0.9, help="kill rate each part must reach (default 0.9)")
    args = parser.parse_args(argv)
    mutants = load_mutants()
    if args.part:
        mutants = [m for m in mutants if m.part in args.part]
    if args.id:
        unknown = sorted(set(args.id) - {m.id for m in mutants})
        if unknown:
            parser.error(f"unknown mutant id(s) {unknown}")
        mutants = [m for m in mutants if m.id in args.id]
    if not mutants:
        parser.error(f"no mutant selected (part={args.part}, id={args.id}) in {MUTANT_DIR}")
    if args.list:
        for m in mutants:
            print(f"{m.part:8s} {m.id:40s} {m.file}  {m.why}")
        return 0
    outcomes = []
    for i, mutant in enumerate(mutants, 1):
        outcome = run_mutant(mutant, timeout=args.timeout)
        outcomes.append(outcome)
        print(
            f"[{i}/{len(mutants)}] {outcome.status:8s} {mutant.part:8s} {mutant.id} ({outcome.seconds:.1f} s) {outcome.detail}", flush=True
        )
    print("\nkill rate per part (timeouts count as killed; stale mutants are not counted):")
    failed = False
    for part, (killed, counted) in kill_rates(outcomes).items():
        rate = killed / counted if counted else 0.0
        failed |= rate < args.target
        print(f"  {part:8s} {killed}/{counted} = {rate:.0%}" + ("" if rate >= args.target else f"  (below {args.target:.0%})"))
    survivors = [o for o in outcomes if o.status == "survived"]
    stale = [o for o in outcomes if o.status == "stale"]
    if survivors:
        print("survivors:")
        for o in survivors:
            print(f"  {o.mutant.part}/{o.mutant.id}: {o.mutant.file}: {o.mutant.why}")
    if stale:
        print("stale (the code no longer holds the find text):")
        for o in stale:
            print(f"  {o.mutant.part}/{o.mutant.id}: {o.detail}")
    return 1 if failed or stale else 0


if __name__ == "__main__":
    sys.exit(main())
