"""``dfpo probe``: parameter-space drift of several objectives on the same batch from the same starting point.

    dfpo probe --objectives gspo,dfpo_min,gspo_noclip,dfpo_min:stopgrad=score --seeds 4 --out runs/probe
    dfpo probe --run runs/tiny-gspo --seeds 8 --first-seed 100

For each seed: a policy (the tiny preset warmed up with that seed, or ``--run``'s checkpoint, loaded through the
checksummed tensors-only loader), one rollout batch sampled from it (``rollout.prompts_per_step`` groups of G), pi_old
from it, ``--move-steps`` optimiser steps of the FIRST objective on the batch (so the policy is off-policy, as on the
later optimiser steps of a rollout batch, where the ratios, clipping and DFPO's transforms act), then every
objective's own optimiser step from that one point, split by ``dfpo.core.probe.probe_step`` into direct + cross
(the rest of the batch's gradient) + momentum (the AdamW state the move steps left) + decay (weight decay) beside the
measured change, and put back before the next objective. One batch, one starting point, one optimiser
state: only the loss differs, so each objective's figures are compared with its matched control on common random
numbers (a matched control by construction).

Outputs in ``--out``: probe.json (every seed's figures and the settings), probe.md (the tables below) and probe.png;
seeds/seedN.json, each seed's records as soon as it ends (the same command again goes on at the next seed).
Tables: per objective and event kind, the mean over seeds of each figure with a 95% Student-t interval over seeds
(magnitudes, then each part's share of the first-order prediction), with a generated warning under it for every
objective and kind whose first-order error passes ``FIRST_ORDER_ERROR_LIMIT``;
then each objective with a group transform against its matched control (the first label without a transform whose
trust region it shares, ``unmatched_components``), paired over seeds, intervals Bonferroni-adjusted over that
table (``dfpo.core.stats``), each cell with its verdict on "restoring cancellation lowers the drift".

Choices made here (the issue leaves them open; what a TRL / verl user would expect):
1. The probe's batch is one mini-batch of every group of the rollout (one loss call), its step the trainer's:
   AdamW with ``optim``'s settings (``--run``: with the checkpoint's moments and learning rate), gradient clipping
   at ``optim.max_grad_norm``. Sampling always uses transformers' ``generate`` loop on the policy (the HF engine).
2. Without ``--config`` or ``--run`` the policy is the tiny preset of ``configs/tiny-cpu.toml`` ("a+b=", single
   digits) with 16 prompts a batch (``PROBE_DEFAULTS``); any ``--set`` applies on top. Its groups share a token
   often (the "1" of a two-digit sum, followed by digits that differ) but its task has one correct form, so it
   holds no equivalent pairs; ``--set data.task=equiv --set model.sft_steps=300`` (``EQUIV_SETS``) gives a task with
   several correct forms ("12", "3+9", "9+3") and a policy that finds two of them in a group, and no shared events
   (its groups rarely agree on a first character). A shared event is a (context, token) that two or more
   completions of a group hold (eq 2, Prop. 3.1; ``dfpo.core.probe.probe_events``'s "subset" rule, probe.json's
   ``shared_events``); a document without that field (the ones stored before it) used the "whole" rule: only what
   every completion of a group holds.
3. A seed sets the policy (tiny preset: its initialisation and warm start) and the batch; with ``--run`` the
   policy is the checkpoint's and a seed sets the batch only.
4. The reference pi_ref (a KL term ``beta > 0``, online IPO's log-ratio, anything that reads ``ref_logp``) is the
   trainer's: the model a run starts from, frozen, scored by the trainer's own reference pass
   (``OldLogpStage.reference_logp``) on the probe's batch once per seed, before any step. Without ``--run`` that is
   the policy the probe starts from (the warm-started tiny preset, or the pretrained model), so pi_ref = pi_old at
   the start; with ``--run`` it is the run's reference (RUN_DIR/init_model for the tiny preset, the model's name
   otherwise, the base model with the adapters off under LoRA), not its checkpoint: the KL the run's next step would
   see. It is built and scored only when some label reads it.
5. The sampler pi_rollout (``rollout_logp``, read by a ``rollout_correction`` or ``rollout_rejection``) is the HF
   engine's per-token log-probs of the sampled tokens (the untruncated ones, ``rollout.sampler_logp``), as the
   trainer passes them; pi_old is what the trainer's ``rollout.old_logp`` makes it: the sampler's log-probs
   themselves where sampling is the policy (``auto`` with the HF engine, float32, temperature 1, no top-k / top-p:
   the tiny preset), else a no-grad forward of the policy before any step. So on the tiny preset rho = pi_old /
   pi_rollout = 1 at every token, through the ``--move-steps`` too (pi_old stays the sampling policy's, as over
   a rollout batch's optimiser steps in training): a correction or rejection built on rho weighs every token 1 and
   rejects none, and the label's figures are its uncorrected objective's; only a bypass correction
   (``rollout_bypass``: rho = pi_theta / pi_old) sees the move steps. With ``--set rollout.old_logp=recompute`` (or
   bf16, or top-k / top-p) rho is the two computations' mismatch, as in training.
"""

