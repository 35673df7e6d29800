"""The LLM trainer: rollouts -> rewards -> group advantages -> K off-policy optimiser steps.

One training step (one rollout batch):

1. take ``prompts_per_step`` prompts (seeded, resumable cursor), generate G completions each;
2. rewards (timeouts and errors give 0 and are counted), ``group_advantages``;
3. old log-probs recomputed by the trainer (no grad), reference log-probs when beta > 0;
4. ``epochs`` passes over the batch in mini-batches of ``minibatch_groups`` whole groups
   (K = epochs * prompts_per_step / minibatch_groups optimiser steps); each mini-batch is
   split into micro-batches of whole groups whose losses are weighted so that the summed
   gradient equals the mini-batch loss gradient exactly (``accumulation_weights``);
   grad-norm clipping, AdamW, cosine schedule with linear warmup and a floor;
5. diagnostics from ``d loss / d logp`` (Energy, shared-prefix residual), metrics line,
   samples, checkpoint.

All loss maths is ``dfpo.policy_loss``; this file never writes an objective formula.

On several processes (torchrun, ``dfpo train --nproc N``; ``dfpo.trainer.llm.distributed``) each samples and
scores every world-th prompt and the shares are gathered, so every process holds the whole rollout batch:
advantages (batch-wide scales included), the mini-batch plan and the metrics come from the global batch. Each
process trains its share of the whole groups of every mini-batch with weights normalised by the mini-batch's
count over all processes; the gradients are summed over the processes (DDP) or reduce-scattered (FSDP2)
before clipping, so N processes take the optimiser steps one process would. With per-group sampling seeds
(``rollout.seed_per_group``, on by itself with more than one process) the rollouts, and so whole runs, do not
depend on the number of processes. Rank 0 writes the run folder; checkpoints hold whole tensors.

Choices made here (where the paper and the peers leave it open):
1. Micro-batch weights are exact for token_mask = "none". With a token mask (STAPO,
   top-entropy) the mask thresholds depend on the batch a loss call sees, so accumulation
   is exact only without micro-batching (optim.microbatch_groups = 0).
2. ``constant`` aggregation gets max_completion_length = rollout.max_new_tokens unless the
   config overrides it, as TRL's dr_grpo does.
3. A non-finite loss or gradient skips that optimiser step (no parameter, optimiser or
   scheduler change); ``train.max_nonfinite_in_row`` skips in a row stop the run with the
   last good checkpoint kept.
"""

from __future__ import annotations

import contextlib
import json
import math
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

import torch

from dfpo import ObjectiveSpec, group_advantages, policy_loss, resolve_objective
from dfpo.trainer.llm import diagnostics as diag
from dfpo.trainer.llm import distributed as dp
from dfpo.trainer.llm.checkpoint import load_checkpoint, rng_state, save_checkpoint, set_rng_state, write_run_file
from dfpo.trainer.llm.config import Config, check_same_config, config_to_dict, config_to_toml
from dfpo.trainer.llm.forward import completion_logprobs, vocab_stats
from dfpo.trainer.llm.rewards import RewardBatch
from dfpo.trainer.llm.rollout import HFGenerateEngine, RolloutBatch, Samples, SamplingParams, build_batch, row_seed, sampler_logp
from dfpo.trainer.llm.run_folder import NullLock, prepare_run_folder, write_mark
from dfpo.trainer.llm.runlog import JsonlLog, NullLog, Scalars, StopSignals, TrainingInterrupted, finite_only, missing_steps
from dfpo.trainer.llm.tasks import PromptSampler, duplicate_prompts, equiv_targets, load_splits, surface_form
from dfpo.trainer.loss import aggregation_count
from dfpo.trainer.metric_registry import reduce_records
from dfpo.trainer.metrics import energy_sums, frequency_buckets, jitter2, logit_grad_norm, score_norm, steps_to_threshold, trailing_mean


class NonFiniteLossError(RuntimeError):
    """Too many optimiser steps in a row had a non-finite loss or gradient."""


# ----------------------------------------------------------------------------- pure helpers


def lr_factor(step: int, *, total: int, warmup: int, min_ratio: float) -> float:
    """Linear warmup over ``warmup`` steps, then cosine from 1 to ``min_ratio`` at ``total``."""
    if warmup > 0 and step < warmup:
        return (step + 1) / warmup
    progress = min(1.0, (step - warmup) / max(1, total - warmup))
    return min_ratio + (1 - min_ratio) * 0.5 * (1 + math.cos(math.pi * progress))


def group_minibatches(group_ids: torch.Tensor, groups_per_batch: int, generator: torch.Generator) -> list[torch.Tensor]:
    """Row indices of mini-batches that each hold ``groups_per_batch`` whole groups, in random group order."""
    groups = torch.unique(group_ids)  # sorted
    order = groups[torch.randperm(len(groups), generator=generator)]
    out = []
    for s in range(0, len(order), groups_per_batch):
        chosen = order[s : s + groups_per_batch]
        out.append(torch.isin(group_ids, chosen).nonzero().flatten())
    return out


def split_groups(rows: torch.Tensor, group_ids: torch.Tensor, groups_per_micro: int) -> list[torch.Tensor]:
    """Split the rows of a mini-batch into micro-batches of ``groups_per_micro`` whole groups (0: one micro)."""
    if groups_per_micro <= 0:
        return [rows]
    groups = []
    for g in group_ids[rows].tolist():
        if g not in groups:
            groups.append(g)
    out = []
    for s in range(0, len(groups), groups_per_micro):
        chosen = torch.tensor(groups[s : s + groups_per_micro])
        out.append(rows[torch.isin(group_ids[rows], chosen)])
    return out


def split_groups_by_tokens(rows: torch.Tensor, group_ids: torch.Tensor, tokens_per_row: torch.Tensor, budget: int) -> list[torch.Tensor]:
    """Split a mini-batch's rows into micro-batches of whole groups whose padded size fits ``budget`` tokens.

    A micro-batch is trimmed to its longest row, so its cost is (rows) x (longest row): groups are added in
    order while that product stays within the budget; a group larger than the budget alone is a micro-batch
    of its own (groups are never split). ``tokens_per_row`` (B,): prompt plus completion tokens of each row.
    """
    order: list[int] = []
    for g in group_ids[rows].tolist():
        if g not in order:
            order.append(g)
    out, current, longest, n_rows = [], [], 0, 0
    for g in order:
        members = rows[group_ids[rows] == g]
        g_longest = int(tokens_per_row[members].max())
        fits = (n_rows + len(members)) * max(longest, g_longest) <= budget
        if current and not fits:
            out.append(torch.cat(current))
            current, longest, n_rows = [], 0, 0
        current.append(members)
        longest, n_rows = max(longest, g_longest), n_rows + len(members)
    if current:
        out.append(torch.cat(current))
    return out


def split_settings(cfg: Config, world: int) -> list[str]:
    """The settings that split a mini-batch over several loss calls (micro-batches, a token budget, processes)."""
    out = []
    if cfg.optim.microbatch_groups and cfg.optim.microbatch_groups < cfg.optim.minibatch_groups:
        out.append(f"optim.microbatch_groups={cfg.optim.microbatch_groups}")
    if cfg.optim.max_tokens_per_microbatch:
        out.append(f"optim.max_tokens_per_microbatch={cfg.optim.max_tokens_per_microbatch}")
    if world > 1:
        out.append(f"training on {world} processes")
    return out


