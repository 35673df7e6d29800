"""``dfpo compare``: objectives on the LLM trainer over paired seeds, with matched controls.

    dfpo compare --objectives gspo,dfpo_min --seeds 10 --out runs/compare
    dfpo compare --objectives gspo_noclip,dfpo_min:stopgrad=score --baseline gspo_noclip --seeds 10

Every objective label (a preset, optionally with ``:key=value`` overrides) trains once per seed
with everything else equal (same config, same seed: same warm start, same prompts, same held-out
eval problems). Each method is compared with the baseline on the same seed, and the paired
differences get 95% bootstrap intervals over seeds. A comparison whose two sides differ in the
trust region (clip range, stop-gradient form, aggregation, advantage scale, ...; see
``dfpo.trainer.loss.unmatched_components``) is flagged in the table: a difference it shows may
come from the trust region, not from the in-group transform.

Runs go to OUT/<label>/seed<k>/ and are skipped when their summary.json exists, so a long
comparison can be interrupted and started again with the same command.
"""

from __future__ import annotations

import json
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import numpy as np

# (key in the per-run record, column title, format of a difference)
OUTCOMES = (
    ("eval", "final eval avg@k", "{:+.3f}"),
    ("reward_last10", "train reward, last 10 steps", "{:+.3f}"),
    ("steps_to_kappa", "steps to kappa (10-step mean)", "{:+.1f}"),
    ("clip_frac", "clipped fraction (mean over steps)", "{:+.3f}"),
    ("asym", "Asym eq 23 (mean over steps)", "{:+.2e}"),
)


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
    from dfpo.trainer.llm.config import load_config
    from dfpo.trainer.loss import objective_from_label

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


def train_command(plan: Plan, label: str, seed: int) -> list[str]:
    """The ``dfpo train`` command of one (label, seed) run."""
    from dfpo.trainer.loss import parse_objective_label

    name, overrides = parse_objective_label(label)
    cmd = [sys.executable, "-m", "dfpo", "train", "--config", plan.config, "--quiet"]
    for item in (*plan.sets, f"seed={seed}", f"objective.name={name}", f"run_dir={run_dir(plan, label, seed)}"):
        cmd += ["--set", item]
    for key, value in overrides.items():
        cmd += ["--set", f"objective.overrides.{key}={str(value).lower() if isinstance(value, bool) else value}"]
    return cmd


def run_one(plan: Plan, label: str, seed: int) -> str:
    """Train one run unless its summary.json exists; returns a status line."""
    path = run_dir(plan, label, seed)
    if (path / "summary.json").is_file():
        return f"compare: {label} seed {seed}: done before, skipped"
    if path.exists():  # an interrupted run: start it again from scratch
        import shutil

        shutil.rmtree(path)
    proc = subprocess.run(train_command(plan, label, seed), capture_output=True, text=True)
    if proc.returncode != 0:
        raise RuntimeError(f"{label} seed {seed} failed (exit {proc.returncode}): {proc.stderr.strip()[-500:]}")
    return f"compare: {label} seed {seed}: trained"


def read_run(path: Path) -> dict[str, float]:
    """The outcomes of one finished run from its summary.json and metrics.jsonl."""
    summary = json.loads((path / "summary.json").read_text())
    rows = [json.loads(line) for line in (path / "metrics.jsonl").read_text().splitlines() if line.strip()]
    final = summary.get("final_eval") or {}
    avg = [v for k, v in final.items() if k.startswith("eval/avg@")]
    steps = summary.get("reward/steps_to_kappa_ma10")
    return {
        "eval": avg[0] if avg else float("nan"),
        "reward_last10": float(np.mean([r["reward/mean"] for r in rows[-10:]])),
        "steps_to_kappa": float(steps if steps is not None else len(rows)),
        "clip_frac": float(np.mean([r.get("clip/frac_low", 0.0) + r.get("clip/frac_high", 0.0) for r in rows])),
        "asym": float(np.mean([r.get("weights/asym", 0.0) for r in rows])),
    }


def paired_table(records: dict[str, dict[int, dict[str, float]]], baseline: str, matched: dict[str, list[str]]) -> list[str]:
    """Markdown: per method and outcome, mean paired difference (method - baseline) [95% bootstrap CI]."""
    from dfpo.toy.metrics import bootstrap_ci

    seeds = sorted(records[baseline])
    head = "| method - " + baseline + " | matched control? | " + " | ".join(t for _, t, _ in OUTCOMES) + " |"
    lines = [head, "|---" * (len(OUTCOMES) + 2) + "|"]
    for label in records:
        if label == baseline:
            continue
        cells = []
        for key, _, fmt in OUTCOMES:
            diff = np.array([records[label][s][key] - records[baseline][s][key] for s in seeds])
            if np.isnan(diff).any():
                cells.append("n/a")
                continue
            mean, lo, hi = bootstrap_ci(diff)
            side = "" if lo <= 0 <= hi else " *"
            cells.append(f"{fmt.format(mean)} [{fmt.format(lo)}, {fmt.format(hi)}]{side}")
        match = "yes" if not matched[label] else "NO: differs in " + ", ".join(matched[label])
        lines.append(f"| {label} | {match} | " + " | ".join(cells) + " |")
    return lines


