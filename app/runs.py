"""Run folders for the *Training runs* page: where they are, what they hold, their logs read incrementally.

Two kinds of run folder are recognised:

- a trainer run (``dfpo train``): config.toml and metrics.jsonl (eval.jsonl, samples.jsonl too),
  one metrics line per step;
- a toy run (``dfpo toy run`` / ``dfpo toy ablate``, written by ``dfpo.toy.report``): config.json and
  metrics.jsonl, one line per objective, seed and step. Each objective is shown as a run of its
  own, whose value at a step is the mean over the seeds.

A log is read incrementally: each refresh reads only the bytes appended since the last one (a log
replaced or truncated by a resumed run is read again from its start), so a 200 MB log is parsed
once, not on every rerun of the page. A line is skipped, and counted, when it is not a JSON
object or its ``step`` is not a finite number; a non-finite metric value is left out of its curve
and counted. No Streamlit here.
"""

from __future__ import annotations

import json
import math
import os
import threading
import tomllib
from array import array
from collections import Counter
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from ..core.settings import finite_number
from ..toy import layout as toy_layout
from ..toy.metric_names import RENAMED as TOY_RENAMED
from ..trainer.run.layout import RunDir

TRAINER, TOY = "trainer", "toy"
CHUNK = 8 << 20
"""Bytes read at a time from a log."""
NOT_METRICS = frozenset({"step", "seed"})


def resolve_folder(text: str, cwd: Path | None = None) -> Path:
    """'~/runs' or 'runs' as an absolute path: the user's home expanded, a relative path taken from ``cwd``."""
    path = Path(text.strip()).expanduser()
    return (Path(cwd or os.getcwd()) / path).resolve() if not path.is_absolute() else path.resolve()


def run_kind(folder: Path) -> str | None:
    """TRAINER, TOY, or None when ``folder`` is not a run folder."""
    if (folder / RunDir.METRICS).is_file() and RunDir(folder).config.is_file():
        return TRAINER
    if (folder / toy_layout.METRICS).is_file() and (folder / toy_layout.CONFIG).is_file():
        return TOY
    return None


def discover_runs(root: Path, max_depth: int = 3) -> list[Path]:
    """Run folders (either kind) at ``root`` or up to ``max_depth`` levels below it, sorted."""
    root = Path(root)
    if not root.is_dir():
        return []
    found = {root} if run_kind(root) else set()
    for depth in range(1, max_depth + 1):
        for log in root.glob("/".join(["*"] * depth) + "/metrics.jsonl"):
            if run_kind(log.parent):
                found.add(log.parent)
    return sorted(found)


class JsonlReader:
    """A .jsonl file read incrementally: ``refresh`` parses the complete lines appended since the
    last call and hands the accepted rows to ``_add_rows``; the unterminated last line (a line being
    written, or torn) is parsed afresh on each refresh into ``tail``, never committed."""

    def __init__(self, path: Path):
        self.path = Path(path)
        self._reset()

    def _reset(self) -> None:
        self._stamp: tuple[int, int, int] | None = None  # (inode, size, mtime_ns) at the last read
        self._offset = 0  # bytes committed (up to the last newline read)
        self.lines_read = 0
        self.skipped = 0
        self.tail: dict | None = None
        self.tail_skipped = 0
        self._clear()

    def _clear(self) -> None:
        """Forget every row (subclasses keep what they accumulated)."""

    def _add_rows(self, rows: list[dict]) -> None:
        raise NotImplementedError

    def refresh(self) -> bool:
        """Read what was appended; True when anything changed since the last call."""
        try:
            st = os.stat(self.path)
        except FileNotFoundError:
            changed = self._stamp is not None
            self._reset()
            return changed
        stamp = (st.st_ino, st.st_size, st.st_mtime_ns)
        if stamp == self._stamp:
            return False
        if self._stamp is not None and (st.st_ino != self._stamp[0] or st.st_size < self._offset):
            self._reset()  # replaced or truncated (a resumed run rewrites its logs): read it again
        with open(self.path, "rb") as f:
            f.seek(self._offset)
            pending = b""
            while chunk := f.read(CHUNK):
                data = pending + chunk
                end = data.rfind(b"\n") + 1
                self._add_rows(self._rows(data[:end]))
                self._offset += end
                pending = data[end:]
        self.tail, self.tail_skipped = None, 0
        if pending.strip():
            row = self._parse(pending)
            self.tail, self.tail_skipped = (row, 0) if row is not None else (None, 1)
        self._stamp = stamp
        return True

    @staticmethod
    def _parse(line: bytes) -> dict | None:
        try:
            row = json.loads(line)
        except (ValueError, UnicodeDecodeError):
            return None
        return row if isinstance(row, dict) and finite_number(row.get("step")) else None

    def _rows(self, data: bytes) -> list[dict]:
        """The accepted rows of complete lines; the others counted in ``skipped``."""
        rows = []
        for line in data.splitlines():
            if not line.strip():
                continue
            self.lines_read += 1
            row = self._parse(line)
            if row is None:
                self.skipped += 1
            else:
                rows.append(row)
        return rows

    @property
    def bad_lines(self) -> int:
        """Lines skipped: not JSON, not an object, or a step that is not a finite number (torn tail included)."""
        return self.skipped + self.tail_skipped


