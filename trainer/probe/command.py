"""``dfpo probe``: parameter-space drift of several objectives on the same batch from the same starting point.

    dfpo probe --objectives gspo,dfpo_min,gspo_noclip,dfpo_min:stopgrad=score --out runs/probe
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

Choices made here, where the paper says nothing (each what a TRL / verl user would expect):
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
   policy is the checkpoint's and a seed sets the batch only. A config with a supervised warm-up (warmup.steps > 0,
   ``dfpo.trainer.warmup``) starts from the trainer's cached warm-up (built when missing), as its runs do.
4. The reference pi_ref (a KL term ``beta > 0``, online IPO's log-ratio, anything that reads ``ref_logp``) is the
   trainer's: the model a run starts from, frozen, scored by the trainer's own reference pass
   (``OldLogpStage.reference_logp``) on the probe's batch once per seed, before any step. Without ``--run`` that is
   the policy the probe starts from (the warm-started tiny preset, the warm-up, or the pretrained model), so pi_ref = pi_old at
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
import sys
from pathlib import Path

import torch

from ...core.files import write_run_file
from . import DEFAULT_OBJECTIVES
from .figure import plot
from .plan import ProbePlan, make_plan, matched_controls
from .report import events_sentence, render_markdown
from .seeds import run_probe

FILES = ("probe.json", "probe.md", "probe.png")


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
    "events_sentence",
    "make_plan",
    "matched_controls",
    "probe_command",
    "render_markdown",
    "run_probe",
    "write_outputs",
]
