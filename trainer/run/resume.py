"""What a resume may change and what it may not: the config a checkpoint was made with, compared key by key.

A resume continues a run exactly; ``RESUME_SETTABLE`` are the keys ``--set`` may change with ``--resume`` without
breaking that, and ``check_same_config`` names every other key that differs, with both values.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from ..config import Config, config_to_dict
from .layout import RunDir


def flat_items(table: dict, prefix: str = "") -> dict[str, Any]:
    """``{"optim": {"lr": 1e-4}}`` -> ``{"optim.lr": 1e-4}`` (nested tables as dotted keys)."""
    out: dict[str, Any] = {}
    for key, value in table.items():
        if isinstance(value, dict) and value:
            out.update(flat_items(value, f"{prefix}{key}."))
        else:
            out[f"{prefix}{key}"] = value
    return out


def config_differences(a: dict, b: dict, *, ignore: tuple[str, ...] = ()) -> list[str]:
    """Dotted keys whose values differ between two config dicts (``config_to_dict``), except ``ignore`` and the
    keys under them."""
    fa, fb = flat_items(a), flat_items(b)
    skipped = lambda key: any(key == p or key.startswith(p + ".") for p in ignore)  # noqa: E731
    return sorted(k for k in set(fa) | set(fb) if not skipped(k) and fa.get(k, _MISSING) != fb.get(k, _MISSING))


_MISSING = object()

RESUME_SETTABLE = ("train.steps", "train.save_every", "log.progress", "log.samples_every", "eval.every", "train.parallel")
"""Keys that --set may change when resuming without breaking exact continuation."""
RESUME_IGNORED = (*RESUME_SETTABLE, "run_dir")
"""Config keys a resume may change: those --set may change with --resume, and where the folder now is."""


def check_same_config(run_dir: str | Path, saved: dict | None, cfg: Config) -> None:
    """ValueError naming each key (and both values) in which ``cfg`` differs from the config the checkpoint was made
    with (``saved``), the resume-settable keys aside; nothing to check for a checkpoint of an older dfpo (None)."""
    if saved is None:
        return
    current = config_to_dict(cfg)
    diff = config_differences(saved, current, ignore=RESUME_IGNORED)
    if diff:
        raise ValueError(config_mismatch_message(run_dir, diff, saved, current))


def config_mismatch_message(run_dir: str | Path, keys: list[str], saved: dict, current: dict) -> str:
    a, b = flat_items(saved), flat_items(current)
    shown = ", ".join(f"{k} ({a.get(k)!r} in the checkpoint, {b.get(k)!r} in config.toml)" for k in keys[:5])
    more = f" and {len(keys) - 5} more" if len(keys) > 5 else ""
    return (
        f"--resume {run_dir}: {RunDir(run_dir).config} differs from the config checkpoint.pt was made with: {shown}{more}. "
        "A resume continues that run exactly: put config.toml back as it was (dfpo train --resume RUN --restore-config "
        "writes it from the checkpoint), or start a new run with --config"
    )
