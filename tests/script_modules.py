"""Load a file of scripts/ or benchmarks/ (neither is a package) as a module, for the tests of those scripts."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType

ROOT = Path(__file__).resolve().parents[1]


def load_script(path: Path | str, name: str | None = None) -> ModuleType:
    """The module of ``path`` (absolute, or relative to the repository root), registered in ``sys.modules`` under
    ``name`` (the file's stem by default), where a dataclass defined in it looks its module up."""
    path = ROOT / path
    name = name or path.stem
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module
