"""``log.param_drift`` across training, stored: the trainer's drift/* keys at every probed step of a few runs (one
per objective), kept as a small JSON under docs/probe/ so that the sentence and the figure about them are generated
from the store, never from a run folder and never typed.

    python -m dfpo.trainer.probe.across store runs/drift-smollm2/gspo runs/drift-smollm2/dfpo_min \\
        --out docs/probe/smollm2-drift.json --figure docs/figures/smollm2-drift.png

Each run's rows are its probed steps (those whose metrics line holds ``drift/shared_found``). What a figure contains
is the metric registry's (``dfpo.core.metric_registry``): found events are every (context, token) that two or more
members of a group hold after the same prefix (eq 2) in the step's first mini-batch, counted before the
``log.param_drift_events`` cap; direct, cross, momentum and decay add up to the first-order prediction of the trial
step's change of log pi (the batch's own gradient through the event's coefficients, the rest of the batch, the
optimiser's first moment from earlier steps, weight decay), and measured is the change a forward pass sees.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path

from ...core.loss.objectives import format_objective_label
from ..compare import read_metrics_rows
from ..run.layout import RunDir

KEYS = (
    "shared_found",
    "shared_found_whole",
    "shared_events",
    "equiv_pairs",
    "shared_direct",
    "shared_cross",
    "shared_momentum",
    "shared_decay",
    "shared_measured",
    "shared_predicted",
    "shared_error",
    "shared_error_ratio",
    "shared_batch_cross_share",
    "equiv_logodds_direct",
    "equiv_logodds_cross",
    "equiv_logodds_momentum",
    "equiv_logodds_measured",
    "equiv_logodds_predicted",
    "equiv_logodds_error",
    "equiv_logodds_error_ratio",
)
"""The drift/* keys a stored row keeps (a key a step did not log is left out of its row). A document stored before
the prediction and its error were kept has neither (``error_sentence`` says so)."""
PARTS = ("direct", "cross", "momentum", "decay", "measured")
"""The parts the figure draws for shared events, in this order."""


def probed_steps(run: Path) -> list[dict]:
    """One row per probed step of a finished run: its step and every KEYS value it logged (as drift/KEY)."""
    rows = read_metrics_rows(RunDir(run).metrics)
    out = []
    for r in rows:
        if not isinstance(r.get("drift/shared_found"), (int, float)):
            continue
        out.append({"step": int(r["step"]), **{k: float(r[f"drift/{k}"]) for k in KEYS if isinstance(r.get(f"drift/{k}"), (int, float))}})
    return out


def run_label(cfg) -> str:
    """The objective label of a run's config (name and overrides, as dfpo compare spells them)."""
    return format_objective_label(cfg.objective.name, cfg.objective.overrides)


def store(runs: list[Path], command: str) -> dict:
    """The document: the command that trained the runs and, per objective label, its seed and probed steps.
    ValueError naming a run without a probed step (trained without log.param_drift)."""
    from ..config import load_config

    doc = {"command": command, "runs": {}}
    for run in runs:
        steps = probed_steps(run)
        if not steps:
            raise ValueError(f"{run}: no probed step in its metrics.jsonl: train it with --set log.param_drift=true")
        cfg = load_config(str(RunDir(run).config), [])
        doc["runs"][run_label(cfg)] = {"seed": int(cfg.seed), "steps": steps}
    return doc


def found_per_step(doc: dict) -> list[float]:
    """Every probed step's found shared events, over all runs of the document."""
    return [row["shared_found"] for run in doc["runs"].values() for row in run["steps"]]


def summary_sentence(doc: dict) -> str:
    """What the stored runs say, generated: how many seeds they rest on, found shared events per probed step (median,
    range), equivalent pairs, the first-order error (or that the document does not store it), and each objective's mean
    shares of direct, cross and momentum in the shared events' first-order prediction."""
    found = found_per_step(doc)
    pairs = [row.get("equiv_pairs", 0.0) for run in doc["runs"].values() for row in run["steps"]]
    labels = ", ".join(f"`{label}`" for label in doc["runs"])
    steps = sorted({row["step"] for run in doc["runs"].values() for row in run["steps"]})
    seeds = sorted({run["seed"] for run in doc["runs"].values()})
    text = (
        f"`log.param_drift` in {len(doc['runs'])} training runs, one seed an objective ({'seed' if len(seeds) == 1 else 'seeds'} "
        f"{', '.join(map(str, seeds))}: no interval over seeds; {labels}; probed at steps {', '.join(map(str, steps))}) found "
        f"a median of {statistics.median(found):g} shared events a probed step (min {min(found):g}, max {max(found):g}, "
        f"{len(found)} probed steps) and {sum(1 for p in pairs if p > 0)} of {len(pairs)} probed steps had an equivalent pair. "
        + error_sentence(doc)
    )
    parts = []
    for label, run in doc["runs"].items():
        shares = _mean_shares(run["steps"])
        if shares:
            parts.append(f"`{label}` " + ", ".join(f"{k} {v:.2f}" for k, v in shares.items()))
    if parts:
        text += " Mean abs share of the shared events' first-order prediction over its probed steps: " + "; ".join(parts) + "."
    return text


def error_sentence(doc: dict) -> str:
    """The largest first-order error of the shared events over every stored probed step (error / mean abs measured), or
    that the document does not store the prediction and its error (stored before ``KEYS`` kept them)."""
    ratios = [row["shared_error_ratio"] for run in doc["runs"].values() for row in run["steps"] if "shared_error_ratio" in row]
    if not ratios:
        return (
            "The document stores neither the first-order prediction nor its error, so how far the parts below are from the "
            "measured change is not known (a document stored by this version keeps both)."
        )
    return f"The first-order prediction misses the shared events' measured change by at most {100 * max(ratios):.1f}% of it."


def _mean_shares(steps: list[dict]) -> dict[str, float]:
    """Direct, cross and momentum as shares of (direct + cross + momentum + decay), averaged over the probed steps whose sum is > 0."""
    shares = []
    for row in steps:
        total = sum(row.get(f"shared_{p}", 0.0) for p in ("direct", "cross", "momentum", "decay"))
        if total > 0:
            shares.append({p: row.get(f"shared_{p}", 0.0) / total for p in ("direct", "cross", "momentum")})
    return {p: statistics.fmean(s[p] for s in shares) for p in ("direct", "cross", "momentum")} if shares else {}


def plot(doc: dict, path: Path) -> None:
    """Per objective, the shared events' mean abs direct, cross, momentum, decay and measured change at each probed step."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    runs = doc["runs"]
    fig, axes = plt.subplots(1, len(runs), figsize=(3.6 * len(runs), 3.2), dpi=110, sharey=True, squeeze=False)
    for ax, (label, run) in zip(axes[0], runs.items()):
        steps = [row["step"] for row in run["steps"]]
        for part in PARTS:
            ax.plot(steps, [row.get(f"shared_{part}", float("nan")) for row in run["steps"]], marker="o", label=part)
        ax.set_title(f"{label} (seed {run['seed']})", fontsize=9)
        ax.set_xlabel("training step")
        ax.set_yscale("symlog", linthresh=1e-4)
    axes[0][0].set_ylabel("mean abs change of log pi, shared events")
    axes[0][-1].legend(fontsize=7)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path)
    plt.close(fig)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m dfpo.trainer.probe.across", description=__doc__.split("\n\n")[0])
    sub = p.add_subparsers(dest="cmd", required=True)
    s = sub.add_parser("store", help="store the probed steps of finished runs as one JSON document (and draw its figure)")
    s.add_argument("runs", nargs="+", type=Path)
    s.add_argument("--command", required=True, help="the command that trained the runs, as the document records it")
    s.add_argument("--out", type=Path, required=True)
    s.add_argument("--figure", type=Path, default=None)
    args = p.parse_args(argv)
    try:
        doc = store(args.runs, args.command)
    except ValueError as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    args.out.write_text(json.dumps(doc, indent=2) + "\n", encoding="utf-8")
    if args.figure:
        plot(doc, args.figure)
    print(summary_sentence(doc))
    return 0


if __name__ == "__main__":
    sys.exit(main())
