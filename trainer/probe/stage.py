"""The drift stage (``log.param_drift``): how the update moves shared tokens and equivalent answers in parameter space.

Every ``log.param_drift_every`` training steps (and at step 1), after the step's real optimiser steps, the stage
takes one trial optimiser step on the step's first mini-batch with the run's own objective, optimiser state,
learning rate and gradient clipping, and ``dfpo.core.probe.probe_step`` splits how it moves each probed event
(shared (context, token) events of a group; pairs of correct completions of one group with different tokens,
eq 5's equivalent answers) into direct + cross (the rest of this mini-batch's gradient) + momentum (the optimiser's
state from earlier steps) + decay (weight decay) beside the measured change; then the parameters and the optimiser
are put back, so the run trains exactly as with the stage off. ``drift/*_step`` is the real change of the same
events over the step's optimiser steps (log pi now minus log pi_old).

The trial step is the (K + 1)-th step this rollout batch would have had: the policy has moved K optimiser steps
off pi_old, so the ratios, clipping and DFPO's transforms act as on a real later step (on-policy, at K = 0, every
DFPO transform is the identity and would show nothing).

Choices made here:
1. One loss call over the whole mini-batch (its micro-batches joined): the trial step's gradient is the mini-batch
   loss's, as the real step's is for objectives that are not batch-coupled.
2. One process only: a trial step on one rank of DDP or FSDP would wait for the others' gradients; the setting is
   refused on several processes (``check_drift_settings``), before any work.
3. ``summary.json`` gets each ``drift/*_step`` and ``drift/*_measured`` summed over the probed steps
   (``drift_summary``): the run's cumulative drift of shared events and of equivalent log-odds, as probed.
"""

from __future__ import annotations

import math

import torch

from ...core.loss import ObjectiveSpec
from ...core.probe import PARTS, DriftBatch, DriftReport, EventDrift, probe_step, summary
from ..forward import completion_logprobs
from ..minibatches import micro_batch
from ..stages.old_logp import OldLogProbs
from ..stages.rollout import Rollout

KINDS = (("shared", "shared"), ("pairs", "equiv_logodds"))
"""(attribute of ``DriftReport``, the middle of its ``drift/*`` keys)."""
SUMMARY_PARTS = (
    "coef",
    *PARTS,
    "predicted",
    "measured",
    "error",
    "error_ratio",
    *(f"{part}_share" for part in PARTS),
    "batch_cross_share",
)
"""The figures of ``core.probe.summary`` each ``drift/<kind>_<part>`` key carries: mean abs coef and parts, the shares
of the first-order prediction, the cross term's share of the batch's own part, and error / abs measured."""
CUMULATIVE = ("step", "measured")
"""The parts of ``drift/*`` that ``summary.json`` sums over the probed steps."""


def check_drift_settings(cfg, world: int) -> None:
    """``log.param_drift`` on one process only (choice 2); ValueError naming the setting otherwise."""
    if cfg.log.param_drift and world > 1:
        raise ValueError(
            f"log.param_drift = true needs one process (its trial optimiser step is not shared out), got {world} processes; "
            "set log.param_drift = false or train on one process"
        )


