"""Mutation testing: apply each hand-written mutant alone, run its tests, count the ones they kill.

    python scripts/mutation.py                 # every mutant of mutation/*.toml
    python scripts/mutation.py --part loss     # one part (loss, toy, theory, llm)
    python scripts/mutation.py --id asym-sample-variance
    python scripts/mutation.py --list          # what would run, without running it
    python scripts/mutation.py --in-place      # mutate the checkout itself (no copy)

A mutant is a plausible bug written down as data: a file, a piece of its source that occurs
exactly once, and the text that replaces it. Each is applied alone, the file is restored
afterwards (also on Ctrl-C), and the tests named for it run in a fresh pytest process.

Where: by default in a temporary copy of the checkout (the files ``git ls-files -co
--exclude-standard`` lists), with the copy's packages imported instead of the checkout's (a
``sitecustomize`` first on PYTHONPATH maps each ``package-dir`` of pyproject.toml to the copy), so
a mutant never reaches a file that someone else is editing, testing or committing in the
checkout. ``--in-place`` mutates the checkout itself, as before.

Baseline: each distinct test selection first runs once without any mutant; a selection that does
not pass then (a failing or missing test, a selection that collects nothing) makes its mutants
errors, not kills, since its failure says nothing about them.

Outcomes: a mutant is killed when pytest fails (exit 1: a test failed; exit 2: collection broke,
e.g. the mutated module no longer imports) or runs past ``--timeout``; it survives when pytest
passes. It is an error when its tests did not run (pytest exit 3, 4 or 5: an internal error, a
usage error such as a test path or node id that does not exist, no test collected) or when its
baseline failed: an error counts in its part as a mutant not killed. A mutant whose ``find`` text
is missing or ambiguous is stale (the code moved on) and is not counted. The exit status is 1
when a part falls below ``--target`` (default 90%) or a mutant is stale or an error.

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

A ``tests`` entry is a pytest argument: a file, or one test's node id (``tests/x.py::test_a``).
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import shutil
import subprocess
import sys
import tempfile
import time
import tomllib
from collections import defaultdict
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
MUTANT_DIR = ROOT / "mutation"

KILLING_EXITS = {1: "a test failed", 2: "collection failed or the run was interrupted"}
"""pytest exit codes that kill a mutant: its tests ran (or its module no longer imports) and did not pass."""

NOT_RUN_EXITS = {
    3: "pytest's internal error",
    4: "pytest usage error: a test path or node id that does not exist, or a bad option",
    5: "no test collected",
}
"""pytest exit codes that mean the tests did not run: an error of the mutant list, never a kill."""


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
    status: str  # "killed", "survived", "timeout", "error", "stale"
    seconds: float
    detail: str = ""


@dataclasses.dataclass(frozen=True)
class Workspace:
    """Where mutants are applied and their tests run: ``root`` (the checkout, or a copy of it) and the environment
    of the pytest processes (None: this process's own)."""

    root: Path
    env: dict[str, str] | None = None


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


def pytest_command(tests: tuple[str, ...]) -> list[str]:
    """The pytest process of one test selection: stop at the first failure, slow tests included (``-m ''``)."""
    return [sys.executable, "-m", "pytest", "-x", "-q", "-p", "no:cacheprovider", "-m", "", *tests]


def run_tests(tests: tuple[str, ...], workspace: Workspace, *, timeout: float) -> subprocess.CompletedProcess:
    """``pytest_command(tests)`` run in ``workspace``; subprocess.TimeoutExpired past ``timeout`` seconds."""
    return subprocess.run(pytest_command(tests), cwd=workspace.root, env=workspace.env, capture_output=True, text=True, timeout=timeout)


def first_problem(stdout: str) -> str:
    """The first FAILED / ERROR line of pytest's output, else its last line ('' when it printed nothing)."""
    lines = stdout.strip().splitlines()
    flagged = [line for line in lines if line.startswith(("FAILED", "ERROR"))]
    return flagged[0] if flagged else (lines[-1] if lines else "")


def classify(returncode: int, stdout: str) -> tuple[str, str]:
    """(status, detail) of a mutant whose tests exited with ``returncode``: 'survived' (0), 'killed' (1, 2) or
    'error' (any other code: the tests did not run, ``NOT_RUN_EXITS``)."""
    if returncode == 0:
        return "survived", ""
    if returncode in KILLING_EXITS:
        return "killed", first_problem(stdout)
    meaning = NOT_RUN_EXITS.get(returncode, "not a pytest exit code")
    return "error", f"its tests did not run (pytest exit code {returncode}: {meaning}): {first_problem(stdout)[-300:]}"


def baseline_problem(tests: tuple[str, ...], workspace: Workspace, *, timeout: float) -> str:
    """'' when the selection ``tests`` passes without any mutant, else why it does not (one line)."""
    try:
        proc = run_tests(tests, workspace, timeout=timeout)
    except subprocess.TimeoutExpired:
        return f"without any mutant its tests ran past the {timeout:g} s timeout"
    if proc.returncode == 0:
        return ""
    meaning = {**KILLING_EXITS, **NOT_RUN_EXITS}.get(proc.returncode, "not a pytest exit code")
    return f"without any mutant its tests do not pass (pytest exit code {proc.returncode}: {meaning}): {first_problem(proc.stdout)[-300:]}"


def run_mutant(mutant: Mutant, *, timeout: float, workspace: Workspace | None = None) -> Outcome:
    """Apply ``mutant`` in ``workspace`` (the checkout itself unless given), run its tests in a fresh process,
    restore the file."""
    workspace = workspace or Workspace(ROOT)
    path = workspace.root / mutant.file
    if not path.is_file():
        return Outcome(mutant, "stale", 0.0, f"no file {mutant.file}")
    original = path.read_text(encoding="utf-8")
    count = original.count(mutant.find)
    if count != 1:
        return Outcome(mutant, "stale", 0.0, f"find text occurs {count} times in {mutant.file}")
    start = time.perf_counter()
    try:
        path.write_text(original.replace(mutant.find, mutant.replace), encoding="utf-8")
        proc = run_tests(mutant.tests, workspace, timeout=timeout)
    except subprocess.TimeoutExpired:
        return Outcome(mutant, "timeout", time.perf_counter() - start, "tests ran past the timeout (counted as killed)")
    finally:
        path.write_text(original, encoding="utf-8")
    status, detail = classify(proc.returncode, proc.stdout)
    return Outcome(mutant, status, time.perf_counter() - start, detail)


def checkout_files(root: Path = ROOT) -> list[str]:
    """The checkout's files a copy holds: tracked ones and untracked ones git does not ignore (no .venv, no runs)."""
    out = subprocess.run(["git", "ls-files", "-co", "--exclude-standard", "-z"], cwd=root, capture_output=True, check=True)
    return [name for name in out.stdout.decode().split("\0") if name and (root / name).is_file()]


def package_dirs(root: Path) -> dict[str, str]:
    """pyproject.toml's ``[tool.setuptools] package-dir``: each import name and its folder under ``root``."""
    pyproject = root / "pyproject.toml"
    if not pyproject.is_file():
        return {}
    data = tomllib.loads(pyproject.read_text(encoding="utf-8"))
    return dict(data.get("tool", {}).get("setuptools", {}).get("package-dir", {}))


def import_shim(mapping: dict[str, Path]) -> str:
    """A ``sitecustomize`` that imports each package of ``mapping`` (import name -> folder) from that folder, ahead
    of any installed or editable copy of it."""
    folders = {name: str(folder) for name, folder in mapping.items()}
    return f'''"""Written by scripts/mutation.py: the packages of a mutation copy are imported from the copy."""
import importlib.util
import os
import sys

_FOLDERS = {folders!r}


class _MutationCopyFinder:
    @classmethod
    def find_spec(cls, fullname, path=None, target=None):
        folder = _FOLDERS.get(fullname)
        if folder is None:
            return None
        return importlib.util.spec_from_file_location(
            fullname, os.path.join(folder, "__init__.py"), submodule_search_locations=[folder]
        )


sys.meta_path.insert(0, _MutationCopyFinder)
'''


def copy_checkout(dest: Path, root: Path = ROOT) -> Workspace:
    """Copy the checkout's files (``checkout_files``) into ``dest`` and return the workspace whose pytest processes
    import the copy's packages (``import_shim`` as ``dest/.mutation-site/sitecustomize.py``, first on PYTHONPATH)
    and write no bytecode (a mutant and its restored original may share a size and an mtime second)."""
    for name in checkout_files(root):
        target = dest / name
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(root / name, target)
    site = dest / ".mutation-site"
    site.mkdir(exist_ok=True)
    mapping = {name: dest / folder for name, folder in package_dirs(dest).items()}
    (site / "sitecustomize.py").write_text(import_shim(mapping), encoding="utf-8")
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(site), *filter(None, [env.get("PYTHONPATH")])])
    env["PYTHONDONTWRITEBYTECODE"] = "1"
    return Workspace(dest, env)


