"""Run folders of the toy lab: per-step metrics, a markdown summary with Student-t intervals, PNG curves.

Layout of a run folder::

    config.json         the ToyConfig and the task's shape
    metrics.jsonl       one line per objective, seed and step, every metric
    metrics_mean.csv    per objective and step, each metric's mean over seeds
    summary.md          summary table (mean [95% t-interval] over seeds) and the paper checks
    reward.png, tax.png, equiv_entropy.png, asym.png, overview.png

The paper checks compare a DFPO variant with GSPO on paired seeds (same seed index, same
initial noise) with ``dfpo.core.stats``: a Student-t interval of the paired difference,
Bonferroni-adjusted over every check the table shows; "negligible" when that interval lies
within 2% of the baseline's mean, "reproduced" when it lies on the predicted side of 0,
"contradicted" on the other side, else "inconclusive". Given the run folder of the same command
on a disjoint seed set (``--discovery``), each check also shows that set's verdict and whether
the two agree (a statement is only written down when it replicates).
"""

from __future__ import annotations

import csv
import dataclasses
import json
from pathlib import Path

import numpy as np

from ..core import stats
from ..core.files import naming_write_errors, read_utf8, write_text_atomic
from ..core.loss import objective_from_label, unmatched_components
from ..core.metrics import jitter2, steps_to
from . import layout
from .config import ToyConfig
from .metric_names import RENAMED

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
    mean, lo, hi = stats.paired_interval(values).as_tuple()
    return f"{fmt.format(mean)} [{fmt.format(lo)}, {fmt.format(hi)}]"


def summary_table(summary: dict[str, dict[str, object]]) -> str:
    """Markdown table: one row per objective, mean [95% Student-t interval] over seeds (descriptive, not tests)."""
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


NEGLIGIBLE = stats.NEGLIGIBLE
"""A paired difference whose adjusted interval lies within this fraction of the baseline's mean is negligible."""


def paired_verdict(
    diff: np.ndarray, direction: int, baseline: float | None = None, *, tests: int = 1
) -> tuple[str, tuple[float, float, float]]:
    """The verdict of ``dfpo.core.stats.verdict`` on the Student-t interval of a paired difference,
    Bonferroni-adjusted over ``tests``: 'negligible (within 2% of the baseline)', 'reproduced',
    'contradicted' or 'inconclusive'; 'inconclusive (no difference)' when every difference is 0."""
    interval = stats.paired_interval(diff, tests=tests)
    if np.allclose(diff, 0, atol=1e-12):
        return "inconclusive (no difference)", interval.as_tuple()
    word = stats.verdict(interval, direction, baseline, NEGLIGIBLE)
    if word == "negligible":
        word = f"negligible (within {NEGLIGIBLE:.0%} of the baseline)"
    return word, interval.as_tuple()


CLAIMS = ("reproduced", "contradicted", "negligible")
"""Verdict words that state something (and so must replicate on a second seed set)."""


def replicated(first: str, second: str) -> str:
    """'yes' when two seed sets give the same claim, 'no' when they differ, 'n/a' when neither claims anything."""
    claim = lambda v: next((w for w in CLAIMS if w in v), None)  # noqa: E731  'not attributable (reproduced ...)' claims 'reproduced'
    a, b = claim(first), claim(second)
    if a is None and b is None:
        return "n/a"
    return "yes" if a == b and ("not attributable" in first) == ("not attributable" in second) else "no"


def _specs(labels, config) -> dict:
    return {o: objective_from_label(o, **dict(getattr(config, "overrides", {}) or {})) for o in labels}


def comparison_pairs(labels, config) -> list[tuple[str, str, list[str]]]:
    """(method, baseline, unmatched components) for every DFPO label: each matched GSPO-family control
    of the run, and plain ``gspo`` too when it is not matched (the comparison a reader would make).

    A baseline is a sequence-level objective without an in-group transform (gspo, gspo_noclip, gspo with
    overrides). The pair is a matched control when ``unmatched`` is empty: same clip range and
    stop-gradient form (the score form counts as no clipping), aggregation, advantage scale, token mask
    and KL weight. The learning rate and seeds are the run's, shared by every objective.
    """
    specs = _specs(labels, config)
    methods = [o for o, sp in specs.items() if sp.transform != "none"]
    baselines = [o for o, sp in specs.items() if sp.transform == "none" and sp.ratio_level == "sequence"]
    pairs = [(m, b, unmatched_components(specs[m], specs[b])) for m in methods for b in baselines]
    return [(m, b, u) for m, b, u in pairs if not u or b == "gspo"]