def accumulation_weights(masks: list[torch.Tensor], aggregation: str) -> list[float]:
    """Weights w_u with sum_u w_u * loss(micro u) == loss(whole mini-batch) for an aggregation:
    each micro-batch's ``aggregation_count`` over the mini-batch's."""
    counts = [float(aggregation_count(m, aggregation)) for m in masks]
    total = sum(counts)
    return [c / total if total > 0 else 0.0 for c in counts]


@dataclass(frozen=True)
class Rollout:
    """One rollout batch: the completions of ``examples`` (G per prompt, grouped), their texts and rewards."""

    examples: list
    batch: RolloutBatch
    texts: list[str]
    rewards: RewardBatch
    sampler_logp: torch.Tensor  # (B, T) log pi_rollout(y_t), 0 on padding
    sampler_entropy: torch.Tensor  # (B, T) entropy of the distribution each token was sampled from

    def reward_tensor(self) -> torch.Tensor:
        """The total rewards (B,) float32."""
        return torch.tensor(self.rewards.total, dtype=torch.float32)


@dataclass
class MicroBatch:
    """Rows of one loss call, trimmed to their longest prompt and completion, with their accumulation weight."""

    batch: RolloutBatch
    old_logp: torch.Tensor | None  # (b, T); None: the policy has not moved yet, its own log-probs are the old ones
    ref_logp: torch.Tensor | None  # (b, T)
    advantages: torch.Tensor  # (b,)
    weight: float
    rows: torch.Tensor | None = None  # (b,) indices into the rollout batch
    rollout_logp: torch.Tensor | None = None  # (b, T) the sampler's log-probs (read by a rollout correction)


def micro_batch(
    batch: RolloutBatch, rows: torch.Tensor, old_logp, ref_logp, adv: torch.Tensor, weight: float, rollout_logp=None
) -> MicroBatch:
    """The rows of ``batch`` as a micro-batch, padding trimmed away (old/ref/rollout log-probs cut to the same width)."""
    part, width = batch.rows(rows).trimmed()
    cut = lambda x: None if x is None else x[rows, :width]  # noqa: E731
    return MicroBatch(part, cut(old_logp), cut(ref_logp), adv[rows], weight, rows, cut(rollout_logp))


@dataclass
class UpdateStats:
    """What the optimiser steps of one rollout batch produced: per-step loss metrics and
    gradient norms (steps taken only) and the number of skipped non-finite steps."""

    loss_metrics: list[dict] = field(default_factory=list)
    grad_norms: list[float] = field(default_factory=list)
    skipped: int = 0
    recompute_s: float = 0.0
    """Seconds spent recomputing old log-probs that a skipped first step left unscored."""


@dataclass
class StepDiagnostics:
    """Running sums of one training step's diagnostics over its optimiser steps."""

    energy: torch.Tensor | None = None
    shared_num: float = 0.0
    shared_den: float = 0.0
    shared_positions: int = 0

    def add_energy(self, sums: torch.Tensor) -> None:
        self.energy = sums.cpu() if self.energy is None else self.energy + sums.cpu()


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
) -> tuple[dict, bool]:
    """Forward/backward every micro-batch with its weight; returns (metrics, all finite).

    Gradients accumulate in ``.grad``; on a non-finite loss the remaining micro-batches are skipped and
    (metrics, False) returned (the caller zeroes the gradients); with ``stop_early`` False they still run
    (sharded training: every rank must take part in every forward and backward). A micro-batch without old log-probs takes
    its own, detached (the first optimiser step of a rollout batch), and records them and their entropy in
    ``first_pass``. Entropy is computed when the objective reads it, or for that record.
    """
    records: list[dict[str, float]] = []  # one per micro-batch, combined by each key's reduction at the end
    weights: list[float] = []
    needs_entropy = spec.needs_entropy
    finite = True
    for mb in micro_batches:
        b = mb.batch
        targets = b.completion_ids.to(device)  # (b, T)
        mask = b.mask.to(device)  # (b, T)
        scores = completion_logprobs(
            model, b, device, amp_dtype, with_entropy=needs_entropy or mb.old_logp is None, keep_hidden=diagnostics is not None
        )
        logp, entropy = scores.logp, scores.entropy  # (b, T)
        if not bool(torch.isfinite(logp.detach())[mask].all()):
            if stop_early:
                return {}, False
            finite = False
        old_logp = logp.detach() if mb.old_logp is None else mb.old_logp.to(device)
        if mb.old_logp is None and first_pass is not None:
            first_pass.record(mb.rows, logp.detach(), entropy.detach())
        logp.retain_grad()
        loss, metrics = policy_loss(
            spec,
            logp=logp,
            old_logp=old_logp,
            advantages=mb.advantages.to(device),
            mask=mask,
            group_ids=b.group_ids.to(device),
            entropy=entropy if needs_entropy else None,
            ref_logp=None if mb.ref_logp is None else mb.ref_logp.to(device),
            rollout_logp=mb.rollout_logp.to(device) if spec.needs_rollout_logp else None,
        )
        if not bool(torch.isfinite(loss.detach())):
            if stop_early:
                return {}, False
            finite = False
        (loss * mb.weight).backward()
        if not finite:  # the step will be skipped: the metrics and diagnostics would be meaningless
            continue
        record = {k: float(v) for k, v in metrics.items()}
        if entropy is not None and bool(mask.any()):
            record["entropy/mean"] = float(entropy.detach()[mask].mean())
        records.append(record)
        weights.append(mb.weight)
        if diagnostics is not None and logp.grad is not None:
            prob, coll = vocab_stats(model, scores, b, device)  # (b, T) each, no grad
            coef = logp.grad.detach()  # (b, T) = d loss_minibatch / d logp, weight included
            if buckets is not None:
                norm = logit_grad_norm(coef, prob, coll)  # (b, T) closed-form logit-gradient norm
                diagnostics.add_energy(energy_sums(norm, targets, mask, buckets))
            num, den, n = diag.shared_prefix_sums(coef, score_norm(prob, coll), targets, mask, b.group_ids.to(device))
            diagnostics.shared_num += num
            diagnostics.shared_den += den
            diagnostics.shared_positions += n
    return reduce_records(records, weights), finite


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


@torch.no_grad()
def batch_logp(model, batch: RolloutBatch, device, rows_per_chunk: int, amp_dtype=None) -> tuple[torch.Tensor, torch.Tensor]:
    """(logp, entropy) (B, T) under ``model``, in chunks of rows (each trimmed of padding), no grad."""
    logp, entropy = torch.zeros(batch.mask.shape), torch.zeros(batch.mask.shape)
    for s in range(0, batch.mask.shape[0], rows_per_chunk):
        rows = torch.arange(s, min(s + rows_per_chunk, batch.mask.shape[0]))
        part, width = batch.rows(rows).trimmed()
        scores = completion_logprobs(model, part, device, amp_dtype, with_entropy=True)
        logp[rows, :width], entropy[rows, :width] = scores.logp.float().cpu(), scores.entropy.float().cpu()
    return logp, entropy