from __future__ import annotations

import contextlib
import json
import math
import statistics
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

import torch

from ...core import stats
from ...core.drift_tables import KINDS, MIN_SEEDS, SHARES, comparison_table, first_order_flags, share_table, summary_table, values
from ...core.files import check_writable_folder, write_run_file
from ...core.loss import ObjectiveSpec, group_advantages, objective_from_label, unmatched_components
from ...core.loss.advantages import GREEDY_BASELINE, LENGTH_WEIGHTED, MULTI_REWARD, TOKEN_LEVEL
from ...core.probe import OLD_RULE, RULE_WORDS, DriftBatch, document_rule, probe_step, summary
from ...core.settings import finite_number
from ..config import Config, config_from_dict, load_config
from . import DEFAULT_OBJECTIVES

PROBE_DEFAULTS = (
    "model.sft_steps=100",
    "data.task=add",
    "data.max_operand=9",
    "data.eval_size=32",
    "rollout.prompts_per_step=16",
    "rollout.group_size=8",
    "rollout.max_new_tokens=5",
    "optim.lr=3e-4",
    "threads=1",
)
"""The tiny preset of configs/tiny-cpu.toml (model, warm start, task, rollout, learning rate) with 16 prompts a batch
(choice 2)."""
EQUIV_SETS = ("data.task=equiv", "model.sft_steps=300")
"""``--set`` these for equivalent pairs: the equiv task, whose correct answers have several surface forms, and a
warm start long enough that a group holds two correct ones (choice 2)."""
FILES = ("probe.json", "probe.md", "probe.png")


@dataclass(frozen=True)
class ProbePlan:
    """What to probe: labels, their matched controls, seeds, the config, the run folder (or None) and the outputs."""

    labels: tuple[str, ...]
    controls: dict[str, str]
    seeds: tuple[int, ...]
    config: Config
    run: Path | None
    move_steps: int
    max_events: int
    out: Path
    command: str


def matched_controls(labels: Sequence[str]) -> dict[str, str]:
    """{label with a group transform: the first label without one whose trust region it shares}."""
    specs = {label: objective_from_label(label) for label in labels}
    out = {}
    for label, spec in specs.items():
        if spec.transform == "none":
            continue
        control = next((c for c, s in specs.items() if s.transform == "none" and not unmatched_components(spec, s)), None)
        if control is not None:
            out[label] = control
    return out


READS_MORE_THAN_THE_TOTAL = (*LENGTH_WEIGHTED, *MULTI_REWARD, *GREEDY_BASELINE, *TOKEN_LEVEL)
"""Advantage estimators the probe cannot compute from the rollout's total rewards alone (issue 30's peers' estimators)."""
PROBE_INPUTS = ("entropy", "ref_logp", "rollout_logp")
"""The loss inputs beyond the batch's that the probe computes (choices 4 and 5); a label reading another is refused."""