class DriftStage:
    """The trial step and its metrics, every ``every`` training steps."""

    def __init__(self, model, spec: ObjectiveSpec, optimizer: torch.optim.Optimizer, *, log_cfg, max_grad_norm: float, device, amp):
        self.model, self.spec, self.optimizer, self.device, self.amp = model, spec, optimizer, device, amp
        self.every, self.max_events = log_cfg.param_drift_every, log_cfg.param_drift_events
        self.max_grad_norm = max_grad_norm if max_grad_norm > 0 else math.inf

    def due(self, step: int) -> bool:
        return step == 1 or step % self.every == 0

    def run(self, step: int, rollout: Rollout, plan: list[list[torch.Tensor]], old: OldLogProbs, adv: torch.Tensor) -> dict[str, float]:
        """The ``drift/*`` metrics of training step ``step`` ({} when not due), after its optimiser steps."""
        if not self.due(step) or not plan:
            return {}
        rows = torch.cat(plan[0])  # the step's first mini-batch, whole groups
        mb = micro_batch(rollout.batch, rows, old.first.logp, old.ref_logp, adv, 1.0, rollout.sampler_logp)
        part, dev = mb.batch, self.device
        correct = torch.tensor(rollout.rewards.correct, dtype=torch.float64)[rows] > 0  # (b,)
        batch = DriftBatch(
            tokens=part.completion_ids.to(dev),
            mask=part.mask.to(dev),
            group_ids=part.group_ids.to(dev),
            advantages=mb.advantages.to(dev),
            old_logp=mb.old_logp.to(dev),
            correct=correct,
            ref_logp=None if mb.ref_logp is None else mb.ref_logp.to(dev),
            rollout_logp=None if mb.rollout_logp is None else mb.rollout_logp.to(dev),
        )
        needs_entropy = self.spec.needs_entropy

        def score(r: torch.Tensor):
            s = completion_logprobs(self.model, part.rows(r), dev, self.amp, with_entropy=needs_entropy)
            return s.logp, s.entropy

        report = probe_step(score, self.optimizer, batch, self.spec, max_events=self.max_events, max_grad_norm=self.max_grad_norm)
        return drift_metrics(report, mb.old_logp, part.mask)


def real_step_change(events: EventDrift, old_logp: torch.Tensor, mask: torch.Tensor, *, pairs: bool) -> torch.Tensor:
    """(n,) log pi(e) before the trial step (the policy after the real optimiser steps) minus under pi_old."""
    old = old_logp.double().cpu()
    if not pairs:
        return events.value - old[events.where[:, 0], events.where[:, 1]]
    seq = torch.where(mask.cpu(), old, 0.0).sum(-1)  # (b,) log pi_old(y)
    return events.value - (seq[events.where[:, 0]] - seq[events.where[:, 1]])


def drift_metrics(report: DriftReport, old_logp: torch.Tensor, mask: torch.Tensor) -> dict[str, float]:
    """``drift/<kind>_<part>`` from a probe report: each figure of ``core.probe.summary`` (``SUMMARY_PARTS``) and the
    real step's change; ``drift/shared_found`` and ``drift/shared_found_whole``, the shared events the probe's rule
    found before the ``log.param_drift_events`` cap and how many of them their whole group holds; a kind with no event gives its count only, and a share or ratio whose denominator is 0 is left
    out (no value is made up)."""
    out: dict[str, float] = {}
    for attr, kind in KINDS:
        events: EventDrift = getattr(report, attr)
        out["drift/shared_events" if attr == "shared" else "drift/equiv_pairs"] = float(len(events))
        if attr == "shared":  # eq 2's events (``core.probe.probe_events``, subset rule) before the cap, whole-group among them
            out["drift/shared_found"] = float(report.found)
            out["drift/shared_found_whole"] = float(report.found_whole)
        if len(events) == 0:
            continue
        parts = summary(events)
        for part in SUMMARY_PARTS:
            if part in parts:
                out[f"drift/{kind}_{part}"] = parts[part]
        step = real_step_change(events, old_logp, mask, pairs=attr == "pairs").abs().mean()
        if torch.isfinite(step):
            out[f"drift/{kind}_step"] = float(step)
    return out


def drift_summary(rows: list[dict]) -> dict[str, float]:
    """``summary.json``'s cumulative drift: each ``drift/<kind>_step`` and ``drift/<kind>_measured`` summed over the
    logged steps that hold it, and the number of probed steps; {} for a run without ``log.param_drift``."""
    probed = [r for r in rows if "drift/shared_events" in r]
    if not probed:
        return {}
    out: dict[str, float] = {"drift/probed_steps": float(len(probed))}
    for _, kind in KINDS:
        for part in CUMULATIVE:
            key = f"drift/{kind}_{part}"
            values = [float(r[key]) for r in probed if key in r]
            if values:
                out[f"drift/cumulative_{kind}_{part}"] = sum(values)
    return out
