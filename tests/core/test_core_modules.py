"""core/__init__.py says what each module of core/ is for: one line each, none missing, none stale."""

from pathlib import Path

import dfpo.core

CORE = Path(dfpo.core.__file__).parent


def _modules_on_disk() -> set[str]:
    """Every module of core/: a .py file other than __init__.py, or a folder that is a package."""
    files = {p.stem for p in CORE.glob("*.py") if p.name != "__init__.py"}
    packages = {p.name for p in CORE.iterdir() if p.is_dir() and (p / "__init__.py").exists()}
    return files | packages


def _modules_in_docstring() -> dict[str, str]:
    """The 'Modules' section of the docstring: name -> its line (the name is the line's first word)."""
    doc = dfpo.core.__doc__
    section = doc.split("Modules", 1)[1].split("\n", 1)[1]
    rows = [line.split(None, 1) for line in section.splitlines() if line.startswith("    ") and line.strip()]
    return {row[0]: row[1] if len(row) > 1 else "" for row in rows}


def test_every_module_of_core_has_one_line_saying_what_it_is_for():
    """The set of names in the docstring equals the set of modules on disk, and each has a non-empty line."""
    listed = _modules_in_docstring()
    on_disk = _modules_on_disk()
    assert sorted(on_disk - set(listed)) == [], "modules of core/ missing from core/__init__.py's docstring"
    assert sorted(set(listed) - on_disk) == [], "core/__init__.py's docstring names modules that are not in core/"
    assert all(len(line.split()) >= 4 for line in listed.values())
