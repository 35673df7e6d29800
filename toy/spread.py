"""Does DFPO's in-group transform matter once the trust region is matched? A sweep over the spread
of sequence ratios within a group.

DFPO's transforms act on the post-clip sequence weights sbar_i of a group. When every s_i is close
to 1 (on-policy, K = 1) the transforms are the identity; when most sequences are clipped (GSPO's
3e-4 / 4e-4 range) the ratio form (eqs 59-62) gives them GSPO's zero gradient. The transform can
only change the update through the spread of s_i over the unclipped sequences of a group. This
sweep moves one knob that widens that spread (inner steps K, learning rate, group size G, ...)
with a method and a baseline that share the clip range, stop-gradient form, aggregation, lr and
seeds, and reports the paired difference (method - baseline) of Steps (eq 19), final reward,
learning tax and equivalent-set entropy against the measured spread (``ratio/spread``: the
within-group std of log s_i at each update, averaged over updates, groups and seeds).
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Callable
from pathlib import Path

import numpy as np

from dfpo.toy.metrics import bootstrap_ci
from dfpo.toy.report import summarise, to_numpy
from dfpo.toy.train import ToyConfig, run

KNOBS = ("inner_steps", "lr", "group_size", "init_noise")
"""ToyConfig fields the sweep may vary."""

EFFECTS = [
    ("steps_to_kappa", "Steps(E[R]>=kappa) eq 19", "{:+.2f}"),
    ("final_reward", "final E[R]", "{:+.4f}"),
    ("tax_kl_cum", "tax: cum. KL", "{:+.2e}"),
    ("final_equiv_entropy", "equiv-set entropy", "{:+.4f}"),
]


def spread_sweep(
    base: ToyConfig,
    knob: str,
    values: list[float],
    out: str | Path,
    *,
    baseline: str,
    method: str,
    plots: bool = True,
    progress: Callable[[str], None] | None = None,
) -> Path:
    """Train ``baseline`` and ``method`` at each value of ``knob``; write summary.md, spread.json, spread.png."""
    from dfpo.trainer.loss import objective_from_label, unmatched_components

    if knob not in KNOBS:
        raise ValueError(f"knob must be one of {KNOBS}, got knob={knob!r}")
    unmatched = unmatched_components(
        objective_from_label(method, **dict(base.overrides)), objective_from_label(baseline, **dict(base.overrides))
    )
    if unmatched:
        raise ValueError(
            f"{method!r} and {baseline!r} are not a matched control (they differ in {unmatched}); the sweep isolates the transform only between matched objectives"
        )
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    rows = []
    for value in values:
        config = dataclasses.replace(base, objectives=(baseline, method), **{knob: type(getattr(base, knob))(value)})
        if progress:
            progress(f"toy spread: {knob} = {value}")
        _, results = run(config)
        res = to_numpy(results)
        summary = summarise(res, config.kappa)
        row = {
            knob: value,
            "spread": float(res[baseline]["ratio/spread"].mean()),
            "spread_method": float(res[method]["ratio/spread"].mean()),
        }
        row["clip_frac"] = float(np.mean(summary[baseline]["clip_frac"]))
        for key, _, _ in EFFECTS:
            if key in summary[baseline]:
                row[key] = bootstrap_ci(np.asarray(summary[method][key], float) - np.asarray(summary[baseline][key], float))
                row[f"{key}/baseline"] = float(np.mean(summary[baseline][key]))
        rows.append(row)
    (out / "spread.json").write_text(json.dumps(rows, indent=2) + "\n")
    lines = _table(rows, base, knob, baseline, method)
    if plots:
        _plot(rows, knob, out / "spread.png", f"{method} - {baseline} (toy {base.task}, {base.seeds} paired seeds)")
        lines += ["", "![paired effect vs ratio spread](spread.png)"]
    path = out / "summary.md"
    path.write_text("\n".join(lines) + "\n")
    return path


def _significant(ci: tuple[float, float, float]) -> bool:
    return ci[1] > 0 or ci[2] < 0


def _relative(row: dict, key: str) -> str:
    base = row[f"{key}/baseline"]
    return f" ({100 * row[key][0] / base:+.1f}%)" if abs(base) > 1e-12 else ""


def _table(rows: list[dict], base: ToyConfig, knob: str, baseline: str, method: str) -> list[str]:
    effects = [e for e in EFFECTS if e[0] in rows[0]]
    lines = [
        f"# {method} vs {baseline} as the within-group ratio spread grows (toy {base.task}, {base.mode})",
        "",
        f"{base.seeds} paired seeds, {base.steps} steps, G = {base.group_size}, K = {base.inner_steps}, {base.optimizer} lr = {base.lr}"
        f" (the swept knob, {knob}, overrides its base value). Matched control: same clip range, stop-gradient form,",
        "aggregation, advantage scale, lr and seeds. Cells: mean paired difference (method - baseline) [95% bootstrap CI];",
        "* where the interval excludes 0; (x%) is the mean difference relative to the baseline's mean. Spread: within-group",
        "std of log s_i at each update (baseline's run).",
        "",
        f"| {knob} | ratio spread | {baseline} clipped fraction | " + " | ".join(label for _, label, _ in effects) + " |",
        "|---" * (len(effects) + 3) + "|",
    ]
    for row in rows:
        cells = [
            f"{fmt.format(row[k][0])} [{fmt.format(row[k][1])}, {fmt.format(row[k][2])}]"
            + (" *" if _significant(row[k]) else "")
            + _relative(row, k)
            for k, _, fmt in effects
        ]
        lines.append(f"| {row[knob]:g} | {row['spread']:.4f} | {row['clip_frac']:.3f} | " + " | ".join(cells) + " |")
    hits = [(row[knob], label) for row in rows for k, label, _ in effects if _significant(row[k])]
    lines += [""]
    if hits:
        lines.append("Effects whose interval excludes 0: " + "; ".join(f"{label} at {knob} = {v:g}" for v, label in hits) + ".")
    else:
        lines.append(
            f"No effect of {method} over its matched {baseline} excludes 0 at any spread in this sweep: here the in-group transform does not change steps, reward, tax or equivalent-set entropy beyond seed noise."
        )
    return lines


def _plot(rows: list[dict], knob: str, path: Path, title: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    effects = [e for e in EFFECTS if e[0] in rows[0]]
    fig, axes = plt.subplots(1, len(effects), figsize=(3.6 * len(effects), 3.6), dpi=110, squeeze=False)
    x = np.array([r["spread"] for r in rows])
    for ax, (key, label, _) in zip(axes[0], effects):
        mean = np.array([r[key][0] for r in rows])
        err = np.array([[r[key][0] - r[key][1] for r in rows], [r[key][2] - r[key][0] for r in rows]])
        ax.errorbar(x, mean, yerr=err, marker="o", capsize=4)
        for r, xi, yi in zip(rows, x, mean):
            ax.annotate(f"{knob}={r[knob]:g}", (xi, yi), fontsize=7, xytext=(3, 3), textcoords="offset points")
        ax.axhline(0, color="grey", lw=0.8)
        ax.set_xscale("log")
        ax.set_xlabel("within-group std of log s_i")
        ax.set_title(f"difference in {label}", fontsize=9)
        ax.grid(alpha=0.3)
    fig.suptitle(f"{title}: paired difference with 95% bootstrap CI", fontsize=10)
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)
