"""What the explorer's pages show, as plain functions (no Streamlit here, so tests call them directly).

Every number comes from the project's own code: the loss core (``policy_loss`` through the
shared-prefix probe of ``dfpo.trainer.loss.cancellation``), the toy lab, the claims ledger, and
the files of trainer run folders. Bad input raises ``ValueError`` with a sentence a page can show.
"""

from __future__ import annotations

import json
import math
import tomllib
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from dfpo.trainer.loss.cancellation import ATLAS_COLUMNS, CANCEL_TOL, AtlasCell, atlas, atlas_rows  # noqa: F401  the atlas lives with the core

PREFIX_LEN = 3
"""Shared positions of the hand-made group ('The answer is' in the paper's 10+10 example)."""
DEFAULT_REWARDS = (0.0, 1.0, 1.0, 0.0)
"""The paper's App. A group: 'The answer is 25 .', 'The answer is 20 .' twice, '... 25 .' again."""
DEFAULT_LENGTHS = (5, 5, 5, 5)


def parse_numbers(text: str, name: str, cast=float) -> list:
    """'1, 0, 1' -> [1.0, 0.0, 1.0]; ValueError naming the field and the bad entry."""
    out = []
    for item in filter(None, (x.strip() for x in text.replace(";", ",").split(","))):
        try:
            value = cast(item)
        except ValueError:
            raise ValueError(f"{name}: {item!r} is not a number") from None
        if isinstance(value, float) and not math.isfinite(value):
            raise ValueError(f"{name}: {item!r} is not a finite number")
        out.append(value)
    return out


def cancellation_case(
    objective: str, rewards: list[float], lengths: list[int], *, shared_log_ratio: float, scale: float, seed: int, **overrides
):
    """The shared-token breakdown of one hand-made group, or ValueError saying why nothing can move."""
    from dfpo.trainer.loss.cancellation import group_breakdown, make_shared_prefix_group

    if len(rewards) < 2:
        raise ValueError(f"a group needs G >= 2 completions, got G={len(rewards)}: with one completion every advantage is 0")
    if len(lengths) != len(rewards):
        raise ValueError(f"give one length per completion: {len(rewards)} rewards but {len(lengths)} lengths")
    if min(lengths) <= PREFIX_LEN:
        raise ValueError(f"every length must exceed the {PREFIX_LEN} shared tokens, got lengths={lengths}")
    if len(set(rewards)) == 1:
        raise ValueError("all rewards are equal: every advantage is 0, so no objective moves anything (the group carries no signal)")
    group = make_shared_prefix_group(
        torch.tensor(rewards, dtype=torch.float64),
        lengths,
        prefix_len=PREFIX_LEN,
        shared_log_ratio=shared_log_ratio,
        log_ratio_scale=scale,
        seed=seed,
    )
    return group_breakdown(objective, group, **overrides)


def breakdown_table(b) -> list[dict]:
    """One row per completion of a GroupBreakdown, for a table or a chart."""
    return [
        {
            "completion": i + 1,
            "advantage A_i": float(b.advantages[i]),
            "length": int(b.lengths[i]),
            "sequence ratio s_i": float(b.seq_ratio[i]),
            "post-clip sbar_i": float(b.post_clip[i]),
            "weight after transform": float(b.weight[i]),
            "clipped": bool(b.clipped[i]),
            "coefficient on the shared token": float(b.coefficient[i]),
        }
        for i in range(len(b.advantages))
    ]


# ----------------------------------------------------------------------------- run folders


def read_jsonl(path: Path) -> tuple[list[dict], int]:
    """The JSON objects of a .jsonl file and how many lines were skipped (torn, corrupt, not an object)."""
    rows, skipped = [], 0
    if not path.is_file():
        return rows, 0
    for line in path.read_text(encoding="utf-8", errors="replace").splitlines():
        if not line.strip():
            continue
        try:
            obj = json.loads(line)
        except json.JSONDecodeError:
            skipped += 1
            continue
        if isinstance(obj, dict):
            rows.append(obj)
        else:
            skipped += 1
    return rows, skipped


def is_run(folder: Path) -> bool:
    return (folder / "metrics.jsonl").is_file() and (folder / "config.toml").is_file()


def discover_runs(roots: list[Path], max_depth: int = 3) -> list[Path]:
    """Trainer run folders (config.toml + metrics.jsonl) under ``roots``, sorted."""
    found = set()
    for root in roots:
        root = Path(root)
        if not root.is_dir():
            continue
        if is_run(root):
            found.add(root)
        for depth in range(1, max_depth + 1):
            for cfg in root.glob("/".join(["*"] * depth) + "/config.toml"):
                if is_run(cfg.parent):
                    found.add(cfg.parent)
    return sorted(found)


