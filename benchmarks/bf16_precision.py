"""What bf16 autocast on a CPU does to the numbers an experiment reads (issue 59), on one fixed rollout batch.

    OMP_NUM_THREADS=1 python benchmarks/bf16_precision.py        # SmolLM2-135M-Instruct: docs/throughput/bf16-precision.json
    python benchmarks/bf16_precision.py --config X.toml --set rollout.max_new_tokens=8 --out /tmp/p.json

The work of ``configs/smollm2-cpu.toml`` (4 sum-task prompts x 8 completions) with 16 new tokens: one rollout batch,
sampled once in float32 by the trainer's own rollout stage and held fixed. The weights never move, so every ratio
pi_theta / pi_old read here is on-policy: exactly 1 in exact arithmetic. Three pipelines score the batch:

- ``float32``: pi_old and pi_theta both in float32 (the trainer without autocast);
- ``bf16``: both under bf16 autocast (the trainer with ``model.amp = "bf16"``);
- ``mixed``: pi_old in float32, pi_theta under bf16 autocast.

pi_old comes from the trainer's no-grad old-log-prob pass (``stages.old_logp.batch_logp``, in chunks of a
micro-batch's rows); pi_theta, the loss and its gradient from the update's forward (``stages.update.micro_loss``: by
default the LM head fused with the loss core's objective, ``dfpo.core.fused``; with ``optim.fused_head = "off"``
``dfpo.core.loss.policy_loss`` on the log-probs), over micro-batches of ``optim.minibatch_groups`` groups, weighted
(``minibatches.accumulation_weights``) into the loss of the whole batch as one mini-batch. This is what a later
optimiser step of a rollout batch reads for its rows before the policy moved; the rows the first step trains take
pi_old from their own forward (ratio 1 by construction in any precision). Two more ratio rows take pi_old from the
sampler's own float32 log-probs (``rollout.old_logp = "sampler"``, the float32 trainer's default on this config).

What it reads off:
1. the ratio exp(logp_new - logp_old): per token (eq 7) and per sequence (GSPO's length-normalised ratio, eq 44):
   max |ratio - 1| and the share of sequences outside GSPO's clip band [1 - eps_low, 1 + eps_high] (the objective's
   own eps, 3e-4 and 4e-4), with the loss core's clip fractions;
2. the loss of each objective (``gspo``, ``dfpo_min:stopgrad=score``) under bf16 and mixed against float32;
3. the full parameter gradient: cosine similarity and relative norm error against float32.

Choices where the issue is silent: one fixed batch (seed of the config, training step 1); the clip band is the one
that the objective resolves to; the loss's relative error is left out (None) where the float32 loss is exactly 0.
Precision figures, not timings: other processes may run beside it.
"""

from __future__ import annotations

import argparse
import datetime
import json
import math
import platform
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import torch

from dfpo.core.loss import ObjectiveSpec, objective_from_label, sequence_log_ratio, token_log_ratio
from dfpo.core.metric_registry import reduce_records

ROOT = Path(__file__).resolve().parents[1]
DEFAULT_CONFIG = ROOT / "configs" / "smollm2-cpu.toml"
DEFAULT_SETS = ("rollout.max_new_tokens=16",)
"""The issue's work: the config's prompts and groups, 16 new tokens."""
FIXED_SETS = ("device=cpu", "model.amp=none", "train.save_every=0", "eval.every=0", "log.tensorboard=false", "log.progress=false")
"""The rollout is sampled in float32 on the CPU; the run folder (a temporary one) gets no checkpoint or evaluation."""
DEFAULT_OUT = ROOT / "docs" / "throughput" / "bf16-precision.json"
OBJECTIVE_LABELS = ("gspo", "dfpo_min:stopgrad=score")
BF16_FLAGS = ("avx512_bf16", "amx_bf16")
"""/proc/cpuinfo flags of x86 CPUs with bf16 arithmetic in hardware."""
PIPELINES = {"float32": (None, None), "bf16": (torch.bfloat16, torch.bfloat16), "mixed": (None, torch.bfloat16)}
"""Pipeline -> (autocast dtype of pi_old's pass, of pi_theta's forward); None: float32."""
SAMPLER_PIPELINES = {"sampler_float32": None, "sampler_mixed": torch.bfloat16}
"""Ratio rows with pi_old from the sampler's float32 log-probs -> autocast dtype of pi_theta's forward."""
STEP = 1
"""The training step whose rollout batch is measured (its prompts and sampling seed)."""


