"""Keep a long experiment's finished cells in the repository, so no finished cell is lost with the machine.

    python scripts/keep_cells.py save runs/smollm2-stage0-a       # -> docs/attribution/cells/smollm2-stage0-a/
    python scripts/keep_cells.py restore smollm2-stage0-a runs/   # -> runs/smollm2-stage0-a/ (cells not there yet)

A registered experiment on the real model trains for hours over several sessions, and ``runs/`` is not in the
repository. ``save`` copies each FINISHED cell (a run folder holding summary.json) of a ``dfpo compare`` folder:
its run mark, config.toml, summary.json and its three logs (about 20 kB a cell; never the tax reference, the
figures or the TensorBoard files). ``restore`` copies them back into a comparison folder where that cell is missing,
so ``dfpo compare`` with the registered command reads them as done ("done before, skipped") and trains only the rest.
Nothing is overwritten on either side: a cell already there is left as it is, and said so. The files are data: they
are copied, never run.
"""

from __future__ import annotations

import argparse
import shutil
import sys
from pathlib import Path

from dfpo.trainer.run.layout import RunDir

ROOT = Path(__file__).resolve().parents[1]
KEPT = ROOT / "docs" / "attribution" / "cells"
FILES = (RunDir.MARK, RunDir.CONFIG, RunDir.SUMMARY, *RunDir.LOGS)
"""What a finished cell keeps: what ``dfpo compare`` reads of it (identity, settings, outcomes, curves)."""


def finished_cells(folder: Path) -> list[Path]:
    """Every run folder under ``folder`` (LABEL/seedN) that holds a summary.json, in name order."""
    return sorted(p.parent for p in folder.glob(f"*/seed*/{RunDir.SUMMARY}"))


def copy_cell(source: Path, target: Path) -> bool:
    """Copy a cell's ``FILES`` from ``source`` into a new folder ``target``; False (nothing copied) where ``target``
    already exists."""
    if target.exists():
        return False
    tmp = target.with_name(target.name + ".partial")
    if tmp.exists():
        shutil.rmtree(tmp)  # a copy this script began and never finished
    tmp.mkdir(parents=True)
    for name in FILES:
        if (source / name).is_file():
            shutil.copy2(source / name, tmp / name)
    tmp.rename(target)
    return True


def transfer(source_root: Path, target_root: Path) -> tuple[int, int]:
    """(copied, left as they were) over every finished cell of ``source_root`` into ``target_root``."""
    copied = kept = 0
    for cell in finished_cells(source_root):
        rel = cell.relative_to(source_root)
        if copy_cell(cell, target_root / rel):
            copied += 1
        else:
            kept += 1
    return copied, kept


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True)
    save = sub.add_parser("save", help="copy a comparison folder's finished cells into docs/attribution/cells/NAME")
    save.add_argument("folder", type=Path)
    restore = sub.add_parser("restore", help="copy docs/attribution/cells/NAME's cells into RUNS/NAME where missing")
    restore.add_argument("name")
    restore.add_argument("runs", type=Path)
    args = parser.parse_args(argv)
    if args.command == "save":
        if not args.folder.is_dir():
            print(f"keep_cells: {args.folder} is not a folder; give the --out of a dfpo compare", file=sys.stderr)
            return 2
        source, target = args.folder, KEPT / args.folder.name
    else:
        source, target = KEPT / args.name, args.runs / args.name
        if not source.is_dir():
            print(f"keep_cells: no kept cells named {args.name!r} in {KEPT}", file=sys.stderr)
            return 2
    copied, kept = transfer(source, target)
    print(f"keep_cells: {copied} finished cells copied into {target}, {kept} already there left as they were")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
