"""The update stage: the K optimiser steps of one rollout batch.

For each optimiser step of the plan (``minibatches.optimiser_step_plan``: ``epochs`` passes over mini-batches of
whole groups) every micro-batch's loss is ``dfpo.policy_loss`` (the only place an objective's formula lives) of its
log-probs under the policy, times its accumulation weight: by default with the LM head fused in
(``forward.fused_completion_loss``: the loss's gradient taken in the forward, three matmuls over the logits), with
``optim.fused_head = "off"`` from ``forward.completion_logprobs`` first. The backward passes accumulate the mini-batch gradient; then the gradient is combined over processes, its norm
clipped, and AdamW steps under a cosine schedule with linear warmup and a floor (``lr_factor``). This is PPO's
multi-epoch mini-batch update as GRPO, DAPO and GSPO train (verl's ``update_actor``, TRL's ``num_iterations``).

Choices made here (where the paper and the peers leave it open):
1. Micro-batch weights are exact for token_mask = "none". With a token mask (STAPO, top-entropy) the mask
   thresholds depend on the batch a loss call sees, so accumulation is exact only without micro-batching
   (optim.microbatch_groups = 0); the trainer warns when an objective is batch-coupled and split.
2. A non-finite loss or gradient skips that optimiser step (no parameter, optimiser or scheduler change);
   ``train.max_nonfinite_in_row`` skips in a row stop the run with the last good checkpoint kept.
3. Diagnostics (Energy, eq 24; the shared-prefix residual) are read off ``d loss / d logp`` after each backward
   pass, so no objective formula is repeated for them.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field

import torch

from ...core.loss import ObjectiveSpec, policy_loss
from ...core.metric_registry import reduce_records
from ...core.metrics import frequency_buckets
from ..diagnostics import StepDiagnostics
from ..forward import TokenScores, completion_logprobs, fused_completion_loss, vocab_stats
from ..minibatches import MicroBatch, micro_batch, optimiser_step_plan
from ..parallel import OneProcess
from ..run.state import RunState
from ..sampler import RolloutBatch
from .old_logp import FirstPass, OldLogProbs, OldLogpStage
from .rollout import Rollout


class NonFiniteLossError(RuntimeError):
    """Too many optimiser steps in a row had a non-finite loss or gradient."""


def lr_factor(step: int, *, total: int, warmup: int, min_ratio: float) -> float:
    """Linear warmup over ``warmup`` steps, then cosine from 1 to ``min_ratio`` at ``total``.

    ``step`` counts the optimiser steps taken (0-based): optimiser step k (1-based) applies ``lr_factor(k - 1)``, so
    step k <= warmup applies k / warmup (the last warm-up step the full lr), the first step after it the full lr
    again (cosine at 0), and the last step (k = total) the cosine at (total - 1 - warmup) / (total - warmup); the
    floor ``min_ratio`` is the factor after the last step."""
    if warmup > 0 and step < warmup:
        return (step + 1) / warmup
    progress = min(1.0, (step - warmup) / max(1, total - warmup))
    return min_ratio + (1 - min_ratio) * 0.5 * (1 + math.cos(math.pi * progress))


def warmup_updates(total: int, warmup_ratio: float) -> int:
    """Optimiser steps of the linear warm-up: ``warmup_ratio`` of all ``total``, rounded to the nearest."""
    return int(round(warmup_ratio * total))


def lr_schedule(optimizer: torch.optim.Optimizer, *, total: int, warmup_ratio: float, min_ratio: float):
    """The run's schedule on ``optimizer`` (``lr_factor`` times its lr), stepped once after each optimiser step."""
    warmup = warmup_updates(total, warmup_ratio)
    return torch.optim.lr_scheduler.LambdaLR(optimizer, lambda s: lr_factor(s, total=total, warmup=warmup, min_ratio=min_ratio))


@dataclass
class MicroLoss:
    """One micro-batch's loss and what the step reads off it, whichever path scored it."""

    loss: torch.Tensor
    """0-d loss of the objective, with the graph to the model's parameters."""
    metrics: dict[str, torch.Tensor]
    scores: TokenScores
    """(b, T) detached log-probs and entropies (and the hidden states ``vocab_stats`` reads, when kept)."""
    finite: bool
    """False when a real position's log-prob is not finite (the step is skipped)."""
    logp_coef: Callable[[], torch.Tensor | None]
    """After the backward of ``loss * weight``: d (loss * weight) / d logp (b, T), what the diagnostics read."""