# ------------------------------------------------------------------------------------------------------ the machine


def cpu_model(cpuinfo: str) -> str:
    """The first "model name" of /proc/cpuinfo's text ("" when it has none)."""
    for line in cpuinfo.splitlines():
        key, _, value = line.partition(":")
        if key.strip() == "model name":
            return value.strip()
    return ""


def bf16_flags(cpuinfo: str) -> list[str]:
    """Which of ``BF16_FLAGS`` the first CPU's "flags" line of /proc/cpuinfo's text holds."""
    for line in cpuinfo.splitlines():
        key, _, value = line.partition(":")
        if key.strip() == "flags":
            held = set(value.split())
            return [f for f in BF16_FLAGS if f in held]
    return []


def read_cpuinfo() -> str:
    """/proc/cpuinfo's text ("" where there is none)."""
    try:
        return Path("/proc/cpuinfo").read_text()
    except OSError:
        return ""


# ------------------------------------------------------------------------------------------------------ the figures


def ratio_stats(new_logp: torch.Tensor, old_logp: torch.Tensor, mask: torch.Tensor, *, eps_low: float, eps_high: float) -> dict:
    """How far exp(logp_new - logp_old) lies from 1 on the real tokens (eq 7) and per sequence (GSPO's
    length-normalised ratio s_i, eq 44), and the share of sequences with a real token whose s_i lies outside the clip
    band [1 - eps_low, 1 + eps_high]. ``new_logp``, ``old_logp``: (B, T); ``mask``: (B, T) bool."""
    token_dev = (token_log_ratio(new_logp, old_logp, mask).exp() - 1).abs()[mask]  # (N,)
    has_tokens = mask.any(-1)  # (B,)
    seq_ratio = sequence_log_ratio(new_logp, old_logp, mask).exp()[has_tokens]  # (B',)
    outside = (seq_ratio < 1 - eps_low) | (seq_ratio > 1 + eps_high)  # (B',)
    none = token_dev.numel() == 0
    return {
        "token_max_abs_dev": 0.0 if none else float(token_dev.max()),
        "token_mean_abs_dev": 0.0 if none else float(token_dev.mean()),
        "token_exactly_1_share": 0.0 if none else float((token_dev == 0).float().mean()),
        "seq_max_abs_dev": 0.0 if none else float((seq_ratio - 1).abs().max()),
        "seq_outside_band": int(outside.sum()),
        "seq_outside_band_share": 0.0 if none else float(outside.float().mean()),
        "sequences": int(has_tokens.sum()),
    }


def loss_error(value: float, reference: float, scale: float) -> dict:
    """``value`` against the float32 ``reference``: |difference|, relative to the reference where it is not 0, and
    relative to ``scale``, the mean |A_i| of the batch (a loss at ratio 1 is a weighted mean of A_i terms, and
    group-normalised advantages sum to 0 in each group, so the reference itself is often round-off)."""
    diff = abs(value - reference)
    return {
        "value": value,
        "abs_error": diff,
        "rel_error": diff / abs(reference) if reference != 0 else None,
        "error_per_mean_abs_adv": diff / scale if scale > 0 else None,
    }


