"""Toy run reports: the per-seed summary of a run, its markdown (levels and the paper checks), the run folder.

    summary.md          summary table (levels over seeds) and the paper checks (``dfpo.toy.checks``)
    reward.png, tax.png, equiv_entropy.png, asym.png, overview.png   (``dfpo.toy.plots``)

Levels: a Student-t interval of the mean over seeds, clipped to the quantity's support (a KL, an entropy or a
fraction never gets a negative bound); the censored outcomes (steps to kappa, the tax paid to reach it) get the
Kaplan-Meier median with its Brookmeyer-Crowley interval, ``>=`` where a seed that never reached kappa leaves it
open (``dfpo.core.stats``). ``render_summary`` is a pure function of a config and a per-seed summary, so the
attribution page re-renders a run's tables from its stored evidence (docs/attribution/data/).
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import numpy as np

from ..core import stats
from ..core.files import write_text_atomic
from ..core.labels import parse_run_label
from ..core.loss import objective_from_label
from ..core.metrics import jitter2, steps_to
from . import layout
from .checks import CENSORED, censored, comparison_pairs, paired_verdict, prediction_checks, replicated
from .folder import _plain, config_from_dict, read_config, read_metrics, write_metrics
from .plots import PLOTS, plot_curves

__all__ = [
    "COLUMNS",
    "PLOTS",
    "auto_notes",
    "comparison_pairs",
    "config_from_dict",
    "paired_verdict",
    "plot_curves",
    "prediction_checks",
    "read_discovery",
    "read_metrics",
    "render_summary",
    "replicated",
    "summarise",
    "summary_table",
    "to_numpy",
    "write_run",
]


def to_numpy(results: dict) -> dict[str, dict[str, np.ndarray]]:
    """{objective: {metric: (steps, S) array}} from torch tensors."""
    return {o: {k: v.detach().cpu().numpy().astype(float) for k, v in h.items()} for o, h in results.items()}


def summarise(results: dict[str, dict[str, np.ndarray]], kappa: float) -> dict[str, dict[str, object]]:
    """Per objective: per-seed summary values (arrays over seeds) of the run. ``reached`` says which seeds reached
    kappa; for the others ``steps_to_kappa`` (steps + 1) and ``tax_at_kappa`` (the tax at the last step) are lower
    bounds."""
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
        if "update/norm" in h:
            row["update_norm"] = h["update/norm"].mean(0)
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


UNIT = (0.0, 1.0)
POSITIVE = (0.0, None)
FREE = (None, None)
COLUMNS = [  # (summary key, title, format, the quantity's support)
    ("steps_to_kappa", "Steps(R>=kappa) eq 19, KM median", "{:.1f}", POSITIVE),
    ("jitter2_reward", "Jitter2(R) eq 20", "{:.2e}", POSITIVE),
    ("final_reward", "final E[R]", "{:.3f}", UNIT),
    ("mean_reward", "mean E[R] over steps", "{:.3f}", UNIT),
    ("tax_kl_cum", "tax: cum. KL", "{:.2e}", POSITIVE),
    ("tax_kl_init", "tax: KL to init", "{:.2e}", POSITIVE),
    ("tax_at_kappa", "tax paid to reach kappa, KM median", "{:.2e}", POSITIVE),
    ("final_equiv_entropy", "equiv-set entropy", "{:.3f}", POSITIVE),
    ("final_equiv_logodds", "equiv log-odds", "{:+.2f}", FREE),
    ("final_entropy", "sequence entropy", "{:.3f}", POSITIVE),
    ("asym", "Asym eq 23 (mean)", "{:.2e}", POSITIVE),
    ("residual_rel", "shared-token residual (net/gross)", "{:.3f}", UNIT),
    ("energy_frequent", "Energy(frequent) eq 24", "{:.3f}", UNIT),
    ("clip_frac", "clipped fraction", "{:.3f}", UNIT),
    ("update_norm", "update norm per rollout batch", "{:.3g}", POSITIVE),
]


def level_cell(row: dict, key: str, fmt: str, bounds: stats.Bounds) -> str:
    """One objective's level: 'mean [95% t-interval]' clipped to ``bounds``, or for a censored key the Kaplan-Meier
    median with its interval and how many seeds reached kappa ('>=' where censoring leaves a value open)."""
    if key in CENSORED:
        return stats.km_median(row[key], censored(row)).text(fmt)
    if stats.unbounded_reason(stats.paired_interval(row[key])):  # one seed: the clipped interval would be the whole support
        return f"{fmt.format(float(np.mean(row[key])))} (no interval)"
    ci = stats.mean_interval(row[key], bounds=bounds)
    return f"{fmt.format(ci.mean)} [{fmt.format(ci.low)}, {fmt.format(ci.high)}]"


def summary_table(summary: dict[str, dict[str, object]]) -> str:
    """Markdown table: one row per objective, each level over seeds (descriptive, not tests); where a level has no
    interval, a sentence under the table says why."""
    cols = [c for c in COLUMNS if all(c[0] in s for s in summary.values())]
    lines = ["| objective | " + " | ".join(c[1] for c in cols) + " |", "|---" * (len(cols) + 1) + "|"]
    reasons = set()
    for name, s in summary.items():
        lines.append(f"| {name} | " + " | ".join(level_cell(s, key, fmt, bounds) for key, _, fmt, bounds in cols) + " |")
        reasons |= {stats.unbounded_reason(stats.paired_interval(s[key])) for key, *_ in cols if key not in CENSORED}
    reasons.discard("")
    if reasons:
        lines += ["", f"A level marked '(no interval)' has none ({'; '.join(sorted(reasons))})."]
    return "\n".join(lines)


def auto_notes(config, summary: dict[str, dict[str, object]]) -> list[str]:
    """Plain-language notes that explain the table (computed from the run, not hard-coded verdicts)."""
    notes = []
    specs = {o: objective_from_label(parse_run_label(o).objective, **dict(config.overrides)) for o in summary}
    aggs = {o: sp.aggregation for o, sp in specs.items()}
    if len(set(aggs.values())) > 1:
        notes.append(
            "- The objectives aggregate differently (" + ", ".join(f"{o}: {a}" for o, a in aggs.items()) + "). At one learning rate "
            "a token sum takes steps about L times larger than a per-sequence token mean, so speed and drift differences between "
            "aggregations are partly step-size differences; compare objectives that share an aggregation, or tune lr per objective."
        )
    shrunk = [o for o, sp in specs.items() if sp.length_aware and sp.transform == "min"]
    if shrunk:
        notes.append(
            f"- {', '.join(shrunk)}: length-aware Min-Replace sets stilde_i = L_i min_j (sbar_j / L_j) <= sbar_i, which at ratios near 1 "
            "is L_i / (the group's longest length): every sequence but the longest of its group takes a smaller step than under its "
            "matched control. It cancels shared tokens at unequal lengths, but its differences in speed, tax and entropy are also "
            "those of a smaller step, so they are not attributable to cancellation alone unless they hold against a "
            "step-size-matched control too (--match-step)."
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


DISCOVERY_MUST_MATCH = ("task", "task_options", "objectives", "overrides", "mode", "steps", "group_size", "inner_steps", "minibatches")
DISCOVERY_MUST_MATCH += ("groups_per_step", "optimizer", "lr", "init_noise", "kappa", "match_step", "step_matched")


def read_discovery(path, config) -> tuple[dict[str, dict[str, object]], object]:
    """(per-seed summary, ToyConfig) of an earlier run folder of the same experiment on a disjoint seed set.

    ValueError, before any training, when the folder is not a toy run, differs from ``config`` in
    anything but the seed set, or used the same ``--seed`` (the same seeds: not a replication).
    """
    try:
        earlier, _ = read_config(path)
    except ValueError as err:
        raise ValueError(f"--discovery {err}") from None
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


def run_title(config) -> str:
    return f"toy {config.task} ({config.mode}), G={config.group_size}, K={config.inner_steps}, {config.optimizer} lr={config.lr}, {config.seeds} seeds"


def render_summary(config, summary: dict[str, dict[str, object]], *, discovery=None, notes=()) -> list[str]:
    """The lines of a run's summary.md (without its plots): levels, the paper checks (with the discovery set's
    verdicts when ``discovery`` = (summary, config)), and the notes."""
    lines = [
        f"# {run_title(config)}",
        "",
        f"Steps: {config.steps}; kappa = {config.kappa}; seed set --seed {config.seed}; every cell is the mean over seeds with its 95% "
        "Student-t interval (clipped to the quantity's range), or for steps and the tax paid to reach kappa the Kaplan-Meier median "
        "with its Brookmeyer-Crowley interval ('>=': a seed that never reached kappa leaves it open).",
        "E[R] is the exact expected reward of the policy (enumeration), not the sampled batch mean.",
        "",
        summary_table(summary),
        "",
        "## The paper's predictions in this toy (paired over seeds, DFPO variant vs each GSPO-family control)",
        "",
        *prediction_checks(summary, config, discovery),
        "",
        "Only a matched control (same clip range and stop-gradient form, aggregation, advantage scale and learning rate; seeds",
        "are shared by the whole run) can reproduce or contradict a prediction. A difference that shows against an unmatched",
        "baseline and not against the matched one comes from the trust region, not from cancellation. A step-size-matched",
        "control is the matched control at a learning rate calibrated on a disjoint seed set so that its effective step matches",
        "the method's (--match-step). A prediction that is not reproduced here is a finding about this toy, not a failure of the run.",
        "Negligible: the adjusted interval lies within 2% of the control's level; reproduced/contradicted: it lies wholly",
        "on the predicted/opposite side of 0. A statement holds only if a second, disjoint seed set gives the same verdict",
        "(--discovery: the run folder of the same command with another --seed).",
    ]
    notes = auto_notes(config, summary) + list(notes)
    if notes:
        lines += ["", "## Notes", "", *notes]
    return lines


def write_run(
    out: Path,
    config,
    task,
    results: dict,
    *,
    findings: list[str] | None = None,
    plots: bool = True,
    discovery=None,
    extra: dict | None = None,
) -> Path:
    """Write the whole run folder; return the path of summary.md. ``discovery``: ``read_discovery``'s pair;
    ``extra``: more keys for config.json (the wall time, a step-size calibration)."""
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    res = to_numpy(results)
    cfg = dataclasses.asdict(config)
    cfg["task_shape"] = {"prompts": len(task.prompts), "rows": task.n_rows, "vocab": len(task.vocab), "max_len": task.max_len}
    cfg.update(extra or {})
    write_text_atomic(out / layout.CONFIG, json.dumps(cfg, indent=2, default=str) + "\n")
    write_metrics(res, out)
    summary = summarise(res, config.kappa)
    lines = render_summary(config, summary, discovery=discovery, notes=findings or ())
    if plots:
        written = plot_curves(res, out, run_title(config))
        lines += ["", "## Plots", "", *[f"![{p.stem}]({p.name})" for p in written]]
    path = out / layout.SUMMARY
    write_text_atomic(path, "\n".join(lines) + "\n")
    return path
