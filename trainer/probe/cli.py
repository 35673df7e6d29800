"""`dfpo probe`: parameter-space drift of several objectives on one batch from one starting point (imports stay
light here; the work is ``dfpo.trainer.probe.command``, which imports torch and transformers when it runs).

dfpo probe [--objectives gspo,dfpo_min,gspo_noclip,dfpo_min:stopgrad=score] [--seeds N] [--first-seed 0]
           [--config FILE] [--set KEY=VALUE ...] | [--run RUN_DIR]   [--out runs/probe]
"""

from __future__ import annotations

import argparse
import shlex

from . import DEFAULT_OBJECTIVES


class OwnUsageParser(argparse.ArgumentParser):
    """A command's parser that refuses an argument it does not know itself, in one sentence under its own usage.

    argparse hands a sub-command's unknown arguments up to the top parser, which refuses them under ``dfpo``'s usage
    ("unrecognized arguments"), saying neither which command they were given to nor what it takes."""

    def parse_known_args(self, args=None, namespace=None):
        namespace, extras = super().parse_known_args(args, namespace)
        if extras:
            what = "is not an option" if len(extras) == 1 else "are not options"
            self.error(f"{', '.join(extras)} {what} of {self.prog}; {self.prog} --help lists its options")
        return namespace, extras


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
    from ...core.drift_tables import MIN_SEEDS
    from .command import make_plan, probe_command  # deferred: torch (see the module docstring)

    if args.seeds is None:  # as many as the tables need: fewer draw a too-few-seeds warning (render_markdown)
        args.seeds = MIN_SEEDS
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
        help="how one optimiser step moves shared tokens and equivalent answers, split into its causes, per objective "
        "(one batch, one starting point); writes a table and a PNG",
        description="Builds a small policy (by default the 'tiny' model: a character-level transformer warmed up on "
        "single-digit additions such as '3+4=' and trained here in memory, nothing downloaded), samples one batch of "
        "answers from it, and lets each objective take one real optimiser step from that same point on that same batch. "
        "dfpo.core.probe then splits how the step moves each shared (context, token) event (every answer of a group "
        "has the same token after the same prefix) and each pair of equivalent correct answers into four parts that "
        "add up to the first-order prediction: direct (the event's own loss coefficients), cross (the rest of this "
        "batch's gradient, through shared parameters), momentum (the optimiser's state from the --move-steps before) "
        "and decay (weight decay), beside the measured change; shares are of the first-order prediction, and a "
        "first-order error above half the measured change is flagged. Writes OUT/probe.json, OUT/probe.md and "
        "OUT/probe.png (docs/probe.md).",
    )
    p.__class__ = OwnUsageParser  # an unknown argument is refused under dfpo probe's usage, not dfpo's
    p.add_argument("--objectives", default=DEFAULT_OBJECTIVES, help=f"comma-separated objective labels (default {DEFAULT_OBJECTIVES})")
    p.add_argument(
        "--seeds",
        type=int,
        default=None,
        help="how many seeds; each gives its own policy and batch, and the tables average over them (default: the fewest "
        "whose tables draw no too-few-seeds warning, dfpo.core.drift_tables.MIN_SEEDS; the command line probe.md records "
        "names the number)",
    )
    p.add_argument(
        "--first-seed", type=int, default=0, help="first seed (default 0); a set that confirms a finding must not overlap the first"
    )
    p.add_argument(
        "--config",
        default=None,
        help="TOML config of the policy and its batch (default: the 'tiny' model warmed up on the addition task, 16 "
        "prompts of 8 answers; its groups share tokens but it has only one correct answer form, so for equivalent "
        "answers add --set data.task=equiv --set model.sft_steps=300)",
    )
    p.add_argument("--set", action="append", metavar="KEY=VALUE", help="config override (repeatable)")
    p.add_argument(
        "--run", default=None, metavar="RUN_DIR", help="probe the checkpoint of a dfpo train run folder (nothing in it is written)"
    )
    p.add_argument(
        "--move-steps",
        type=int,
        default=2,
        help="optimiser steps of the first objective on the batch before the probed step, so the policy is off-policy (ratios "
        "off 1) and AdamW carries momentum into the probed step, as on a rollout batch's later steps (default 2)",
    )
    p.add_argument(
        "--max-events", type=int, default=32, help="at most this many shared events, and as many pairs, per objective and seed (default 32)"
    )
    p.add_argument("--out", default="runs/probe", help="output folder (default runs/probe)")
    p.add_argument("--quiet", action="store_true", help="no progress lines")
    p.set_defaults(func=_cmd_probe)
