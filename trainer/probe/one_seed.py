"""One seed of ``dfpo probe``: its policy and optimiser, one rollout batch sampled from it, pi_old and pi_ref as the
trainer takes them, the ``--move-steps``, then every objective's own step from that one point (``probe_step``), as
records. The numbered choices (choice 2, ...) are those of ``dfpo.trainer.probe.command``'s docstring.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import torch

from ...core.loss import ObjectiveSpec, group_advantages, objective_from_label
from ...core.probe import DriftBatch, probe_step, summary
from ..config import Config, config_from_dict, config_to_dict
from ..parallel import load_keeping_kernel
from .plan import ProbePlan


@dataclass
class Start:
    """The policy a seed probes from, its optimiser and what sampling needs."""

    model: torch.nn.Module
    tok: object
    eos_ids: set[int]
    optimizer: torch.optim.Optimizer
    device: torch.device
    amp: torch.dtype | None
    dtype: torch.dtype
    """``model.dtype`` resolved as the trainer resolves it (with ``amp``, it decides where pi_old comes from)."""
    ref: torch.nn.Module | None
    """The frozen reference policy (choice 4): the starting policy itself in memory (scored before any step), the
    trainer's reference model otherwise; None when no label reads ``ref_logp``, or under LoRA (adapters off)."""


def build_start(plan: ProbePlan, cfg: Config, train_examples: list, say: Callable[[str], None], *, with_ref: bool) -> Start:
    """The policy of one seed: the tiny preset warmed up in memory with ``cfg.seed``, a pretrained model, or ``--run``'s
    checkpoint; AdamW as the trainer builds it (``--run``: with the checkpoint's state); the reference policy when
    ``with_ref`` (choice 4)."""
    from ..policy import (
        build_char_tokenizer,
        build_tiny_model,
        check_pad_token,
        generation_eos_ids,
        load_policy,
        resolve_amp,
        resolve_device,
        resolve_dtype,
        sft_warm_start,
    )
    from ..run.checkpoint import load_checkpoint
    from ..tasks import sft_target
    from ..warmup import ensure_warm_model, warm_folder

    device = resolve_device(cfg.device)
    dtype, amp = resolve_dtype(cfg.model.dtype, device), resolve_amp(cfg.model.amp, device)
    warm = warm_folder(cfg)  # warmup.steps > 0: the trainer's cached warm-up (built now when missing), as it starts
    if cfg.model.name == "tiny" and plan.run is None and warm is None:  # in memory: nothing is written
        tok = build_char_tokenizer()
        model = build_tiny_model(cfg.model, tok, cfg.seed).to(device)
        sft_warm_start(
            model,
            tok,
            train_examples,
            target_fn=sft_target(cfg.data.task),
            steps=cfg.model.sft_steps,
            batch_size=cfg.model.sft_batch_size,
            lr=cfg.model.sft_lr,
            seed=cfg.seed,
            device=device,
        )
        check_pad_token(tok, cfg.model.pad_token)
        model.train()
        eos_ids = ({tok.eos_token_id} | set(generation_eos_ids(model))) - {None}
        ref = model if with_ref else None  # the starting policy; reference_logp scores it before any step moves it
    else:
        run_dir = plan.run if plan.run is not None else Path(".")  # a pretrained model is read from its name, not this
        if warm is not None:  # with --run too: the trainer's reference model is the warm-up
            ensure_warm_model(cfg, device=device, say=say)
        policy = load_policy(
            cfg,
            run_dir=run_dir,
            device=device,
            dtype=dtype,
            resume=True,  # reads RUN_DIR/init_model (tiny) or the model's name; writes nothing
            with_ref=with_ref,  # the trainer's reference: RUN_DIR/init_model (tiny) or the model's name, frozen
            train_examples=train_examples,
            on_rank0=lambda fn: fn(),
            say=say,
            warm=warm,
        )
        model, tok, eos_ids, ref = policy.model, policy.tok, policy.eos_ids, policy.ref
    o = cfg.optim
    params = [p for p in model.parameters() if p.requires_grad]
    optimizer = torch.optim.AdamW(params, lr=o.lr, betas=(o.beta1, o.beta2), eps=o.adam_eps, weight_decay=o.weight_decay)
    if plan.run is not None:
        saved = load_checkpoint(plan.run)  # checksummed, tensors and plain data only
        names = {n for n, p in model.named_parameters() if p.requires_grad}
        if set(saved["model"]) != names:
            raise ValueError(f"--run {plan.run}: the checkpoint's parameters do not match the model of its config.toml")
        with torch.no_grad():
            for n, p in model.named_parameters():
                if n in saved["model"]:
                    p.copy_(saved["model"][n].to(p.device, p.dtype))
        load_keeping_kernel(optimizer, saved["optimizer"])  # the run's moments and learning rate
    return Start(model, tok, eos_ids, optimizer, device, amp, dtype, ref)