def make_plan(
    *,
    objectives: str,
    seeds: int,
    first_seed: int,
    config: str | None,
    sets: list[str] | None,
    run: str | None,
    move_steps: int,
    max_events: int,
    out: str,
    command: str = "",
) -> ProbePlan:
    """Every input checked before any work: labels, seeds, steps, the config or run folder, the output folder."""
    labels = tuple(x.strip() for x in objectives.split(",") if x.strip())
    if not labels:
        raise ValueError(f"--objectives needs at least one objective label, got --objectives {objectives!r}")
    if len(set(labels)) != len(labels):
        raise ValueError(f"--objectives repeats a label: {objectives!r}")
    for label in labels:
        spec = objective_from_label(label)  # names the bad label or component
        if spec.adv_scale in READS_MORE_THAN_THE_TOTAL:
            raise ValueError(
                f"--objectives {label!r}: the probe gives each label advantages of the rollout's total rewards, and "
                f"adv_scale={spec.adv_scale!r} reads more (lengths, reward columns, a greedy completion or per-token "
                "statistics): probe another adv_scale, or train it with dfpo train"
            )
        missing = {k: why for k, why in spec.required_inputs().items() if k not in PROBE_INPUTS}
        if missing:
            raise ValueError(
                f"--objectives {label!r} reads {', '.join(f'{k} ({why})' for k, why in missing.items())}, which the probe "
                f"does not compute (it computes {', '.join(PROBE_INPUTS)}): probe it without that term, or train it with dfpo train"
            )
    if seeds < 1:
        raise ValueError(f"--seeds must be >= 1, got --seeds {seeds}")
    if first_seed < 0 or first_seed + seeds > 2**32:
        raise ValueError(f"--first-seed must be in [0, 2^32 - seeds], got --first-seed {first_seed}")
    if move_steps < 0:
        raise ValueError(f"--move-steps must be >= 0, got --move-steps {move_steps}")
    if max_events < 1:
        raise ValueError(f"--max-events must be >= 1, got --max-events {max_events}")
    if run is not None:
        if config is not None or sets:
            raise ValueError("--run probes the run folder's own config and checkpoint; drop --config and --set")
        cfg = run_config(Path(run))
    else:
        cfg = load_config(config, [*(PROBE_DEFAULTS if config is None else ()), *(sets or [])])
    if cfg.rollout.group_size < 2:
        raise ValueError(f"rollout.group_size must be >= 2 for groups, got {cfg.rollout.group_size}")
    check_writable_folder("--out", out)
    return ProbePlan(
        labels,
        matched_controls(labels),
        tuple(range(first_seed, first_seed + seeds)),
        cfg,
        None if run is None else Path(run),
        move_steps,
        max_events,
        Path(out),
        command,
    )


def run_config(run_dir: Path) -> Config:
    """The config of a run folder with a checkpoint, read without writing anything (``--run``); ValueError naming the
    folder for anything else."""
    from ..run.checkpoint import check_checkpoint
    from ..run.resume import resume_config

    cfg = resume_config(run_dir, [])  # its config.toml, checked against the checkpoint's record
    check_checkpoint(run_dir)  # checksum and contents, before any work
    return cfg


# ----------------------------------------------------------------------------- one seed


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

    device = resolve_device(cfg.device)
    dtype, amp = resolve_dtype(cfg.model.dtype, device), resolve_amp(cfg.model.amp, device)
    if cfg.model.name == "tiny" and plan.run is None:  # in memory: nothing is written
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
        optimizer.load_state_dict(saved["optimizer"])  # the run's moments and learning rate
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

    cfg = config_from_dict({**_config_dict(plan.config), "seed": seed})
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


def _config_dict(cfg: Config) -> dict:
    from ..config import config_to_dict

    return config_to_dict(cfg)


# ----------------------------------------------------------------------------- the whole probe


SEEDS_FOLDER = "seeds"
"""OUT/seeds/seedN.json: one seed's records, written as soon as that seed is probed, so that a probe stopped part-way
(a session's end kills it) goes on at the next seed when the same command runs again."""


def seed_key(plan: ProbePlan) -> dict:
    """Everything that decides one seed's records besides the seed (as JSON reads it back): the labels, the steps
    before the probed one, the event cap, the config, the run folder, the shared-event rule and the code
    (``dfpo.trainer.run.code.source_sha256``)."""
    from ..run.code import source_sha256

    key = {
        "objectives": list(plan.labels),
        "move_steps": plan.move_steps,
        "max_events": plan.max_events,
        "config": {k: v for k, v in _config_dict(plan.config).items() if k != "seed"},
        "run": None if plan.run is None else str(plan.run),
        "shared_events": SHARED_RULE,
        "source_sha256": source_sha256(),
    }
    return json.loads(json.dumps(key))