def kill_rates(outcomes: list[Outcome]) -> dict[str, tuple[int, int]]:
    """Per part: (killed, counted), where timeouts count as killed, errors as not killed and stale mutants are
    not counted."""
    rates: dict[str, list[int]] = defaultdict(lambda: [0, 0])
    for o in outcomes:
        if o.status == "stale":
            continue
        rates[o.mutant.part][1] += 1
        rates[o.mutant.part][0] += o.status in ("killed", "timeout")
    return {part: (k, n) for part, (k, n) in sorted(rates.items())}


def run_all(mutants: list[Mutant], workspace: Workspace, *, timeout: float, baseline: bool = True) -> list[Outcome]:
    """Every mutant's outcome, printed as it comes; with ``baseline``, a mutant whose selection fails without any
    mutant is an error and does not run."""
    problems: dict[tuple[str, ...], str] = {}
    outcomes = []
    for i, mutant in enumerate(mutants, 1):
        if baseline and mutant.tests not in problems:
            problems[mutant.tests] = baseline_problem(mutant.tests, workspace, timeout=timeout)
        if baseline and problems[mutant.tests]:
            outcome = Outcome(mutant, "error", 0.0, problems[mutant.tests])
        else:
            outcome = run_mutant(mutant, timeout=timeout, workspace=workspace)
        outcomes.append(outcome)
        print(
            f"[{i}/{len(mutants)}] {outcome.status:8s} {mutant.part:8s} {mutant.id} ({outcome.seconds:.1f} s) {outcome.detail}", flush=True
        )
    return outcomes