def sample_rollout(start: Start, cfg: Config, train_examples: list, eval_examples: list):
    """One rollout batch of ``rollout.prompts_per_step`` groups from the policy, seeded by ``cfg.seed`` (its
    ``sampler_logp`` is the sampler's log-probs, pi_rollout), and pi_old as the trainer takes it (choice 5)."""
    from ..decode import DecodeOptions
    from ..parallel import OneProcess
    from ..rewards.compute import RewardComputer, reward_spec
    from ..rewards.pool import default_workers
    from ..sampler import HFGenerateEngine
    from ..stages.old_logp import batch_logp, old_logp_from_sampler
    from ..stages.rollout import RolloutStage

    rewards = RewardComputer(
        reward_spec(cfg.reward.kind, cfg.data.task, cfg.reward.user_fn),
        format_weight=cfg.reward.format_weight,
        format_regex=cfg.reward.format_regex,
        timeout_s=cfg.reward.timeout_s,
        workers=cfg.reward.workers or default_workers(),
        max_tasks_per_worker=cfg.reward.max_tasks_per_worker,
        memory_limit_mb=cfg.reward.memory_limit_mb,
        functions=cfg.reward.functions,
        weights=cfg.reward.weights,
    )
    try:
        engine = HFGenerateEngine(
            start.model, start.tok.pad_token_id, start.eos_ids, cfg.rollout.batch_size, start.amp, DecodeOptions.from_config(cfg.rollout)
        )
        stage = RolloutStage(
            cfg,
            device=start.device,
            engine=engine,
            tok=start.tok,
            eos_ids=start.eos_ids,
            rewards=rewards,
            parallel=OneProcess(),
            train_examples=train_examples,
            eval_examples=eval_examples,
            max_prompt_tokens=None,
        )
        rollout = stage.run(1, seed_per_group=True)
    finally:
        rewards.close()
    if cfg.rollout.mask_truncated:
        rollout.batch.mask &= ~rollout.batch.truncated[:, None]
    if old_logp_from_sampler(cfg.rollout, start.amp, start.dtype):  # the trainer's rollout.old_logp: no forward pass
        return rollout, rollout.sampler_logp.clone()  # (B, T) pi_old = pi_rollout, exactly
    rows = cfg.rollout.prompts_per_step * cfg.rollout.group_size
    old_logp, _ = batch_logp(start.model, rollout.batch, start.device, rows, start.amp)  # (B, T) pi_old = the policy now
    return rollout, old_logp


def reference_logp(start: Start, cfg: Config, spec: ObjectiveSpec, batch) -> torch.Tensor:
    """pi_ref (B, T) of every row of ``batch``: the trainer's reference pass (``OldLogpStage.reference_logp``, on the
    reference model, or the policy with its LoRA adapters off) on ``start.ref``, before any step (choice 4).
    ``spec``: a label that reads ``ref_logp``."""
    from ..parallel import OneProcess
    from ..stages.old_logp import OldLogpStage

    rows = cfg.rollout.prompts_per_step * cfg.rollout.group_size
    stage = OldLogpStage(
        start.model, start.ref, spec, OneProcess(), device=start.device, amp=start.amp, from_sampler=False, rows_per_forward=rows
    )
    out = stage.reference_logp(batch, torch.ones(batch.mask.shape[0], dtype=torch.bool))  # (B, T)
    assert out is not None  # spec reads ref_logp
    return out


def probe_seed(plan: ProbePlan, seed: int, say: Callable[[str], None]) -> list[dict]:
    """Every label's figures on seed ``seed``: one record per label and event kind."""
    from ..forward import completion_logprobs
    from ..tasks import load_splits

    cfg = config_from_dict({**config_to_dict(plan.config), "seed": seed})
    if cfg.threads:
        torch.set_num_threads(cfg.threads)
    train_examples, eval_examples = load_splits(cfg.data, cfg.seed)
    specs: dict[str, ObjectiveSpec] = {label: objective_from_label(label) for label in plan.labels}
    reads_ref = next((spec for spec in specs.values() if spec.needs_ref_logp), None)
    start = build_start(plan, cfg, train_examples, say, with_ref=reads_ref is not None)
    rollout, old_logp = sample_rollout(start, cfg, train_examples, eval_examples)
    b = rollout.batch
    ref_logp = None if reads_ref is None else reference_logp(start, cfg, reads_ref, b)  # (B, T), before any step
    correct = torch.tensor(rollout.rewards.correct, dtype=torch.float64) > 0
    dev = start.device

    def batch_for(spec: ObjectiveSpec) -> DriftBatch:
        adv = group_advantages(rollout.reward_tensor().double(), b.group_ids, scale=spec.adv_scale, eps=spec.adv_eps)
        return DriftBatch(
            b.completion_ids.to(dev),
            b.mask.to(dev),
            b.group_ids.to(dev),
            adv.to(dev),
            old_logp.to(dev),
            correct,
            ref_logp=None if ref_logp is None else ref_logp.to(dev),
            rollout_logp=rollout.sampler_logp.to(dev),  # (B, T) pi_rollout, read by a rollout correction only
        )

    def score(rows: torch.Tensor):
        s = completion_logprobs(start.model, b.rows(rows), dev, start.amp, with_entropy=any(sp.needs_entropy for sp in specs.values()))
        return s.logp, s.entropy

    clip = cfg.optim.max_grad_norm if cfg.optim.max_grad_norm > 0 else math.inf
    first = specs[plan.labels[0]]
    for _ in range(plan.move_steps):  # off-policy: the first objective's real steps, common to every label
        probe_step(score, start.optimizer, batch_for(first), first, max_events=0, max_grad_norm=clip, keep_step=True)
    records = []
    for label, spec in specs.items():
        report = probe_step(score, start.optimizer, batch_for(spec), spec, max_events=plan.max_events, max_grad_norm=clip)
        for kind, events in (("shared", report.shared), ("equivalent", report.pairs)):
            record = {"seed": seed, "objective": label, "kind": kind, "events": len(events), **summary(events)}
            if kind == "shared":  # before the --max-events cap, and the whole-group ones among them
                record.update(found=report.found, found_whole=report.found_whole)
            records.append(record)
    return records
