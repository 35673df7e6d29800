"""``dfpo compare``: objectives on the LLM trainer over paired seeds, with matched controls.

    dfpo compare --objectives gspo,dfpo_min --seeds 32 --out runs/compare
    dfpo compare --objectives gspo_noclip,dfpo_min:stopgrad=score --baseline gspo_noclip --seeds 32 --first-seed 1000

Every objective label (a preset, optionally with ``:key=value`` overrides) trains once per seed
with everything else equal (same config, same seed: same warm start, same prompts, same held-out
eval problems). Each method is compared with the baseline on the same seed. The paired
differences get Student-t intervals over seeds, Bonferroni-adjusted over every interval of the
table (``dfpo.core.stats``: honest at small n, where a percentile bootstrap under-covers); a cell
is marked * only when its adjusted interval excludes 0. Every outcome's per-seed values are
printed too (and written to per_seed.csv). A warning (stderr and compare.md) says when fewer than
8 seeds were run or when a run never reached kappa (its steps to kappa is then censored at the
run's length). A comparison whose two sides differ in the trust region (clip range, stop-gradient
form, aggregation, advantage scale, ...; see ``dfpo.core.loss.unmatched_components``) is
flagged in the table: a difference it shows may come from the trust region, not from the in-group
transform.

Runs go to OUT/<label>/seed<k>/ and are skipped when their summary.json exists, so a long
comparison can be interrupted and started again with the same command: a run with a
checkpoint.pt is continued with ``dfpo train --resume`` and any other is started with
``dfpo train`` (which restarts a run folder of its own that died before its first checkpoint).
Nothing is deleted here.

Before anything runs, every OUT/<label>/seed<k>/ that holds a run (a checkpoint or a summary) must hold the run of
that label and seed under this comparison's config: its identity (``run_folder.run_identity``, kept in the mark
dfpo train writes) is checked, and a folder holding another run, or one whose identity is unknown, is refused
naming both, so no run is resumed or reported under a label it does not have. A run that fails, and a run whose
files cannot be read (a torn metrics line: FILE:LINE), stop the comparison with one line.
"""

from __future__ import annotations

import csv
import io
import json
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from ..core import stats
from ..core.files import write_text_atomic
from ..core.loss import objective_from_label, parse_objective_label, unmatched_components
from .config import Config, config_to_dict, load_config
from .layout import RunDir
from .run_folder import folder_identity, run_identity

# (key in the per-run record, column title, format of a difference)
OUTCOMES = (
    ("eval", "final eval avg@k", "{:+.3f}"),
    ("reward_last10", "train reward, last 10 steps", "{:+.3f}"),
    ("steps_to_kappa", "steps to kappa (10-step mean; censored at the run's length)", "{:+.1f}"),
    ("clip_frac", "clipped fraction (mean over steps)", "{:+.3f}"),
    ("asym", "Asym eq 23 (mean over steps)", "{:+.2e}"),
)
VALUE_FORMATS = {"eval": "{:.4f}", "reward_last10": "{:.4f}", "steps_to_kappa": "{:.0f}", "clip_frac": "{:.4f}", "asym": "{:.4g}"}
"""How a per-seed value is printed."""

MIN_SEEDS = 8
"""Fewer paired seeds than this draw a warning: the interval is wide and leans on near-normal differences."""


@dataclass(frozen=True)
class Plan:
    """What to run: labels, seeds, the base config file and its --set assignments."""

    labels: tuple[str, ...]
    baseline: str
    seeds: tuple[int, ...]
    config: str
    sets: tuple[str, ...]
    out: Path


def make_plan(objectives: str, baseline: str | None, seeds: int, first_seed: int, config: str, sets: list[str] | None, out: str) -> Plan:
    """Validate everything before any training: labels, baseline, seed count, config file."""
    labels = tuple(x.strip() for x in objectives.split(",") if x.strip())
    if len(labels) < 2:
        raise ValueError(f"--objectives needs at least two labels, got --objectives {objectives!r}")
    if len(set(labels)) != len(labels):
        raise ValueError(f"--objectives repeats a label: {objectives!r}")
    for label in labels:
        objective_from_label(label)  # raises, naming the bad label or component
    baseline = baseline or labels[0]
    if baseline not in labels:
        raise ValueError(f"--baseline {baseline!r} is not one of --objectives {list(labels)}")
    if seeds < 2:
        raise ValueError(f"--seeds must be >= 2 for a paired interval, got --seeds {seeds}")
    load_config(config, list(sets or []))  # a bad config or --set fails now
    return Plan(labels, baseline, tuple(range(first_seed, first_seed + seeds)), config, tuple(sets or []), Path(out))