def level_table(records: dict[str, dict[int, dict[str, float]]]) -> list[str]:
    """Markdown: per label, each outcome's mean over seeds (what the differences are differences of)."""
    lines = ["| objective | " + " | ".join(t for _, t, _ in OUTCOMES) + " |", "|---" * (len(OUTCOMES) + 1) + "|"]
    for label, by_seed in records.items():
        vals = [np.mean([r[key] for r in by_seed.values()]) for key, _, _ in OUTCOMES]
        lines.append(f"| {label} | " + " | ".join(f"{v:.4g}" for v in vals) + " |")
    return lines


def plot_differences(records, baseline: str, path: Path) -> None:
    """One panel per outcome: each method's paired difference to the baseline with its 95% CI."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from dfpo.toy.metrics import bootstrap_ci

    methods = [m for m in records if m != baseline]
    seeds = sorted(records[baseline])
    fig, axes = plt.subplots(1, len(OUTCOMES), figsize=(3.3 * len(OUTCOMES), 0.6 * len(methods) + 2.2), dpi=110, squeeze=False)
    for ax, (key, title, _) in zip(axes[0], OUTCOMES):
        for i, m in enumerate(methods):
            diff = np.array([records[m][s][key] - records[baseline][s][key] for s in seeds])
            if np.isnan(diff).any():
                continue
            mean, lo, hi = bootstrap_ci(diff)
            ax.errorbar([mean], [i], xerr=[[mean - lo], [hi - mean]], fmt="o", capsize=4)
            ax.scatter(diff, np.full(len(diff), i) + 0.18, s=8, alpha=0.5, color="gray")
        ax.axvline(0, color="black", lw=0.8)
        ax.set_yticks(range(len(methods)), methods if ax is axes[0][0] else [""] * len(methods), fontsize=8)
        ax.set_ylim(-0.6, len(methods) - 0.4)
        ax.set_title(title, fontsize=8, wrap=True)
        ax.grid(alpha=0.3, axis="x")
    fig.suptitle(f"paired difference to {baseline} over {len(seeds)} seeds (dot: mean, bar: 95% bootstrap CI; gray: seeds)", fontsize=9)
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)


def compare(plan: Plan, *, jobs: int = 1, progress=print) -> Path:
    """Train every (label, seed) run (``jobs`` at a time), then write OUT/compare.md and OUT/compare.png."""
    from dfpo.trainer.loss import objective_from_label, unmatched_components

    plan.out.mkdir(parents=True, exist_ok=True)
    tasks = [(label, seed) for seed in plan.seeds for label in plan.labels]  # seed-major: pairs finish together
    with ThreadPoolExecutor(max_workers=max(1, jobs)) as pool:
        for line in pool.map(lambda t: run_one(plan, *t), tasks):
            progress(line)
    records = {label: {s: read_run(run_dir(plan, label, s)) for s in plan.seeds} for label in plan.labels}
    base_spec = objective_from_label(plan.baseline)
    matched = {label: unmatched_components(objective_from_label(label), base_spec) for label in plan.labels}
    plot_differences(records, plan.baseline, plan.out / "compare.png")
    lines = [
        f"# {len(plan.seeds)} paired seeds ({plan.seeds[0]}..{plan.seeds[-1]}), config {plan.config}"
        + (f", --set {' '.join(plan.sets)}" if plan.sets else ""),
        "",
        "Paired difference per seed (method - baseline), mean [95% percentile bootstrap CI over seeds]; * where the interval excludes 0.",
        "Steps to kappa: first step whose 10-step mean train reward reaches eval.kappa; a run that never does counts its length.",
        "",
        *paired_table(records, plan.baseline, matched),
        "",
        "Means over seeds:",
        "",
        *level_table(records),
        "",
        "![paired differences](compare.png)",
    ]
    path = plan.out / "compare.md"
    path.write_text("\n".join(lines) + "\n")
    (plan.out / "records.json").write_text(json.dumps({k: {str(s): r for s, r in v.items()} for k, v in records.items()}, indent=2))
    return path