def grad_agreement(grads: list[torch.Tensor], reference: list[torch.Tensor]) -> dict:
    """Cosine similarity of two full parameter gradients, the relative error of the norm | |g| - |g_ref| | / |g_ref|
    and of the vector |g - g_ref| / |g_ref| (None where the reference is 0); sums in float64. Each list holds one
    tensor per parameter, in the same order and shapes."""
    dot = sum(float((g.double() * r.double()).sum()) for g, r in zip(grads, reference))
    norm = math.sqrt(sum(float(g.double().square().sum()) for g in grads))
    ref = math.sqrt(sum(float(r.double().square().sum()) for r in reference))
    diff = math.sqrt(sum(float((g.double() - r.double()).square().sum()) for g, r in zip(grads, reference)))
    return {
        "norm": norm,
        "reference_norm": ref,
        "cosine": dot / (norm * ref) if norm > 0 and ref > 0 else None,
        "norm_rel_error": abs(norm - ref) / ref if ref > 0 else None,
        "diff_rel_error": diff / ref if ref > 0 else None,
    }


# ------------------------------------------------------------------------------------------------------ the work


@dataclass
class FixedRollout:
    """One rollout batch, sampled once in float32, and what scoring it needs."""

    model: torch.nn.Module
    batch: object
    """The trainer's ``RolloutBatch`` (B = prompts x G rows)."""
    sampler_logp: torch.Tensor
    """(B, T) the sampler's float32 log-probs."""
    advantages: dict[str, torch.Tensor]
    """Objective label -> A_i (B,) from the group's rewards, by the trainer's advantage stage."""
    specs: dict[str, ObjectiveSpec]
    micro_rows: list[torch.Tensor]
    """Row indices of each micro-batch: ``optim.microbatch_groups`` (else ``minibatch_groups``) whole groups."""
    fused_head: str
    head_dtype: str
    rewards: list[float]


def check_labels(labels: list[str]) -> dict[str, ObjectiveSpec]:
    """Each objective label's spec; ValueError in one sentence naming a label the loss core does not know."""
    specs = {}
    for label in labels:
        try:
            specs[label] = objective_from_label(label)
        except (ValueError, KeyError) as err:
            raise ValueError(
                f"--objectives: {label!r} is not an objective label ({err}); write e.g. gspo or dfpo_min:stopgrad=score"
            ) from None
    return specs


def group_rows(group_ids: torch.Tensor, groups_per_micro: int) -> list[torch.Tensor]:
    """Row indices (each (b,)) of consecutive micro-batches of ``groups_per_micro`` whole groups; ``group_ids`` (B,)."""
    groups = torch.unique(group_ids)  # (n,) sorted
    return [torch.isin(group_ids, groups[s : s + groups_per_micro]).nonzero().flatten() for s in range(0, len(groups), groups_per_micro)]


def fixed_rollout(cfg, specs: dict[str, ObjectiveSpec]) -> FixedRollout:
    """The trainer built from ``cfg`` (float32, CPU, a temporary run folder) samples and scores the rollout batch of
    training step ``STEP``; each objective's advantages come from the trainer's advantage stage."""
    from dfpo.trainer.stages.advantages import advantages
    from dfpo.trainer.train import Trainer

    trainer = Trainer(cfg, quiet=True)
    try:
        rollout = trainer.rollout_stage.run(STEP, seed_per_group=trainer.state.seed_per_group)
        adv = {
            label: advantages(
                rollout,
                spec,
                mask_truncated=cfg.rollout.mask_truncated,
                format_weight=cfg.reward.format_weight,
                function_weights=trainer.rewards.function_weights,
            )
            for label, spec in specs.items()
        }  # label -> (B,)
    finally:
        trainer.close()
    per_micro = cfg.optim.microbatch_groups or cfg.optim.minibatch_groups
    return FixedRollout(
        trainer.model.eval(),
        rollout.batch,
        rollout.sampler_logp,
        adv,
        specs,
        group_rows(rollout.batch.group_ids, per_micro),
        cfg.optim.fused_head,
        cfg.optim.head_dtype,
        list(rollout.rewards.total),
    )