def _check_rows(summary: dict[str, dict[str, object]], config) -> list[tuple[str, str, str, list[str], int, str, np.ndarray, float]]:
    """(prediction text, method, baseline, unmatched, direction, key, paired difference, baseline mean) of every check."""
    rows = []
    for key, direction, text in PREDICTIONS:
        for m, b, unmatched in comparison_pairs(list(summary), config):
            if key not in summary[b] or key not in summary[m]:
                continue
            base = np.asarray(summary[b][key], float)
            rows.append((text, m, b, unmatched, direction, key, np.asarray(summary[m][key], float) - base, float(base.mean())))
    return rows


def _judge(diff: np.ndarray, direction: int, base: float, unmatched: list[str], tests: int) -> tuple[str, tuple[float, float, float]]:
    verdict, ci = paired_verdict(diff, direction, base, tests=tests)
    if unmatched and verdict in ("reproduced", "contradicted"):
        verdict = f"not attributable ({verdict} against an unmatched baseline)"
    return verdict, ci


def _seed_set(config, n: int) -> str:
    return f"--seed {getattr(config, 'seed', '?')}, {n} seeds"


def prediction_checks(summary: dict[str, dict[str, object]], config=None, discovery=None) -> list[str]:
    """Markdown lines: each paper prediction checked for every DFPO variant against every GSPO-family
    baseline of the run. Only a matched control can reproduce or contradict a prediction; against an
    unmatched baseline the verdict reads "not attributable" (the difference may come from the trust
    region, not from the transform).

    Every interval is Bonferroni-adjusted over the checks of the table. ``discovery`` = (summary,
    config) of the same experiment on a disjoint seed set: its verdict stands beside each check,
    with 'replicated?' (the same claim on both sets)."""
    rows = _check_rows(summary, config)
    if not rows:
        return ["(no check: needs a dfpo_* objective and a GSPO-family baseline (gspo, gspo_noclip) in the run)"]
    tests = len(rows)
    n = len(rows[0][6])
    earlier = {}
    if discovery is not None:
        d_summary, d_config = discovery
        d_rows = _check_rows(d_summary, d_config)
        earlier = {(r[0], r[1], r[2]): _judge(r[6], r[4], r[7], r[3], len(d_rows))[0] for r in d_rows}
        d_n = len(d_rows[0][6]) if d_rows else 0
    head = f"| prediction | method | baseline | matched control? | paired difference (method - baseline) [adjusted CI] (relative to the baseline) | verdict ({_seed_set(config, n)}) |"
    lines = [
        f"Intervals: {stats.interval_note(tests)}.",
        "",
        head + (f" verdict on the discovery set ({_seed_set(d_config, d_n)}) | replicated? |" if discovery is not None else ""),
        "|---" * (6 + 2 * (discovery is not None)) + "|",
    ]
    for text, m, b, unmatched, direction, _key, diff, base in rows:
        verdict, (mean, lo, hi) = _judge(diff, direction, base, unmatched, tests)
        rel = stats.relative(stats.Interval(mean, lo, hi, n, 0.95, tests), base)
        match = "yes" if not unmatched else "no: " + ", ".join(unmatched)
        line = f"| {text} | {m} | {b} | {match} | {mean:+.3g} [{lo:+.3g}, {hi:+.3g}]{rel} | {verdict} |"
        if discovery is not None:
            before = earlier.get((text, m, b), "not checked")
            line += f" {before} | {replicated(before, verdict)} |"
        lines.append(line)
    return lines