def micro_loss(
    model,
    mb: MicroBatch,
    spec: ObjectiveSpec,
    device,
    amp_dtype,
    *,
    fused_head: str,
    keep_hidden: bool,
    head_dtype: str = "autocast",
    shared_prompt: str = "off",
) -> MicroLoss | None:
    """Score micro-batch ``mb`` with the policy and take the objective's loss: the LM head fused with the loss
    (``fused_completion_loss``, ``fused_head`` eager or compile) or log-probs first, then ``policy_loss`` (``off``,
    and a head that is not plain); the head's matmuls in ``forward.head_matmul_dtype(amp_dtype, head_dtype)``, the decoder
    over a group's shared prompt once with ``shared_prompt`` "auto" (``forward.completion_hidden``). Entropy is computed when the objective reads it, or for the first pass's record
    (a micro-batch without old log-probs takes its own, detached). None: a non-finite log-prob and no loss to take."""
    b = mb.batch
    mask = b.mask.to(device)  # (b, T)
    with_entropy = spec.needs_entropy or mb.old_logp is None
    old_logp = None if mb.old_logp is None else mb.old_logp.to(device)
    ref_logp = None if mb.ref_logp is None else mb.ref_logp.to(device)
    rollout_logp = mb.rollout_logp.to(device) if spec.needs_rollout_logp else None
    advantages = mb.advantages.to(device)
    if fused_head != "off":
        fused = fused_completion_loss(
            model, b, device, amp_dtype, spec, old_logp=old_logp, advantages=advantages, ref_logp=ref_logp,
            rollout_logp=rollout_logp, with_entropy=with_entropy, keep_hidden=keep_hidden, compile=fused_head == "compile",
            head_dtype=head_dtype, shared_prompt=shared_prompt,
        )  # fmt: skip
        if fused is not None:
            out, scores = fused
            coef = (lambda: None) if out.logp_grad is None else (lambda: out.logp_grad * mb.weight)
            return MicroLoss(out.loss, out.metrics, scores, out.finite, coef)
    scores = completion_logprobs(
        model, b, device, amp_dtype, with_entropy=with_entropy, keep_hidden=keep_hidden, head_dtype=head_dtype, shared_prompt=shared_prompt
    )
    logp, entropy = scores.logp, scores.entropy  # (b, T)
    if not bool(torch.isfinite(logp.detach())[mask].all()):
        nan_loss = torch.where(mask, logp, 0.0).sum() * 0.0 + math.nan  # kept on the graph: sharded ranks still run backward
        return MicroLoss(nan_loss, {}, scores, False, lambda: None)
    logp.retain_grad()
    loss, metrics = policy_loss(
        spec,
        logp=logp,
        old_logp=logp.detach() if old_logp is None else old_logp,
        advantages=advantages,
        mask=mask,
        group_ids=b.group_ids.to(device),
        entropy=entropy if spec.needs_entropy else None,
        ref_logp=ref_logp,
        rollout_logp=rollout_logp,
        token_ids=b.completion_ids.to(device) if spec.needs_token_ids else None,  # the exact-cancellation arm's shared tokens
    )
    detached = TokenScores(logp.detach(), None if entropy is None else entropy.detach(), scores.kept)
    return MicroLoss(loss, metrics, detached, True, lambda: None if logp.grad is None else logp.grad.detach())


