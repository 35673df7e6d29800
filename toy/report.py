"""Run folders of the toy lab: per-step metrics, a markdown summary with bootstrap intervals, PNG curves.

Layout of a run folder::

    config.json         the ToyConfig and the task's shape
    metrics.jsonl       one line per objective, seed and step, every metric
    metrics_mean.csv    per objective and step, each metric's mean over seeds
    summary.md          summary table (mean [95% bootstrap CI] over seeds) and the paper checks
    reward.png, tax.png, equiv_entropy.png, asym.png, overview.png

The paper checks compare a DFPO variant with GSPO on paired seeds (same seed index, same
initial noise): "reproduced" when the 95% bootstrap interval of the paired difference lies on
the predicted side of 0, "contradicted" when it lies on the other side, else "inconclusive".
"""

from __future__ import annotations

import csv
import dataclasses
import json
from pathlib import Path

import numpy as np

from dfpo.toy.metrics import bootstrap_ci
from dfpo.trainer.metrics import jitter2, steps_to

PLOTS = {
    "reward": ("reward", "expected reward E[R]"),
    "tax": ("tax/kl_cum", "learning tax: cumulative KL at template rows"),
    "equiv_entropy": ("equiv/entropy", "entropy over the equivalent correct answers (nats)"),
    "asym": ("asym", "Asym (eq 23): within-group Var of w_i A_i (rolling mean, 10 steps)"),
}
YLABELS = {"reward": "E[R]", "tax/kl_cum": "cumulative KL", "equiv/entropy": "entropy (nats)", "asym": "Asym"}
SMOOTH = {"asym": 10}
"""Metrics drawn as a trailing rolling mean (window in steps): per-step values are very noisy."""
STYLES = ("-", "--", ":", "-.")


def to_numpy(results: dict) -> dict[str, dict[str, np.ndarray]]:
    """{objective: {metric: (steps, S) array}} from torch tensors."""
    return {o: {k: v.detach().cpu().numpy().astype(float) for k, v in h.items()} for o, h in results.items()}


def summarise(results: dict[str, dict[str, np.ndarray]], kappa: float) -> dict[str, dict[str, object]]:
    """Per objective: per-seed summary values (arrays over seeds) of the run."""
    out = {}
    for name, h in results.items():
        reward = h["reward"].T  # (S, steps)
        steps, reached = steps_to(reward, kappa)
        row = {
            "steps_to_kappa": steps,
            "reached": reached,
            "final_reward": reward[:, -1],
            "mean_reward": reward.mean(-1),
            "tax_kl_cum": h["tax/kl_cum"][-1],
            "tax_kl_init": h["tax/kl_init"][-1],
            "asym": h["asym"].mean(0),
            "tax_at_kappa": h["tax/kl_cum"][np.minimum(steps.astype(int), reward.shape[1]) - 1, np.arange(reward.shape[0])],
            "clip_frac": (h["clip/frac_low"] + h["clip/frac_high"]).mean(0),
        }
        if jitter2(reward) is not None:  # eq 20 needs 3 points or more
            row["jitter2_reward"] = jitter2(reward)
        if "residual/shared_net" in h:  # ratio of sums over the run: updates with no shared event or zero gradient do not dilute it
            gross = h["residual/shared_gross"].sum(0)
            row["residual_rel"] = np.where(gross > 0, h["residual/shared_net"].sum(0) / np.maximum(gross, 1e-300), 0.0)
        for key, col in (
            ("equiv/entropy", "final_equiv_entropy"),
            ("equiv/logodds", "final_equiv_logodds"),
            ("entropy/sequence", "final_entropy"),
            ("energy/frequent", "energy_frequent"),
        ):
            if key in h:
                row[col] = h[key][-1] if key.startswith(("equiv", "entropy")) else h[key].mean(0)
        out[name] = row
    return out