def old_logprobs(fixed: FixedRollout, amp: torch.dtype | None) -> torch.Tensor:
    """pi_old (B, T) of every row by the trainer's no-grad old-log-prob pass, under autocast ``amp`` (None: float32)."""
    from dfpo.trainer.stages.old_logp import batch_logp

    rows = max(len(r) for r in fixed.micro_rows)
    return batch_logp(fixed.model, fixed.batch, torch.device("cpu"), rows, amp, fixed.head_dtype)[0]


@dataclass
class Scored:
    """The update's forward and backward of the whole batch under one pipeline."""

    loss: float
    """The objective's loss of the whole batch (the micro-batches' losses with their accumulation weights)."""
    metrics: dict[str, float]
    """The loss core's metrics, combined over micro-batches as the trainer logs them."""
    logp: torch.Tensor
    """(B, T) pi_theta of the forward, detached, 0 at padding."""
    grads: list[torch.Tensor]
    """The full parameter gradient, one float32 tensor per trainable parameter."""


def scored(fixed: FixedRollout, label: str, old_logp: torch.Tensor, amp: torch.dtype | None) -> Scored:
    """The update's loss (``stages.update.micro_loss``, the loss core's objective ``label``) and its gradient for the
    whole batch against ``old_logp`` (B, T), pi_theta's forward under autocast ``amp``; ValueError on a non-finite loss."""
    from dfpo.trainer.minibatches import accumulation_weights, micro_batch
    from dfpo.trainer.stages.update import micro_loss

    model, batch, spec = fixed.model, fixed.batch, fixed.specs[label]
    params = [p for p in model.parameters() if p.requires_grad]
    model.zero_grad(set_to_none=True)
    weights = accumulation_weights([batch.mask[r] for r in fixed.micro_rows], spec.aggregation)
    logp = torch.zeros(batch.mask.shape)  # (B, T)
    loss, records = 0.0, []
    for rows, weight in zip(fixed.micro_rows, weights):
        mb = micro_batch(batch, rows, old_logp, None, fixed.advantages[label], weight, fixed.sampler_logp)
        part = micro_loss(
            model, mb, spec, torch.device("cpu"), amp, fused_head=fixed.fused_head, keep_hidden=False, head_dtype=fixed.head_dtype
        )
        if part is None or not part.finite or not bool(torch.isfinite(part.loss.detach())):
            raise ValueError(f"{label}: the loss under autocast {amp} is not finite; no figure can be read from it")
        (part.loss * weight).backward()
        loss += weight * float(part.loss.detach())
        records.append({k: float(v) for k, v in part.metrics.items()})
        logp[rows, : part.scores.logp.shape[1]] = part.scores.logp.float()
    grads = [torch.zeros_like(p) if p.grad is None else p.grad.detach().clone() for p in params]
    model.zero_grad(set_to_none=True)
    return Scored(loss, reduce_records(records, weights), logp, grads)


def objective_figures(fixed: FixedRollout, label: str, old: dict[str, torch.Tensor]) -> tuple[dict, dict, dict[str, torch.Tensor]]:
    """For one objective: (loss per pipeline against float32, gradient agreement per pipeline with float32, pi_theta
    (B, T) per pipeline). ``old``: pi_old per precision ("float32", "bf16"). One float32 gradient is kept at a time."""
    reference = scored(fixed, label, old["float32"], None)
    scale = float(fixed.advantages[label].abs().mean())
    loss = {"float32": {**loss_error(reference.loss, reference.loss, scale), "clip": clip_metrics(reference.metrics)}}
    grad = {"float32": grad_agreement(reference.grads, reference.grads)}
    new = {"float32": reference.logp}
    for name, (old_amp, new_amp) in PIPELINES.items():
        if name == "float32":
            continue
        run = scored(fixed, label, old["bf16" if old_amp is not None else "float32"], new_amp)
        loss[name] = {**loss_error(run.loss, reference.loss, scale), "clip": clip_metrics(run.metrics)}
        grad[name] = grad_agreement(run.grads, reference.grads)
        new[name] = run.logp
        del run
    return loss, grad, new