def rows_in(plan: list[list[torch.Tensor]], n_rows: int) -> torch.Tensor:
    """(B,) bool: the rows some micro-batch of ``plan`` holds."""
    out = torch.zeros(n_rows, dtype=torch.bool)
    for micro_rows in plan:
        for rows in micro_rows:
            out[rows] = True
    return out


def gather_groups(parts: list[tuple], n_groups: int, G: int) -> tuple[Samples, list[str], RewardBatch]:
    """The whole batch from every process's (group indices, Samples, texts, RewardBatch) of its groups,
    laid out group-major in global group order as one process would have sampled it."""
    slots: list = [None] * n_groups
    counts = {"errors": 0, "timeouts": 0, "invalid": 0}
    for mine, smp, texts, rew in parts:
        for k, g in enumerate(mine):
            rows = slice(k * G, (k + 1) * G)
            slots[g] = (
                smp.tokens[rows],
                smp.logprobs[rows],
                smp.entropies[rows],
                texts[rows],
                rew.total[rows],
                rew.correct[rows],
                rew.format[rows],
            )
        for key in counts:
            counts[key] += getattr(rew, key)
    flat = lambda j: [x for slot in slots for x in slot[j]]  # noqa: E731
    return Samples(flat(0), flat(1), flat(2)), flat(3), RewardBatch(flat(4), flat(5), flat(6), **counts)


def reduce_diagnostics(d: StepDiagnostics) -> StepDiagnostics:
    """The step's diagnostic sums over all processes."""
    out = StepDiagnostics()
    for energy, num, den, n in dp.gather_objects((d.energy, d.shared_num, d.shared_den, d.shared_positions)):
        if energy is not None:
            out.add_energy(energy)
        out.shared_num, out.shared_den, out.shared_positions = out.shared_num + num, out.shared_den + den, out.shared_positions + n
    return out


def share_first_pass(first: FirstPass, owned: torch.Tensor) -> FirstPass:
    """Every row's old log-probs and entropy (B, T) on every process, each taken from the one process that
    ``owned`` (B,) bool the row (its first-epoch trainer)."""
    keep = owned[:, None]  # (B, 1)
    logp = dp.sum_tensor(torch.where(keep, first.logp, 0.0))  # (B, T)
    entropy = dp.sum_tensor(torch.where(keep, first.entropy, 0.0))  # (B, T)
    done = dp.sum_tensor((first.done & owned).to(torch.int32)) > 0  # (B,)
    return FirstPass(logp, entropy, done)


# ----------------------------------------------------------------------------- the trainer


