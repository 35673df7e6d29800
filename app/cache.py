"""Results that do not change between runs of the explorer, kept on disk (no Streamlit here).

The claims ledger and the toy lab's default comparison take seconds to compute and depend only on
the code: they are stored as JSON under ``$DFPO_APP_CACHE`` (default ``$XDG_CACHE_HOME/dfpo/app``,
else ``~/.cache/dfpo/app``), in a file named after a hash of every source file of the ``dfpo``
packages and the versions of torch, numpy and sympy. Any change to the code gives a new name, so a
stale result is never read; files are written atomically and only ever replaced, never deleted.
"""

from __future__ import annotations

import functools
import hashlib
import importlib
import json
import os
from pathlib import Path

from ..core.files import write_text_atomic

CACHE_ENV = "DFPO_APP_CACHE"
PACKAGES = ("dfpo", "dfpo.theory", "dfpo.toy", "dfpo.trainer", "dfpo.app")
"""Packages whose source the cached results depend on (the app's own code formats them)."""


def cache_dir() -> Path:
    """Where cached results live: $DFPO_APP_CACHE, else $XDG_CACHE_HOME/dfpo/app, else ~/.cache/dfpo/app."""
    if os.environ.get(CACHE_ENV):
        return Path(os.environ[CACHE_ENV]).expanduser()
    base = os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache"
    return Path(base) / "dfpo" / "app"


@functools.cache
def code_version() -> str:
    """16 hex digits of a hash over every .py file of PACKAGES (path and content) and the numeric libraries' versions."""
    # deferred: read only for their versions; importing dfpo.app.cache stays free of torch and sympy
    import numpy
    import sympy
    import torch

    h = hashlib.sha256(f"torch {torch.__version__} numpy {numpy.__version__} sympy {sympy.__version__}".encode())
    for name in PACKAGES:
        for folder in importlib.import_module(name).__path__:
            for path in sorted(Path(folder).rglob("*.py")):
                h.update(f"{name}/{path.relative_to(folder).as_posix()}".encode())
                h.update(path.read_bytes())
    return h.hexdigest()[:16]


def cache_path(name: str, key: str = "") -> Path:
    """The file of result ``name`` for this code version (and ``key``, a short description of its inputs)."""
    digest = hashlib.sha256(f"{code_version()} {key}".encode()).hexdigest()[:16]
    return cache_dir() / f"{name}-{digest}.json"


def load(name: str, key: str = ""):
    """The stored result, or None when there is none for this code version (or it does not parse)."""
    path = cache_path(name, key)
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None


def store(name: str, value, key: str = "") -> Path | None:
    """Write ``value`` (JSON-serialisable) atomically; None, and nothing written, when the folder cannot be written."""
    path = cache_path(name, key)
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        write_text_atomic(path, json.dumps(value))
    except OSError:
        return None
    return path