def seed_file(plan: ProbePlan, seed: int) -> Path:
    return plan.out / SEEDS_FOLDER / f"seed{seed}.json"


def stored_seeds(plan: ProbePlan, key: dict) -> dict[int, dict]:
    """The seeds of ``plan`` already probed under OUT/seeds/ ({seed: its stored document}); ValueError naming the file
    when one cannot be read or was probed with other settings or code than ``key`` (``seed_key``; nothing is probed
    then)."""
    found = {}
    for seed in plan.seeds:
        path = seed_file(plan, seed)
        if not path.is_file():
            continue
        try:
            doc = json.loads(path.read_text(encoding="utf-8"))
        except (OSError, UnicodeDecodeError, json.JSONDecodeError) as err:
            raise ValueError(f"{path} cannot be read as JSON ({err}): move it away to probe seed {seed} again") from None
        if not (
            isinstance(doc, dict) and doc.get("seed") == seed and isinstance(doc.get("records"), list) and finite_number(doc.get("wall_s"))
        ):
            raise ValueError(f"{path} is not a stored seed of dfpo probe: move it away to probe seed {seed} again")
        if doc.get("key") != key:
            differ = sorted(k for k in key if (doc.get("key") or {}).get(k) != key[k])
            raise ValueError(
                f"{path} was probed with other settings or code ({', '.join(differ) or 'its key'} differ): run the command "
                "that made it, move the folder away, or choose another --out"
            )
        found[seed] = doc
    return found


def run_probe(plan: ProbePlan, say: Callable[[str], None] = lambda msg: None) -> dict:
    """Every seed of ``plan``; the document probe.json holds (settings and per-seed records). A seed stored under
    OUT/seeds/ by an earlier run of the same probe is read, not probed again; ``wall_s`` sums each seed's seconds."""
    key = seed_key(plan)
    stored, records, wall_s = stored_seeds(plan, key), [], 0.0
    for k, seed in enumerate(plan.seeds):
        if seed in stored:
            say(f"dfpo probe: seed {seed} ({k + 1}/{len(plan.seeds)}): probed before, read from {seed_file(plan, seed)}")
            seed_records, seconds = stored[seed]["records"], float(stored[seed]["wall_s"])
        else:
            say(f"dfpo probe: seed {seed} ({k + 1}/{len(plan.seeds)})")
            t0 = time.time()
            seed_records = probe_seed(plan, seed, say)
            seconds = time.time() - t0
            doc = {"seed": seed, "key": key, "records": seed_records, "wall_s": seconds}
            seed_file(plan, seed).parent.mkdir(parents=True, exist_ok=True)
            write_run_file(seed_file(plan, seed), json.dumps(doc, indent=1, sort_keys=True) + "\n")
        records += seed_records
        wall_s += seconds
    cfg = plan.config
    return {
        "command": plan.command,
        "objectives": list(plan.labels),
        "controls": plan.controls,
        "seeds": list(plan.seeds),
        "run": None if plan.run is None else str(plan.run),
        "move_steps": plan.move_steps,
        "max_events": plan.max_events,
        "shared_events": SHARED_RULE,
        "settings": {
            "model": cfg.model.name,
            "task": cfg.data.task,
            "prompts_per_step": cfg.rollout.prompts_per_step,
            "group_size": cfg.rollout.group_size,
            "lr": cfg.optim.lr,
            "max_grad_norm": cfg.optim.max_grad_norm,
            "old_logp": cfg.rollout.old_logp,
        },
        "records": records,
        "wall_s": wall_s,
    }


SHARED_RULE = "subset"
"""probe.json's ``shared_events``: the rule that picked the shared events (``dfpo.core.probe.EVENT_RULES``); a
document without it used ``dfpo.core.probe.OLD_RULE``."""


