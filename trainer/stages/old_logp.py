"""The old-log-prob stage: pi_old (and pi_ref) of a rollout batch before any optimiser step moves the policy.

Every objective's ratio is r_{i,t} = pi_theta / pi_old (eq 7; the sequence ratio of eq 44 is its length-normalised
product), with pi_old the policy that sampled the batch (eq 14). This is verl's ``compute_log_prob`` pass, run
before ``update_actor``. Where pi_old comes from (``rollout.old_logp``):

1. ``sampler``: the sampler's own per-token log-probs, when sampling is the policy itself (float32, temperature
   1, no top-p / top-k, the HF engine: what ``auto`` picks then) -- no forward pass at all;
2. ``recompute``: a no-grad forward of the trainer's model, but only for the rows the first optimiser step does
   not train: the first step's own forward (the policy has not moved yet) records its rows' log-probs and
   entropy (``FirstPass``), as TRL's GRPO trainer takes ``logp.detach()`` as pi_old with one iteration.

The reference log-probs pi_ref (a KL term, beta > 0) come from the frozen reference model, or from the base
model with the LoRA adapters switched off.

The optimal token baseline (``adv_scale="otb"``) reads pi_old's log-prob and sum_v pi_v^2 at every token before the
advantages exist: ``OldLogpStage.token_baseline_inputs`` is that pass (verl's ``compute_log_prob`` with
``calculate_sum_pi_squared``), a no-grad forward over every row, run only for that estimator.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

import torch

from ...core.loss import ObjectiveSpec
from ..forward import completion_logprobs, vocab_stats
from ..minibatches import rows_in
from ..parallel import OneProcess
from ..sampler import RolloutBatch
from .rollout import Rollout


@dataclass
class FirstPass:
    """Old log-probs and entropy (B, T) of a rollout batch, filled row by row: by the recompute pass for
    the rows a later optimiser step needs, and by the first optimiser step's own forward for its rows."""

    logp: torch.Tensor  # (B, T)
    entropy: torch.Tensor  # (B, T)
    done: torch.Tensor  # (B,) bool, rows recorded

    @classmethod
    def empty(cls, mask: torch.Tensor) -> FirstPass:
        return cls(torch.zeros(mask.shape), torch.zeros(mask.shape), torch.zeros(mask.shape[0], dtype=torch.bool))

    def record(self, rows: torch.Tensor, logp: torch.Tensor, entropy: torch.Tensor) -> None:
        """Write (b, T') values of ``rows`` (T' <= T: a trimmed micro-batch)."""
        width = logp.shape[1]
        self.logp[rows, :width] = logp.float().cpu()
        self.entropy[rows, :width] = entropy.float().cpu()
        self.done[rows] = True


@dataclass
class OldLogProbs:
    """What the update needs besides the rollout: pi_old (filled further by the first optimiser step) and pi_ref."""

    first: FirstPass
    ref_logp: torch.Tensor | None  # (B, T) of the rows this process trains (0 elsewhere); None without a KL term
    from_sampler: bool
    """pi_old is the sampler's log-probs (no recompute; nothing to compare the sampler with)."""


@torch.no_grad()
def batch_logp(
    model, batch: RolloutBatch, device, rows_per_chunk: int, amp_dtype=None, head_dtype: str = "autocast", shared_prompt: str = "off"
) -> tuple[torch.Tensor, torch.Tensor]:
    """(logp, entropy) (B, T) under ``model``, in chunks of rows (each trimmed of padding), no grad; the LM head's
    matmuls in ``forward.head_matmul_dtype(amp_dtype, head_dtype)``, a group's shared prompt run once with
    ``shared_prompt`` "auto" (``forward.completion_hidden``)."""
    logp, entropy = torch.zeros(batch.mask.shape), torch.zeros(batch.mask.shape)
    for s in range(0, batch.mask.shape[0], rows_per_chunk):
        rows = torch.arange(s, min(s + rows_per_chunk, batch.mask.shape[0]))
        part, width = batch.rows(rows).trimmed()
        scores = completion_logprobs(model, part, device, amp_dtype, with_entropy=True, head_dtype=head_dtype, shared_prompt=shared_prompt)
        logp[rows, :width], entropy[rows, :width] = scores.logp.float().cpu(), scores.entropy.float().cpu()
    return logp, entropy


def mismatch_metrics(sampler_logp: torch.Tensor, old_logp: torch.Tensor, mask: torch.Tensor) -> dict[str, float]:
    """How far the sampler's log-probs are from the trainer's pi_old on the real tokens: mean and max |gap|
    and the k3 KL(pi_old || pi_rollout) estimate, averaged per token. About 0 for float32 sampling from the
    policy itself; larger for another engine, precision, or sampling parameters."""
    if not bool(mask.any()):
        return {}
    gap = (sampler_logp - old_logp)[mask]  # log pi_rollout - log pi_old, (N,)
    k3 = torch.exp(gap) - gap - 1  # k3 estimate of KL(pi_old || pi_rollout) under samples from pi_old ~ pi_rollout
    return {
        "rollout/logp_gap_mean": float(gap.abs().mean()),
        "rollout/logp_gap_max": float(gap.abs().max()),
        "rollout/k3_kl": float(k3.mean()),
    }


def old_logp_from_sampler(rollout_cfg, amp: torch.dtype | None, dtype: torch.dtype) -> bool:
    """Whether pi_old is the sampler's own log-probs (rollout.old_logp; 'auto': when sampling is the policy itself)."""
    r = rollout_cfg
    if r.old_logp != "auto":
        return r.old_logp == "sampler"
    return r.engine == "hf" and r.temperature == 1.0 and r.top_p == 1.0 and r.top_k == 0 and amp is None and dtype == torch.float32