COLUMNS = [
    ("steps_to_kappa", "Steps(R>=kappa) eq 19", "{:.1f}"),
    ("jitter2_reward", "Jitter2(R) eq 20", "{:.2e}"),
    ("final_reward", "final E[R]", "{:.3f}"),
    ("mean_reward", "mean E[R] over steps", "{:.3f}"),
    ("tax_kl_cum", "tax: cum. KL", "{:.2e}"),
    ("tax_kl_init", "tax: KL to init", "{:.2e}"),
    ("tax_at_kappa", "tax paid to reach kappa", "{:.2e}"),
    ("final_equiv_entropy", "equiv-set entropy", "{:.3f}"),
    ("final_equiv_logodds", "equiv log-odds", "{:+.2f}"),
    ("final_entropy", "sequence entropy", "{:.3f}"),
    ("asym", "Asym eq 23 (mean)", "{:.2e}"),
    ("residual_rel", "shared-token residual (net/gross)", "{:.3f}"),
    ("energy_frequent", "Energy(frequent) eq 24", "{:.3f}"),
    ("clip_frac", "clipped fraction", "{:.3f}"),
]


def _cell(values: np.ndarray, fmt: str) -> str:
    mean, lo, hi = bootstrap_ci(values)
    return f"{fmt.format(mean)} [{fmt.format(lo)}, {fmt.format(hi)}]"