def run_dir(plan: Plan, label: str, seed: int) -> Path:
    return plan.out / label.replace(":", "__").replace("=", "-") / f"seed{seed}"


class RunFailed(ValueError):
    """A run of the comparison ended with an error (its own last error line says which). A ValueError: the command
    line prints it as one line, with no traceback."""


def run_sets(plan: Plan, label: str, seed: int) -> list[str]:
    """The --set assignments of one (label, seed) run: the plan's, then its seed, objective and folder."""
    name, overrides = parse_objective_label(label)
    sets = [*plan.sets, f"seed={seed}", f"objective.name={name}", f"run_dir={run_dir(plan, label, seed)}"]
    return sets + [f"objective.overrides.{k}={str(v).lower() if isinstance(v, bool) else v}" for k, v in overrides.items()]


def run_config(plan: Plan, label: str, seed: int) -> Config:
    """The config ``dfpo train`` resolves for one (label, seed) run."""
    return load_config(plan.config, run_sets(plan, label, seed))


def train_command(plan: Plan, label: str, seed: int) -> list[str]:
    """The ``dfpo train`` command of one (label, seed) run."""
    cmd = [sys.executable, "-m", "dfpo", "train", "--config", plan.config, "--quiet"]
    for item in run_sets(plan, label, seed):
        cmd += ["--set", item]
    return cmd


def check_identity(plan: Plan, label: str, seed: int) -> None:
    """ValueError unless OUT/LABEL/seedN, when it holds a run (a checkpoint or a summary), holds the run of ``label``
    and ``seed`` under the plan's config (``run_identity``); naming what it holds instead."""
    path = run_dir(plan, label, seed)
    if not (RunDir(path).checkpoint.is_file() or RunDir(path).summary.is_file()):
        return
    expected, found = run_identity(config_to_dict(run_config(plan, label, seed))), folder_identity(path)
    if found == expected:
        return
    what_now = "nothing was run or reported. Move that folder away, or choose another --out"
    if found is None:
        raise ValueError(
            f"{path} holds a run whose identity is unknown (no identity in {RunDir.MARK} and no config in checkpoint.json: not a run "
            f"of dfpo train, or of one older than run identities); {what_now}"
        )
    if (found.get("objective"), found.get("seed")) != (expected["objective"], expected["seed"]):
        raise ValueError(
            f"{path} holds the run {found.get('objective')} seed {found.get('seed')}, not {expected['objective']} seed {seed}; {what_now}"
        )
    raise ValueError(
        f"{path} holds a run of {expected['objective']} seed {seed} with another config (config "
        f"{str(found.get('config_sha256'))[:12]}, not {expected['config_sha256'][:12]} of --config {plan.config}"
        f"{' --set ' + ' '.join(plan.sets) if plan.sets else ''}); {what_now}"
    )


def resume_command(path: Path) -> list[str]:
    """The ``dfpo train --resume`` command continuing an interrupted run from its checkpoint.pt."""
    return [sys.executable, "-m", "dfpo", "train", "--resume", str(path), "--quiet"]


def command_for(plan: Plan, label: str, seed: int) -> tuple[list[str], str]:
    """What to run for one (label, seed): resume it if it has a checkpoint, else train it from the start.

    Nothing is ever deleted here: a folder that died before its first checkpoint is restarted by
    ``dfpo train`` itself (it empties only a run folder it recognises), and anything else is refused.
    """
    path = run_dir(plan, label, seed)
    if RunDir(path).checkpoint.is_file():
        return resume_command(path), "resumed"
    return train_command(plan, label, seed), "trained"