def flatten(d: dict, prefix: str = "") -> dict[str, object]:
    out = {}
    for k, v in d.items():
        key = f"{prefix}{k}"
        if isinstance(v, dict):
            out.update(flatten(v, key + "."))
        else:
            out[key] = v
    return out


@dataclass(frozen=True)
class Run:
    path: Path
    name: str
    metrics: list[dict]
    evals: list[dict]
    samples: list[dict]
    config: dict[str, object]
    skipped: int


def load_run(folder: Path, root: Path | None = None) -> Run:
    """A run folder's logs and resolved config; ValueError if it is not a run or its config does not parse."""
    folder = Path(folder)
    if not is_run(folder):
        raise ValueError(f"{folder} is not a dfpo run folder (it needs config.toml and metrics.jsonl)")
    try:
        config = flatten(tomllib.loads((folder / "config.toml").read_text(encoding="utf-8")))
    except (tomllib.TOMLDecodeError, UnicodeDecodeError) as err:
        raise ValueError(f"{folder / 'config.toml'} does not parse: {err}") from None
    metrics, s1 = read_jsonl(folder / "metrics.jsonl")
    evals, s2 = read_jsonl(folder / "eval.jsonl")
    samples, s3 = read_jsonl(folder / "samples.jsonl")
    name = str(folder.relative_to(root)) if root and folder.is_relative_to(root) else folder.name
    return Run(folder, name, metrics, evals, samples, config, s1 + s2 + s3)


def metric_keys(runs: list[Run]) -> list[str]:
    """Numeric metric keys logged by any of the runs (step excluded), sorted."""
    keys = {k for r in runs for row in r.metrics for k, v in row.items() if isinstance(v, (int, float)) and not isinstance(v, bool)}
    return sorted(keys - {"step"})


def curve(rows: list[dict], key: str) -> tuple[list[int], list[float]]:
    pts = [(r["step"], r[key]) for r in rows if isinstance(r.get(key), (int, float)) and isinstance(r.get("step"), (int, float))]
    return [int(s) for s, _ in pts], [float(v) for _, v in pts]


def config_diff(runs: list[Run]) -> list[dict]:
    """Every config key of the runs, keys whose values differ first; ``differs`` marks them."""
    keys = sorted({k for r in runs for k in r.config})
    rows = []
    for k in keys:
        values = [r.config.get(k, "(missing)") for r in runs]
        rows.append(
            {
                "key": k,
                "differs": len({json.dumps(v, sort_keys=True, default=str) for v in values}) > 1,
                **{r.name: str(v) for r, v in zip(runs, values)},
            }
        )
    return sorted(rows, key=lambda row: (not row["differs"], row["key"]))


# ----------------------------------------------------------------------------- toy lab and ledger


def run_toy(
    task: str,
    labels: tuple[str, ...],
    *,
    group_size: int,
    inner_steps: int,
    steps: int,
    seeds: int,
    mode: str,
    optimizer: str,
    lr: float,
    progress=None,
):
    """Train the toy for each label; returns ({label: {metric: (steps, S) array}}, summary markdown)."""
    from dfpo.toy.report import prediction_checks, summarise, summary_table, to_numpy
    from dfpo.toy.train import ToyConfig, run, validate

    config = ToyConfig(
        task=task,
        objectives=tuple(labels),
        mode=mode,
        seeds=seeds,
        steps=steps,
        group_size=group_size,
        inner_steps=inner_steps,
        optimizer=optimizer,
        lr=lr,
    )
    validate(config)
    torch.set_num_threads(1)
    _, results = run(config, progress=progress)
    res = to_numpy(results)
    summary = summarise(res, config.kappa)
    text = "\n".join([summary_table(summary), "", *prediction_checks(summary, config)])
    return res, text


def band(values: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Mean and mean +- 1.96 standard errors over seeds of a (steps, S) array."""
    mean = values.mean(1)
    half = 1.96 * values.std(1, ddof=1) / np.sqrt(values.shape[1]) if values.shape[1] > 1 else np.zeros_like(mean)
    return mean, mean - half, mean + half


def ledger_records() -> list[dict[str, str]]:
    """Every claim of the ledger as a dict (id, source, statement, conditions, method, verdict, evidence, notes)."""
    from dfpo.theory.ledger import run_ledger

    return [c.to_dict() for c in run_ledger()]