class MetricLog(JsonlReader):
    """Numeric values by (series, metric) as (step, value) arrays; ``series_key`` names the field that
    splits the log into series (``objective`` in a toy run), else one series ''; ``renamed`` maps keys an
    older writer used to today's names."""

    def __init__(self, path: Path, series_key: str | None = None, renamed: dict[str, str] | None = None):
        self.series_key = series_key
        self.renamed = dict(renamed or {})
        super().__init__(path)

    def _clear(self) -> None:
        self.points: dict[tuple[str, str], tuple[array, array]] = {}
        self.nonfinite = 0

    def _add_rows(self, rows: list[dict]) -> None:
        self.nonfinite += self._fold(rows, self.points)

    def _fold(self, rows: list[dict], points: dict) -> int:
        """Append the rows' numeric values to ``points`` column by column; the number of non-finite values left out."""
        groups: dict[str, list[dict]] = {}
        for row in rows:
            groups.setdefault(str(row.get(self.series_key, "")) if self.series_key else "", []).append(row)
        dropped = 0
        for series, group in groups.items():
            steps = np.array([row["step"] for row in group], dtype=float)  # (N,) finite, checked by _parse
            for key in set().union(*group) - NOT_METRICS - {self.series_key}:
                values, present = _numbers([row.get(key) for row in group])  # (N,), (N,)
                finite = np.isfinite(values)
                dropped += int((present & ~finite).sum())
                keep = present & finite
                if keep.any():
                    s, v = points.setdefault((series, self.renamed.get(key, key)), (array("d"), array("d")))
                    s.frombytes(steps[keep].tobytes())
                    v.frombytes(values[keep].tobytes())
        return dropped

    def series(self) -> list[str]:
        return sorted({s for s, _ in self.points})

    def keys(self, series: str = "") -> set[str]:
        tail = set(self._tail_points()) if self.tail else set()
        return {k for s, k in self.points if s == series} | {k for s, k in tail if s == series}

    def _tail_points(self) -> dict:
        points: dict = {}
        if self.tail is not None:
            self._fold([self.tail], points)
        return points

    def curve(self, key: str, series: str = "") -> tuple[np.ndarray, np.ndarray]:
        """(steps, values) of one metric, sorted by step; values logged at the same step (a toy run's seeds) averaged."""
        steps, values = self.points.get((series, key), (array("d"), array("d")))
        extra = self._tail_points().get((series, key), (array("d"), array("d")))
        s = np.array(steps + extra[0], dtype=float)  # a copy: the arrays keep growing
        v = np.array(values + extra[1], dtype=float)
        if not len(s):
            return s, v
        unique, inverse = np.unique(s, return_inverse=True)
        return unique, np.bincount(inverse, weights=v) / np.bincount(inverse)


class LatestRows(JsonlReader):
    """The rows logged at the highest step seen (sample completions): earlier rows are dropped as later ones arrive."""

    def _clear(self) -> None:
        self.step: float | None = None
        self.rows: list[dict] = []

    def _add_rows(self, rows: list[dict]) -> None:
        for row in rows:
            step = float(row["step"])
            if self.step is None or step > self.step:
                self.step, self.rows = step, []
            if step == self.step:
                self.rows.append(row)