def run_one(plan: Plan, label: str, seed: int) -> str:
    """Train (or resume) one run unless its summary.json exists; returns a status line."""
    path = run_dir(plan, label, seed)
    if RunDir(path).summary.is_file():
        return f"compare: {label} seed {seed}: done before, skipped"
    cmd, how = command_for(plan, label, seed)
    proc = subprocess.run(cmd, capture_output=True, text=True)
    if proc.returncode != 0:
        raise RunFailed(f"{label} seed {seed} failed (exit {proc.returncode}): {last_error(proc.stderr)}")
    return f"compare: {label} seed {seed}: {how}"


def last_error(stderr: str) -> str:
    """The error a failed ``dfpo train`` printed: its last ``dfpo: error:`` line, else its last line."""
    lines = [line.strip() for line in stderr.splitlines() if line.strip()]
    errors = [line.removeprefix("dfpo: error:").strip() for line in lines if line.startswith("dfpo: error:")]
    return (errors or lines or ["(nothing on stderr)"])[-1][-1000:]


def _read_summary(path: Path) -> dict:
    try:
        summary = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as err:
        raise ValueError(f"{path}: cannot be read as JSON ({err}); move {path.parent} away to train that run again") from None
    if not isinstance(summary, dict):
        raise ValueError(f"{path}: not a JSON object; move {path.parent} away to train that run again")
    return summary


def _read_metrics(path: Path) -> list[dict]:
    """The lines of a finished run's metrics.jsonl; ValueError naming FILE:LINE of one that is not a JSON object."""
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as err:
        raise ValueError(f"{path}: cannot be read ({err}); move {path.parent} away to train that run again") from None
    rows = []
    for number, line in enumerate(text.split("\n"), start=1):
        if not line.strip():
            continue
        try:
            row = json.loads(line)
        except json.JSONDecodeError as err:
            row, why = None, str(err)
        else:
            why = f"a JSON {type(row).__name__}"
        if not isinstance(row, dict):
            raise ValueError(
                f"{path}:{number}: not a JSON object ({why}): the log of a finished run is damaged; move {path.parent} away "
                "to train that run again"
            )
        rows.append(row)
    if not rows:
        raise ValueError(f"{path}: no step in it; move {path.parent} away to train that run again")
    return rows


def read_run(path: Path) -> dict[str, float]:
    """The outcomes of one finished run from its summary.json and metrics.jsonl.

    ``kappa_reached`` is 1.0 when the 10-step mean train reward reached eval.kappa, else 0.0: then
    ``steps_to_kappa`` is the run's length, a lower bound (censored).
    """
    summary = _read_summary(RunDir(path).summary)
    rows = _read_metrics(RunDir(path).metrics)
    final = summary.get("final_eval") or {}
    avg = [v for k, v in final.items() if k.startswith("eval/avg@")]
    steps = summary.get("reward/steps_to_kappa_ma10")
    return {
        "eval": avg[0] if avg else float("nan"),
        "reward_last10": float(np.mean([r["reward/mean"] for r in rows[-10:]])),
        "steps_to_kappa": float(steps if steps is not None else len(rows)),
        "kappa_reached": float(steps is not None),
        "clip_frac": float(np.mean([r.get("clip/frac_low", 0.0) + r.get("clip/frac_high", 0.0) for r in rows])),
        "asym": float(np.mean([r.get("weights/asym", 0.0) for r in rows])),
    }


Records = dict[str, dict[int, dict[str, float]]]
"""{label: {seed: read_run's record}}"""


Intervals = dict[tuple[str, str], stats.Interval | None]
"""paired_intervals' answer: (method, outcome) -> interval, computed once per table."""


def _diff(records: Records, label: str, baseline: str, key: str) -> np.ndarray:
    """Per-seed paired difference (label - baseline) of one outcome, (n_seeds,)."""
    return np.array([records[label][s][key] - records[baseline][s][key] for s in sorted(records[baseline])])


def paired_intervals(records: Records, baseline: str) -> Intervals:
    """(method, outcome) -> Student-t interval of the paired difference, Bonferroni-adjusted over every
    interval of the table (methods x outcomes); None where an outcome is missing (NaN) for some seed."""
    cells = [(m, key) for m in records if m != baseline for key, _, _ in OUTCOMES]
    diffs = {c: _diff(records, c[0], baseline, c[1]) for c in cells}
    tests = sum(not np.isnan(d).any() for d in diffs.values()) or 1
    return {c: None if np.isnan(d).any() else stats.paired_interval(d, tests=tests) for c, d in diffs.items()}