def events_sentence(doc: dict) -> str:
    """probe.md's line on which shared events were probed, and how many the rule found before the cap per seed."""
    if document_rule(doc) == OLD_RULE:
        return (
            f"Shared events: the whole-group rule ({RULE_WORDS[OLD_RULE]}): this document has no shared_events field, so "
            "it was made before the subset rule; how many were found before the cap is not recorded."
        )
    found: dict[int, tuple[int, int]] = {}
    for r in doc["records"]:
        if r["kind"] == "shared" and "found" in r:
            found[r["seed"]] = (int(r["found"]), int(r.get("found_whole", 0)))
    counts = [n for n, _ in found.values()]
    whole = [w for _, w in found.values()]
    if not counts:
        return f"Shared events: the subset rule ({RULE_WORDS['subset']})."
    return (
        f"Shared events: the subset rule ({RULE_WORDS['subset']}); "
        f"found in a seed's batch before the cap of {doc['max_events']}: median {statistics.median(counts):g} "
        f"(min {min(counts)}, max {max(counts)}, {len(counts)} seeds), of which held by the whole group: median "
        f"{statistics.median(whole):g} (min {min(whole)}, max {max(whole)})."
    )


def render_markdown(doc: dict) -> str:
    """probe.md: what ran, the per-objective table, the matched-control table, warnings."""
    s = doc["settings"]
    seeds = doc["seeds"]
    where = f"the checkpoint of {doc['run']}" if doc["run"] else f"the {s['model']} model on {s['task']}"
    out = [
        "# Parameter-space drift probe",
        "",
        f"`{doc['command']}`" if doc["command"] else "",
        "",
        f"Seeds {seeds[0]}..{seeds[-1]} ({len(seeds)}); {where}; one batch of {s['prompts_per_step']} groups of {s['group_size']} per seed, "
        f"{doc['move_steps']} optimiser steps of `{doc['objectives'][0]}` off pi_old, then each objective's own AdamW step "
        f"(lr {s['lr']:g}, clip {s['max_grad_norm']:g}) from that one point; at most {doc['max_events']} events of each kind.",
        *_inputs_sentence(doc),
        "",
        events_sentence(doc),
        "",
        "Per event, the first-order change of log pi (predicted = <g_e, Delta theta>, Delta theta the real update) in four "
        "parts that add up to it: direct = what the event's own coefficients cause through its own gradient, cross = what "
        "the rest of this batch's gradient causes through shared parameters, momentum = what the optimiser's state from "
        "the earlier steps carries (AdamW's first moment after the move steps; 0 on a first step), decay = weight decay's "
        "part; measured = the change after the step (a forward pass); error = abs(measured - predicted), error / abs "
        "measured = its ratio (flagged above the first-order limit). Shares are of the first-order prediction: sum abs "
        "part / sum over the four parts of sum abs part; 'cross of batch' = sum abs cross / (sum abs direct + sum abs "
        "cross), the cross term's share of the batch's own gradient's part. Shared events: as the line above says; equivalent: the log-odds of two correct completions of a group with different tokens.",
        "",
        "## Per objective (mean over seeds [95% Student-t interval over seeds])",
        "",
        summary_table(doc),
        *_flags(doc),
        "",
        "### Shares of the first-order prediction (same seeds)",
        "",
        summary_table(doc, SHARES),
        "",
        "## Against the matched control (paired over seeds)",
        "",
        comparison_table(doc),
        "",
        "## How much of the first-order prediction the cross term carries",
        "",
        share_table(doc),
    ]
    if len(seeds) < MIN_SEEDS:
        out += ["", f"Warning: {len(seeds)} seeds (fewer than {MIN_SEEDS}): the intervals are wide and lean on near-normal differences."]
    return "\n".join(out) + "\n"


def _flags(doc: dict) -> list[str]:
    """probe.md's generated first-order warnings under the table (``drift_tables.first_order_flags``); [] when none."""
    flags = first_order_flags(doc)
    return ["", *(f"Warning: {f}" for f in flags)] if flags else []


def _inputs_sentence(doc: dict) -> list[str]:
    """probe.md's line on pi_ref and pi_rollout, when some label reads them (choices 4 and 5); [] otherwise."""
    specs = [objective_from_label(label) for label in doc["objectives"]]
    out = []
    if any(spec.needs_ref_logp for spec in specs):
        ref = f"the reference model of {doc['run']}" if doc["run"] else "the starting policy"
        out.append(f"pi_ref: {ref}, frozen, scored on the batch before any step.")
    if any(spec.needs_rollout_logp for spec in specs):
        source = doc["settings"].get("old_logp", "recompute")
        out.append(f"pi_rollout: the sampler's per-token log-probs; pi_old as rollout.old_logp={source} makes it in training.")
    return ["", " ".join(out)] if out else []