def _numbers(column: list) -> tuple[np.ndarray, np.ndarray]:
    """A column of JSON values as floats and a mask of the real numbers among them (bool, str, None and
    the rest are not numbers; an int too large for a float counts as infinite)."""
    kinds = set(map(type, column))
    if kinds <= {float, int, type(None)}:
        try:
            values = np.array(column, dtype=float)  # None -> nan, masked out below
            present = np.array([v is not None for v in column]) if type(None) in kinds else np.ones(len(column), bool)
            return values, present
        except OverflowError:
            pass
    present = np.array([type(v) in (int, float) for v in column], dtype=bool)
    values = np.array([_as_float(v) if p else 0.0 for v, p in zip(column, present)], dtype=float)
    return values, present


def _as_float(value: float | int) -> float:
    try:
        return float(value)
    except OverflowError:
        return math.inf


def flatten(d: dict, prefix: str = "") -> dict[str, object]:
    out = {}
    for k, v in d.items():
        key = f"{prefix}{k}"
        if isinstance(v, dict):
            out.update(flatten(v, key + "."))
        else:
            out[key] = v
    return out


def read_config(folder: Path, kind: str) -> dict[str, object]:
    """The flattened config of a run folder; ValueError naming the file when it does not parse."""
    path = RunDir(folder).config if kind == TRAINER else folder / toy_layout.CONFIG
    try:
        text = path.read_text(encoding="utf-8")
        raw = tomllib.loads(text) if kind == TRAINER else json.loads(text)
    except (tomllib.TOMLDecodeError, ValueError, UnicodeDecodeError) as err:
        raise ValueError(f"{path} does not parse: {err}") from None
    if not isinstance(raw, dict):
        raise ValueError(f"{path} does not hold a table of settings")
    return flatten(raw)


class RunFolder:
    """One run folder and its logs, refreshed on demand (safe to share between browser sessions)."""

    def __init__(self, path: Path):
        self.path = Path(path)
        self.kind = run_kind(self.path)
        if self.kind is None:
            raise ValueError(f"{self.path} is not a run folder (config.toml or config.json, and metrics.jsonl)")
        if self.kind == TOY:  # an older toy run logged some of the trainer's metrics under the toy's own names
            self.metrics = MetricLog(self.path / toy_layout.METRICS, "objective", TOY_RENAMED)
        else:
            self.metrics = MetricLog(RunDir(self.path).metrics)
        self.evals = MetricLog(RunDir(self.path).evals)
        self.samples = LatestRows(RunDir(self.path).samples)
        self._lock = threading.Lock()
        self._config_stamp: tuple | None = None
        self._config: dict[str, object] = {}

    def config(self) -> dict[str, object]:
        """The flattened config, read again only when its file changed."""
        path = RunDir(self.path).config if self.kind == TRAINER else self.path / toy_layout.CONFIG
        st = os.stat(path)
        stamp = (st.st_ino, st.st_size, st.st_mtime_ns)
        with self._lock:
            if stamp != self._config_stamp:
                self._config, self._config_stamp = read_config(self.path, self.kind), stamp
            return self._config

    def series(self) -> list[str]:
        """'' for a trainer run; a toy run's objective labels, in the order of its config."""
        if self.kind == TRAINER:
            return [""]
        labels = self.config().get("objectives")
        return [str(x) for x in labels] if isinstance(labels, list) and labels else self.metrics.series()

    def refresh(self) -> None:
        with self._lock:
            for log in (self.metrics, self.evals, self.samples):
                log.refresh()

    @property
    def bad_lines(self) -> int:
        return self.metrics.bad_lines + self.evals.bad_lines + self.samples.bad_lines


@dataclass(frozen=True)
class Run:
    """What the page draws: a trainer run folder, or one objective of a toy run folder."""

    id: str
    name: str
    folder: RunFolder
    series: str = ""

    def config(self) -> dict[str, object]:
        config = dict(self.folder.config())
        if self.folder.kind == TOY:
            config = {"objective": self.series, **config}
        return config

    def curve(self, key: str) -> tuple[np.ndarray, np.ndarray]:
        return self.folder.metrics.curve(key, self.series)

    def keys(self) -> set[str]:
        return self.folder.metrics.keys(self.series)