def clip_metrics(metrics: dict[str, float]) -> dict[str, float]:
    """The loss core's clip fractions (``clip/*``) of a scored pipeline."""
    return {k: v for k, v in metrics.items() if k.startswith("clip/")}


def ratio_figures(fixed: FixedRollout, new: dict[str, torch.Tensor], old: dict[str, torch.Tensor], spec: ObjectiveSpec) -> dict:
    """``ratio_stats`` of every pipeline (pi_theta ``new`` against its pi_old) and of the sampler's rows."""
    band = {"eps_low": spec.eps_low, "eps_high": spec.eps_high}
    mask = fixed.batch.mask  # (B, T)
    out = {}
    for name, (old_amp, _) in PIPELINES.items():
        out[name] = ratio_stats(new[name], old["bf16" if old_amp is not None else "float32"], mask, **band)
    for name, new_amp in SAMPLER_PIPELINES.items():
        out[name] = ratio_stats(new["float32" if new_amp is None else "bf16"], fixed.sampler_logp, mask, **band)
    return out


def measure(cfg, labels: list[str]) -> dict:
    """Every figure of the module docstring for the rollout batch of ``cfg`` (no file written)."""
    specs = check_labels(labels)
    fixed = fixed_rollout(cfg, specs)
    old = {"float32": old_logprobs(fixed, None), "bf16": old_logprobs(fixed, torch.bfloat16)}
    losses, grads, ratios = {}, {}, None
    for label in labels:
        losses[label], grads[label], new = objective_figures(fixed, label, old)
        if ratios is None:  # pi_theta is the same forward for every objective: read off the first
            ratios = ratio_figures(fixed, new, old, specs[label])
    mask = fixed.batch.mask
    return {
        "work": {
            "prompts": int(fixed.batch.group_ids.unique().numel()),
            "group_size": cfg.rollout.group_size,
            "max_new_tokens": cfg.rollout.max_new_tokens,
            "completion_tokens": int(mask.sum()),
            "mean_completion_tokens": float(mask.sum(-1).float().mean()),
            "mean_reward": sum(fixed.rewards) / max(1, len(fixed.rewards)),
            "micro_batches": len(fixed.micro_rows),
            "fused_head": fixed.fused_head,
            "head_dtype": fixed.head_dtype,
            "clip_band": {label: [1 - s.eps_low, 1 + s.eps_high] for label, s in specs.items()},
        },
        "ratio": ratios,
        "loss": losses,
        "gradient": grads,
    }


# ------------------------------------------------------------------------------------------------------ the report


def report_lines(result: dict) -> list[str]:
    """The small table printed after a run: ratios, then loss and gradient per objective and pipeline."""

    def num(x, fmt=".3g"):
        return "-" if x is None else format(x, fmt)

    lines = [f"{'pipeline':<16} {'tok max|r-1|':>12} {'tok exact=1':>11} {'seq max|s-1|':>12} {'seq outside band':>16}"]
    for name, r in result["ratio"].items():
        outside = f"{r['seq_outside_band']}/{r['sequences']}"
        lines.append(
            f"{name:<16} {num(r['token_max_abs_dev']):>12} {num(r['token_exactly_1_share'], '.2f'):>11} "
            f"{num(r['seq_max_abs_dev']):>12} {outside:>16}"
        )
    lines.append("")
    lines.append(
        f"{'objective':<24} {'pipeline':<8} {'loss':>11} {'|dL|':>9} {'|dL|/|L32|':>10} {'|dL|/mean|A|':>12} {'clipped':>7} "
        f"{'grad cosine':>11} {'|g| rel err':>11} {'|g-g32|/|g32|':>13}"
    )
    for label, per in result["loss"].items():
        for name, loss in per.items():
            g = result["gradient"][label][name]
            clip = loss["clip"]
            clipped = clip["clip/frac_low"] + clip["clip/frac_high"] if {"clip/frac_low", "clip/frac_high"} <= set(clip) else None
            lines.append(
                f"{label:<24} {name:<8} {num(loss['value'], '.4g'):>11} {num(loss['abs_error'], '.2g'):>9} {num(loss['rel_error'], '.2g'):>10} "
                f"{num(loss['error_per_mean_abs_adv'], '.2g'):>12} {num(clipped, '.2f'):>7} {num(g['cosine'], '.6f'):>11} "
                f"{num(g['norm_rel_error']):>11} {num(g['diff_rel_error']):>13}"
            )
    return lines


