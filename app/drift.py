"""What the drift page shows, as plain data: the toy's closed-form probe, and a ``dfpo probe`` folder's document.

The page (``page_drift.py``) only lays these out. A probe folder is read as JSON and checked for the keys the tables
need before anything is drawn; whatever it holds is shown in data frames (plain text, never markup).
"""

from __future__ import annotations

import json
from pathlib import Path

from ..core import stats
from ..core.drift_tables import FIGURES, KINDS, comparisons, cross_shares, values
from ..toy.param_drift import default_probe_config, probe_toy

TOY_TASKS = ("tenplusten", "family")
"""tenplusten: no row tied across prompts (no cross term across prompts); family: template rows tied across prompts."""
PARTS = ("direct", "cross", "measured")
DOC_KEYS = ("objectives", "controls", "seeds", "records")


def toy_rows(task: str, labels: tuple[str, ...], seeds: int) -> list[dict[str, object]]:
    """Per objective and kind, the mean over seeds of each figure of one SGD step from one point (``probe_toy``)."""
    return probe_toy(default_probe_config(task=task, objectives=labels, seeds=seeds)).rows()


def read_probe_folder(folder: Path) -> dict:
    """The probe.json of a ``dfpo probe`` output folder; ValueError (one sentence) when it is missing or not one."""
    path = folder / "probe.json"
    if not path.is_file():
        raise ValueError(f"no probe.json in {folder}: point this at the --out folder of a dfpo probe run")
    try:
        doc = json.loads(path.read_text())
    except (json.JSONDecodeError, UnicodeDecodeError) as err:
        raise ValueError(f"{path} is not JSON ({err.__class__.__name__}): re-run dfpo probe into a fresh folder") from None
    missing = [k for k in DOC_KEYS if not isinstance(doc, dict) or k not in doc]
    if missing:
        raise ValueError(f"{path} lacks {', '.join(missing)}: it was not written by dfpo probe")
    return doc


def doc_rows(doc: dict) -> list[dict[str, object]]:
    """Per objective and kind: seeds, and each figure's mean with its 95% interval over seeds (None where absent)."""
    out = []
    for label in doc["objectives"]:
        for kind in KINDS:
            row: dict[str, object] = {"objective": label, "events": kind, "seeds": len(values(doc, label, kind, "direct"))}
            for figure in FIGURES:
                vals = list(values(doc, label, kind, figure).values())
                iv = stats.paired_interval(vals) if vals else None
                row[figure] = None if iv is None else iv.mean
                row[f"{figure} low"] = None if iv is None or iv.n < 2 else iv.low
                row[f"{figure} high"] = None if iv is None or iv.n < 2 else iv.high
            out.append(row)
    return out


def comparison_rows(doc: dict) -> list[dict[str, object]]:
    """Each transform against its matched control (``drift_tables.comparisons``) as rows."""
    return [
        {
            "method": c.method,
            "control": c.control,
            "events": c.kind,
            "figure": c.figure,
            "control mean": c.control_mean,
            "difference": None if c.interval is None else c.interval.mean,
            "low": None if c.interval is None else c.interval.low,
            "high": None if c.interval is None else c.interval.high,
            "verdict": c.verdict,
        }
        for c in comparisons(doc)
    ]


def share_rows(doc: dict) -> list[dict[str, object]]:
    """The cross term's share per objective and kind (``drift_tables.cross_shares``) as rows."""
    return [
        {
            "objective": s.objective,
            "events": s.kind,
            "cross share": s.interval.mean,
            "low": s.interval.low,
            "high": s.interval.high,
            "side": s.side,
        }
        for s in cross_shares(doc)
    ]
