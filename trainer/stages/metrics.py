"""The metrics stage: one line of ``metrics.jsonl`` per training step, samples, and the run's summary.

Every key and its meaning and reduction is declared in ``dfpo.core.metric_registry`` (docs/metrics.md). Per
step: the reward (mean, std, correct, format; reward errors, timeouts and invalid values counted), completion
lengths and truncation, zero-variance groups, the rollout's entropy under pi_old, the optimiser's learning rate
and steps, the loss metrics of the optimiser steps (each key by its declared reduction), Energy's buckets (eq 24)
and the shared-prefix residual, the task's ``forms/*`` (``tasks.surface_form_shares``), dynamic sampling's
counts, the sampler/trainer mismatch (``rollout/logp_gap_*``, ``rollout/k3_kl``) and the stage times. A
non-finite value is not logged (``log/dropped_nonfinite`` counts them). Per run (``summary.json``): Jitter2
(eq 20), Steps(reward >= kappa) (eq 19) and, with ``log.param_drift``, the cumulative drift (``probe.stage``).
"""

from __future__ import annotations

import time
from pathlib import Path

from ...core.metric_registry import reduce_records
from ...core.metrics import jitter2, steps_to_threshold, trailing_mean
from .. import diagnostics as diag
from ..diagnostics import StepDiagnostics
from ..probe.stage import drift_summary
from ..run.layout import RunDir
from ..run.logs import JsonlLog, finite_only, missing_steps
from ..tasks import surface_form_shares
from .old_logp import OldLogProbs, mismatch_metrics
from .rollout import Rollout
from .update import UpdateStats


class Stopwatch:
    """Seconds of a training step's stages: ``lap(name)`` records the time since the previous lap."""

    def __init__(self) -> None:
        self.start = self.last = time.time()
        self.laps: dict[str, float] = {}

    def lap(self, name: str) -> None:
        now = time.time()
        self.laps[name] = now - self.last
        self.last = now

    def stage_times(self, *, recompute_s: float) -> dict[str, float]:
        """``time/*`` of a step laid out as rollout, old_logp, update laps: old log-probs recomputed during the
        update (``recompute_s``) count as old-log-prob time, and the step's total runs until now."""
        return {
            "time/rollout_s": self.laps["rollout"],
            "time/old_logp_s": self.laps["old_logp"] + recompute_s,
            "time/update_s": self.laps["update"] - recompute_s,
            "time/step_s": time.time() - self.start,
        }


def diagnostic_metrics(d: StepDiagnostics) -> dict:
    """Energy's share per frequency bucket (eq 24) and the shared-token cancellation residual of a step (eq 2):
    over every shared event, its length part (eq 67's 1/|y_i|), and over the events a whole group holds, with the
    coefficient mass there (the residual's denominator, logged even at 0, where the residual itself is 0/0)."""
    m: dict = {}
    if d.energy is not None and float(d.energy.sum()) > 0:
        share = d.energy / d.energy.sum()
        for b, v in enumerate(share.tolist()):
            m[f"energy/bucket{b}"] = v
    m["diag/shared_positions"] = d.shared_positions
    m["diag/shared_coef_whole"] = d.shared_den  # sum |c| at the whole-group events: 0 where no gradient reaches them
    m["diag/shared_events"] = d.events
    if d.event_den > 0:
        m["diag/shared_residual"] = d.event_num / d.event_den
        m["diag/shared_residual_length"] = d.length_num / d.event_den
    if d.shared_den > 0:
        m["diag/shared_residual_whole"] = d.shared_num / d.shared_den
    return m