class OldLogpStage:
    """pi_old of the rows no first-step forward covers, and pi_ref of the rows this process trains."""

    def __init__(
        self,
        model,
        ref_model,
        spec: ObjectiveSpec,
        parallel: OneProcess,
        *,
        device: torch.device,
        amp: torch.dtype | None,
        from_sampler: bool,
        rows_per_forward: int,
        head_dtype: str = "autocast",
        shared_prompt: str = "off",
    ):
        self.model, self.ref_model, self.spec, self.parallel = model, ref_model, spec, parallel
        self.device, self.amp, self.from_sampler = device, amp, from_sampler
        self.rows_per_forward = rows_per_forward
        """Rows of one no-grad forward pass: a micro-batch's worth of groups."""
        self.head_dtype = head_dtype
        """``optim.head_dtype``: the dtype of the LM head's matmuls under autocast (``forward.head_matmul_dtype``)."""
        self.shared_prompt = shared_prompt
        """``optim.shared_prompt``: "auto" runs a group's shared prompt once (``forward.completion_hidden``)."""

    def run(self, rollout: Rollout, plan: list[list[torch.Tensor]]) -> OldLogProbs:
        """pi_old of every row the first optimiser step of ``plan`` does not score itself, and pi_ref."""
        batch, B = rollout.batch, rollout.batch.mask.shape[0]
        trained_here = rows_in(plan, B)  # (B,) the rows this process trains on (all on one process)
        if self.from_sampler:  # pi_old is the sampler: its log-probs need no forward pass
            first = FirstPass(rollout.sampler_logp.clone(), rollout.sampler_entropy.clone(), torch.ones(B, dtype=torch.bool))
        else:
            first = FirstPass.empty(batch.mask)
            first.done[:] = ~trained_here  # rows other processes train are not needed here
            later = ~first.done
            later[torch.cat(plan[0])] = False  # the first step's own forward gives its rows' old log-probs
            self.recompute(batch, first, later)
        return OldLogProbs(first, self.reference_logp(batch, trained_here), self.from_sampler)

    @torch.no_grad()
    def token_baseline_inputs(self, batch: RolloutBatch) -> tuple[torch.Tensor, torch.Tensor]:
        """pi_old's log-prob and sum_v pi_v^2 of the distribution each token was drawn from, both (B, T) float32 on the
        CPU (0 at padding), for every row: what ``optimal_token_baseline`` reads (the policy has not moved yet)."""
        B = batch.mask.shape[0]
        logp, pi_squared = torch.zeros(batch.mask.shape), torch.zeros(batch.mask.shape)
        for s in range(0, B, self.rows_per_forward):
            rows = torch.arange(s, min(s + self.rows_per_forward, B))
            part, width = batch.rows(rows).trimmed()
            scores = completion_logprobs(
                self.model,
                part,
                self.device,
                self.amp,
                with_entropy=False,
                keep_hidden=True,
                head_dtype=self.head_dtype,
                shared_prompt=self.shared_prompt,
            )
            _, collision = vocab_stats(self.model, scores, part, self.device)  # (b, width) sum_v pi_v^2
            real = part.mask.to(collision.device)
            logp[rows, :width] = scores.logp.float().cpu()
            pi_squared[rows, :width] = torch.where(real, collision.float(), 0.0).cpu()
        return logp, pi_squared

    def fill_unscored(self, batch: RolloutBatch, first: FirstPass) -> float:
        """Before a later optimiser step: the rows a skipped first step left unscored (the policy has not moved);
        returns the seconds it took."""
        return self.recompute(batch, first, ~first.done)

    def recompute(self, batch: RolloutBatch, first: FirstPass, rows: torch.Tensor) -> float:
        """Old log-probs (and entropy) of ``rows`` (B,) bool by a no-grad forward pass; returns its seconds."""
        if not self.parallel.anywhere(bool(rows.any())):
            return 0.0
        t0 = time.time()
        index = rows.nonzero().flatten()
        with self.parallel.gathered():  # entered by every process: it gathers the layers
            if len(index):
                logp, entropy = batch_logp(
                    self.model, batch.rows(index), self.device, self.rows_per_forward, self.amp, self.head_dtype, self.shared_prompt
                )
                first.record(index, logp, entropy)
        return time.time() - t0

    def reference_logp(self, batch: RolloutBatch, rows: torch.Tensor) -> torch.Tensor | None:
        """Log-probs under the reference policy (B, T) of the rows this process trains, (B,) bool (0 elsewhere),
        when the objective has a KL term, else None."""
        if not self.spec.needs_ref_logp:
            return None
        index = rows.nonzero().flatten()
        part = batch if len(index) == rows.shape[0] else batch.rows(index)
        if self.ref_model is not None:
            logp = batch_logp(self.ref_model, part, self.device, self.rows_per_forward, self.amp, self.head_dtype, self.shared_prompt)[0]
        else:
            with self.model.disable_adapter(), self.parallel.gathered():  # LoRA: the base model is the reference
                logp = batch_logp(self.model, part, self.device, self.rows_per_forward, self.amp, self.head_dtype, self.shared_prompt)[0]
        out = torch.zeros(batch.mask.shape)  # (B, T)
        out[index, : logp.shape[1]] = logp
        return out

    def shared(self, old: OldLogProbs, plan: list[list[torch.Tensor]], epochs: int) -> OldLogProbs:
        """After the update: every row's pi_old on every process, from the process that trained it in the first
        epoch (its first-step forward recorded it). The sampler's log-probs are whole everywhere already."""
        if old.from_sampler:
            return old
        owned = rows_in(plan[: len(plan) // epochs], old.first.done.shape[0])  # (B,)
        return OldLogProbs(self.parallel.share_first_pass(old.first, owned), old.ref_logp, old.from_sampler)