def accumulate_gradients(
    model,
    micro_batches: list[MicroBatch],
    spec: ObjectiveSpec,
    device,
    *,
    buckets: torch.Tensor | None = None,
    diagnostics: StepDiagnostics | None = None,
    amp_dtype: torch.dtype | None = None,
    first_pass: FirstPass | None = None,
    stop_early: bool = True,
    fused_head: str = "eager",
    head_dtype: str = "autocast",
    shared_prompt: str = "off",
) -> tuple[dict, bool]:
    """Forward/backward every micro-batch with its weight; returns (metrics, all finite).

    Gradients accumulate in ``.grad``; on a non-finite log-prob or loss the remaining micro-batches are skipped and
    (metrics, False) returned (the caller zeroes the gradients); with ``stop_early`` False they still run (sharded
    training: every rank must take part in every forward and backward). A micro-batch without old log-probs takes
    its own, detached (the first optimiser step of a rollout batch), and records them and their entropy in
    ``first_pass``. ``fused_head`` (``optim.fused_head``): how each micro-batch is scored (``micro_loss``);
    ``head_dtype`` (``optim.head_dtype``): the dtype of its LM head's matmuls under autocast; ``shared_prompt``
    (``optim.shared_prompt``): whether its decoder runs a group's shared prompt once (``forward.completion_hidden``).
    """
    records: list[dict[str, float]] = []  # one per micro-batch, combined by each key's reduction at the end
    weights: list[float] = []
    finite = True
    for mb in micro_batches:
        b = mb.batch
        mask = b.mask.to(device)  # (b, T)
        part = micro_loss(
            model,
            mb,
            spec,
            device,
            amp_dtype,
            fused_head=fused_head,
            keep_hidden=diagnostics is not None,
            head_dtype=head_dtype,
            shared_prompt=shared_prompt,
        )
        if not part.finite:
            if stop_early:
                return {}, False
            finite = False
        entropy = part.scores.entropy  # (b, T) detached
        if mb.old_logp is None and first_pass is not None and part.finite:
            first_pass.record(mb.rows, part.scores.logp, entropy)
        if not bool(torch.isfinite(part.loss.detach())):
            if stop_early:
                return {}, False
            finite = False
        (part.loss * mb.weight).backward()
        if not finite:  # the step will be skipped: the metrics and diagnostics would be meaningless
            continue
        record = {k: float(v) for k, v in part.metrics.items()}
        if entropy is not None and bool(mask.any()):
            record["entropy/mean"] = float(entropy[mask].mean())
        records.append(record)
        weights.append(mb.weight)
        coef = part.logp_coef() if diagnostics is not None else None  # (b, T) = d loss_minibatch / d logp, weight included
        if coef is not None:
            prob, coll = vocab_stats(model, part.scores, b, device)  # (b, T) each, no grad
            diagnostics.add(coef, prob, coll, b.completion_ids.to(device), mask, b.group_ids.to(device), buckets, spec.aggregation)
    return reduce_records(records, weights), finite


@dataclass
class UpdateStats:
    """What the optimiser steps of one rollout batch produced: per-step loss metrics and
    gradient norms (steps taken only) and the number of skipped non-finite steps."""

    loss_metrics: list[dict] = field(default_factory=list)
    grad_norms: list[float] = field(default_factory=list)
    skipped: int = 0
    recompute_s: float = 0.0
    """Seconds spent recomputing old log-probs that a skipped first step left unscored."""
    diagnostics: StepDiagnostics = field(default_factory=StepDiagnostics)
    """The step's diagnostic sums over its optimiser steps and processes."""
    update_norm: float | None = None
    """With log.update_norm: the L2 norm of the trainable parameters' change over the step's optimiser steps."""


FUSED_ADAMW_DTYPES = (torch.float32, torch.bfloat16, torch.float16, torch.float64)
FUSED_ADAMW_DEVICES = ("cpu", "cuda")


def adamw_kernel(params: list[torch.Tensor], foreach: bool | None) -> dict[str, bool | None]:
    """AdamW's implementation keywords: torch's fused kernel (one pass over each parameter; on one CPU thread about 7x
    the per-parameter loop on SmolLM2's 135M parameters, and what TRL's default optimiser, adamw_torch_fused, runs)
    where the parallel layout leaves the choice to torch (``foreach`` None) and every parameter is a plain float tensor
    on a CPU or CUDA device; else ``foreach`` as the layout asks (FSDP2's sharded and whole parameters: False)."""
    plain = all(type(p.data) is torch.Tensor and p.device.type in FUSED_ADAMW_DEVICES and p.dtype in FUSED_ADAMW_DTYPES for p in params)
    return {"fused": True} if foreach is None and plain and params else {"foreach": foreach}