def report(outcomes: list[Outcome], target: float) -> int:
    """Print the kill rate per part and the survivors, errors and stale mutants; 1 when a part is below ``target``
    or any mutant is stale or an error, else 0."""
    print("\nkill rate per part (timeouts count as killed, errors as not killed; stale mutants are not counted):")
    failed = False
    for part, (killed, counted) in kill_rates(outcomes).items():
        rate = killed / counted if counted else 0.0
        failed |= rate < target
        print(f"  {part:8s} {killed}/{counted} = {rate:.0%}" + ("" if rate >= target else f"  (below {target:.0%})"))
    for status, heading in (
        ("survived", "survivors:"),
        ("error", "errors (the tests did not run, or fail without the mutant):"),
        ("stale", "stale (the code no longer holds the find text):"),
    ):
        chosen = [o for o in outcomes if o.status == status]
        if chosen:
            print(heading)
        for o in chosen:
            print(f"  {o.mutant.part}/{o.mutant.id}: {o.mutant.file}: {o.mutant.why if status == 'survived' else o.detail}")
    return 1 if failed or any(o.status in ("error", "stale") for o in outcomes) else 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--part", action="append", help="only this part (repeatable)")
    parser.add_argument("--id", action="append", help="only this mutant id (repeatable)")
    parser.add_argument("--list", action="store_true", help="list the mutants and exit")
    parser.add_argument("--timeout", type=float, default=600.0, help="seconds per mutant (default 600)")
    parser.add_argument("--target", type=float, default=0.9, help="kill rate each part must reach (default 0.9)")
    parser.add_argument("--in-place", action="store_true", help="mutate the checkout itself instead of a temporary copy")
    parser.add_argument("--no-baseline", action="store_true", help="skip running each test selection once without a mutant")
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
    if args.in_place:
        return report(run_all(mutants, Workspace(ROOT), timeout=args.timeout, baseline=not args.no_baseline), args.target)
    with tempfile.TemporaryDirectory(prefix="dfpo-mutation-") as tmp:
        workspace = copy_checkout(Path(tmp))
        print(f"mutants run in a copy of the checkout: {tmp}", flush=True)
        return report(run_all(mutants, workspace, timeout=args.timeout, baseline=not args.no_baseline), args.target)


if __name__ == "__main__":
    sys.exit(main())
