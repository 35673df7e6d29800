"""Every logged metric key, once: what it measures and how values of it combine (its reduction).

The loss core, the LLM trainer (``metrics.jsonl``, TensorBoard), its processes (``distributed.combine_metrics``)
and the TRL integration (``dfpo/*`` keys in TRL's logs) all combine values with ``reduce_values`` and the
reduction declared here, so a maximum stays a maximum whether it is taken over micro-batches, processes,
optimiser steps or a logging window. ``docs/metrics.md`` is generated from this table
(``python scripts/update_readme.py``), and a test fails for a key that is logged but not declared here.

Reductions:
- ``mean``: a weighted mean (over micro-batches with their accumulation weights, over processes with their
  shares of the batch; equal weights over optimiser steps and logging windows);
- ``min`` / ``max``: the extreme value;
- ``sum``: a count added up (failures, dropped groups, positions);
- ``last``: the latest value (the learning rate, the number of updates so far).
"""

from __future__ import annotations

import math
import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

REDUCTIONS = ("mean", "min", "max", "sum", "last")


@dataclass(frozen=True)
class Metric:
    """A logged key (``{name}`` in it stands for a part filled in at run time), its meaning and reduction."""

    key: str
    reduction: str
    meaning: str
    where: str
    """Who writes it: ``policy_loss`` (the loss core, per call), ``trainer`` (one value per training step) or
    ``eval`` (one value per evaluation)."""

    def __post_init__(self) -> None:
        if self.reduction not in REDUCTIONS:
            raise ValueError(f"metric {self.key!r}: reduction must be one of {REDUCTIONS}, got {self.reduction!r}")

    @property
    def pattern(self) -> re.Pattern:
        return re.compile("^" + re.sub(r"\\\{\w+\\\}", r"[^/]+", re.escape(self.key)) + "$")


_LOSS, _TRAINER, _EVAL = "policy_loss", "trainer", "eval"

_DRIFT_PARTS = (
    ("coef", "mean", "mean abs logit-space coefficient (eq 2's sum_i c_it; for a pair the gap of mean c, eq 5's kappa gap)"),
    ("direct", "mean", "mean abs first-order change of log pi that the event's own coefficients cause (dfpo.core.probe)"),
    ("cross", "mean", "mean abs first-order change the rest of this batch's gradient causes through shared parameters"),
    (
        "momentum",
        "mean",
        "mean abs first-order change the optimiser's state from earlier steps causes (momentum buffer, Adam's first moment)",
    ),
    ("decay", "mean", "mean abs first-order change weight decay causes"),
    ("predicted", "mean", "mean abs first-order prediction <g_e, Delta theta> = direct + cross + momentum + decay"),
    ("measured", "mean", "mean abs change of log pi after the trial step, by a forward pass"),
    ("error", "mean", "mean abs (measured - predicted): the second-order remainder"),
    ("error_ratio", "mean", "error / mean abs measured (flagged above dfpo.core.probe.FIRST_ORDER_ERROR_LIMIT)"),
    *(
        (
            f"{part}_share",
            "mean",
            f"sum abs {part} / sum over direct, cross, momentum, decay of sum abs part: share of the first-order prediction",
        )
        for part in ("direct", "cross", "momentum", "decay")
    ),
    (
        "batch_cross_share",
        "mean",
        "sum abs cross / (sum abs direct + sum abs cross): the cross term's share of this batch's own gradient's part",
    ),
    ("step", "mean", "mean abs change over the training step's real optimiser steps: log pi now minus log pi_old"),
)
"""The parts of the drift/* keys, each for shared events and for equivalent pairs."""

