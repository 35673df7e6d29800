"""What the drift page shows, as plain data: the toy's closed-form probe, and a ``dfpo probe`` folder's document.

The page (``page_drift.py``) only lays these out. Every table comes with its notes: one generated sentence for each
empty or zero cell (a kind of event a seed did not have, an objective whose step moved nothing, a figure the
document does not record), and the table's ``note`` column names the notes that explain its row. A probe folder is
read as JSON and checked for the keys the tables need before anything is drawn; whatever it holds is shown in data
frames and as escaped text (never markup).

The first-order prediction is split four ways (``dfpo.core.probe``): direct (the event's own coefficients), cross
(the rest of THIS batch's gradient), momentum (the optimiser's state from earlier steps) and decay (weight decay).
A document written before that split has no momentum or decay: its cross holds all three, and the notes say so.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from pathlib import Path

import torch

from ..core import probe as core_probe
from ..core.drift_tables import (
    FIGURES,
    KINDS,
    SHARE_TESTS,
    SHARE_WORDS,
    comparisons,
    cross_shares,
    figure_interval,
    first_order_flags,
    lumped,
    values,
)
from ..toy.param_drift import ROW_FIGURES, default_probe_config, probe_start, probe_toy

TOY_TASKS = ("family", "tenplusten")
"""family (the page's default): template rows tied across prompts, so groups share tokens; tenplusten (paper App. A):
one prompt, no row tied across prompts."""
DEFAULT_OBJECTIVES = ("gspo_noclip", "dfpo_min:stopgrad=score", "grpo")
"""The page's default: objectives whose probed step moves both kinds of event on ``family`` (a test checks it). With
gspo or dfpo_min first (the page's earlier default), the K - 1 earlier steps are that objective's own, which carry every
sequence ratio past GSPO's clip range of 3e-4 / 4e-4 on its advantage's side, so gspo's and dfpo_min's probed step is
exactly 0 (the page says why, from the data); they are offered, not chosen."""
MORE_OBJECTIVES = ("gspo", "dfpo_min", "dapo")
PARTS = core_probe.PARTS
"""The first-order prediction's parts (direct, cross, momentum, decay), in table order."""
BARS = (*PARTS, "measured")
ZERO_PARTS = {
    "momentum": "no optimiser state from earlier steps reached the probed events (a first step, or SGD without momentum)",
    "decay": "no weight decay reached them (the probe's decay part is lr x weight_decay x the parameters, 0 when weight_decay is 0)",
}
"""Why a part of the first-order prediction is exactly 0 in every row of a document (``dfpo.core.probe``'s definitions)."""
DOC_KEYS = ("objectives", "controls", "seeds", "records")
KIND_EVENTS = {"shared": "shared event", "equivalent": "equivalent pair"}
WHAT_EVENT = {
    "shared": "a shared event is a position at which every completion of a group has the same context and token (eq 2)",
    "equivalent": "an equivalent pair is two correct completions of one group with different tokens (eq 5)",
}


@dataclass
class Table:
    """Rows for a data frame and the numbered sentences that explain its empty and zero cells."""

    rows: list[dict[str, object]] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    left_out: list[str] = field(default_factory=list)
    """Sentences about rows left out of ``rows`` (a kind of event no seed had)."""
    flags: list[str] = field(default_factory=list)
    """``drift_tables.first_order_flags``: the rows with a seed whose first-order error is past the limit."""

    def note(self, sentence: str) -> int:
        """The number (from 1) of ``sentence`` among the notes, adding it once."""
        if sentence not in self.notes:
            self.notes.append(sentence)
        return self.notes.index(sentence) + 1


def _blank(x: object) -> bool:
    return x is None or (isinstance(x, float) and math.isnan(x))


def _seed_list(seeds: list[int], of: int) -> str:
    return f"seed{'s' if len(seeds) > 1 else ''} {', '.join(map(str, seeds))} of {of}"


def _mark(row: dict[str, object], numbers: list[int]) -> None:
    row["note"] = ", ".join(str(n) for n in sorted(set(numbers)))


# ----------------------------------------------------------------------------- the toy


@dataclass(frozen=True)
class ProbedPoint:
    """What the toy probe's step starts from, rebuilt as ``probe_toy`` builds it (the same generators): the batch's
    rollouts and, per objective, its loss coefficients there and the loss core's clip metrics."""

    task: object
    config: object
    tokens: torch.Tensor  # (S, B, T)
    mask: torch.Tensor  # (S, B, T) bool
    group: torch.Tensor  # (S, B)
    form: torch.Tensor  # (S, B) answer form, -1 wrong
    n_groups: int
    coef: dict[str, torch.Tensor]  # label -> (S, B, T)
    clip: dict[str, tuple[float, float]]  # label -> (clip/frac_low, clip/frac_high) pooled over seeds
    bounds: dict[str, tuple[float, float]]  # label -> (eps_low, eps_high)


def probed_point(task: str, labels: tuple[str, ...], seeds: int) -> ProbedPoint:
    """The batch and each objective's coefficients at the point ``probe_toy`` steps from: the initial policy, then
    K - 1 SGD steps of the first objective on the batch (``dfpo.toy.param_drift``'s docstring)."""
    config = default_probe_config(task=task, objectives=labels, seeds=seeds)
    start = probe_start(config)
    toy, specs, roll, logpi = start.task, start.specs, start.roll, start.logpi
    coef, clip, bounds = {}, {}, {}
    for name in labels:
        c, m = start.coefficients(name, logpi)
        coef[name] = c.detach()
        clip[name] = (float(m.get("clip/frac_low", 0.0)), float(m.get("clip/frac_high", 0.0)))
        bounds[name] = (float(specs[name].eps_low), float(specs[name].eps_high))
    n_groups = start.batch_of[labels[0]].n_groups
    return ProbedPoint(toy, config, roll.tokens, roll.mask, roll.group, roll.form, n_groups, coef, clip, bounds)


def _first_tokens(point: ProbedPoint, s: int, g: int) -> str:
    """The first tokens of group g of seed s, with their counts: "'The' 5 times, '10' 3 times"."""
    members = (point.group[s] == g).nonzero().flatten().tolist()
    firsts = [point.task.vocab[int(point.tokens[s, b, 0])] for b in members]
    return ", ".join(f"{w!r} {firsts.count(w)} times" for w in sorted(set(firsts), key=firsts.index))


def _no_shared_event(point: ProbedPoint, missing: list[int]) -> str:
    """Why the seeds in ``missing`` have no shared event, from their rollouts."""
    S, G = point.config.seeds, point.config.group_size
    groups = {s: torch.unique(point.group[s]).tolist() for s in missing}
    split_first = all(len(set(point.tokens[s, point.group[s] == g, 0].tolist())) > 1 for s in missing for g in groups[s])
    where = f"any of the {S} seeds" if len(missing) == S else _seed_list(missing, S)
    why = f"no position has all {G} completions of a group on one context and token"
    if split_first:
        s = missing[0]
        why = (
            f"every group's {G} completions already differ at their first token (seed {s}: {_first_tokens(point, s, groups[s][0])}; "
            f"task {point.config.task} has {point.n_groups} group(s) a seed), and at no later position do they all come back to one context and token"
        )
    tail = (
        "so the shared rows are left out of the table and chart"
        if len(missing) == S
        else "the shared rows' figures are means over the other seeds"
    )
    return f"No shared event in {where}: {WHAT_EVENT['shared']}; here {why}; {tail}."


def _no_pair(point: ProbedPoint, missing: list[int]) -> str:
    """Why each seed in ``missing`` has no equivalent pair, from its rollouts: its correct completions' token sequences."""
    S = point.config.seeds
    whys = []
    for s in missing:
        correct = [b for b in range(point.tokens.shape[1]) if int(point.form[s, b]) >= 0]
        texts = sorted({point.task.decode(point.tokens[s, b][point.mask[s, b]].tolist()) for b in correct})
        if not correct:
            whys.append(f"seed {s} drew no correct completion")
        elif len(texts) == 1:
            whys.append(f"seed {s}'s {len(correct)} correct completion(s) all read {texts[0]!r}")
        else:
            whys.append(f"seed {s}'s correct completions with different tokens fall in different groups")
    tail = "the equivalent rows' figures are means over the other seeds" if len(missing) < S else "so the equivalent rows are left out"
    return f"No equivalent pair in {_seed_list(missing, S)}: {WHAT_EVENT['equivalent']}, and {'; '.join(whys)}; {tail}."


def _all_zero(point: ProbedPoint, label: str) -> str:
    """Why every figure of ``label``'s rows is exactly 0, from its coefficients and clip fractions at the probed point."""
    coef = point.coef[label]  # (S, B, T)
    moving = int((coef.abs().sum(-1) > 0).sum())
    total = int(coef.shape[0] * coef.shape[1])
    low, high = point.clip[label]
    eps_low, eps_high = point.bounds[label]
    first, K = point.config.objectives[0], point.config.inner_steps
    head = (
        f"{label}: every figure is exactly 0 because {total - moving} of the {total} completions ({point.config.seeds} seeds) have a "
        f"zero loss coefficient at every token at the probed point, so its step does not move the policy"
    )
    if moving == 0 and low + high >= 1 - 1e-9:
        return (
            f"{head}. The clip is the cause, not cancellation (which zeroes only a group's sum at a shared position, eq 2): after "
            f"the K - 1 = {K - 1} earlier SGD steps of {first} (the first objective chosen) the loss core reports clip/frac_low "
            f"{100 * low:.1f}% and clip/frac_high {100 * high:.1f}%: every ratio is outside "
            f"[1 - {eps_low:g}, 1 + {eps_high:g}], where the clipped surrogate is flat (eq 44)."
        )
    return f"{head} (clip/frac_low {100 * low:.1f}%, clip/frac_high {100 * high:.1f}%)."


def toy_table(task: str, labels: tuple[str, ...], seeds: int) -> Table:
    """Per objective and kind: the seeds chosen, the seeds with events, and each ``toy.param_drift.ROW_FIGURES`` figure of
    ``core.probe.summary`` averaged over the seeds with events; with a note for each empty or zero cell."""
    result = probe_toy(default_probe_config(task=task, objectives=labels, seeds=seeds))
    point = probed_point(task, labels, seeds)
    why_none = {"shared": _no_shared_event, "equivalent": _no_pair}
    out, marks = Table(), []
    per_seed_records = [
        {"seed": s, "objective": label, "kind": kind, **core_probe.summary(e)}
        for label in labels
        for kind, events in (("shared", result.shared[label]), ("equivalent", result.pairs[label]))
        for s, e in enumerate(events)
        if len(e)
    ]
    out.flags = first_order_flags({"objectives": list(labels), "records": per_seed_records})
    for label in labels:
        for kind, per_seed in (("shared", result.shared[label]), ("equivalent", result.pairs[label])):
            missing = [s for s, e in enumerate(per_seed) if len(e) == 0]
            if len(missing) == seeds:
                if (sentence := why_none[kind](point, missing)) not in out.left_out:
                    out.left_out.append(sentence)
                continue
            sums = [core_probe.summary(e) for e in per_seed if len(e)]
            row: dict[str, object] = {"objective": label, "events": kind, "seeds": seeds, "seeds with events": len(sums)}
            for figure in ROW_FIGURES:
                vals = [s[figure] for s in sums if figure in s]
                row[figure] = sum(vals) / len(vals) if vals else None
            numbers = [out.note(why_none[kind](point, missing))] if missing else []
            if all(row[f] == 0.0 for f in ("coef", "direct", "cross", "measured")):
                numbers.append(out.note(_all_zero(point, label)))
            marks.append(numbers)
            out.rows.append(row)
    _toy_optimiser_state(out, point.config.optimizer)
    for row, numbers in zip(out.rows, marks):
        if not numbers and any(_blank(v) for v in row.values()):
            numbers.append(out.note("cross_share or error_ratio is empty where its denominator is 0 (nothing moved)."))
        _mark(row, numbers)
    return out


def _toy_optimiser_state(table: Table, optimizer: str) -> None:
    """The toy's momentum and decay columns: exactly 0 on its plain SGD step, so left out with one sentence (kept,
    should a row ever hold a non-zero one)."""
    if any(r.get(k) not in (0.0, None) for r in table.rows for k in ("momentum", "decay")):
        return
    for r in table.rows:
        for key in ("momentum", "decay", "momentum_share"):
            r.pop(key, None)
    table.notes.append(
        f"momentum and decay are exactly 0 in every row, so their columns are left out: the toy's step is plain {optimizer.upper()} "
        "from the probed point, with no optimiser state from earlier steps and no weight decay."
    )


# ----------------------------------------------------------------------------- a dfpo probe folder


def probe_folders(roots: list[Path], depth: int = 2) -> list[Path]:
    """The ``dfpo probe`` output folders (holding a probe.json) at most ``depth`` levels under ``roots``, sorted, so the
    page offers the probes of the runs it was started on (the tiny model's and a real model's alike)."""
    found: set[Path] = set()
    for root in roots:
        for level in range(depth + 1):
            pattern = "/".join(["*"] * level + ["probe.json"])
            found.update(p.parent for p in root.glob(pattern) if p.is_file())
    return sorted(found)


STORED = Path(__file__).resolve().parents[1] / "docs" / "probe"
"""The documents the repository stores (docs/probe/: the probe's seed sets, log.param_drift across training); a
checkout has them, an installed wheel does not (then the page offers none)."""
ACROSS_KEYS = ("command", "runs")
"""What a stored log.param_drift-across-training document holds (``dfpo.trainer.probe.across.store``)."""


def _json_object(path: Path) -> dict | None:
    try:
        doc = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError):
        return None
    return doc if isinstance(doc, dict) else None


def stored_documents(folder: Path = STORED) -> tuple[list[Path], list[Path]]:
    """(probe documents, across-training documents) among ``folder``'s JSON files, sorted: a probe document holds
    ``DOC_KEYS``, an across-training one ``ACROSS_KEYS``; any other file is not offered."""
    docs = {path: _json_object(path) for path in sorted(folder.glob("*.json"))} if folder.is_dir() else {}
    probes = [p for p, d in docs.items() if d is not None and all(k in d for k in DOC_KEYS)]
    across = [p for p, d in docs.items() if d is not None and all(k in d for k in ACROSS_KEYS)]
    return probes, across


def read_across(path: Path) -> dict:
    """A stored log.param_drift-across-training document; ValueError (one sentence) when it is not one."""
    doc = _json_object(path)
    runs = doc.get("runs") if doc is not None else None
    ok = isinstance(runs, dict) and bool(runs) and isinstance(doc.get("command"), str)
    ok = ok and all(
        isinstance(run, dict)
        and isinstance(run.get("steps"), list)
        and all(
            isinstance(row, dict) and isinstance(row.get("step"), int) and isinstance(row.get("shared_found"), (int, float))
            for row in run["steps"]
        )
        for run in runs.values()
    )
    if not ok:
        raise ValueError(f"{path} is not a stored log.param_drift document: re-make it with python -m dfpo.trainer.probe.across store")
    return doc


def across_rows(doc: dict, part: str) -> list[dict[str, object]]:
    """One row per (objective, probed step): the shared events' mean abs ``part`` (direct, cross, momentum, decay or
    measured) of that step, or None where the step did not log it."""
    return [
        {"objective": label, "step": row["step"], "value": row.get(f"shared_{part}")}
        for label, run in doc["runs"].items()
        for row in run["steps"]
    ]


def read_probe_folder(folder: Path) -> dict:
    """The probe.json of a ``dfpo probe`` output folder, or a stored probe document itself; ValueError (one sentence)
    when it is missing or not one."""
    path = folder if folder.is_file() else folder / "probe.json"
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


def doc_table(doc: dict) -> Table:
    """Per objective and kind: the document's seeds, the seeds with events, and each figure's mean with its 95%
    interval over seeds; figures no record has are left out (a note says which), as are kinds no seed had."""
    doc = with_error_ratio(doc)
    out = Table(flags=first_order_flags(doc))
    what = {**WHAT_EVENT, "shared": f"a shared event is {core_probe.RULE_WORDS[core_probe.document_rule(doc)]}"}
    seeds = len(doc["seeds"])
    figures = [f for f in FIGURES if any(f in r for r in doc["records"])]
    absent: dict[str, list[str]] = {kind: [] for kind in KINDS}
    for label in doc["objectives"]:
        for kind in KINDS:
            have = sorted(values(doc, label, kind, "direct"))
            if not have:
                absent[kind].append(label)
                continue
            row: dict[str, object] = {"objective": label, "events": kind, "seeds": seeds, "seeds with events": len(have)}
            numbers = []
            for figure in figures:
                vals = list(values(doc, label, kind, figure).values())
                iv = figure_interval(vals, figure) if vals else None
                row[figure] = None if iv is None else iv.mean
                row[f"{figure} low"] = None if iv is None or iv.n < 2 else iv.low
                row[f"{figure} high"] = None if iv is None or iv.n < 2 else iv.high
            missing = [s for s in doc["seeds"] if s not in have]
            if missing:
                numbers.append(
                    out.note(
                        f"{label}, {kind}: no {KIND_EVENTS[kind]} in {_seed_list(missing, seeds)} ({what[kind]}); its figures are means over the other seeds."
                    )
                )
            if len(have) < 2:
                numbers.append(out.note("low and high are empty where fewer than 2 seeds had events: one value bounds no interval."))
            if any(_blank(row[f]) for f in figures):
                numbers.append(out.note("A share or error_ratio is empty where nothing moved (its denominator is 0)."))
            if all(row.get(f) == 0.0 for f in ("direct", "cross", "measured") if f in row):
                numbers.append(
                    out.note(f"{label}, {kind}: direct, cross and measured are exactly 0: the probed step did not move these events.")
                )
            _mark(row, numbers)
            out.rows.append(row)
    for kind, labels in absent.items():
        if labels:
            whose = "any objective" if len(labels) == len(doc["objectives"]) else ", ".join(labels)
            out.left_out.append(
                f"No {KIND_EVENTS[kind]} for {whose} in any of the document's {seeds} seeds: {what[kind]}; "
                f"so the {kind} rows are left out of the table and chart."
            )
    if lumped(doc):
        out.notes.append(not_recorded_sentence())
    if core_probe.document_rule(doc) == core_probe.OLD_RULE and out.rows:
        out.notes.append(
            "shared events: the whole-group rule (this document has no shared_events field: it was made before the probe took "
            "every (context, token) two or more completions of a group hold, eq 2), so it probes fewer events than a new one."
        )
    for part, why in ZERO_PARTS.items():
        if out.rows and all(r.get(part) == 0.0 for r in out.rows):
            number = out.note(f"{part} is exactly 0 in every row: {why}.")
            for r in out.rows:
                _mark(r, [*map(int, filter(None, str(r["note"]).split(", "))), number])
    return out


def not_recorded_sentence() -> str:
    return (
        "momentum and decay: not recorded by this run (its records have no optimiser-state part: written before the probe "
        "split it from the batch's), so its cross holds the rest of the batch, the optimiser's state from earlier steps and "
        "weight decay together, and cross_share is cross's share of direct + cross."
    )


def with_error_ratio(doc: dict) -> dict:
    """``doc`` with each record's error_ratio, computed as error / measured where a record predates it (the same
    ratio ``core.probe.summary`` writes), so ``drift_tables.first_order_flags`` can read every document."""
    records = [
        r if "error_ratio" in r or not r.get("measured") or "error" not in r else {**r, "error_ratio": r["error"] / r["measured"]}
        for r in doc["records"]
    ]
    return {**doc, "records": records}


def chart_rows(rows: list[dict[str, object]], kind: str) -> tuple[list[dict[str, object]], list[str]]:
    """The rows of one kind the chart can show (some bar above 0) and the bars present: what a chart draws, or
    ([], ...) when it would be empty."""
    parts = [p for p in BARS if any(isinstance(r.get(p), float) and r[p] > 0 for r in rows if r["events"] == kind)]
    shown = [r for r in rows if r["events"] == kind and any(isinstance(r.get(p), float) and r[p] > 0 for p in parts)]
    return shown, parts


def empty_chart_sentence(table: Table, kind: str) -> str:
    """Why the chart of ``kind`` is empty: the left-out sentence, or every row's zero note."""
    words = {"shared": "No shared event", "equivalent": "No equivalent pair"}[kind]
    said = [s for s in table.left_out if s.startswith(words) or f", {kind}:" in s]
    if said:
        return said[0]
    return f"Nothing to draw for {KIND_EVENTS[kind]}s: every objective's bars are 0 (see the notes under the table)."


def comparison_rows(doc: dict) -> list[dict[str, object]]:
    """Each transform against its matched control (``drift_tables.comparisons``) as rows, less the kinds of event no
    record of the document has (``doc_table``'s left-out sentence says why they are missing)."""
    kinds = {r["kind"] for r in doc["records"] if "direct" in r}  # a kind with events (dfpo probe writes events=0 records)
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
        if c.kind in kinds
    ]


def share_rows(doc: dict) -> list[dict[str, object]]:
    """The cross term's share per objective and kind, of the first-order prediction and of the batch's own part
    (``drift_tables.cross_shares``, each of ``SHARE_TESTS``), as rows."""
    return [
        {
            "objective": s.objective,
            "events": s.kind,
            "share of": SHARE_WORDS[s.figure],
            "cross share": s.interval.mean,
            "low": s.interval.low,
            "high": s.interval.high,
            "side": s.side,
        }
        for figure in SHARE_TESTS
        for s in cross_shares(doc, figure)
    ]
