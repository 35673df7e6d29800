"""The toy's analogue of the paper's Table 4: the gain of DFPO (Min-Replace) over GSPO as G grows.

Paper Table 4 (Qwen3-32B, AIME25 avg@32, DFPO Min-Replace minus GSPO): G = 2, 4, 8, 16 ->
+3.1, +4.2, +5.6, +5.7 points: the gain grows with G. Here the gain is measured on paired
seeds (same seed index, same initial noise) for the toy's final expected reward, its mean over
training (sample efficiency) and the learning tax, each with a Student-t interval Bonferroni-adjusted
over every gain the table shows (``dfpo.core.stats``).
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

import numpy as np

from ..core import stats
from ..core.files import write_text_atomic
from ..core.labels import parse_run_label
from ..core.loss import objective_from_label, unmatched_components
from . import layout
from .checks import paired_difference
from .report import summarise, to_numpy, write_metrics
from .train import ToyConfig, run

PAPER_TABLE4 = {2: 3.1, 4: 4.2, 8: 5.6, 16: 5.7}

GAINS = [
    ("final_reward", "final E[R]"),
    ("mean_reward", "mean E[R] over steps"),
    ("steps_to_kappa", "Steps(E[R]>=kappa)"),
    ("tax_kl_cum", "tax: cum. KL"),
]


def sweep_group_size(
    configs: list[ToyConfig],
    out: str | Path,
    *,
    baseline: str = "gspo",
    method: str = "dfpo_min",
    plots: bool = True,
    progress: Callable[[str], None] | None = None,
) -> Path:
    """Run ``baseline`` and ``method`` for each config (one per G); write summary.md, gains.json, plots."""
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    rows = []
    for config in configs:
        if progress:
            progress(f"toy sweep-g: G = {config.group_size}")
        _, results = run(config)
        res = to_numpy(results)
        sub = out / f"G{config.group_size}"
        sub.mkdir(exist_ok=True)
        write_metrics(res, sub)
        summary = summarise(res, config.kappa)
        row = {
            "G": config.group_size,
            "summary": {side: {k: np.asarray(v).tolist() for k, v in summary[side].items()} for side in (method, baseline)},
        }
        rows.append(row)
    tests = len(rows) * len(GAINS)
    for row in rows:
        m, b = ({k: np.asarray(v) for k, v in row["summary"][side].items()} for side in (method, baseline))
        for key, _ in GAINS:
            row[key] = stats.interval_text(paired_difference(m, b, key, tests=tests))
            row[f"{key}/center"] = [v if np.isfinite(v) else None for v in paired_difference(m, b, key, tests=tests).as_tuple()]
        row[f"final_reward/{baseline}"] = float(np.mean(b["final_reward"]))
    write_text_atomic(out / "gains.json", json.dumps(rows, indent=2) + "\n")
    c = configs[0]
    unmatched = unmatched_components(
        objective_from_label(parse_run_label(method).objective, **dict(c.overrides)),
        objective_from_label(parse_run_label(baseline).objective, **dict(c.overrides)),
    )
    match = (
        "yes"
        if not unmatched
        else "NO, they differ in " + ", ".join(unmatched) + ": a gain may come from the trust region, not the transform"
    )
    lines = [
        f"# Gain of {method} over {baseline} as the group size grows (toy {c.task}, {c.mode})",
        "",
        f"{c.seeds} paired seeds (--seed {c.seed}), {c.steps} steps, K = {c.inner_steps}, {c.optimizer} lr = {c.lr}. Cells: mean paired difference ({method} - {baseline}) [{stats.interval_note(tests)}].",
        f"Steps to kappa = {c.kappa}: the median paired difference with its censoring-aware sign-test interval (a seed that never reaches kappa only bounds its difference), or where the seeds are too few for a sign test and every run reached kappa the t-interval of the mean. Paper Table 4 (AIME25 points, not comparable units): {PAPER_TABLE4}.",
        f"Matched control (same clip range, stop-gradient form, aggregation, advantage scale): {match}.",
        "",
        "| G | " + " | ".join(f"gain in {label}" for _, label in GAINS) + f" | {baseline} final E[R] | paper Table 4 |",
        "|---" * (len(GAINS) + 3) + "|",
    ]
    for row in rows:
        cells = [row[k] for k, _ in GAINS]
        base = row[f"final_reward/{baseline}"]
        lines.append(f"| {row['G']} | " + " | ".join(cells) + f" | {base:.3f} | {PAPER_TABLE4.get(row['G'], '-')} |")
    gains = [row["mean_reward/center"][0] for row in rows]
    grows = all(b >= a for a, b in zip(gains, gains[1:]))
    lines += [
        "",
        f"Does the gain in mean E[R] grow with G, as the paper's Table 4 says? {'yes' if grows else 'no'} "
        f"(means: {', '.join(f'{g:+.3g}' for g in gains)}). A 'no' is a finding about this toy.",
    ]
    if plots:
        _plot(rows, out / "gain_vs_G.png", f"{method} - {baseline} (toy {c.task})")
        lines += ["", "![gain vs G](gain_vs_G.png)"]
    path = out / layout.SUMMARY
    write_text_atomic(path, "\n".join(lines) + "\n")
    return path


def _plot(rows: list[dict], path: Path, title: str) -> None:
    import matplotlib  # deferred: only the PNG writer needs it (~0.3 s), and it must get the Agg backend first

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2, figsize=(10, 4), dpi=110)
    gs = [r["G"] for r in rows]
    for ax, (key, label) in zip(axes, GAINS[:2]):
        mean = np.array([r[f"{key}/center"][0] for r in rows])
        err = np.array(
            [[r[f"{key}/center"][0] - r[f"{key}/center"][1] for r in rows], [r[f"{key}/center"][2] - r[f"{key}/center"][0] for r in rows]]
        )
        ax.errorbar(gs, mean, yerr=err, marker="o", capsize=4)
        ax.axhline(0, color="grey", lw=0.8)
        ax.set_xscale("log", base=2)
        ax.set_xticks(gs, [str(g) for g in gs])
        ax.set_xlabel("group size G")
        ax.set_ylabel(f"gain in {label}")
        ax.grid(alpha=0.3)
    fig.suptitle(f"{title} (95% t-interval over paired seeds, Bonferroni-adjusted over the table)", fontsize=10)
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)
