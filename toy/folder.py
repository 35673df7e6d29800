"""A toy run folder's files: per-step metrics written and read back, and the config of an earlier run.

Layout (names in ``dfpo.toy.layout``)::

    config.json         the ToyConfig, the task's shape, the wall time and any step-size calibration
    metrics.jsonl       one line per objective, seed and step, every metric
    metrics_mean.csv    per objective and step, each metric's mean over seeds
"""

from __future__ import annotations

import csv
import dataclasses
import json
import math
from pathlib import Path

import numpy as np

from ..core.files import naming_write_errors, read_utf8
from . import layout
from .config import ToyConfig
from .metric_names import RENAMED


def write_metrics(results: dict[str, dict[str, np.ndarray]], out: Path) -> None:
    """metrics.jsonl (every objective, seed, step) and metrics_mean.csv (means over seeds)."""
    with naming_write_errors(out / layout.METRICS), open(out / layout.METRICS, "w") as f:
        for name, h in results.items():
            keys = sorted(h)
            steps, seeds = h[keys[0]].shape
            for s in range(seeds):
                for t in range(steps):
                    rec = {"objective": name, "seed": s, "step": t + 1}
                    rec.update({k: float(h[k][t, s]) for k in keys})
                    f.write(json.dumps(rec) + "\n")
    keys = sorted({k for h in results.values() for k in h})
    with naming_write_errors(out / layout.METRICS_MEAN), open(out / layout.METRICS_MEAN, "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(["objective", "step", *keys])
        for name, h in results.items():
            steps = next(iter(h.values())).shape[0]
            for t in range(steps):
                w.writerow([name, t + 1, *[f"{h[k][t].mean():.6g}" if k in h else "" for k in keys]])


def read_metrics(out: Path) -> dict[str, dict[str, np.ndarray]]:
    """The inverse of ``write_metrics``: {objective: {metric: (steps, S) array}} from OUT/metrics.jsonl (keys of
    RENAMED under their new names)."""
    cells: dict[str, dict[str, dict[tuple[int, int], float]]] = {}
    for line in read_utf8(Path(out) / layout.METRICS).splitlines():
        if line.strip():
            rec = json.loads(line)
            by_key = cells.setdefault(rec.pop("objective"), {})
            seed, step = rec.pop("seed"), rec.pop("step")
            for key, value in rec.items():
                by_key.setdefault(RENAMED.get(key, key), {})[(step - 1, seed)] = value
    results = {}
    for name, by_key in cells.items():
        results[name] = {}
        for key, vals in by_key.items():
            steps, seeds = max(t for t, _ in vals) + 1, max(s for _, s in vals) + 1
            arr = np.full((steps, seeds), math.nan)
            for (t, s), v in vals.items():
                arr[t, s] = v
            if np.isnan(arr).any():
                raise ValueError(f"{out}/metrics.jsonl is incomplete: {name} {key} misses {int(np.isnan(arr).sum())} (step, seed) values")
            results[name][key] = arr
    return results


def _plain(value):
    """Comparable form of a config value (mappings as sorted items, sequences as tuples)."""
    if isinstance(value, dict) or hasattr(value, "items"):
        return tuple(sorted((k, _plain(v)) for k, v in dict(value).items()))
    if isinstance(value, (list, tuple)):
        return tuple(_plain(v) for v in value)
    return value


def config_from_dict(raw: dict) -> ToyConfig:
    """The ToyConfig a config.json (or a stored evidence file) holds; keys it does not know are left out."""
    known = {f.name for f in dataclasses.fields(ToyConfig)}
    values = {k: v for k, v in raw.items() if k in known}
    values["objectives"] = tuple(values.get("objectives", ()))
    return ToyConfig(**values)


def read_config(path) -> tuple[ToyConfig, dict]:
    """(ToyConfig, the whole config.json) of a toy run folder; ValueError when it is not one."""
    path = Path(path)
    if not (path / layout.CONFIG).is_file() or not (path / layout.METRICS).is_file():
        raise ValueError(f"{str(path)!r}: no config.json and metrics.jsonl in it; is it a dfpo toy run folder?")
    raw = json.loads(read_utf8(path / layout.CONFIG))
    return config_from_dict(raw), raw