def auto_notes(config, summary: dict[str, dict[str, object]]) -> list[str]:
    """Plain-language notes that explain the table (computed from the run, not hard-coded verdicts)."""
    notes = []
    aggs = {o: objective_from_label(o, **dict(config.overrides)).aggregation for o in summary}
    if len(set(aggs.values())) > 1:
        notes.append(
            "- The objectives aggregate differently (" + ", ".join(f"{o}: {a}" for o, a in aggs.items()) + "). At one learning rate "
            "a token sum takes steps about L times larger than a per-sequence token mean, so speed and drift differences between "
            "aggregations are partly step-size differences; compare objectives that share an aggregation, or tune lr per objective."
        )
    specs = {o: objective_from_label(o, **dict(config.overrides)) for o in summary}
    shrunk = [o for o, sp in specs.items() if sp.length_aware and sp.transform == "min"]
    if shrunk:
        notes.append(
            f"- {', '.join(shrunk)}: length-aware Min-Replace sets stilde_i = L_i min_j (sbar_j / L_j) <= sbar_i, which at ratios near 1 "
            "is L_i / (the group's longest length): every sequence but the longest of its group takes a smaller step than under its "
            "matched control. It cancels shared tokens at unequal lengths, but its differences in speed, tax and entropy are also "
            "those of a smaller step, so they are not attributable to cancellation alone."
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
                f"- {o} clips {spec_clip:.0%} of its sequences on average over the inner steps (the GSPO paper's clip range 3e-4 / 4e-4; "
                "the first inner step, at ratio 1, clips none), and a clipped sequence gets no gradient. Ratio-form DFPO (the default, "
                "eqs 59-62) keeps exactly that clipping, so at this range it can differ from GSPO only on the unclipped sequences. "
                "Score-form DFPO (stopgrad=score, eq 68) keeps a gradient on clipped sequences: it has no trust region there, and its "
                "matched control is gspo_noclip, not gspo."
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
    import matplotlib  # deferred: only the PNG writer needs it (~0.3 s), and it must get the Agg backend first

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
        fig, ax = plt.subplots(figsize=(7, 4.2), dpi=110, layout="constrained")
        draw(ax, key, label)
        ax.set_title(f"{title}\n{label}", fontsize=10)
        legend_below(fig, *ax.get_legend_handles_labels(), fontsize=8)
        path = out / f"{fname}.png"
        fig.savefig(path)
        plt.close(fig)
        written.append(path)
    if keys:
        fig, axes = plt.subplots(2, 2, figsize=(12, 8), dpi=100, layout="constrained")
        for ax, (_, key, label) in zip(axes.flat, keys):
            draw(ax, key, label)
            ax.set_title(label, fontsize=10)
        for ax in list(axes.flat)[len(keys) :]:
            ax.axis("off")
        legend_below(fig, *axes.flat[0].get_legend_handles_labels(), fontsize=9)
        fig.suptitle(f"{title} (band: mean +- 1.96 s.e. over seeds)", fontsize=11)
        path = out / layout.OVERVIEW
        fig.savefig(path)
        plt.close(fig)
        written.append(path)
    return written


def legend_below(fig, handles, labels, *, fontsize: float, max_columns: int = 6):
    """A legend under the axes of ``fig`` (a constrained layout makes room for it), in as many columns as fit
    the figure's width: a row of long labels (``dfpo_min:eps_low=0.2:eps_high=0.2``) ran off the canvas and was cut."""
    renderer = fig.canvas.get_renderer()
    for ncol in range(min(len(labels), max_columns), 0, -1):
        legend = fig.legend(handles, labels, loc="outside lower center", ncol=ncol, fontsize=fontsize)
        if ncol == 1 or legend.get_window_extent(renderer).width <= 0.98 * fig.bbox.width:
            return legend
        legend.remove()
    return None


def write_metrics(results: dict[str, dict[str, np.ndarray]], out: Path) -> None:
    """metrics.jsonl (every objective, seed, step) and metrics_mean.csv (means over seeds)."""
    with naming_write_errors(out / layout.METRICS), open(out / layout.METRICS, "w") as f:
        for name, h in results.items():
            keys = sorted(h)
            steps, seeds = h[keys[0]].shape
            for s in range(seeds):
                for t in range(steps):
                    rec = {"objective": name, "seed": s, "step": t + 1}
                    rec.update({k: float(h[k][t, s]) for k in keys})
                    f.write(json.dumps(rec) + "\n")
    keys = sorted({k for h in results.values() for k in h})
    with naming_write_errors(out / layout.METRICS_MEAN), open(out / layout.METRICS_MEAN, "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(["objective", "step", *keys])
        for name, h in results.items():
            steps = next(iter(h.values())).shape[0]
            for t in range(steps):
                w.writerow([name, t + 1, *[f"{h[k][t].mean():.6g}" if k in h else "" for k in keys]])


def read_metrics(out: Path) -> dict[str, dict[str, np.ndarray]]:
    """The inverse of ``write_metrics``: {objective: {metric: (steps, S) array}} from OUT/metrics.jsonl (keys of
    RENAMED under their new names)."""
    import math

    cells: dict[str, dict[str, dict[tuple[int, int], float]]] = {}
    for line in read_utf8(Path(out) / layout.METRICS).splitlines():
        if line.strip():
            rec = json.loads(line)
            by_key = cells.setdefault(rec.pop("objective"), {})
            seed, step = rec.pop("seed"), rec.pop("step")
            for key, value in rec.items():
                by_key.setdefault(RENAMED.get(key, key), {})[(step - 1, seed)] = value
    results = {}
    for name, by_key in cells.items():
        results[name] = {}
        for key, vals in by_key.items():
            steps, seeds = max(t for t, _ in vals) + 1, max(s for _, s in vals) + 1
            arr = np.full((steps, seeds), math.nan)
            for (t, s), v in vals.items():
                arr[t, s] = v
            if np.isnan(arr).any():
                raise ValueError(f"{out}/metrics.jsonl is incomplete: {name} {key} misses {int(np.isnan(arr).sum())} (step, seed) values")
            results[name][key] = arr
    return results


DISCOVERY_MUST_MATCH = ("task", "task_options", "objectives", "overrides", "mode", "steps", "group_size", "inner_steps", "minibatches")
DISCOVERY_MUST_MATCH += ("groups_per_step", "optimizer", "lr", "init_noise", "kappa")


def read_discovery(path, config) -> tuple[dict[str, dict[str, object]], object]:
    """(per-seed summary, ToyConfig) of an earlier run folder of the same experiment on a disjoint seed set.

    ValueError, before any training, when the folder is not a toy run, differs from ``config`` in
    anything but the seed set, or used the same ``--seed`` (the same seeds: not a replication).
    """
    import dataclasses as dc

    path = Path(path)
    if not (path / layout.CONFIG).is_file() or not (path / layout.METRICS).is_file():
        raise ValueError(f"--discovery {str(path)!r}: no config.json and metrics.jsonl in it; is it a dfpo toy run folder?")
    raw = json.loads(read_utf8(path / layout.CONFIG))
    known = {f.name for f in dc.fields(ToyConfig)}
    raw = {k: v for k, v in raw.items() if k in known}
    raw["objectives"] = tuple(raw.get("objectives", ()))
    earlier = ToyConfig(**raw)
    differ = [k for k in DISCOVERY_MUST_MATCH if _plain(getattr(earlier, k)) != _plain(getattr(config, k))]
    if differ:
        raise ValueError(
            f"--discovery {str(path)!r} is another experiment: it differs in {', '.join(f'{k} ({getattr(earlier, k)!r} there, {getattr(config, k)!r} here)' for k in differ)}"
        )
    if earlier.seed == config.seed:
        raise ValueError(
            f"--discovery {str(path)!r} used the same --seed {config.seed}: the same seeds are no replication; choose another --seed"
        )
    return summarise(read_metrics(path), earlier.kappa), earlier


def _plain(value):
    """Comparable form of a config value (mappings as sorted items, sequences as tuples)."""
    if isinstance(value, dict) or hasattr(value, "items"):
        return tuple(sorted((k, _plain(v)) for k, v in dict(value).items()))
    if isinstance(value, (list, tuple)):
        return tuple(_plain(v) for v in value)
    return value


def write_run(out: Path, config, task, results: dict, *, findings: list[str] | None = None, plots: bool = True, discovery=None) -> Path:
    """Write the whole run folder; return the path of summary.md. ``discovery``: ``read_discovery``'s pair."""
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    res = to_numpy(results)
    cfg = dataclasses.asdict(config)
    cfg["task_shape"] = {"prompts": len(task.prompts), "rows": task.n_rows, "vocab": len(task.vocab), "max_len": task.max_len}
    write_text_atomic(out / layout.CONFIG, json.dumps(cfg, indent=2, default=str) + "\n")
    write_metrics(res, out)
    summary = summarise(res, config.kappa)
    title = f"toy {config.task} ({config.mode}), G={config.group_size}, K={config.inner_steps}, {config.optimizer} lr={config.lr}, {config.seeds} seeds"
    lines = [
        f"# {title}",
        "",
        f"Steps: {config.steps}; kappa = {config.kappa}; seed set --seed {config.seed}; every cell is the mean over seeds with its 95% Student-t interval.",
        "E[R] is the exact expected reward of the policy (enumeration), not the sampled batch mean.",
        "",
        summary_table(summary),
        "",
        "## The paper's predictions in this toy (paired over seeds, DFPO variant vs each GSPO-family baseline)",
        "",
        *prediction_checks(summary, config, discovery),
        "",
        "Only a matched control (same clip range and stop-gradient form, aggregation, advantage scale; lr and seeds are shared",
        "by the whole run) can reproduce or contradict a prediction. A difference that shows against an unmatched baseline and",
        "not against the matched one comes from the trust region, not from cancellation.",
        "A prediction that is not reproduced here is a finding about this toy, not a failure of the run.",
        "Negligible: the adjusted interval lies within 2% of the baseline's mean; reproduced/contradicted: it lies wholly",
        "on the predicted/opposite side of 0. A statement holds only if a second, disjoint seed set gives the same verdict",
        "(--discovery: the run folder of the same command with another --seed).",
    ]
    notes = auto_notes(config, summary) + list(findings or [])
    if notes:
        lines += ["", "## Notes", "", *notes]
    if plots:
        written = plot_curves(res, out, title)
        lines += ["", "## Plots", "", *[f"![{p.stem}]({p.name})" for p in written]]
    path = out / layout.SUMMARY
    write_text_atomic(path, "\n".join(lines) + "\n")
    return path