PLOT_PARTS = (("direct", "tab:blue"), ("cross", "tab:orange"), ("momentum", "tab:purple"), ("decay", "tab:gray"), ("measured", "tab:green"))
"""probe.png's bars per objective: the four parts of the first-order prediction and the measured change."""
LOG_SPAN = 10.0
"""probe.png uses a log axis when the largest bar is more than this many times the smallest non-zero one."""


def bar_stats(doc: dict, label: str, kind: str, figure: str) -> tuple[float, float, float, int]:
    """(mean over seeds, lower and upper whisker length, seeds) of one bar: the 95% Student-t interval over seeds,
    its lower end cut at 0 (the figures are absolute values, never below 0); whiskers 0 for fewer than 2 seeds."""
    vals = list(values(doc, label, kind, figure).values())
    if not vals:
        return 0.0, 0.0, 0.0, 0
    iv = stats.paired_interval(vals)
    if iv.n < 2:
        return iv.mean, 0.0, 0.0, iv.n
    return iv.mean, iv.mean - max(iv.low, 0.0), iv.high - iv.mean, iv.n


def panel_layout(doc: dict, kind: str) -> dict:
    """What one panel of probe.png draws: ``bars`` {figure: [bar_stats per objective]}, ``drawn`` [(figure, colour)],
    ``log`` (the bars span more than ``LOG_SPAN``), ``counts`` (seeds each objective's bars hold), ``notes`` (the
    panel's sentences: parts 0 in every seed or absent, objectives without such events, whiskers cut by the log axis)."""
    labels = doc["objectives"]
    bars = {figure: [bar_stats(doc, label, kind, figure) for label in labels] for figure, _ in PLOT_PARTS}
    zero = [f for f, rows in bars.items() if any(r[3] for r in rows) and all(r[0] == 0 for r in rows)]
    missing = [f for f, rows in bars.items() if not any(r[3] for r in rows)]
    drawn = [(f, c) for f, c in PLOT_PARTS if f not in zero and f not in missing]
    heights = [r[0] for f, _ in drawn for r in bars[f] if r[0] > 0]
    log = bool(heights) and max(heights) > LOG_SPAN * min(heights)
    counts = [max((bars[f][i][3] for f, _ in drawn), default=0) for i in range(len(labels))]
    notes = [f"abs {f}: 0 in every seed, not drawn" for f in zero] + [f"abs {f}: not in this document" for f in missing]
    if any(n == 0 for n in counts):
        notes.append("0 seeds: no such event under that objective")
    if any(n == 1 for n in counts):
        notes.append("1 seed: no whisker (an interval needs 2 seeds)")
    if log and any(r[0] - r[1] <= 0 for f, _ in drawn for r in bars[f] if r[3] >= 2):
        notes.append("a whisker down to the bottom edge: its interval reaches 0")
    return {"bars": bars, "drawn": drawn, "log": log, "counts": counts, "notes": notes}


def empty_reason(doc: dict, kind: str) -> str:
    """Why a panel of probe.png has no bar (shown in the panel)."""
    seeds = len(doc["seeds"])
    if kind == "shared":
        who = "every completion of a group" if document_rule(doc) == OLD_RULE else "two or more completions of a group"
        return f"no group shared a token\n({who}, same prefix)\nin the batches of {seeds} seeds"
    return f"no group held two correct answers\nwith different tokens\nin the batches of {seeds} seeds"