def summary_table(summary: dict[str, dict[str, object]]) -> str:
    """Markdown table: one row per objective, mean [95% bootstrap CI] over seeds."""
    cols = [c for c in COLUMNS if all(c[0] in s for s in summary.values())]
    lines = ["| objective | " + " | ".join(c[1] for c in cols) + " |", "|---" * (len(cols) + 1) + "|"]
    for name, s in summary.items():
        cells = [_cell(s[key], fmt) for key, _, fmt in cols]
        n_reached, n = int(np.sum(s["reached"])), len(s["reached"])
        cells[0] += f" ({n_reached}/{n} reached)" if cols[0][0] == "steps_to_kappa" else ""
        lines.append(f"| {name} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


# Predictions of the paper, as (summary key, direction of DFPO - GSPO, what the paper says).
PREDICTIONS = [
    ("steps_to_kappa", -1, "Prediction 1 (eq 19): DFPO reaches the reward threshold in fewer steps"),
    ("jitter2_reward", -1, "Prediction 2 (eq 21): DFPO's reward curve jitters less"),
    ("final_reward", +1, "Prediction 3 (eq 22): DFPO's final reward is higher"),
    ("tax_kl_cum", -1, "Prop. 3.1: DFPO pays less learning tax (drift at reward-irrelevant template rows)"),
    ("tax_at_kappa", -1, "Prop. 3.1 at matched progress: DFPO pays less tax to reach the reward threshold"),
    ("final_equiv_entropy", +1, "Cor. 3.2: DFPO keeps more entropy over the equivalent correct answers"),
]


NEGLIGIBLE = 0.02
"""A paired difference smaller than this fraction of the baseline's mean is called negligible."""


def paired_verdict(diff: np.ndarray, direction: int, baseline: float | None = None) -> tuple[str, tuple[float, float, float]]:
    """'reproduced' / 'contradicted' / 'inconclusive' from the bootstrap CI of a paired difference;
    'negligible' when |mean difference| < NEGLIGIBLE * |baseline mean| (significant or not)."""
    mean, lo, hi = bootstrap_ci(diff)
    if np.allclose(diff, 0, atol=1e-12):
        return "inconclusive (no difference)", (mean, lo, hi)
    if baseline is not None and abs(mean) < NEGLIGIBLE * abs(baseline):
        return f"negligible (< {NEGLIGIBLE:.0%} of the baseline)", (mean, lo, hi)
    low_side, high_side = (lo, hi) if direction > 0 else (-hi, -lo)  # the interval of direction * diff
    if low_side > 0:
        return "reproduced", (mean, lo, hi)
    if high_side < 0:
        return "contradicted", (mean, lo, hi)
    return "inconclusive", (mean, lo, hi)


def _specs(labels, config) -> dict:
    from dfpo.trainer.loss import objective_from_label

    return {o: objective_from_label(o, **dict(getattr(config, "overrides", {}) or {})) for o in labels}


def comparison_pairs(labels, config) -> list[tuple[str, str, list[str]]]:
    """(method, baseline, unmatched components) for every DFPO label: each matched GSPO-family control
    of the run, and plain ``gspo`` too when it is not matched (the comparison a reader would make).

    A baseline is a sequence-level objective without an in-group transform (gspo, gspo_noclip, gspo with
    overrides). The pair is a matched control when ``unmatched`` is empty: same clip range and
    stop-gradient form (the score form counts as no clipping), aggregation, advantage scale, token mask
    and KL weight. The learning rate and seeds are the run's, shared by every objective.
    """
    from dfpo.trainer.loss import unmatched_components

    specs = _specs(labels, config)
    methods = [o for o, sp in specs.items() if sp.transform != "none"]
    baselines = [o for o, sp in specs.items() if sp.transform == "none" and sp.ratio_level == "sequence"]
    pairs = [(m, b, unmatched_components(specs[m], specs[b])) for m in methods for b in baselines]
    return [(m, b, u) for m, b, u in pairs if not u or b == "gspo"]


def prediction_checks(summary: dict[str, dict[str, object]], config=None) -> list[str]:
    """Markdown lines: each paper prediction checked for every DFPO variant against every GSPO-family
    baseline of the run. Only a matched control can reproduce or contradict a prediction; against an
    unmatched baseline the verdict reads "not attributable" (the difference may come from the trust
    region, not from the transform)."""
    pairs = comparison_pairs(list(summary), config)
    if not pairs:
        return ["(no check: needs a dfpo_* objective and a GSPO-family baseline (gspo, gspo_noclip) in the run)"]
    lines = [
        "| prediction | method | baseline | matched control? | paired difference (method - baseline) [95% CI] | verdict |",
        "|---|---|---|---|---|---|",
    ]
    for key, direction, text in PREDICTIONS:
        for m, b, unmatched in pairs:
            if key not in summary[b]:
                continue
            base = np.asarray(summary[b][key], float)
            diff = np.asarray(summary[m][key], float) - base
            verdict, (mean, lo, hi) = paired_verdict(diff, direction, float(base.mean()))
            match = "yes" if not unmatched else "no: " + ", ".join(unmatched)
            if unmatched and verdict in ("reproduced", "contradicted"):
                verdict = f"not attributable ({verdict} against an unmatched baseline)"
            lines.append(f"| {text} | {m} | {b} | {match} | {mean:+.3g} [{lo:+.3g}, {hi:+.3g}] | {verdict} |")
    return lines


def auto_notes(config, summary: dict[str, dict[str, object]]) -> list[str]:
    """Plain-language notes that explain the table (computed from the run, not hard-coded verdicts)."""
    from dfpo.trainer.loss import objective_from_label

    notes = []
    aggs = {o: objective_from_label(o, **dict(config.overrides)).aggregation for o in summary}
    if len(set(aggs.values())) > 1:
        notes.append(
            "- The objectives aggregate differently (" + ", ".join(f"{o}: {a}" for o, a in aggs.items()) + "). At one learning rate "
            "a token sum takes steps about L times larger than a per-sequence token mean, so speed and drift differences between "
            "aggregations are partly step-size differences; compare objectives that share an aggregation, or tune lr per objective."
        )
    mean = lambda o, k: float(np.mean(summary[o][k]))  # noqa: E731
    if config.inner_steps == 1:
        notes.append(
            "- K = 1: every ratio is 1 at the only update of each batch, so DFPO's transforms are the identity and DFPO trains exactly as GSPO."
        )
    taxes = {o: mean(o, "tax_kl_cum") for o in summary}
    if all(abs(t) < 1e-8 for t in taxes.values()):
        notes.append(
            "- No objective moved the template rows (cumulative KL < 1e-8 for all). The template choice is independent of everything the "
            "sequence weights depend on (its contexts merge into the same next state), so the expected gradient there is zero for every "
            "objective, GSPO included: in this setting the learning tax of sampled runs is finite-group noise, not a systematic drift."
        )
    if "residual_rel" in summary.get("gspo", {}):
        res = {o: mean(o, "residual_rel") for o in summary if "residual_rel" in summary[o]}
        notes.append(
            "- Shared-token cancellation (eq 2), measured directly on the events where a whole group shares a context-token pair: "
            + ", ".join(f"{o} {r:.3f}" for o, r in res.items())
            + " (sum over the run of |sum_i coef_i| over sum_i |coef_i|; 0 = exact cancellation). This is the paper's mechanism; whether "
            "it turns into more drift depends on how far each objective moves the policy (the tax columns)."
        )
    if config.mode == "exact":
        notes.append(
            "- Exact mode is the infinite-group limit: advantages use the policy's own mean and std, every completion is weighted by "
            "pi_old(y), Min-Replace takes the minimum over the whole support. Even plain policy gradient on a softmax moves mass towards "
            "the more likely of two equally good answers (d z_a ~ pi_a A), so some equivalent-set entropy loss is not specific to any objective."
        )
    for o in summary:
        spec_clip = mean(o, "clip_frac")
        if o == "gspo" and spec_clip > 0.1:
            notes.append(
                f"- {o} clips {spec_clip:.0%} of its sequences on average (the GSPO paper's clip range 3e-4 / 4e-4): after the first inner "
                "step most of its gradient is clipped away. Ratio-form DFPO (the default, eqs 59-62) keeps exactly that clipping, so at this "
                "range it can differ from GSPO only on the few unclipped sequences. Score-form DFPO (stopgrad=score, eq 68) keeps a gradient "
                "on clipped sequences: it has no trust region there, and its matched control is gspo_noclip, not gspo."
            )
    if config.task == "tenplusten" and all("final_equiv_entropy" in s for s in summary.values()):
        notes.append(
            "- In tenplusten the equivalent-set entropy also falls for a legitimate reason: while '25' is still likely, the context 'The' "
            "can still lead to a wrong answer and '10' cannot, so the policy gradient itself moves mass to '10 + 10 = 20 .' before the "
            "rewards saturate (after that every advantage is 0 and the entropy freezes). The family task, where every correct form is "
            "chosen at the same context as the wrong ones, isolates the objective-induced drift of Cor. 3.2 better."
        )
    return notes


def plot_curves(results: dict[str, dict[str, np.ndarray]], out: Path, title: str) -> list[Path]:
    """One PNG per metric of PLOTS (a curve per objective, band = mean +- 1.96 s.e. over seeds) and an overview."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    written = []
    keys = [(fname, key, label) for fname, (key, label) in PLOTS.items() if all(key in h for h in results.values())]
    colors = plt.get_cmap("tab10")

    def draw(ax, key, label):
        for i, (name, h) in enumerate(results.items()):
            y = h[key]  # (steps, S)
            window = SMOOTH.get(key, 1)
            if window > 1 and y.shape[0] >= window:
                c = np.cumsum(np.vstack([np.zeros((1, y.shape[1])), y]), axis=0)
                y = np.vstack([c[1:window] / np.arange(1, window)[:, None], (c[window:] - c[:-window]) / window])
            x = np.arange(1, y.shape[0] + 1)
            mean = y.mean(1)
            half = 1.96 * y.std(1, ddof=1) / np.sqrt(y.shape[1]) if y.shape[1] > 1 else np.zeros_like(mean)
            ax.plot(x, mean, color=colors(i % 10), label=name, lw=1.6, ls=STYLES[i % len(STYLES)])
            ax.fill_between(x, mean - half, mean + half, color=colors(i % 10), alpha=0.2, lw=0)
        ax.set_xlabel("step (rollout batch)")
        ax.set_ylabel(YLABELS.get(key, key), fontsize=9)
        ax.grid(alpha=0.3)

    for fname, key, label in keys:
        fig, ax = plt.subplots(figsize=(7, 4.2), dpi=110)
        draw(ax, key, label)
        ax.set_title(f"{title}\n{label}", fontsize=10)
        ax.legend(fontsize=8, ncol=2)
        fig.tight_layout()
        path = out / f"{fname}.png"
        fig.savefig(path)
        plt.close(fig)
        written.append(path)
    if keys:
        fig, axes = plt.subplots(2, 2, figsize=(12, 8), dpi=100)
        for ax, (_, key, label) in zip(axes.flat, keys):
            draw(ax, key, label)
            ax.set_title(label, fontsize=10)
        for ax in list(axes.flat)[len(keys) :]:
            ax.axis("off")
        handles, labels = axes.flat[0].get_legend_handles_labels()
        fig.legend(handles, labels, loc="lower center", ncol=min(len(labels), 6), fontsize=9)
        fig.suptitle(f"{title} (band: mean +- 1.96 s.e. over seeds)", fontsize=11)
        fig.tight_layout(rect=(0, 0.05, 1, 0.96))
        path = out / "overview.png"
        fig.savefig(path)
        plt.close(fig)
        written.append(path)
    return written


def write_metrics(results: dict[str, dict[str, np.ndarray]], out: Path) -> None:
    """metrics.jsonl (every objective, seed, step) and metrics_mean.csv (means over seeds)."""
    with open(out / "metrics.jsonl", "w") as f:
        for name, h in results.items():
            keys = sorted(h)
            steps, seeds = h[keys[0]].shape
            for s in range(seeds):
                for t in range(steps):
                    rec = {"objective": name, "seed": s, "step": t + 1}
                    rec.update({k: float(h[k][t, s]) for k in keys})
                    f.write(json.dumps(rec) + "\n")
    keys = sorted({k for h in results.values() for k in h})
    with open(out / "metrics_mean.csv", "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(["objective", "step", *keys])
        for name, h in results.items():
            steps = next(iter(h.values())).shape[0]
            for t in range(steps):
                w.writerow([name, t + 1, *[f"{h[k][t].mean():.6g}" if k in h else "" for k in keys]])


def write_run(out: Path, config, task, results: dict, *, findings: list[str] | None = None, plots: bool = True) -> Path:
    """Write the whole run folder; return the path of summary.md."""
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    res = to_numpy(results)
    cfg = dataclasses.asdict(config)
    cfg["task_shape"] = {"prompts": len(task.prompts), "rows": task.n_rows, "vocab": len(task.vocab), "max_len": task.max_len}
    (out / "config.json").write_text(json.dumps(cfg, indent=2, default=str) + "\n")
    write_metrics(res, out)
    summary = summarise(res, config.kappa)
    title = f"toy {config.task} ({config.mode}), G={config.group_size}, K={config.inner_steps}, {config.optimizer} lr={config.lr}, {config.seeds} seeds"
    lines = [
        f"# {title}",
        "",
        f"Steps: {config.steps}; kappa = {config.kappa}; every cell is the mean over seeds with its 95% percentile bootstrap interval.",
        "E[R] is the exact expected reward of the policy (enumeration), not the sampled batch mean.",
        "",
        summary_table(summary),
        "",
        "## The paper's predictions in this toy (paired over seeds, DFPO variant vs each GSPO-family baseline)",
        "",
        *prediction_checks(summary, config),
        "",
        "Only a matched control (same clip range and stop-gradient form, aggregation, advantage scale; lr and seeds are shared",
        "by the whole run) can reproduce or contradict a prediction. A difference that shows against an unmatched baseline and",
        "not against the matched one comes from the trust region, not from cancellation.",
        "A prediction that is not reproduced here is a finding about this toy, not a failure of the run.",
    ]
    notes = auto_notes(config, summary) + list(findings or [])
    if notes:
        lines += ["", "## Notes", "", *notes]
    if plots:
        written = plot_curves(res, out, title)
        lines += ["", "## Plots", "", *[f"![{p.stem}]({p.name})" for p in written]]
    path = out / "summary.md"
    path.write_text("\n".join(lines) + "\n")
    return path
