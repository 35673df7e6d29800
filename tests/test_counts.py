"""Counts and lists a reader meets outside the app (README, the ``dfpo`` command's docstring) agree with the code:
each fails when the code gains or loses what it counts. The app's own pages: tests/app/test_pages.py."""

from __future__ import annotations

import re
from pathlib import Path

import dfpo.cli
from dfpo.core.loss import OBJECTIVES

ROOT = Path(__file__).resolve().parents[1]
README = (ROOT / "README.md").read_text()


def test_readme_preset_count_is_the_registrys():
    counts = re.findall(r"(\d+) presets in all", README)
    assert counts == [str(len(OBJECTIVES.builtin))]


def test_the_dfpo_docstring_lists_every_subcommand_in_the_parsers_order():
    sub = next(a for a in dfpo.cli.build_parser()._actions if a.dest == "command")
    listed = re.findall(r"^    dfpo (\w+)", dfpo.cli.__doc__, re.M)
    assert listed == list(sub.choices)