class Trainer:
    """Everything a run needs, built from a Config in ``__init__`` (cheap checks first, then the model,
    optimiser, step-0 checkpoint and logs), so the initial parameters are there to read before ``run``.

    The run folder is locked from construction until ``run`` returns (or ``close`` is called).
    """

    def __init__(self, cfg: Config, *, resume: bool = False, quiet: bool = False):
        self.cfg, self.resume, self.quiet = cfg, resume, quiet
        self.run_dir = Path(cfg.run_dir)
        from dfpo.trainer.llm.policy import resolve_device

        dp.check_world_size(cfg, dp.launched_world_size())  # before any work, before joining the group
        self.device = resolve_device(cfg.device)
        self.rank, self.world = dp.init_from_env(self.device.type)
        dp.check_world_size(cfg, self.world)
        if self.device.type == "cuda" and self.world > 1:
            self.device = torch.device("cuda", torch.cuda.current_device())  # torchrun's LOCAL_RANK (init_from_env)
        self.quiet = quiet or self.rank > 0  # rank 0 speaks for the run
        # every process samples its groups from their own seeds, so the rollout does not depend on the world size
        self.seed_per_group = cfg.rollout.seed_per_group or (self.world > 1 and cfg.rollout.engine == "hf")
        # checked and locked first, by rank 0 (the others wait for its verdict)
        self.lock = dp.on_rank0(lambda: prepare_run_folder(self.run_dir, resume=resume, steps=cfg.train.steps)) or NullLock()
        self.rewards = None
        try:
            dp.agree(lambda: self._build(cfg))  # refused on every process, reported once
            self._setup()
        except BaseException:
            self._close_rewards()
            self.lock.abandon()  # a refused config leaves no empty run folder behind
            raise

    def _build(self, cfg: Config) -> None:
        from dfpo.trainer.llm.policy import check_model_available, resolve_amp, resolve_dtype
        from dfpo.trainer.llm.reward_pool import default_workers
        from dfpo.trainer.llm.rewards import RewardComputer, reward_spec

        self.dtype = resolve_dtype(cfg.model.dtype, self.device)
        self.amp = resolve_amp(cfg.model.amp, self.device)
        overrides = dict(cfg.objective.overrides)
        if cfg.rollout.correction != "none":
            overrides.update(
                rollout_correction=cfg.rollout.correction, rollout_low=cfg.rollout.correction_low, rollout_cap=cfg.rollout.correction_cap
            )
        if resolve_objective(cfg.objective.name, **overrides).aggregation == "constant":
            overrides.setdefault("max_completion_length", cfg.rollout.max_new_tokens)
        self.spec = resolve_objective(cfg.objective.name, **overrides)  # resolved once, passed down as is
        split = split_settings(cfg, self.world)
        if self.spec.batch_coupled and split:
            self._say(
                f"warning: objective {self.spec.name!r} is coupled across a mini-batch ({'; '.join(self.spec.batch_coupling())}), "
                f"and {', '.join(split)} splits each mini-batch over several loss calls: their summed gradient is not the "
                "mini-batch loss's. Set optim.microbatch_groups = 0 and optim.max_tokens_per_microbatch = 0 on one process "
                "for the exact loss."
            )
        self.rewards = RewardComputer(
            reward_spec(cfg.reward.kind, cfg.data.task, cfg.reward.user_fn),
            format_weight=cfg.reward.format_weight,
            format_regex=cfg.reward.format_regex,
            timeout_s=cfg.reward.timeout_s,
            workers=cfg.reward.workers or max(1, default_workers() // self.world),  # processes on one machine share its cores
        )
        check_model_available(cfg.model.name)
        if cfg.rollout.engine == "vllm":  # before any work: installed, a supported device, no adapters to merge
            from dfpo.trainer.llm.vllm_engine import check_vllm_available

            check_vllm_available(self.device)
            if cfg.model.lora_r > 0:
                raise ValueError("rollout.engine = 'vllm' samples from full weights; with model.lora_r > 0 use rollout.engine = 'hf'")
        self.train_examples, self.eval_examples = load_splits(cfg.data, cfg.seed)
        shared = duplicate_prompts(self.train_examples, self.eval_examples)
        if shared and self.rank == 0:  # said once, even with --quiet
            print(f"dfpo: warning: {len(shared)} eval prompt(s) also appear in the train split (e.g. {shared[0][:60]!r}); "
                  "eval scores on them measure memorisation", file=sys.stderr, flush=True)  # fmt: skip
        # lengths checked with the tokenizer alone: before any weights load or warm up
        self.max_prompt_tokens = check_lengths(cfg, self.train_examples, self.eval_examples)
        self.groups_per_step = cfg.rollout.prompts_per_step
        self.k_updates = cfg.optim.epochs * (self.groups_per_step // cfg.optim.minibatch_groups)
        self.total_updates = cfg.train.steps * self.k_updates

    # -- setup -------------------------------------------------------------------------------

    def _say(self, msg: str) -> None:
        if not self.quiet:
            print(msg, file=sys.stderr, flush=True)

    def _load_model(self):
        from dfpo.trainer.llm.policy import (
            build_char_tokenizer,
            build_tiny_model,
            check_pad_token,
            load_pretrained_policy,
            sft_warm_start,
            wrap_lora,
        )

        cfg, m = self.cfg, self.cfg.model
        init_dir = self.run_dir / "init_model"
        if m.name == "tiny":
            if not self.resume:

                def warm_start() -> None:
                    tok = build_char_tokenizer()
                    model = build_tiny_model(m, tok, cfg.seed).to(self.device)
                    t0 = time.time()
                    target = (
                        (lambda ex, rng: equiv_targets(ex.meta["a"], ex.meta["b"], rng))
                        if cfg.data.task == "equiv"
                        else (lambda ex, rng: ex.answer)
                    )
                    losses = sft_warm_start(
                        model,
                        tok,
                        self.train_examples,
                        target_fn=target,
                        steps=m.sft_steps,
                        batch_size=m.sft_batch_size,
                        lr=m.sft_lr,
                        seed=cfg.seed,
                        device=self.device,
                    )
                    if losses:
                        self._say(
                            f"tiny preset: {m.sft_steps} SFT steps in {time.time() - t0:.1f}s, loss {losses[0]:.3f} -> {losses[-1]:.3f}"
                        )
                    model.save_pretrained(init_dir)
                    tok.save_pretrained(init_dir)

                dp.on_rank0(warm_start)  # rank 0 warms up and saves; every rank loads the saved model below
            source = str(init_dir)
        else:
            source = m.name
        model, tok = load_pretrained_policy(source, m, self.device, self.dtype if m.name != "tiny" else torch.float32)
        check_pad_token(tok, m.pad_token)
        ref = None
        if self.spec.beta > 0 and m.lora_r <= 0:
            ref, _ = load_pretrained_policy(source, m, self.device, self.dtype if m.name != "tiny" else torch.float32)
            ref.eval().requires_grad_(False)
        if m.gradient_checkpointing:
            model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
        model = wrap_lora(model, m)
        model.train()
        return model, tok, ref

    def _prompt_ids(self, examples) -> list[list[int]]:
        return encode_prompts(self.tok, examples, self.cfg.data, self.max_prompt_tokens)

    def _setup(self) -> None:
        """The expensive part of construction: model, tokenizer, engine, optimiser, checkpoint, logs."""
        from transformers.utils import logging as hf_logging

        hf_logging.disable_progress_bar()
        cfg = self.cfg
        if self.rank == 0:
            self.run_dir.mkdir(parents=True, exist_ok=True)
            write_run_file(self.run_dir / "config.toml", config_to_toml(cfg))  # on resume: with any --set train.steps
        torch.manual_seed(cfg.seed)
        self.model, self.tok, self.ref_model = self._load_model()
        self.eos_ids = {self.tok.eos_token_id} | set(_generation_eos(self.model))
        self.eos_ids.discard(None)
        # FSDP2: the decoder layers are sharded over the processes, the rest stays whole on each
        self.fsdp_layers = dp.shard_layers(self.model) if self.world > 1 and cfg.train.parallel == "fsdp2" else []
        self.engine = self._rollout_engine()
        self.params = [p for p in self.model.parameters() if p.requires_grad]
        o = cfg.optim
        self.optimizer = torch.optim.AdamW(
            self.params,
            lr=o.lr,
            betas=(o.beta1, o.beta2),
            eps=o.adam_eps,
            weight_decay=o.weight_decay,
            foreach=False if self.fsdp_layers else None,  # sharded and whole parameters do not mix in one foreach call
        )
        warmup = int(round(o.warmup_ratio * self.total_updates))
        self.scheduler = torch.optim.lr_scheduler.LambdaLR(
            self.optimizer, lambda s: lr_factor(s, total=self.total_updates, warmup=warmup, min_ratio=o.min_lr_ratio)
        )
        self.sampler = PromptSampler(len(self.train_examples), cfg.seed, cfg.data.shuffle)
        self.start_step, self.nonfinite_in_row, self.updates_done, self.step_now = 0, 0, 0, 0
        if self.resume:
            self._restore()
        else:
            self._save(0)
        writes = self.rank == 0  # the other ranks write nothing
        log = lambda name: JsonlLog(self.run_dir / name) if writes else NullLog()  # noqa: E731
        self.metrics_log, self.eval_log, self.samples_log = log("metrics.jsonl"), log("eval.jsonl"), log("samples.jsonl")
        self.scalars = Scalars(
            self.run_dir,
            cfg.log.tensorboard and writes,
            cfg.log.wandb_project if writes else "",
            self.start_step or None,
            config_to_dict(cfg),
        )
        self.eval_prompt_ids = self._prompt_ids(self.eval_examples)

    def _rollout_engine(self):
        """The HF engine on the trainer's own model, or vLLM started from the model's folder (synced after a resume)."""
        cfg = self.cfg
        if cfg.rollout.engine == "hf":
            return HFGenerateEngine(self.model, self.tok.pad_token_id, self.eos_ids, cfg.rollout.batch_size, self.amp)
        from dfpo.trainer.llm.vllm_engine import VLLMEngine

        folder = str(self.run_dir / "init_model") if cfg.model.name == "tiny" else cfg.model.name
        context = getattr(self.model.config, "max_position_embeddings", 2048)
        engine = VLLMEngine(folder, eos_ids=self.eos_ids, device=self.device, seed=cfg.seed, max_model_len=context)
        if self.resume:  # the checkpoint's weights, not the folder's
            engine.sync_weights(self.model)
        return engine

    def _trainable_state(self) -> dict:
        """Whole trainable parameters on the CPU (sharded ones gathered: every process calls this)."""
        return {n: dp.full_tensor(p.detach()).cpu().clone() for n, p in self.model.named_parameters() if p.requires_grad}

    def _save(self, step: int) -> Path:
        """Rank 0 writes the checkpoint: whole tensors, the one-process format, and the world size that trained it."""
        self.last_checkpoint_step = step
        if self.rank > 0 and not self.fsdp_layers:  # DDP: rank 0 holds the same parameters and optimiser state
            dp.on_rank0(lambda: None)
            return self.run_dir / "checkpoint.pt"
        state = {
            "step": step,
            "model": self._trainable_state(),
            "optimizer": dp.full_optimizer_state(self.optimizer) if self.fsdp_layers else self.optimizer.state_dict(),
            "scheduler": self.scheduler.state_dict(),
            "sampler": self.sampler.state_dict(),
            "rng": rng_state(),
            "nonfinite_in_row": self.nonfinite_in_row,
            "updates_done": self.updates_done,
            "world_size": self.world,
            "seed_per_group": self.seed_per_group,
        }

        def write() -> Path:
            path = save_checkpoint(self.run_dir, state, config=config_to_dict(self.cfg))
            if step == self.start_step:  # the folder has held a checkpoint: it is never cleared as a start-up leftover
                write_mark(self.run_dir, checkpointed=True)
            return path

        return dp.on_rank0(write) or self.run_dir / "checkpoint.pt"

    def _restore(self) -> None:
        state = load_checkpoint(self.run_dir)
        check_same_config(self.run_dir, state.get("config"), self.cfg)
        names = {n for n, p in self.model.named_parameters() if p.requires_grad}
        if set(state["model"]) != names:
            raise ValueError(f"--resume {self.run_dir}: checkpoint parameters do not match the model (was the config edited?)")
        for n, p in self.model.named_parameters():
            if n in state["model"]:
                dp.load_full(p, state["model"][n])
        self.optimizer.load_state_dict(state["optimizer"])
        if self.fsdp_layers:
            dp.shard_optimizer_state(self.optimizer)
        self.scheduler.load_state_dict(state["scheduler"])
        self.sampler.load_state_dict(state["sampler"])
        set_rng_state(state["rng"])
        self.start_step = int(state["step"])
        self.last_checkpoint_step = self.start_step
        self.nonfinite_in_row = int(state["nonfinite_in_row"])
        self.updates_done = int(state["updates_done"])
        c = self.start_step
        saved_world = int(state.get("world_size", 1))
        was_seeded = bool(state.get("seed_per_group", self.cfg.rollout.seed_per_group))
        self.seed_per_group = self.seed_per_group or was_seeded  # a run seeded per group stays so on any world size
        if saved_world != self.world and self.rank == 0:  # said even with --quiet: the run goes on differently laid out
            print(f"dfpo: resuming {self.run_dir} on {self.world} process(es); the checkpoint (step {c}) was written by a run on "
                  f"{saved_world}: the world size changed", file=sys.stderr, flush=True)  # fmt: skip
            if not was_seeded and self.seed_per_group:
                print("dfpo: note: rollouts are now seeded per group (rollout.seed_per_group), as on more than one process; "
                      "they no longer continue the single-process random stream", file=sys.stderr, flush=True)  # fmt: skip
        if self.rank == 0:
            self._truncate_logs(c)
        self._say(f"resumed {self.run_dir} at step {c}")

    def _truncate_logs(self, c: int) -> None:
        """Drop log lines past the checkpoint's step ``c`` (they are re-run); warn about lines lost before it."""
        JsonlLog.truncate(self.run_dir / "metrics.jsonl", lambda r: r.get("step", 0) <= c)
        JsonlLog.truncate(self.run_dir / "samples.jsonl", lambda r: r.get("step", 0) <= c)
        JsonlLog.truncate(self.run_dir / "eval.jsonl", lambda r: r.get("step", 0) < c)
        lost = missing_steps(JsonlLog.read(self.run_dir / "metrics.jsonl"), c)
        if lost:  # said even with --quiet: the log will have a gap
            print(f"dfpo: warning: metrics.jsonl of {self.run_dir} has no line for step(s) {lost[:10]}{' ...' if len(lost) > 10 else ''} "
                  f"(lost before the checkpoint at step {c}); they are not re-run", file=sys.stderr, flush=True)  # fmt: skip

    # -- one step ----------------------------------------------------------------------------

    def _sampling(self, temperature: float) -> SamplingParams:
        r = self.cfg.rollout
        return SamplingParams(max_new_tokens=r.max_new_tokens, temperature=temperature, top_p=r.top_p, top_k=r.top_k)

    def rollout(self, examples) -> Rollout:
        """G completions of every example, grouped, decoded and scored."""
        return self._assemble(*self._sample_and_score(list(examples)))

    def _sample_and_score(self, examples: list, draw: int = 0) -> tuple[list, list[list[int]], Samples, list[str], RewardBatch]:
        """G completions of every example and their rewards. On several processes each samples and scores its
        share of the groups (every world-th) and the shares are gathered, so every process returns the whole
        batch. With per-group seeds group g of rollout draw ``draw`` samples from seed (seed, step, draw * n + g)."""
        cfg, G, n = self.cfg, self.cfg.rollout.group_size, len(examples)
        mine = list(range(self.rank, n, self.world))  # this process's groups (all of them on one process)
        local, prompt_ids = [examples[g] for g in mine], self._prompt_ids(examples)
        local_ids = [prompt_ids[g] for g in mine]
        params = self._sampling(cfg.rollout.temperature)
        with dp.gathered(self.fsdp_layers):  # sampling takes a different number of forwards on each process
            if self.seed_per_group:
                seeds = [row_seed(cfg.seed, self.step_now, draw * n + g) for g in mine]
                samples = self.engine.sample(local_ids, G, params, seeds=seeds)
            else:
                samples = self.engine.sample(local_ids, G, params)
        texts = self.tok.batch_decode(samples.tokens, skip_special_tokens=True)
        per_completion = [ex for ex in local for _ in range(G)]
        rewards = self.rewards([ex.prompt for ex in per_completion], texts, per_completion)
        if self.world > 1:
            samples, texts, rewards = gather_groups(dp.gather_objects((mine, samples, texts, rewards)), n, G)
        return examples, prompt_ids, samples, texts, rewards

    def _assemble(self, examples: list, prompt_ids: list[list[int]], samples: Samples, texts: list[str], rewards: RewardBatch) -> Rollout:
        batch = build_batch(
            prompt_ids,
            samples.tokens,
            self.cfg.rollout.group_size,
            pad_id=self.tok.pad_token_id,
            eos_ids=self.eos_ids,
            max_new_tokens=self.cfg.rollout.max_new_tokens,
        )
        logp, entropy = sampler_logp(samples, batch.mask.shape[1])
        return Rollout(examples, batch, texts, rewards, logp, entropy)

    def dynamic_rollout(self, first_examples: list) -> tuple[Rollout, dict[str, float]]:
        """DAPO's dynamic sampling: groups whose rewards are all equal carry no signal and are dropped; more
        prompts are drawn until ``prompts_per_step`` groups remain or ``rollout.max_extra_batches`` extra
        rollout batches were drawn (then the step trains on the groups it has). Returns the rollout and
        ``rollout/dropped_groups``, ``rollout/extra_batches``."""
        G, want = self.cfg.rollout.group_size, self.groups_per_step
        kept: list[tuple] = []  # (example, prompt ids, tokens, logprobs, entropies, texts, total, correct, format) per group
        counts = {"errors": 0, "timeouts": 0, "invalid": 0}
        dropped, extra, examples = 0, -1, first_examples
        while len(kept) < want and extra < self.cfg.rollout.max_extra_batches:
            extra += 1
            if extra:
                examples = [self.train_examples[i] for i in self.sampler.take(self.groups_per_step)]
            exs, pids, smp, texts, rew = self._sample_and_score(examples, draw=extra)
            for k in ("errors", "timeouts", "invalid"):
                counts[k] += getattr(rew, k)
            for g, ex in enumerate(exs):
                rows = range(g * G, (g + 1) * G)
                totals = [rew.total[i] for i in rows]
                if max(totals) == min(totals):
                    dropped += 1
                    continue
                pick = lambda seq, rows=rows: [seq[i] for i in rows]  # noqa: E731
                kept.append(
                    (
                        ex,
                        pids[g],
                        pick(smp.tokens),
                        pick(smp.logprobs),
                        pick(smp.entropies),
                        pick(texts),
                        totals,
                        pick(rew.correct),
                        pick(rew.format),
                    )
                )
        stats = {"rollout/dropped_groups": dropped, "rollout/extra_batches": extra}
        if not kept:  # not one informative group: train on the last draw as it is (all its advantages are 0)
            return self._assemble(exs, pids, smp, texts, rew), stats
        kept = kept[:want]
        flat = lambda j: [x for group in kept for x in group[j]]  # noqa: E731
        samples = Samples(flat(2), flat(3), flat(4))
        rewards = RewardBatch(flat(6), flat(7), flat(8), **counts)
        return self._assemble([g[0] for g in kept], [g[1] for g in kept], samples, flat(5), rewards), stats

    def old_logp_from_sampler(self) -> bool:
        """Whether pi_old is the sampler's own log-probs (rollout.old_logp; 'auto': when sampling is the policy itself)."""
        r = self.cfg.rollout
        if r.old_logp != "auto":
            return r.old_logp == "sampler"
        return (
            r.engine == "hf"
            and r.temperature == 1.0
            and r.top_p == 1.0
            and r.top_k == 0
            and self.amp is None
            and self.dtype == torch.float32
        )

    def train_step(self, step: int) -> dict:
        """Rollout -> advantages -> old log-probs of the rows the first optimiser step does not cover ->
        reference log-probs -> the K optimiser steps -> metrics."""
        cfg = self.cfg
        t0 = time.time()
        self.step_now = step
        idx = self.sampler.take(self.groups_per_step)
        examples = [self.train_examples[i] for i in idx]
        ro, sampling_stats = self.dynamic_rollout(examples) if cfg.rollout.dynamic_sampling else (self.rollout(examples), {})
        batch = ro.batch
        t_roll = time.time() - t0
        rewards = ro.reward_tensor()  # (B,)
        adv = group_advantages(rewards, batch.group_ids, scale=self.spec.adv_scale, eps=cfg.objective.advantage_eps)  # (B,)
        if cfg.rollout.mask_truncated:
            batch.mask &= ~batch.truncated[:, None]
        plan = self.optimiser_steps(step, batch)
        trained_here = rows_in(plan, batch.mask.shape[0])  # (B,) the rows this process trains on (all on one process)
        t1 = time.time()
        from_sampler = self.old_logp_from_sampler()
        if from_sampler:  # pi_old is the sampler: its log-probs need no forward pass
            first = FirstPass(ro.sampler_logp.clone(), ro.sampler_entropy.clone(), torch.ones(batch.mask.shape[0], dtype=torch.bool))
        else:
            first = FirstPass.empty(batch.mask)
            first.done[:] = ~trained_here  # rows other processes train are not needed here
            later = ~first.done
            later[torch.cat(plan[0])] = False  # the first step's own forward gives its rows' old log-probs
            self._recompute_old(batch, first, later)
        ref_logp = self._reference_logp(batch, trained_here)
        buckets = None
        if cfg.log.diagnostics:
            buckets = frequency_buckets(batch.completion_ids, batch.mask, list(cfg.log.energy_buckets), len(self.tok))
        step_diag = StepDiagnostics()
        t2 = time.time()
        upd = self.update(step, batch, plan, first, ref_logp, adv, buckets, step_diag, ro.sampler_logp)
        if self.world > 1:
            step_diag = reduce_diagnostics(step_diag)
            if not from_sampler:  # every row's pi_old from the process that trained it in the first epoch
                first = share_first_pass(first, rows_in(plan[: len(plan) // cfg.optim.epochs], batch.mask.shape[0]))
        t_upd = time.time() - t2
        self.engine.sync_weights(self.model)  # the next rollout samples from the new weights (a no-op for the HF engine)
        out = self._step_metrics(step, ro, first.entropy, upd, step_diag)
        out.update(sampling_stats)
        if not from_sampler:
            out.update(mismatch_metrics(ro.sampler_logp, first.logp, batch.mask))
        out["time/rollout_s"], out["time/old_logp_s"] = t_roll, t2 - t1 + upd.recompute_s
        out["time/update_s"], out["time/step_s"] = t_upd - upd.recompute_s, time.time() - t0
        self._write_samples(step, ro)
        return out

    def optimiser_steps(self, step: int, batch: RolloutBatch) -> list[list[torch.Tensor]]:
        """The row indices of every optimiser step's micro-batches: ``epochs`` passes over seeded mini-batches
        of whole groups, each split by a group count or a token budget (groups stay whole). The mini-batches
        are drawn from the whole batch's group ids, the same on every process; each process keeps its share
        of every mini-batch (``rank_share``), so all take the same optimiser steps."""
        o = self.cfg.optim
        tokens_per_row = batch.attention_mask.sum(-1)  # (B,) prompt + completion tokens
        plan = []
        for epoch in range(o.epochs):
            gen = torch.Generator().manual_seed(self.cfg.seed * 1_000_003 + step * 101 + epoch)
            for rows in group_minibatches(batch.group_ids, o.minibatch_groups, gen):
                rows = dp.rank_share(rows, batch.group_ids, self.rank, self.world)  # this process's groups of it
                if o.max_tokens_per_microbatch:
                    plan.append(split_groups_by_tokens(rows, batch.group_ids, tokens_per_row, o.max_tokens_per_microbatch))
                else:
                    plan.append(split_groups(rows, batch.group_ids, o.microbatch_groups))
        return plan

    def _rows_per_forward(self) -> int:
        """Rows of one no-grad forward pass: a micro-batch's worth of groups."""
        return (self.cfg.optim.microbatch_groups or self.cfg.optim.minibatch_groups) * self.cfg.rollout.group_size

    def _anywhere(self, flag: bool) -> bool:
        """``flag`` on this process, or on any process when the model is sharded (all must join its forwards)."""
        return dp.any_true(flag) if self.fsdp_layers else flag

    def _recompute_old(self, batch: RolloutBatch, first: FirstPass, rows: torch.Tensor) -> float:
        """Old log-probs (and entropy) of ``rows`` (B,) bool by a no-grad forward pass; returns its seconds."""
        if not self._anywhere(bool(rows.any())):
            return 0.0
        t0 = time.time()
        index = rows.nonzero().flatten()
        with dp.gathered(self.fsdp_layers):  # entered by every process: it gathers the layers
            if len(index):
                logp, entropy = batch_logp(self.model, batch.rows(index), self.device, self._rows_per_forward(), self.amp)
                first.record(index, logp, entropy)
        return time.time() - t0

    def _reference_logp(self, batch: RolloutBatch, rows: torch.Tensor) -> torch.Tensor | None:
        """Log-probs under the reference policy (B, T) of the rows this process trains, (B,) bool (0 elsewhere),
        when the objective has a KL term, else None."""
        if not self.spec.needs_ref_logp:
            return None
        per_chunk = self._rows_per_forward()
        index = rows.nonzero().flatten()
        part = batch if len(index) == rows.shape[0] else batch.rows(index)
        if self.ref_model is not None:
            logp = batch_logp(self.ref_model, part, self.device, per_chunk, self.amp)[0]
        else:
            with self.model.disable_adapter(), dp.gathered(self.fsdp_layers):  # LoRA: the base model is the reference
                logp = batch_logp(self.model, part, self.device, per_chunk, self.amp)[0]
        out = torch.zeros(batch.mask.shape)  # (B, T)
        out[index, : logp.shape[1]] = logp
        return out

    def update(
        self,
        step: int,
        batch: RolloutBatch,
        plan: list[list[torch.Tensor]],
        first: FirstPass,
        ref_logp: torch.Tensor | None,
        adv: torch.Tensor,
        buckets: torch.Tensor | None,
        step_diag: StepDiagnostics,
        rollout_logp: torch.Tensor | None = None,
    ) -> UpdateStats:
        """The optimiser steps of one rollout batch (``plan``): each accumulated over its micro-batches,
        clipped, stepped (or skipped if non-finite). The first step scores its own rows' old log-probs;
        rows a skipped first step left unscored are recomputed before the next (the policy has not moved)."""
        cfg = self.cfg
        upd = UpdateStats()
        for k, micro_rows in enumerate(plan):
            if k > 0 and self._anywhere(not bool(first.done.all())):
                upd.recompute_s += self._recompute_old(batch, first, ~first.done)
            masks = [batch.mask[r] for r in micro_rows]
            # the mini-batch's count over all processes normalises every process's micro-batches
            weights = (
                dp.global_accumulation_weights(masks, self.spec.aggregation)
                if self.world > 1
                else accumulation_weights(masks, self.spec.aggregation)
            )
            # rows without old log-probs yet are the first step's: its own forward gives them
            micros = [
                micro_batch(batch, r, first.logp if bool(first.done[r].all()) else None, ref_logp, adv, w, rollout_logp)
                for r, w in zip(micro_rows, weights)
            ]
            metrics, finite = accumulate_gradients(
                self.model,
                micros,
                self.spec,
                self.device,
                buckets=buckets,
                diagnostics=step_diag if cfg.log.diagnostics else None,
                amp_dtype=self.amp,
                first_pass=first,
                stop_early=not self.fsdp_layers,
            )
            if self.world > 1:  # one verdict for all processes, then the summed (global) gradient
                finite = dp.all_ranks(finite)
                if finite:
                    dp.sync_gradients(self.params, self.world)
                    metrics = dp.combine_metrics(dp.gather_objects((metrics, sum(weights))))
            norm = None
            if finite:
                max_norm = cfg.optim.max_grad_norm if cfg.optim.max_grad_norm > 0 else math.inf
                if self.fsdp_layers:
                    norm = dp.clip_grad_norm(self.params, max_norm)
                else:
                    norm = float(torch.nn.utils.clip_grad_norm_(self.params, max_norm))
                finite = math.isfinite(norm)
            if not finite:
                self.optimizer.zero_grad(set_to_none=True)
                upd.skipped += 1
                self.nonfinite_in_row += 1
                self._say(f"step {step}: non-finite loss or gradient, optimiser step skipped ({self.nonfinite_in_row} in a row)")
                if self.nonfinite_in_row >= cfg.train.max_nonfinite_in_row:
                    raise NonFiniteLossError(
                        f"{self.nonfinite_in_row} optimiser steps in a row had a non-finite loss or gradient (at training step {step}); "
                        f"stopped. The last good checkpoint is {self.run_dir / 'checkpoint.pt'} (step {self.last_checkpoint_step}). "
                        "Lower optim.lr, set optim.max_grad_norm > 0, or check the reward function; then --resume the run "
                        "or start again, or raise train.max_nonfinite_in_row."
                    )
                continue
            self.optimizer.step()
            self.scheduler.step()
            self.optimizer.zero_grad(set_to_none=True)
            self.nonfinite_in_row = 0
            self.updates_done += 1
            upd.loss_metrics.append(metrics)
            upd.grad_norms.append(norm)
        return upd

    def _step_metrics(self, step: int, ro: Rollout, entropy: torch.Tensor, upd: UpdateStats, step_diag: StepDiagnostics) -> dict:
        cfg = self.cfg
        batch, texts, rew, rewards = ro.batch, ro.texts, ro.rewards, ro.reward_tensor()
        loss_metrics, grad_norms, skipped = upd.loss_metrics, upd.grad_norms, upd.skipped
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
            "optim/lr": self.scheduler.get_last_lr()[0],
            "optim/updates": self.updates_done,
            "optim/skipped_nonfinite": skipped,
        }
        if grad_norms:
            m["grad/norm"] = sum(grad_norms) / len(grad_norms)
        m.update(reduce_records(loss_metrics))  # over the optimiser steps, each key by its declared reduction
        if step_diag.energy is not None and float(step_diag.energy.sum()) > 0:
            share = step_diag.energy / step_diag.energy.sum()
            for b, v in enumerate(share.tolist()):
                m[f"energy/bucket{b}"] = v
        m["diag/shared_positions"] = step_diag.shared_positions
        if step_diag.shared_den > 0:
            m["diag/shared_residual"] = step_diag.shared_num / step_diag.shared_den
        if cfg.data.task in ("equiv", "add"):
            forms = [surface_form(t, ex) for t, ex in zip(texts, [e for e in ro.examples for _ in range(cfg.rollout.group_size)])]
            for name in ("number", "swap", "split", "echo", "invalid"):
                m[f"forms/{name}"] = forms.count(name) / len(forms)
        clean, dropped = finite_only(m)
        if dropped:
            clean["log/dropped_nonfinite"] = len(dropped)
            self._say(f"step {step}: non-finite metrics not logged: {dropped}")
        return clean

    def _write_samples(self, step: int, ro: Rollout) -> None:
        every = self.cfg.log.samples_every
        if not every or (step % every and step != 1):
            return
        G = self.cfg.rollout.group_size
        for i in range(min(self.cfg.log.samples_per_step, len(ro.texts))):
            ex = ro.examples[i // G]
            self.samples_log.write(
                {"step": step, "prompt": ex.prompt, "answer": ex.answer, "completion": ro.texts[i], "reward": ro.rewards.total[i]}
            )

    def evaluate(self, step: int) -> dict:
        """avg@k (mean correctness over k samples of each eval prompt) and pass@k; RNG forked."""
        cfg = self.cfg
        k = cfg.eval.k
        n = len(self.eval_examples)
        mine = list(range(self.rank, n, self.world))  # each process evaluates every world-th prompt
        prompt_ids, params = [self.eval_prompt_ids[i] for i in mine], self._sampling(cfg.eval.temperature)
        completions: list[list[int]] = []
        with (
            dp.gathered(self.fsdp_layers),
            torch.random.fork_rng(devices=[torch.cuda.current_device()] if self.device.type == "cuda" else []),
        ):
            torch.manual_seed(cfg.seed * 7919 + step)
            if self.seed_per_group and prompt_ids:
                completions = self.engine.sample(prompt_ids, k, params, seeds=[row_seed(cfg.seed, 7919, step, i) for i in mine]).tokens
            elif prompt_ids:
                completions = self.engine.generate(prompt_ids, k, params)
        texts = self.tok.batch_decode(completions, skip_special_tokens=True)
        exs = [self.eval_examples[i] for i in mine for _ in range(k)]
        rew = self.rewards([e.prompt for e in exs], texts, exs) if exs else None
        rows: list = [None] * n
        for part_mine, part_correct in dp.gather_objects((mine, [] if rew is None else rew.correct)):
            for j, i in enumerate(part_mine):
                rows[i] = part_correct[j * k : (j + 1) * k]
        correct = torch.tensor(rows, dtype=torch.float32).view(n, k)
        out = {"step": step, f"eval/avg@{k}": float(correct.mean()), f"eval/pass@{k}": float((correct > 0).any(1).float().mean())}
        self.eval_log.write(out)
        self.scalars.log(out, step)
        return out

    # -- run ---------------------------------------------------------------------------------

    def run(self, stop: StopSignals | None = None) -> dict:
        """Train to cfg.train.steps; SIGINT/SIGTERM stop after the current step with a checkpoint
        (``TrainingInterrupted``), a second one at once (``StoppedAtOnce``). ``stop``: the signal handling the
        command line installed before construction (else the run installs its own). The run folder's lock and the
        reward workers are released however the run ends."""
        threads_before = torch.get_num_threads()
        if self.cfg.threads:
            torch.set_num_threads(self.cfg.threads)
        try:
            with StopSignals(immediate=False) if stop is None else contextlib.nullcontext(stop.training()) as self.stop:
                return self._run()
        finally:
            torch.set_num_threads(threads_before)  # the process-wide setting is left as found
            self._close_rewards()
            self.lock.release()

    def _close_rewards(self) -> None:
        if self.rewards is not None and hasattr(self.rewards, "close"):
            self.rewards.close()

    def _stop_if_asked(self, step: int) -> None:
        """After a finished step: on a signal recorded by any process, checkpoint this step (unless just
        written) and stop (every process, at the same step)."""
        signum = dp.any_rank(self.stop.signum)
        if signum is None:
            return
        if self.last_checkpoint_step != step:
            self._save(step)
        raise TrainingInterrupted(signum, step, self.run_dir)

    def close(self) -> None:
        """Close the logs and release the run folder without training (``run`` does this itself)."""
        for log in (self.metrics_log, self.eval_log, self.samples_log, self.scalars):
            log.close()
        self._close_rewards()
        self.lock.release()

    def _run(self) -> dict:
        cfg = self.cfg
        bar = None
        if cfg.log.progress and not self.quiet:
            from tqdm import tqdm

            bar = tqdm(total=cfg.train.steps, initial=self.start_step, desc="dfpo train", unit="step", dynamic_ncols=True, mininterval=2.0)
        t_start = time.time()
        try:
            self._stop_if_asked(self.start_step)  # a signal during start-up: the step-0 (or resumed) checkpoint is there
            for s in range(self.start_step, cfg.train.steps):
                if cfg.eval.every and s % cfg.eval.every == 0:
                    self.evaluate(s)
                m = self.train_step(s + 1)
                self.metrics_log.write(m)
                self.scalars.log(m, s + 1)
                if (s + 1) % cfg.train.save_every == 0 or s + 1 == cfg.train.steps:
                    self._save(s + 1)
                if bar is not None:
                    bar.set_postfix(reward=f"{m['reward/mean']:.3f}", step_s=f"{m['time/step_s']:.2f}", refresh=False)
                    bar.update(1)
                self._stop_if_asked(s + 1)
            final_eval = self.evaluate(cfg.train.steps) if cfg.eval.every else {}
        finally:
            if bar is not None:
                bar.close()
            self.metrics_log.close()
            self.eval_log.close()
            self.samples_log.close()
            self.scalars.close()
        if self.rank > 0:  # rank 0 reads the log and writes the summary
            return {}
        summary = run_summary(self.run_dir, cfg.eval.kappa)
        summary.update({"final_eval": final_eval, "wall_s_this_session": time.time() - t_start})
        write_run_file(self.run_dir / "summary.json", json.dumps(summary, indent=2, sort_keys=True))
        return summary


def encode_prompts(tok, examples, data, max_tokens: int | None = None) -> list[list[int]]:
    """Prompt token ids: the template applied, then the tokenizer's chat template when it has one
    (data.chat_template = "auto"/"on") or plain text ("off", or no template). A prompt longer than
    ``max_tokens`` is an error naming its source, or keeps its last tokens with data.truncate_prompts."""
    has_template = bool(getattr(tok, "chat_template", None))
    if data.chat_template == "on" and not has_template:
        raise ValueError('data.chat_template = "on" but the tokenizer has no chat template; set it to "auto" or "off"')
    out = []
    for ex in examples:
        text = data.prompt_template.replace("{prompt}", ex.prompt)  # not str.format: LaTeX braces stay
        if has_template and data.chat_template != "off":
            text = tok.apply_chat_template(
                [{"role": "user", "content": text}], add_generation_prompt=True, tokenize=False, enable_thinking=data.enable_thinking
            )
        ids = tok(text, add_special_tokens=False).input_ids
        if max_tokens is not None and len(ids) > max_tokens:
            if not data.truncate_prompts:
                where = ex.source or f"prompt {ex.prompt[:40]!r}"
                raise ValueError(
                    f"{where}: the prompt has {len(ids)} tokens, more than the {max_tokens} the model's context leaves beside "
                    "rollout.max_new_tokens; shorten it, lower rollout.max_new_tokens, or set data.truncate_prompts = true"
                )
            ids = ids[-max_tokens:]
        out.append(ids)
    return out


def check_lengths(cfg: Config, train_examples: list, eval_examples: list) -> int | None:
    """The longest prompt the model's context leaves beside ``rollout.max_new_tokens`` (None: no limit known), after
    checking every train and eval prompt against it: a ValueError names the first that does not fit. Needs only the
    tokenizer and the model's config, so it runs before any weights load."""
    from dfpo.trainer.llm.policy import check_completion_fits, tokenizer_and_context

    tok, context = tokenizer_and_context(cfg.model)
    check_completion_fits(cfg.rollout.max_new_tokens, context)
    limit = None if context is None else context - cfg.rollout.max_new_tokens
    encode_prompts(tok, [*train_examples, *eval_examples], cfg.data, limit)
    return limit


def _generation_eos(model) -> list[int]:
    gc = getattr(model, "generation_config", None)
    eos = getattr(gc, "eos_token_id", None) if gc is not None else None
    if eos is None:
        return []
    return list(eos) if isinstance(eos, (list, tuple)) else [eos]


def run_summary(run_dir: Path, kappa: float) -> dict:
    """Run-level metrics from metrics.jsonl: Jitter2 (eq 20) and Steps(reward >= kappa) (eq 19),
    the latter also on the 10-step trailing mean (one noisy step should not count as reaching kappa)."""
    rows = JsonlLog.read(Path(run_dir) / "metrics.jsonl")
    steps = [r["step"] for r in rows]
    reward = [r["reward/mean"] for r in rows]
    last = max(steps, default=0)
    return {
        "steps": last,
        "steps_missing_from_log": missing_steps(rows, last),
        "reward/first": reward[0] if reward else None,
        "reward/last": reward[-1] if reward else None,
        "reward/jitter2": None if jitter2(reward) is None else float(jitter2(reward)),
        "reward/steps_to_kappa": steps_to_threshold(steps, reward, kappa),
        "reward/steps_to_kappa_ma10": steps_to_threshold(steps, trailing_mean(reward, 10), kappa),
        "kappa": kappa,
    }


def train(cfg: Config, *, resume: bool = False, quiet: bool = False) -> dict:
    """Run (or resume) a training run; returns the run summary."""
    return Trainer(cfg, resume=resume, quiet=quiet).run()