def paired_table(records: Records, baseline: str, matched: dict[str, list[str]], intervals: Intervals) -> list[str]:
    """Markdown: per method and outcome, mean paired difference (method - baseline) [adjusted 95% CI]; * where it excludes 0."""
    head = "| method - " + baseline + " | matched control? | " + " | ".join(t for _, t, _ in OUTCOMES) + " |"
    lines = [head, "|---" * (len(OUTCOMES) + 2) + "|"]
    for label in records:
        if label == baseline:
            continue
        cells = []
        for key, _, fmt in OUTCOMES:
            ci = intervals[(label, key)]
            if ci is None:
                cells.append("n/a")
                continue
            cells.append(f"{fmt.format(ci.mean)} [{fmt.format(ci.low)}, {fmt.format(ci.high)}]" + (" *" if ci.excludes_zero else ""))
        match = "yes" if not matched[label] else "NO: differs in " + ", ".join(matched[label])
        lines.append(f"| {label} | {match} | " + " | ".join(cells) + " |")
    return lines


def level_table(records: Records) -> list[str]:
    """Markdown: per label, each outcome's mean over seeds (what the differences are differences of)."""
    lines = ["| objective | " + " | ".join(t for _, t, _ in OUTCOMES) + " |", "|---" * (len(OUTCOMES) + 1) + "|"]
    for label, by_seed in records.items():
        vals = [np.mean([r[key] for r in by_seed.values()]) for key, _, _ in OUTCOMES]
        lines.append(f"| {label} | " + " | ".join(f"{v:.4g}" for v in vals) + " |")
    return lines


def _value(record: dict[str, float], key: str) -> str:
    text = VALUE_FORMATS[key].format(record[key])
    return text + "+" if key == "steps_to_kappa" and not record.get("kappa_reached", 1.0) else text


def per_seed_tables(records: Records, baseline: str) -> list[str]:
    """Markdown: one table per outcome, a row per seed with every label's value and each paired difference.

    A steps-to-kappa value written N+ is censored: that run never reached kappa in its N steps.
    """
    methods = [m for m in records if m != baseline]
    lines = []
    for key, title, fmt in OUTCOMES:
        lines += [
            f"{title}:",
            "",
            "| seed | " + " | ".join(records) + " | " + " | ".join(f"{m} - {baseline}" for m in methods) + " |",
            "|---" * (1 + len(records) + len(methods)) + "|",
        ]
        for s in sorted(records[baseline]):
            values = [_value(records[label][s], key) for label in records]
            diffs = [fmt.format(records[m][s][key] - records[baseline][s][key]) for m in methods]
            lines.append(f"| {s} | " + " | ".join(values) + " | " + " | ".join(diffs) + " |")
        lines.append("")
    return lines


def per_seed_csv(records: Records) -> str:
    """CSV text: label, seed, every outcome and kappa_reached, one row per run."""
    buf = io.StringIO()
    w = csv.writer(buf, lineterminator="\n")
    keys = [key for key, _, _ in OUTCOMES] + ["kappa_reached"]
    w.writerow(["label", "seed", *keys])
    for label, by_seed in records.items():
        for s in sorted(by_seed):
            w.writerow([label, s, *[f"{by_seed[s].get(k, float('nan')):.6g}" for k in keys]])
    return buf.getvalue()


def warnings_for(records: Records) -> list[str]:
    """Why the table may mislead: fewer than MIN_SEEDS paired seeds, censored steps to kappa."""
    out = []
    n = len(next(iter(records.values())))
    if n < MIN_SEEDS:
        out.append(
            f"warning: only {n} paired seeds (fewer than {MIN_SEEDS}): the intervals are wide and rest on the paired differences "
            f"being close to normal; run --seeds {MIN_SEEDS} or more before reading a difference."
        )
    censored = [
        f"{label} seed {s}" for label, by_seed in records.items() for s in sorted(by_seed) if not by_seed[s].get("kappa_reached", 1.0)
    ]
    if censored:
        total = sum(len(v) for v in records.values())
        out.append(
            f"warning: {len(censored)} of {total} runs never reached kappa ({', '.join(censored)}): their steps to kappa is the "
            "run's length, a lower bound, so that column's paired difference is biased (toward 0 when both runs of a pair are censored)."
        )
    return out