METRICS: tuple[Metric, ...] = (
    # the loss core (dfpo.policy_loss), one value per loss call
    Metric("loss/policy", "mean", "the policy term of the loss alone (no KL term, no entropy bonus)", _LOSS),
    Metric(
        "clip/frac_low",
        "mean",
        "share clipped on the low side: token level, kept tokens with A < 0 and r < 1 - eps_low (symmetric: r below the "
        "range); sequence level, the share of sequences",
        _LOSS,
    ),
    Metric("clip/frac_high", "mean", "the same on the high side (A > 0 and r > 1 + eps_high; CISPO: r > eps_high)", _LOSS),
    Metric("ratio/mean", "mean", "mean over real tokens of the ratio the objective uses (r_it, or s_i broadcast)", _LOSS),
    Metric("ratio/max", "max", "largest ratio the objective uses over real tokens", _LOSS),
    Metric(
        "weights/asym",
        "mean",
        "eq 23: Var_i(w_i A_i) within each group (population variance), averaged over groups; w_i is the post-transform "
        "sequence weight, or the token mean of post-clip token weights",
        _LOSS,
    ),
    Metric(
        "weights/spread",
        "mean",
        "max_i w_i - min_i w_i within each group, averaged over groups: w_i is the sequence weight of weights/asym (the "
        "importance ratio after the objective's transform); 0 when a group's weights are one value",
        _LOSS,
    ),
    Metric(
        "shared/whole_group_positions",
        "sum",
        "cancel='shared_whole' only: the (group, position) events whose prefix and token every completion of the group "
        "holds, taken out of the gradient (summed over the step's loss calls: once per optim.epochs pass)",
        _LOSS,
    ),
    Metric("mask/frac", "mean", "share of real tokens dropped by the token mask (STAPO, top-entropy, OPSM)", _LOSS),
    Metric(
        "ratio/clamped_frac",
        "mean",
        "share of real tokens whose |log pi - log pi_old| exceeded 20 and was clamped there (no ratio gradient)",
        _LOSS,
    ),
    Metric("cov/frac", "mean", "share of real tokens Clip-Cov drops or KL-Cov penalises", _LOSS),
    Metric("kl/ref", "mean", "mean k3 KL to the reference policy over real tokens (beta > 0 only)", _LOSS),
    Metric(
        "kl/old",
        "mean",
        "mean KL estimate to the sampling policy pi_old over real tokens (old_kl_coef > 0 only; prime-rl's penalty)",
        _LOSS,
    ),
    Metric("entropy/bonus", "mean", "the mean entropy over kept tokens that the entropy bonus rewards (entropy_coef > 0)", _LOSS),
    Metric("proximal/penalty", "mean", "Kimi k1.5's tau/2 (log pi - log pi_old)^2, mean over kept tokens (proximal_coef > 0)", _LOSS),
    Metric("nll/positive", "mean", "VAPO's NLL: mean -log pi over the kept tokens of positive-advantage completions (nll_coef > 0)", _LOSS),
    Metric("nll/positive_frac", "mean", "share of kept tokens in positive-advantage completions, the NLL's tokens (nll_coef > 0)", _LOSS),
    Metric(
        "ipo/margin",
        "mean",
        "online IPO's h: log(pi / pi_ref) of each group's best completion minus its worst's, mean over pairs (ipo_beta > 0)",
        _LOSS,
    ),
    Metric("ipo/pair_frac", "mean", "share of groups with unequal advantages, the ones that give an IPO pair (ipo_beta > 0)", _LOSS),
    Metric("rollout/weight_mean", "mean", "mean of the rollout correction's weight pi_old / pi_rollout over real tokens", _LOSS),
    Metric("rollout/weight_zero_frac", "mean", "share of real tokens the rollout correction's mask zeroes", _LOSS),
    Metric("rollout/token_truncated_frac", "mean", "share of real tokens whose correction ratio exceeds the cap", _LOSS),
    Metric("rollout/seq_ratio_min", "min", "smallest sequence-level correction ratio prod_t pi_old / pi_rollout", _LOSS),
    Metric("rollout/seq_ratio_mean", "mean", "mean sequence-level correction ratio over non-empty completions", _LOSS),
    Metric("rollout/seq_ratio_max", "max", "largest sequence-level correction ratio prod_t pi_old / pi_rollout", _LOSS),
    Metric("rollout/rejected_frac", "mean", "share of real tokens the rollout rejection drops (rollout_rejection)", _LOSS),
    Metric("rollout/rejected_seq_frac", "mean", "share of non-empty completions with a token the rollout rejection drops", _LOSS),
    Metric(
        "fused/two_pass",
        "mean",
        "fused_policy_loss (the trainer's update by default): share of real tokens whose LM head ran twice, because their "
        "coupled unit (a completion, a group, a batch-coupled batch) held more logits than max_logits_mib, or a scaled group's "
        "budget held no (V, H) buffer for their completion (0 = all in one pass)",
        _LOSS,
    ),
    Metric(
        "fused/row_scaled",
        "mean",
        "fused_policy_loss: share of real tokens whose completion's gradient was summed at placeholder coefficients and "
        "scaled once, in units longer than a logits block (GSPO-like objectives and DFPO; dfpo.core.fused.row_scaled): one pass, "
        "a logits block and a (V, H) buffer per completion held (one for a whole Min-Replace group: dfpo.core.fused.group_folded)",
        _LOSS,
    ),
    # the trainer, one value per training step (metrics.jsonl)
    Metric("entropy/mean", "mean", "policy entropy over the real tokens of the loss calls (when the objective reads it)", _TRAINER),
    Metric("reward/mean", "mean", "mean total reward of the step's completions", _TRAINER),
    Metric("reward/std", "mean", "standard deviation of the step's total rewards (population)", _TRAINER),
    Metric("reward/correct", "mean", "share of completions the correctness reward scores as correct (its mean)", _TRAINER),
    Metric("reward/format", "mean", "share of completions that earn the format reward", _TRAINER),
    Metric("reward/fn{i}", "mean", "mean value of the i-th of reward.functions (from 0) over the step's completions", _TRAINER),
    Metric(
        "reward/greedy",
        "mean",
        "adv_scale=remax: mean total reward of the step's greedy completions, one per prompt (ReMax's baseline, not trained on)",
        _TRAINER,
    ),
    Metric("reward/errors", "sum", "reward calls that raised or whose worker died (scored 0)", _TRAINER),
    Metric("reward/timeouts", "sum", "reward calls still running at reward.timeout_s (scored 0, worker replaced)", _TRAINER),
    Metric("reward/invalid", "sum", "reward calls that returned something other than a finite number within +-1e6", _TRAINER),
    Metric("completion/length", "mean", "mean number of real completion tokens", _TRAINER),
    Metric("completion/truncated_frac", "mean", "share of completions that hit rollout.max_new_tokens", _TRAINER),
    Metric("completion/empty_frac", "mean", "share of completions that are empty after stripping whitespace", _TRAINER),
    Metric("groups/zero_var_frac", "mean", "share of groups whose rewards are all equal (zero advantages)", _TRAINER),
    Metric(
        "entropy/coef",
        "last",
        "the entropy bonus's coefficient this step's loss used (entropy_target set: Skywork-OR1's adaptive coefficient)",
        _TRAINER,
    ),
    Metric(
        "entropy/controlled",
        "last",
        "the entropy that moves the adaptive coefficient: -mean log pi_old over the step's real tokens (Skywork-OR1)",
        _TRAINER,
    ),
    Metric("entropy/rollout", "mean", "entropy of the old policy over the rollout's real tokens", _TRAINER),
    Metric("optim/lr", "last", "learning rate after the step's last optimiser step", _TRAINER),
    Metric("optim/updates", "last", "optimiser steps taken since the start of the run", _TRAINER),
    Metric("optim/skipped_nonfinite", "sum", "optimiser steps skipped for a non-finite loss or gradient", _TRAINER),
    Metric("grad/norm", "mean", "global gradient norm before clipping, mean over the step's optimiser steps", _TRAINER),
    Metric(
        "optim/update_norm",
        "last",
        "with log.update_norm: L2 norm of the trainable parameters' change over the step's optimiser steps (its step size)",
        _TRAINER,
    ),
    Metric("energy/bucket{b}", "mean", "eq 24: share of the logit-gradient energy on frequency bucket b (0 = most frequent)", _TRAINER),
    Metric(
        "diag/shared_positions",
        "sum",
        "positions whose token and prefix every completion of a group shares (groups of 2 or more)",
        _TRAINER,
    ),
    Metric(
        "diag/shared_events",
        "sum",
        "eq 2's shared events: (group, position) pairs where two or more completions of the group hold the same prefix and "
        "token, counted per distinct prefix-and-token (summed over the step's micro-batches: once per optim.epochs pass)",
        _TRAINER,
    ),
    Metric(
        "diag/shared_residual",
        "mean",
        "eq 2 check on every shared event S (two or more members, same prefix and token), with c_it = d loss / d log pi_it: "
        "sum_S abs(sum_(i in S) c_it) / sum_S sum_(i in S) abs(c_it) (0 = they cancel, 1 = one sign per event; "
        "dfpo.core.metrics.event_residual)",
        _TRAINER,
    ),
    Metric(
        "diag/shared_residual_length",
        "mean",
        "the length part of diag/shared_residual (eq 67's 1/|y_i|): its numerator minus the same numerator with each "
        "member's aggregation weight replaced by its group's mean, over the same denominator; 0 at equal lengths and "
        "for aggregations without a per-sequence weight (dfpo.core.metrics.equal_weight_coef)",
        _TRAINER,
    ),
    Metric(
        "diag/shared_coef_whole",
        "mean",
        "the coefficient mass at the events a whole group holds, sum over them of sum_i |d loss / d log pi| (the "
        "denominator of diag/shared_residual_whole): exactly 0 under cancel=shared_whole, where no gradient reaches "
        "those positions and the residual is 0/0, so this is what shows the cancellation acted in a run",
        _TRAINER,
    ),
    Metric(
        "diag/shared_residual_whole",
        "mean",
        "diag/shared_residual over the events a whole group holds (every completion of the group shares the prefix and "
        "token; the positions of diag/shared_positions; dfpo.core.metrics.shared_residual)",
        _TRAINER,
    ),
    Metric(
        "forms/equiv_entropy",
        "mean",
        "sum task: entropy in nats of the forms number / equation / sentence among the step's correct completions "
        "(0 when fewer than 2 are correct; at most ln 3): the drift between equivalent correct answers (dfpo.trainer.tasks)",
        _TRAINER,
    ),
    Metric(
        "forms/{name}",
        "mean",
        "arithmetic tasks: share of completions of each surface form (add/equiv: number, swap, split, echo, invalid; "
        "sum and sum_template: number, equation, sentence, wrong; sum_template also template, the share that restate "
        "the problem before a result, 'a + b + c = N', right or wrong: dfpo.trainer.tasks.in_template)",
        _TRAINER,
    ),
    *(
        Metric(f"drift/{kind}_{part}", reduction, f"log.param_drift, {what}: {meaning}", _TRAINER)
        for kind, what in (
            ("shared", "shared (context, token) events of a group"),
            ("equiv_logodds", "log-odds log pi(y_a) - log pi(y_b) of equivalent correct answers"),
        )
        for part, reduction, meaning in _DRIFT_PARTS
    ),
    Metric("drift/shared_events", "sum", "log.param_drift: shared events probed (at most log.param_drift_events)", _TRAINER),
    Metric(
        "drift/shared_found",
        "sum",
        "log.param_drift: shared events found before the log.param_drift_events cap (every (context, token) two or more "
        "members of a group hold, eq 2)",
        _TRAINER,
    ),
    Metric("drift/shared_found_whole", "sum", "log.param_drift: of drift/shared_found, those every member of the group holds", _TRAINER),
    Metric(
        "drift/equiv_pairs",
        "sum",
        "log.param_drift: equivalent pairs probed (two correct completions of a group, different tokens)",
        _TRAINER,
    ),
    Metric(
        "rollout/log_kept_mass",
        "mean",
        "mean log of the probability mass top-k / top-p kept at each sampled token (<= 0): the sampled log-prob minus this "
        "is the untruncated one the rollout correction reads (logged when sampling truncates)",
        _TRAINER,
    ),
    Metric("rollout/dropped_groups", "sum", "dynamic sampling: groups dropped because all their rewards were equal", _TRAINER),
    Metric("rollout/extra_batches", "sum", "dynamic sampling: extra rollout batches drawn to fill the step", _TRAINER),
    Metric("rollout/logp_gap_mean", "mean", "mean |log pi_rollout - log pi_old| over real tokens (sampler vs trainer)", _TRAINER),
    Metric("rollout/logp_gap_max", "max", "largest |log pi_rollout - log pi_old| over real tokens", _TRAINER),
    Metric("rollout/k3_kl", "mean", "k3 estimate of KL(pi_old || pi_rollout) per real token", _TRAINER),
    Metric("log/dropped_nonfinite", "sum", "metrics of the step left out of the log because they were not finite", _TRAINER),
    Metric("time/rollout_s", "mean", "seconds spent sampling and scoring the step's rollout", _TRAINER),
    Metric("time/old_logp_s", "mean", "seconds spent computing old log-probs (pi_old) by a forward pass", _TRAINER),
    Metric("time/update_s", "mean", "seconds spent in the optimiser steps", _TRAINER),
    Metric(
        "time/probe_s",
        "mean",
        "seconds of log.param_drift's trial step on a probed step (logged on probed steps only; not in time/step_s)",
        _TRAINER,
    ),
    Metric("time/step_s", "mean", "seconds of the training step (rollout to metrics), the probe's time/probe_s left out", _TRAINER),
    # evaluation (eval.jsonl)
    Metric("eval/avg@{k}", "mean", "mean correctness over k samples of each eval prompt", _EVAL),
    Metric("eval/pass@{k}", "mean", "share of eval prompts with at least one correct sample of k", _EVAL),
    Metric(
        "eval/tax_kl",
        "mean",
        "a proxy of the learning tax at positions that never get a gradient: KL(pi_init || pi_now) of the next-token "
        "distribution at the eval prompts' own positions (the chat template and the question: tokens never generated nor "
        "scored, moved only through shared parameters), mean over positions; pi_init coarsened to its top-k tokens and one "
        "bin for the rest (a lower bound of the full KL, exact when k >= vocab; dfpo.trainer.stages.tax). The tax where "
        "Prop. 3.1 puts it is eval/template_kl",
        _EVAL,
    ),
    Metric(
        "eval/template_kl",
        "mean",
        "learning tax where Prop. 3.1 puts it (tasks with an answer template: sum_template): KL(pi_init || pi_now) at the "
        "template's positions of each eval problem, teacher-forced (prompt + 'a + b + c = ': the distributions that "
        "predict the template's tokens, the shared contexts of a warmed-up group), mean over positions; coarsened as "
        "eval/tax_kl (dfpo.trainer.stages.tax)",
        _EVAL,
    ),
    Metric(
        "eval/template",
        "mean",
        "sum_template: share of the eval samples (k per prompt) that restate the problem before a result (dfpo.trainer.tasks.in_template)",
        _EVAL,
    ),
    Metric(
        "eval/greedy_acc",
        "mean",
        "eval.greedy, at step 0 and the end: share of eval prompts whose greedy completion (temperature 0) is correct",
        _EVAL,
    ),
    Metric("eval/greedy_template", "mean", "eval.greedy, sum_template: share of the greedy completions in the template", _EVAL),
)