def plot(doc: dict, path: Path) -> None:
    """probe.png: per event kind, abs direct / cross / momentum / decay / measured per objective, mean over seeds
    with its 95% interval cut at 0, the number of seeds under each objective; a log axis when the bars span more
    than ``LOG_SPAN``; a part that is 0 in every seed is named in the panel instead of drawn; an empty panel says
    why it is empty."""
    import matplotlib  # deferred: only this writer needs it, with the Agg backend

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    labels = doc["objectives"]
    with plt.rc_context({"text.usetex": False, "text.parse_math": False}):  # labels are never markup
        fig, axes = plt.subplots(1, 2, figsize=(13, 4.8), dpi=100, layout="constrained")
        for ax, kind in zip(axes, KINDS):
            ax.set_title("shared (context, token) events" if kind == "shared" else "equivalent answers' log-odds", fontsize=10)
            if not any(values(doc, label, kind, "direct") for label in labels):
                ax.text(0.5, 0.5, empty_reason(doc, kind), ha="center", va="center", fontsize=9, transform=ax.transAxes)
                ax.set_xticks([])
                ax.set_yticks([])
                continue
            layout = panel_layout(doc, kind)
            bars, drawn, log, counts, notes = (layout[k] for k in ("bars", "drawn", "log", "counts", "notes"))
            width = 0.8 / max(1, len(drawn))
            for j, (figure, color) in enumerate(drawn):
                rows = bars[figure]
                xs = [i + (j - (len(drawn) - 1) / 2) * width for i in range(len(labels))]
                err = [[r[1] for r in rows], [r[2] for r in rows]]
                ax.bar(xs, [r[0] for r in rows], width, yerr=err, color=color, label=f"abs {figure}", capsize=2)
            if log:
                from matplotlib.ticker import FuncFormatter, NullFormatter

                ax.set_yscale("log")
                ax.yaxis.set_major_formatter(FuncFormatter(lambda v, _: f"{v:g}"))  # plain numbers: no mathtext
                ax.yaxis.set_minor_formatter(NullFormatter())
            ticks = [f"{lb.replace(':', chr(10))}\n{n} of {len(doc['seeds'])} seeds" for lb, n in zip(labels, counts)]
            ax.set_xticks(range(len(labels)), ticks, fontsize=8)  # a label's overrides one a line, then the seeds its bars hold
            scale = "log scale" if log else "linear scale"
            ax.set_ylabel(f"mean abs change of log pi per event ({scale})", fontsize=8)
            ax.grid(axis="y", alpha=0.3)
            if notes:  # headroom above the whiskers for them
                low, high = ax.get_ylim()
                ax.set_ylim(low, high * 6 if log else high * 1.25)
                box = {"facecolor": "white", "alpha": 0.85, "edgecolor": "none"}
                ax.text(0.99, 0.98, "\n".join(notes), ha="right", va="top", fontsize=7, transform=ax.transAxes, bbox=box)
            ax.legend(fontsize=7, loc="upper left")
        fig.suptitle(
            "one optimiser step from one point, per objective: bars are means over seeds, whiskers the 95% Student-t "
            "interval over seeds (cut at 0)",
            fontsize=9,
        )
        tmp = path.with_name(f".{path.name}.tmp")
        try:
            fig.savefig(tmp, format="png")
            tmp.replace(path)
        finally:
            tmp.unlink(missing_ok=True)
            plt.close(fig)


def write_outputs(doc: dict, out: Path) -> list[Path]:
    """probe.json, probe.md and probe.png in ``out`` (created); each written whole or not at all."""
    out.mkdir(parents=True, exist_ok=True)
    paths = [out / name for name in FILES]
    write_run_file(paths[0], json.dumps(doc, indent=1, sort_keys=True) + "\n")
    write_run_file(paths[1], render_markdown(doc))
    plot(doc, paths[2])
    return paths


def probe_command(plan: ProbePlan, *, quiet: bool = False) -> str:
    """Run the probe, write its outputs, return probe.md's text."""
    say = (lambda msg: None) if quiet else (lambda msg: print(msg, file=sys.stderr, flush=True))
    from ..packaged_model import quiet_loading

    threads = torch.get_num_threads()
    try:
        with quiet_loading() if quiet else contextlib.nullcontext():  # no conversion line, no loading bars
            doc = run_probe(plan, say)
    finally:
        torch.set_num_threads(threads)
    write_outputs(doc, plan.out)
    return render_markdown(doc)


__all__ = [
    "DEFAULT_OBJECTIVES",
    "ProbePlan",
    "make_plan",
    "matched_controls",
    "probe_command",
    "render_markdown",
    "run_probe",
    "write_outputs",
]