def provenance(config: str, sets: list[str], cpuinfo: str) -> dict:
    """Where the figures were measured: CPU model and bf16 flags, torch, threads, date, config and --set lines."""
    return {
        "issue": 59,
        "date": datetime.date.today().isoformat(),
        "cpu": cpu_model(cpuinfo) or platform.processor(),
        "cpu_bf16_flags": bf16_flags(cpuinfo),
        "torch": torch.__version__,
        "cpu_capability": torch.backends.cpu.get_cpu_capability(),
        "threads": torch.get_num_threads(),
        "config": config,
        "sets": sets,
    }


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--config", default=str(DEFAULT_CONFIG), help="trainer config whose rollout batch is measured ('' = the defaults)")
    p.add_argument("--set", action="append", default=None, metavar="KEY=VALUE", help=f"config override (default: {' '.join(DEFAULT_SETS)})")
    p.add_argument("--objectives", default=",".join(OBJECTIVE_LABELS), help="comma-separated objective labels")
    p.add_argument("--out", default=str(DEFAULT_OUT), help="JSON file to write ('' = none)")
    p.add_argument("--threads", type=int, default=1)
    return p.parse_args(argv)


def relative(path: str) -> str:
    """``path`` relative to the repository when inside it (what the JSON records)."""
    try:
        return str(Path(path).resolve().relative_to(ROOT))
    except ValueError:
        return path


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    from dfpo.trainer.config import load_config

    try:
        if args.threads < 1:
            raise ValueError(f"--threads {args.threads}: give 1 or more")
        labels = [s.strip() for s in args.objectives.split(",") if s.strip()]
        if not labels:
            raise ValueError("--objectives is empty; give e.g. gspo,dfpo_min:stopgrad=score")
        check_labels(labels)
        out = Path(args.out) if args.out else None
        if out is not None and out.is_dir():
            raise ValueError(f"--out {args.out} is a folder; give a .json file")
        sets = list(DEFAULT_SETS if args.set is None else args.set)
        with tempfile.TemporaryDirectory(prefix="bf16-precision-") as tmp:
            cfg = load_config(args.config or None, [*sets, *FIXED_SETS, f"run_dir={Path(tmp) / 'run'}", f"threads={args.threads}"])
            torch.set_num_threads(args.threads)
            cpuinfo = read_cpuinfo()
            if not bf16_flags(cpuinfo):
                print("bf16_precision: note: this CPU has no bf16 flag in /proc/cpuinfo; autocast emulates bf16", file=sys.stderr)
            t0 = time.time()
            result = {**provenance(relative(args.config) if args.config else "", sets, cpuinfo), **measure(cfg, labels)}
    except ValueError as err:
        print(f"bf16_precision: {err}", file=sys.stderr)
        return 2
    print("\n".join(report_lines(result)))
    print(f"({time.time() - t0:.0f} s, {result['threads']} thread(s))")
    if out is not None:
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(json.dumps(result, indent=2) + "\n")
        print(f"written {relative(str(out))}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
