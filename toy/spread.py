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

from ..core import stats
from ..core.files import read_utf8, write_text_atomic
from ..core.labels import parse_run_label
from ..core.loss import objective_from_label, unmatched_components
from . import layout
from .checks import baseline_level, paired_difference
from .folder import _plain
from .report import summarise, to_numpy
from .train import ToyConfig, run

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
    discovery: tuple[list[dict], dict] | None = None,
) -> Path:
    """Train ``baseline`` and ``method`` at each value of ``knob``; write summary.md, spread.json, spread.png.

    Each cell's interval is Bonferroni-adjusted over every cell of the table. ``discovery``
    (``read_spread_discovery``) adds the replication table: the cells whose adjusted interval
    excludes 0 on either seed set, and whether they do on both with the same sign.
    """
    if knob not in KNOBS:
        raise ValueError(f"knob must be one of {KNOBS}, got knob={knob!r}")
    unmatched = unmatched_components(
        objective_from_label(parse_run_label(method).objective, **dict(base.overrides)),
        objective_from_label(parse_run_label(baseline).objective, **dict(base.overrides)),
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
        rows.append(_row(knob, value, res, summarise(res, config.kappa), baseline, method))
    setup = {"config": dataclasses.asdict(base), "knob": knob, "values": list(values), "baseline": baseline, "method": method}
    write_text_atomic(out / layout.CONFIG, json.dumps(setup, indent=2, default=str) + "\n")
    write_text_atomic(out / layout.SPREAD, json.dumps(rows, indent=2) + "\n")
    lines = render_spread(rows, setup, discovery=discovery)
    if plots:
        _plot(rows, knob, out / "spread.png", f"{method} - {baseline} (toy {base.task}, {base.seeds} paired seeds, --seed {base.seed})")
        lines += ["", "![paired effect vs ratio spread](spread.png)"]
    path = out / layout.SUMMARY
    write_text_atomic(path, "\n".join(lines) + "\n")
    return path


def _row(knob: str, value: float, res: dict, summary: dict, baseline: str, method: str) -> dict:
    """One knob value: measured spread, the baseline's clipped fraction, and both labels' per-seed values of every
    effect (with which seeds reached kappa: a censored steps value is a lower bound, never a number to average)."""
    row = {
        knob: value,
        "spread": float(res[baseline]["ratio/spread"].mean()),
        "spread_method": float(res[method]["ratio/spread"].mean()),
        "clip_frac": float(np.mean(summary[baseline]["clip_frac"])),
        "reached/method": np.asarray(summary[method]["reached"], bool).tolist(),
        "reached/baseline": np.asarray(summary[baseline]["reached"], bool).tolist(),
    }
    for key, _, _ in EFFECTS:
        if key in summary[baseline]:
            row[f"method/{key}"] = np.asarray(summary[method][key], float).tolist()
            row[f"baseline/{key}"] = np.asarray(summary[baseline][key], float).tolist()
    return row


def _side(row: dict, side: str, keys) -> dict:
    """The summary row of one side (method or baseline) of a sweep cell, as ``dfpo.toy.checks`` reads it."""
    out = {key: np.asarray(row[f"{side}/{key}"], float) for key in keys}
    out["reached"] = np.asarray(row[f"reached/{side}"], bool)
    return out


def effect_keys(rows: list[dict]) -> list[str]:
    return [k for k, _, _ in EFFECTS if all(f"method/{k}" in r for r in rows)]


def intervals(rows: list[dict]) -> list[dict]:
    """For each row, {key: (interval, the baseline's level)}, every interval Bonferroni-adjusted over every cell of the
    sweep; a censored key (steps) gets the censoring-aware median interval (``dfpo.toy.checks.paired_difference``)."""
    keys = effect_keys(rows)
    tests = len(rows) * len(keys)
    out = []
    for row in rows:
        m, b = _side(row, "method", keys), _side(row, "baseline", keys)
        cells = {key: paired_difference(m, b, key, tests=tests) for key in keys}
        out.append({key: (ci, baseline_level(b, key, ci)) for key, ci in cells.items()})
    return out


def _effect_cell(cell, fmt: str) -> str:
    """'mean [low, high] * (x% [lo%, hi%])' of one effect at one knob value (* where the interval excludes 0)."""
    ci, level = cell
    rel = stats.relative(ci, level) if level is not None else ""
    return stats.interval_text(ci, fmt) + (" *" if ci.excludes_zero else "") + rel


def _table(rows: list[dict], base: ToyConfig, knob: str, baseline: str, method: str) -> list[str]:
    keys = effect_keys(rows)
    effects = [e for e in EFFECTS if e[0] in keys]
    cells = intervals(rows)
    tests = len(rows) * len(keys)
    lines = [
        f"# {method} vs {baseline} as the within-group ratio spread grows (toy {base.task}, {base.mode})",
        "",
        f"{base.seeds} paired seeds (--seed {base.seed}), {base.steps} steps, G = {base.group_size}, K = {base.inner_steps}, {base.optimizer} lr = {base.lr}"
        f" (the swept knob, {knob}, overrides its base value). Matched control: same clip range, stop-gradient form,",
        f"aggregation, advantage scale, lr and seeds. Cells: mean paired difference (method - baseline) [{stats.interval_note(tests)}];",
        "for steps, the median paired difference with its censoring-aware sign-test interval at the same level, or where",
        "the seeds are too few for a sign test and every run of both sides reached kappa the t-interval of the mean.",
        "* where that interval excludes 0; (x% [lo%, hi%]) is the difference and its interval relative to the baseline's level.",
        "Spread: within-group std of log s_i at each update (baseline's run).",
        "",
        f"| {knob} | ratio spread | {baseline} clipped fraction | " + " | ".join(label for _, label, _ in effects) + " |",
        "|---" * (len(effects) + 3) + "|",
    ]
    for row, cell in zip(rows, cells):
        lines.append(
            f"| {row[knob]:g} | {row['spread']:.4f} | {row['clip_frac']:.3f} | "
            + " | ".join(_effect_cell(cell[k], fmt) for k, _, fmt in effects)
            + " |"
        )
    hits = [(row[knob], label) for row, cell in zip(rows, cells) for k, label, _ in effects if cell[k][0].excludes_zero]
    lines += [""]
    if hits:
        lines.append(
            f"Effects whose adjusted interval excludes 0 ({tests} cells): "
            + "; ".join(f"{label} at {knob} = {v:g}" for v, label in hits)
            + "."
        )
    else:
        lines.append(
            f"No effect of {method} over its matched {baseline} excludes 0 at any spread in this sweep after the correction for {tests} cells."
        )
    return lines


def replication_table(first: list[dict], second: list[dict], first_config: dict, base: ToyConfig, knob: str) -> list[str]:
    """Markdown: every cell whose adjusted interval excludes 0 on either seed set, with both sets' values and 'replicated?'."""
    keys = [k for k in effect_keys(second) if k in effect_keys(first)]
    effects = [e for e in EFFECTS if e[0] in keys]
    cells_a, cells_b = intervals(first), intervals(second)
    lines = [
        f"Replication: discovery set --seed {first_config.get('seed')} ({first_config.get('seeds')} seeds, {len(first) * len(effect_keys(first))} cells) "
        f"and this set --seed {base.seed} ({base.seeds} seeds). A cell replicates when its adjusted interval excludes 0 on both",
        "sets with the same sign; only those are findings.",
        "",
        f"| {knob} | effect | discovery set | this set | replicated? |",
        "|---|---|---|---|---|",
    ]
    found = []
    for row, a, b in zip(second, cells_a, cells_b):
        for key, label, fmt in effects:
            sa, sb = a[key][0].excludes_zero, b[key][0].excludes_zero
            if not (sa or sb):
                continue
            same = sa and sb and (a[key][0].low > 0) == (b[key][0].low > 0)
            lines.append(
                f"| {row[knob]:g} | {label} | {_effect_cell(a[key], fmt)} | {_effect_cell(b[key], fmt)} | {'yes' if same else 'no'} |"
            )
            if same:
                found.append(f"{label} at {knob} = {row[knob]:g}")
    if len(lines) == 5:
        lines.append("| - | no cell excludes 0 on either set | | | |")
    lines += ["", ("Replicated effects: " + "; ".join(found) + ".") if found else "No effect replicates on both seed sets."]
    return lines


def render_spread(rows: list[dict], setup: dict, *, discovery: tuple[list[dict], dict] | None = None) -> list[str]:
    """The lines of a sweep's summary.md (without its figure), from its rows and setup (spread.json, config.json)."""
    from .folder import config_from_dict

    base = config_from_dict(setup["config"])
    lines = _table(rows, base, setup["knob"], setup["baseline"], setup["method"])
    if discovery is not None:
        lines += ["", *replication_table(discovery[0], rows, discovery[1]["config"], base, setup["knob"])]
    return lines


SPREAD_MUST_MATCH = ("task", "task_options", "overrides", "mode", "steps", "group_size", "inner_steps", "minibatches")
SPREAD_MUST_MATCH += ("groups_per_step", "optimizer", "lr", "init_noise", "kappa")


def read_spread_discovery(path, base: ToyConfig, knob: str, values: list[float], baseline: str, method: str) -> tuple[list[dict], dict]:
    """(rows, setup) of an earlier ``dfpo toy spread`` of the same sweep on a disjoint seed set.

    ValueError, before any training, for a folder that is not a spread of this version, another
    sweep (knob, values, labels or any config field but the knob's and the seed set's), or the same --seed.
    """
    path = Path(path)
    if not (path / layout.CONFIG).is_file() or not (path / layout.SPREAD).is_file():
        raise ValueError(
            f"--discovery {str(path)!r}: no config.json and spread.json in it; is it a dfpo toy spread folder of this version?"
        )
    setup = json.loads(read_utf8(path / layout.CONFIG))
    rows = json.loads(read_utf8(path / "spread.json"))
    if not rows or "reached/method" not in rows[0]:
        raise ValueError(
            f"--discovery {str(path)!r} was written by an older dfpo toy spread (no per-seed values in spread.json); run it again"
        )
    here = {"knob": knob, "values": [float(v) for v in values], "baseline": baseline, "method": method}
    there = {
        "knob": setup.get("knob"),
        "values": [float(v) for v in setup.get("values", [])],
        "baseline": setup.get("baseline"),
        "method": setup.get("method"),
    }
    cfg = setup.get("config", {})
    differ = [f"{k} ({there[k]!r} there, {here[k]!r} here)" for k in here if there[k] != here[k]]
    differ += [
        f"{k} ({cfg.get(k)!r} there, {getattr(base, k)!r} here)"
        for k in SPREAD_MUST_MATCH
        if k != knob and _plain(cfg.get(k)) != _plain(getattr(base, k))
    ]
    if differ:
        raise ValueError(f"--discovery {str(path)!r} is another sweep: it differs in {', '.join(differ)}")
    if cfg.get("seed") == base.seed:
        raise ValueError(
            f"--discovery {str(path)!r} used the same --seed {base.seed}: the same seeds are no replication; choose another --seed"
        )
    return rows, setup


def _plot(rows: list[dict], knob: str, path: Path, title: str) -> None:
    import matplotlib  # deferred: only the PNG writer needs it (~0.3 s), and it must get the Agg backend first

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    effects = [e for e in EFFECTS if e[0] in effect_keys(rows)]
    cells = intervals(rows)
    fig, axes = plt.subplots(1, len(effects), figsize=(3.6 * len(effects), 3.6), dpi=110, squeeze=False)
    x = np.array([r["spread"] for r in rows])
    for ax, (key, label, _) in zip(axes[0], effects):
        center = np.array([c[key][0].as_tuple()[0] for c in cells])
        low = np.array([c[key][0].low for c in cells])
        high = np.array([c[key][0].high for c in cells])
        finite = np.isfinite(center) & np.isfinite(low) & np.isfinite(high)  # an interval censoring leaves open is not drawn
        err = np.array([center - low, high - center])[:, finite]
        ax.errorbar(x[finite], center[finite], yerr=err, marker="o", capsize=4, ls="none")
        for r, xi, yi in zip(rows, x, center):
            if np.isfinite(yi):
                ax.annotate(f"{knob}={r[knob]:g}", (xi, yi), fontsize=7, xytext=(3, 3), textcoords="offset points")
        ax.axhline(0, color="grey", lw=0.8)
        ax.set_xscale("log")
        ax.set_xlabel("within-group std of log s_i")
        ax.set_title(f"difference in {label}", fontsize=9)
        ax.grid(alpha=0.3)
    fig.suptitle(f"{title}: paired difference and the table's Bonferroni-adjusted 95% interval", fontsize=10)
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)