def runs_under(roots: list[Path], registry: dict[Path, RunFolder]) -> tuple[list[Run], dict[Path, int]]:
    """Every run under ``roots`` (folders taken from, or added to, ``registry``), named relative to
    their root, and how many run folders each root holds."""
    found: dict[Path, Path] = {}
    counts = {}
    for root in roots:
        folders = discover_runs(root)
        counts[root] = len(folders)
        for folder in folders:
            found.setdefault(folder, root)
    names = {f: str(f.relative_to(r)) if f != r else f.name for f, r in found.items()}
    clash = {n for n, k in Counter(names.values()).items() if k > 1}
    runs = []
    for folder, name in names.items():
        if name in clash:
            name = str(folder)
        rf = registry.get(folder)
        if rf is None:
            try:
                rf = registry[folder] = RunFolder(folder)
            except ValueError:
                continue
        try:
            series = rf.series()
        except (OSError, ValueError):
            series = [""] if rf.kind == TRAINER else []
        for s in series:
            runs.append(Run(f"{folder}#{s}" if s else str(folder), f"{name}: {s}" if s else name, rf, s))
    return sorted(runs, key=lambda r: r.name), counts


def metric_keys(runs: list[Run]) -> list[str]:
    """Numeric metric keys logged by any of the runs (step and seed excluded), sorted."""
    return sorted(set().union(*(r.keys() for r in runs))) if runs else []


def drift_notes(run_keys: dict[str, set[str]], chosen: list[str]) -> list[str]:
    """For the *Training runs* page: per run whose log has ``drift/<kind>_cross`` among the chosen metrics, what its
    cross holds: only this batch's part beside ``drift/<kind>_momentum``, or (no momentum key: logged before the
    split) the batch, the optimiser's state and weight decay together."""
    out = []
    for kind in ("shared", "equiv"):
        cross = f"drift/{kind}_cross"
        if cross not in chosen:
            continue
        old = [name for name, keys in run_keys.items() if cross in keys and f"drift/{kind}_momentum" not in keys]
        new = [name for name, keys in run_keys.items() if cross in keys and f"drift/{kind}_momentum" in keys]
        if new:
            out.append(
                f"{cross} is this batch's part only; the optimiser's state from earlier steps is drift/{kind}_momentum and "
                f"weight decay's drift/{kind}_decay ({', '.join(new)})."
            )
        if old:
            out.append(
                f"{', '.join(old)}: no drift/{kind}_momentum recorded by this run, so its {cross} holds the rest of the batch, "
                "the optimiser's state from earlier steps and weight decay together."
            )
    return out


def config_diff(runs: list[Run], configs: list[dict[str, object]]) -> list[dict]:
    """Every config key of the runs, keys whose values differ first; ``differs`` marks them."""
    keys = sorted({k for c in configs for k in c})
    rows = []
    for k in keys:
        values = [c.get(k, "(missing)") for c in configs]
        rows.append(
            {
                "key": k,
                "differs": len({json.dumps(v, sort_keys=True, default=str) for v in values}) > 1,
                **{r.name: str(v) for r, v in zip(runs, values)},
            }
        )
    return sorted(rows, key=lambda row: (not row["differs"], row["key"]))


def trailing_mean(values: np.ndarray, window: int) -> np.ndarray:
    """Mean of each value and the ``window - 1`` values logged before it (fewer at the start); window 1 = unchanged."""
    values = np.asarray(values, float)
    if window <= 1 or len(values) == 0:
        return values
    c = np.concatenate([[0.0], np.cumsum(values)])
    i = np.arange(1, len(values) + 1)
    lo = np.maximum(i - window, 0)
    return (c[i] - c[lo]) / (i - lo)


def decimate(steps: np.ndarray, values: np.ndarray, max_points: int = 4000) -> tuple[np.ndarray, np.ndarray]:
    """At most about ``max_points`` points to draw: the lowest and the highest value of each run of
    consecutive points, in step order, so spikes stay visible; unchanged when already short enough."""
    n = len(values)
    if n <= max_points:
        return steps, values
    k = -(-n // (max_points // 2))  # points per bucket
    starts = np.arange(0, n, k)
    lo = np.minimum.reduceat(values, starts)
    hi = np.maximum.reduceat(values, starts)
    bucket = np.repeat(np.arange(len(starts)), np.diff(np.append(starts, n)))
    first_lo = np.unique(bucket[values == lo[bucket]], return_index=True)[1]
    first_hi = np.unique(bucket[values == hi[bucket]], return_index=True)[1]
    idx_lo = np.flatnonzero(values == lo[bucket])[first_lo]
    idx_hi = np.flatnonzero(values == hi[bucket])[first_hi]
    keep = np.unique(np.concatenate([idx_lo, idx_hi]))
    return steps[keep], values[keep]