def plot_differences(records: Records, baseline: str, intervals: Intervals, path: Path) -> None:
    """One panel per outcome: each method's paired difference to the baseline with its adjusted 95% CI."""
    import matplotlib  # deferred: only the PNG writer needs it (~0.3 s), and it must get the Agg backend first

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    methods = [m for m in records if m != baseline]
    seeds = sorted(records[baseline])
    fig, axes = plt.subplots(1, len(OUTCOMES), figsize=(3.3 * len(OUTCOMES), 0.6 * len(methods) + 2.2), dpi=110, squeeze=False)
    for ax, (key, title, _) in zip(axes[0], OUTCOMES):
        for i, m in enumerate(methods):
            ci = intervals[(m, key)]
            if ci is None:
                continue
            ax.errorbar([ci.mean], [i], xerr=[[ci.mean - ci.low], [ci.high - ci.mean]], fmt="o", capsize=4)
            ax.scatter(_diff(records, m, baseline, key), np.full(len(seeds), i) + 0.18, s=8, alpha=0.5, color="gray")
        ax.axvline(0, color="black", lw=0.8)
        ax.set_yticks(range(len(methods)), methods if ax is axes[0][0] else [""] * len(methods), fontsize=8)
        ax.set_ylim(-0.6, len(methods) - 0.4)
        ax.set_title(title, fontsize=8, wrap=True)
        ax.grid(alpha=0.3, axis="x")
    fig.suptitle(
        f"paired difference to {baseline} over {len(seeds)} seeds (dot: mean, bar: 95% t-interval, Bonferroni-adjusted; gray: seeds)",
        fontsize=9,
    )
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)


def compare(plan: Plan, *, jobs: int = 1, progress=print, warn=None) -> Path:
    """Train every (label, seed) run (``jobs`` at a time), then write OUT/compare.md, compare.png,
    per_seed.csv and records.json; each warning goes to ``warn`` (default: stderr) and into compare.md."""
    warn = warn or (lambda text: print(text, file=sys.stderr))
    tasks = [(label, seed) for seed in plan.seeds for label in plan.labels]  # seed-major: pairs finish together
    for label, seed in tasks:  # before anything runs: no run is resumed or reported under a label it does not have
        check_identity(plan, label, seed)
    plan.out.mkdir(parents=True, exist_ok=True)
    with ThreadPoolExecutor(max_workers=max(1, jobs)) as pool:
        for line in pool.map(lambda t: run_one(plan, *t), tasks):
            progress(line)
    records = {label: {s: read_run(run_dir(plan, label, s)) for s in plan.seeds} for label in plan.labels}
    base_spec = objective_from_label(plan.baseline)
    matched = {label: unmatched_components(objective_from_label(label), base_spec) for label in plan.labels}
    intervals = paired_intervals(records, plan.baseline)
    plot_differences(records, plan.baseline, intervals, plan.out / "compare.png")
    warnings = warnings_for(records)
    for text in warnings:
        warn(text)
    tests = sum(ci is not None for ci in intervals.values())
    lines = [
        f"# {len(plan.seeds)} paired seeds ({plan.seeds[0]}..{plan.seeds[-1]}), config {plan.config}"
        + (f", --set {' '.join(plan.sets)}" if plan.sets else ""),
        "",
        *[f"**{text}**" for text in warnings],
        *([""] if warnings else []),
        f"Paired difference per seed (method - baseline), mean [{stats.interval_note(tests)}]; * where that interval excludes 0.",
        "Steps to kappa: first step whose 10-step mean train reward reaches eval.kappa; a run that never does counts its length.",
        "",
        *paired_table(records, plan.baseline, matched, intervals),
        "",
        "Means over seeds:",
        "",
        *level_table(records),
        "",
        "Per seed (N+: censored, the run never reached kappa in its N steps):",
        "",
        *per_seed_tables(records, plan.baseline),
        "![paired differences](compare.png)",
    ]
    write_text_atomic(plan.out / "per_seed.csv", per_seed_csv(records))
    write_text_atomic(plan.out / "records.json", json.dumps({k: {str(s): r for s, r in v.items()} for k, v in records.items()}, indent=2))
    path = plan.out / "compare.md"
    write_text_atomic(path, "\n".join(lines) + "\n")
    return path
