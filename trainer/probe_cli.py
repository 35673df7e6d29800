"""`dfpo probe`: parameter-space drift of several objectives on one batch from one starting point (imports stay
light here; the work is ``dfpo.trainer.probe_command``, which imports torch and transformers when it runs).

dfpo probe [--objectives gspo,dfpo_min,gspo_noclip,dfpo_min:stopgrad=score] [--seeds 4] [--first-seed 0]
           [--config FILE] [--set KEY=VALUE ...] | [--run RUN_DIR]   [--out runs/probe]
"""

from __future__ import annotations

import argparse
import shlex

DEFAULT_OBJECTIVES = "gspo,dfpo_min,gspo_noclip,dfpo_min:stopgrad=score"
"""The README's matched pairs: GSPO and DFPO Min-Replace at GSPO's clip range, unclipped GSPO and score-form DFPO."""


def command_line(args: argparse.Namespace) -> str:
    """The command as it ran, every setting spelled out (probe.md and probe.json record it)."""
    words = ["dfpo", "probe", "--objectives", args.objectives, "--seeds", str(args.seeds), "--first-seed", str(args.first_seed)]
    words += ["--config", args.config] if args.config else []
    for item in args.set or []:
        words += ["--set", item]
    words += ["--run", args.run] if args.run else []
    words += ["--move-steps", str(args.move_steps), "--max-events", str(args.max_events), "--out", args.out]
    return shlex.join(words)


def _cmd_probe(args: argparse.Namespace) -> int:
    from .probe_command import make_plan, probe_command  # deferred: torch (see the module docstring)

    plan = make_plan(
        objectives=args.objectives,
        seeds=args.seeds,
        first_seed=args.first_seed,
        config=args.config,
        sets=list(args.set or []),
        run=args.run,
        move_steps=args.move_steps,
        max_events=args.max_events,
        out=args.out,
        command=command_line(args),
    )
    print(probe_command(plan, quiet=args.quiet), end="")
    return 0


def register(subparsers) -> None:
    p = subparsers.add_parser(
        "probe",
        help="parameter-space drift of shared tokens and equivalent answers: direct vs cross vs measured, per objective, on one "
        "batch from one starting point (common random numbers); table and PNG",
        description="Each objective takes one real optimiser step from the same point on the same batch; dfpo.core.probe splits "
        "how it moves each shared (context, token) event and each pair of equivalent answers into the part its own coefficients "
        "cause (direct) and the part the rest of the batch causes through shared parameters (cross), beside the measured change. "
        "Writes OUT/probe.json, OUT/probe.md and OUT/probe.png.",
    )
    p.add_argument("--objectives", default=DEFAULT_OBJECTIVES, help=f"comma-separated objective labels (default {DEFAULT_OBJECTIVES})")
    p.add_argument("--seeds", type=int, default=4, help="seeds, each a policy (tiny preset) and a batch (default 4)")
    p.add_argument(
        "--first-seed", type=int, default=0, help="first seed (default 0); a set that confirms a finding must not overlap the first"
    )
    p.add_argument(
        "--config",
        default=None,
        help="TOML config of the policy and its batch (default: the tiny preset, add task; --set data.task=equiv --set model.sft_steps=300 for equivalent answers)",
    )
    p.add_argument("--set", action="append", metavar="KEY=VALUE", help="config override (repeatable)")
    p.add_argument(
        "--run", default=None, metavar="RUN_DIR", help="probe the checkpoint of a dfpo train run folder (nothing in it is written)"
    )
    p.add_argument(
        "--move-steps",
        type=int,
        default=2,
        help="optimiser steps of the first objective on the batch before the probed step, so the ratios are off 1 (default 2)",
    )
    p.add_argument(
        "--max-events", type=int, default=32, help="at most this many shared events, and as many pairs, per objective and seed (default 32)"
    )
    p.add_argument("--out", default="runs/probe", help="output folder (default runs/probe)")
    p.add_argument("--quiet", action="store_true", help="no progress lines")
    p.set_defaults(func=_cmd_probe)
