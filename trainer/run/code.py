"""The code a run was trained by: a fingerprint of dfpo's training source, kept in each run folder's mark.

An experiment spread over days (``dfpo compare`` skips finished cells) must not mix cells trained by different code:
a change to the sampler or the loss between two cells changes what they measure. ``dfpo train`` records
``code_record()`` in ``.dfpo-run.json``; ``dfpo compare`` reads the records of every run under its --out before it
trains anything (``run.folder.foreign_code``). This module reads no run folder itself: ``run.folder`` imports it.
"""

from __future__ import annotations

import functools
import hashlib
from pathlib import Path

TRAINING_PACKAGES = ("dfpo.core", "dfpo.trainer")
"""The packages whose source decides a run's numbers (the loss core and the trainer)."""


@functools.cache
def source_sha256() -> str:
    """SHA-256 over the relative path and bytes of every .py file of ``TRAINING_PACKAGES``, in sorted order."""
    import importlib

    digest = hashlib.sha256()
    for name in TRAINING_PACKAGES:
        root = Path(importlib.import_module(name).__file__).parent
        for path in sorted(root.rglob("*.py")):
            digest.update(f"{name}/{path.relative_to(root).as_posix()}\0".encode())
            digest.update(path.read_bytes())
            digest.update(b"\0")
    return digest.hexdigest()


def code_record() -> dict:
    """What ``dfpo train`` records of the code that trains a run: dfpo's version and ``source_sha256``."""
    from importlib.metadata import PackageNotFoundError, version

    try:
        dfpo_version = version("dfpo")
    except PackageNotFoundError:
        dfpo_version = "unknown"
    return {"dfpo": dfpo_version, "source_sha256": source_sha256()}


def recorded_sources(mark: dict) -> list[str]:
    """The source fingerprints a run's mark records (every code that trained part of it); [] for a run made before
    dfpo recorded them."""
    codes = mark.get("code") if isinstance(mark, dict) else None
    if not isinstance(codes, list):
        return []
    return [c["source_sha256"] for c in codes if isinstance(c, dict) and isinstance(c.get("source_sha256"), str)]