def lookup(key: str) -> Metric:
    """The declaration of a logged key (templates match their filled-in forms); KeyError naming the key otherwise."""
    for metric in METRICS:
        if metric.key == key or metric.pattern.match(key):
            return metric
    raise KeyError(f"metric {key!r} is not declared in dfpo.core.metric_registry.METRICS")


def reduce_values(key: str, values: Sequence[float], weights: Sequence[float] | None = None) -> float:
    """``values`` of ``key`` combined by its reduction; ``weights`` weigh a ``mean`` (equal weights when None or when
    they sum to 0). Non-finite values are left out (NaN never leaks into a log); nan when none is left."""
    reduction = lookup(key).reduction
    pairs = [(float(v), 1.0 if weights is None else float(w)) for v, w in zip(values, weights or [None] * len(values))]
    pairs = [(v, w) for v, w in pairs if math.isfinite(v)]
    if not pairs:
        return math.nan
    vals = [v for v, _ in pairs]
    if reduction == "min":
        return min(vals)
    if reduction == "max":
        return max(vals)
    if reduction == "sum":
        return sum(vals)
    if reduction == "last":
        return vals[-1]
    total = sum(w for _, w in pairs)
    if total <= 0:
        return sum(vals) / len(vals)
    return sum(v * w for v, w in pairs) / total


def reduce_records(records: Iterable[dict[str, float]], weights: Sequence[float] | None = None) -> dict[str, float]:
    """One record from several (micro-batches, processes, optimiser steps): every key by its reduction, over the
    records that hold it (``weights``: one per record, for ``mean`` keys)."""
    records = list(records)
    weights = list(weights) if weights is not None else [1.0] * len(records)
    keys = list(dict.fromkeys(k for r in records for k in r))
    out = {}
    for k in keys:
        held = [(r[k], w) for r, w in zip(records, weights) if k in r]
        out[k] = reduce_values(k, [v for v, _ in held], [w for _, w in held])
    return out


def markdown_table() -> str:
    """The registry as the markdown table of docs/metrics.md."""
    rows = ["| key | reduction | written by | meaning |", "|---|---|---|---|"]
    rows += [f"| `{m.key}` | {m.reduction} | {m.where} | {m.meaning} |" for m in METRICS]
    return "\n".join(rows)