class UpdateStage:
    """The optimiser (AdamW, schedule) and the K optimiser steps of a rollout batch."""

    def __init__(
        self,
        model,
        spec: ObjectiveSpec,
        cfg,
        parallel: OneProcess,
        old_logp: OldLogpStage,
        *,
        device: torch.device,
        amp: torch.dtype | None,
        vocab_size: int,
        total_updates: int,
        say,
    ):
        self.model, self.spec, self.cfg, self.parallel, self.old_logp = model, spec, cfg, parallel, old_logp
        self.device, self.amp, self.vocab_size, self.say = device, amp, vocab_size, say
        self.params = [p for p in model.parameters() if p.requires_grad]
        o = cfg.optim
        self.optimizer = torch.optim.AdamW(
            self.params,
            lr=o.lr,
            betas=(o.beta1, o.beta2),
            eps=o.adam_eps,
            weight_decay=o.weight_decay,
            **adamw_kernel(self.params, parallel.optimizer_foreach),
        )
        self.scheduler = lr_schedule(self.optimizer, total=total_updates, warmup_ratio=o.warmup_ratio, min_ratio=o.min_lr_ratio)

    def plan(self, step: int, batch: RolloutBatch) -> list[list[torch.Tensor]]:
        """The row indices of every optimiser step's micro-batches on this process (``optimiser_step_plan``)."""
        return optimiser_step_plan(batch, self.cfg.optim, seed=self.cfg.seed, step=step, share_of=self.parallel.rank_share)

    def run(
        self,
        step: int,
        rollout: Rollout,
        plan: list[list[torch.Tensor]],
        old: OldLogProbs,
        adv: torch.Tensor,
        state: RunState,
        spec: ObjectiveSpec | None = None,
    ) -> UpdateStats:
        """The optimiser steps of ``plan``: each accumulated over its micro-batches, combined over processes,
        clipped, stepped (or skipped if non-finite; ``state`` counts the skips in a row and the steps taken). The
        first step scores its own rows' old log-probs; rows a skipped first step left unscored are recomputed
        before the next (the policy has not moved). ``spec``: this step's objective when it differs from the run's (the
        adaptive entropy coefficient, ``dfpo.trainer.entropy_control``)."""
        cfg, batch, first = self.cfg, rollout.batch, old.first
        spec = self.spec if spec is None else spec
        buckets = None
        if cfg.log.diagnostics:
            buckets = frequency_buckets(batch.completion_ids, batch.mask, list(cfg.log.energy_buckets), self.vocab_size)
        upd = UpdateStats()
        start = [p.detach().clone() for p in self.params] if cfg.log.update_norm else None  # one copy of the trainable parameters
        for k, micro_rows in enumerate(plan):
            if k > 0:
                upd.recompute_s += self.old_logp.fill_unscored(batch, first)
            masks = [batch.mask[r] for r in micro_rows]
            weights = self.parallel.accumulation_weights(masks, self.spec.aggregation)
            # rows without old log-probs yet are the first step's: its own forward gives them
            micros = [
                micro_batch(batch, r, first.logp if bool(first.done[r].all()) else None, old.ref_logp, adv, w, rollout.sampler_logp)
                for r, w in zip(micro_rows, weights)
            ]
            metrics, finite = accumulate_gradients(
                self.model,
                micros,
                spec,
                self.device,
                buckets=buckets,
                diagnostics=upd.diagnostics if cfg.log.diagnostics else None,
                amp_dtype=self.amp,
                first_pass=first,
                stop_early=self.parallel.stop_early,
                fused_head=cfg.optim.fused_head,
                head_dtype=cfg.optim.head_dtype,
                shared_prompt=cfg.optim.shared_prompt,
            )
            finite, metrics = self.parallel.combine_gradients(finite, metrics, weights, self.params)
            norm = None
            if finite:
                norm = self.parallel.clip_grad_norm(self.params, cfg.optim.max_grad_norm if cfg.optim.max_grad_norm > 0 else math.inf)
                finite = math.isfinite(norm)
            if not finite:
                self._skip(step, upd, state)
                continue
            self.optimizer.step()
            self.scheduler.step()
            self.optimizer.zero_grad(set_to_none=True)
            state.nonfinite_in_row = 0
            state.updates_done += 1
            upd.loss_metrics.append(metrics)
            upd.grad_norms.append(norm)
        upd.diagnostics = self.parallel.reduce_diagnostics(upd.diagnostics)
        if start is not None:
            upd.update_norm = self.parallel.update_norm(self.params, start)
        return upd

    def _skip(self, step: int, upd: UpdateStats, state: RunState) -> None:
        """A non-finite loss or gradient: the step is skipped; too many in a row stop the run."""
        self.optimizer.zero_grad(set_to_none=True)
        upd.skipped += 1
        state.nonfinite_in_row += 1
        self.say(f"step {step}: non-finite loss or gradient, optimiser step skipped ({state.nonfinite_in_row} in a row)")
        if state.nonfinite_in_row >= self.cfg.train.max_nonfinite_in_row:
            raise NonFiniteLossError(
                f"{state.nonfinite_in_row} optimiser steps in a row had a non-finite loss or gradient (at training step {step}); "
                f"stopped. The last good checkpoint is {self.cfg.folder.checkpoint} (step {state.last_checkpoint_step}). "
                "Lower optim.lr, set optim.max_grad_norm > 0, or check the reward function; then --resume the run "
                "or start again, or raise train.max_nonfinite_in_row."
            )