def step_metrics(
    step: int, rollout: Rollout, old: OldLogProbs, upd: UpdateStats, *, lr: float, updates_done: int, task: str, group_size: int, say
) -> dict:
    """The metrics line of training step ``step`` (the stage times are added by the caller)."""
    batch, texts, rew, rewards = rollout.batch, rollout.texts, rollout.rewards, rollout.reward_tensor()
    entropy = old.first.entropy  # (B, T) pi_old's entropy
    lengths = batch.mask.sum(-1).float()
    m: dict = {
        "step": step,
        "reward/mean": float(rewards.mean()),
        "reward/std": float(rewards.std(unbiased=False)),
        "reward/correct": sum(rew.correct) / len(rew.correct),
        "reward/format": sum(rew.format) / len(rew.format),
        "reward/errors": rew.errors,
        "reward/timeouts": rew.timeouts,
        "reward/invalid": rew.invalid,
        "completion/length": float(lengths.mean()),
        "completion/truncated_frac": float(batch.truncated.float().mean()),
        "completion/empty_frac": sum(1 for t in texts if not t.strip()) / len(texts),
        "groups/zero_var_frac": diag.zero_variance_fraction(rewards, batch.group_ids),
        "entropy/rollout": float(entropy[batch.mask].mean()) if bool(batch.mask.any()) else 0.0,
        "optim/lr": lr,
        "optim/updates": updates_done,
        "optim/skipped_nonfinite": upd.skipped,
    }
    for i, values in enumerate(rew.extra):  # each of reward.functions, apart
        m[f"reward/fn{i}"] = sum(values) / len(values)
    if upd.grad_norms:
        m["grad/norm"] = sum(upd.grad_norms) / len(upd.grad_norms)
    if upd.update_norm is not None:
        m["optim/update_norm"] = upd.update_norm
    m.update(reduce_records(upd.loss_metrics))  # over the optimiser steps, each key by its declared reduction
    m.update(diagnostic_metrics(upd.diagnostics))
    m.update(surface_form_shares(task, texts, [e for e in rollout.examples for _ in range(group_size)]))
    clean, dropped = finite_only(m)
    if dropped:
        clean["log/dropped_nonfinite"] = len(dropped)
        say(f"step {step}: non-finite metrics not logged: {dropped}")
    clean.update(rollout.stats)
    if not old.from_sampler:
        clean.update(mismatch_metrics(rollout.sampler_logp, old.first.logp, batch.mask))
    return clean


def model_input(tok, batch, row: int) -> str:
    """The prompt of ``row`` as the model read it: the decoded prompt tokens, the chat template and special tokens
    included (what the task's ``prompt`` became)."""
    P = batch.prompt_width
    ids = batch.input_ids[row, :P][batch.attention_mask[row, :P].bool()]  # (prompt tokens,) left padding dropped
    return tok.decode(ids.tolist(), skip_special_tokens=False)


def write_samples(log, step: int, rollout: Rollout, log_cfg, group_size: int, tok) -> None:
    """``log.samples_per_step`` completions of the step with their prompt (as the task gave it and as the model read
    it, template and special tokens included), answer and reward, every ``log.samples_every`` steps and at step 1."""
    every = log_cfg.samples_every
    if not every or (step % every and step != 1):
        return
    for i in range(min(log_cfg.samples_per_step, len(rollout.texts))):
        ex = rollout.examples[i // group_size]
        log.write(
            {
                "step": step,
                "prompt": ex.prompt,
                "model_input": model_input(tok, rollout.batch, i),
                "answer": ex.answer,
                "completion": rollout.texts[i],
                "reward": rollout.rewards.total[i],
            }
        )


def run_summary(run_dir: Path, kappa: float) -> dict:
    """Run-level metrics from metrics.jsonl: Jitter2 (eq 20) and Steps(reward >= kappa) (eq 19),
    the latter also on the 10-step trailing mean (one noisy step should not count as reaching kappa); with
    ``log.param_drift`` the cumulative drift of the probed steps (``probe.stage.drift_summary``)."""
    rows = JsonlLog.read(RunDir(run_dir).metrics)
    steps = [r["step"] for r in rows]
    reward = [r["reward/mean"] for r in rows]
    last = max(steps, default=0)
    return drift_summary(rows) | {
        "steps": last,
        "steps_missing_from_log": missing_steps(rows, last),
        "reward/first": reward[0] if reward else None,
        "reward/last": reward[-1] if reward else None,
        "reward/jitter2": None if jitter2(reward) is None else float(jitter2(reward)),
        "reward/steps_to_kappa": steps_to_threshold(steps, reward, kappa),
        "reward/steps_to_kappa_ma10": steps_to_threshold(steps, trailing_mean(reward, 10), kappa),
        "kappa": kappa,
    }
