"""`dfpo train`: group-relative RL fine-tuning of a transformers model (imports stay light here).

dfpo train --config configs/tiny-cpu.toml [--set key=value ...]
dfpo train --resume RUN_DIR [--set train.steps=N]
dfpo train --nproc N ...   (= torchrun --standalone --nproc_per_node N -m dfpo train ...)
"""

from __future__ import annotations

import argparse

# Keys that may change when resuming without breaking exact continuation.
RESUME_SETTABLE = ("train.steps", "train.save_every", "log.progress", "log.samples_every", "eval.every", "train.parallel")


def _cmd_train(args: argparse.Namespace) -> int:
    import sys
    from pathlib import Path

    from dfpo.trainer.llm.config import apply_overrides, config_from_dict, load_config

    sets = list(args.set or [])
    if args.resume:
        run_dir = Path(args.resume)
        cfg_path = run_dir / "config.toml"
        if not cfg_path.is_file():
            raise ValueError(f"--resume {args.resume}: no config.toml in it; is it a dfpo run folder?")
        if args.config:
            raise ValueError("--resume reads RUN_DIR/config.toml; drop --config (use --set train.steps=N to extend)")
        bad = [s for s in sets if s.split("=", 1)[0].strip() not in RESUME_SETTABLE]
        if bad:
            raise ValueError(
                f"--set {bad[0]!r} is not allowed with --resume (it would break exact continuation); allowed: {', '.join(RESUME_SETTABLE)}"
            )
        import tomllib

        from dfpo.files import read_utf8

        raw = apply_overrides(tomllib.loads(read_utf8(cfg_path)), sets)
        raw["run_dir"] = str(run_dir)
        cfg = config_from_dict(raw)
    else:
        if not args.config:
            raise ValueError("--config FILE.toml is required (or --resume RUN_DIR); see configs/tiny-cpu.toml")
        cfg = load_config(args.config, sets)

    from dfpo.trainer.llm import distributed as dp

    if args.nproc is not None and dp.launched_world_size() == 1:
        dp.check_world_size(cfg, args.nproc)  # before launching anything
        if args.nproc > 1:
            _relaunch(args)  # does not return

    from dfpo.trainer.llm.runlog import TrainingInterrupted
    from dfpo.trainer.llm.train import NonFiniteLossError, Trainer

    try:
        trainer = Trainer(cfg, resume=bool(args.resume), quiet=args.quiet)
        rank = trainer.rank
        try:
            summary = trainer.run()
            dp.barrier()  # every process done before any leaves the group
        except NonFiniteLossError as err:
            if rank == 0:
                print(f"dfpo: error: {err}", file=sys.stderr)
            return 1
        except TrainingInterrupted as stop:
            if rank == 0:
                print(f"dfpo: {stop}", file=sys.stderr)
            return stop.exit_code
    finally:
        dp.shutdown()
    import json

    if rank == 0:
        print(json.dumps(summary, indent=2, sort_keys=True))
    return 0


def relaunch_command(args: argparse.Namespace) -> list[str]:
    """torchrun (torch.distributed.run) starting ``args.nproc`` copies of this ``dfpo train`` without --nproc."""
    import sys

    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc_per_node={args.nproc}", "-m", "dfpo", "train"]
    if args.config:
        cmd += ["--config", args.config]
    if args.resume:
        cmd += ["--resume", args.resume]
    for s in args.set or []:
        cmd += ["--set", s]
    if args.quiet:
        cmd.append("--quiet")
    return cmd


def _relaunch(args: argparse.Namespace) -> None:
    """Replace this process by torchrun (signals reach it directly; its exit status is the run's)."""
    import os
    import sys

    cmd = relaunch_command(args)
    sys.stdout.flush()
    sys.stderr.flush()
    os.execv(cmd[0], cmd)


def _cmd_compare(args: argparse.Namespace) -> int:
    from dfpo.trainer.llm.compare import compare, make_plan

    plan = make_plan(args.objectives, args.baseline, args.seeds, args.first_seed, args.config, args.set, args.out)
    print(compare(plan, jobs=args.jobs).read_text())
    return 0


def register(subparsers) -> None:
    p = subparsers.add_parser(
        "train",
        help="RL fine-tuning of a transformers model with any objective (offline tiny preset by default)",
        description="Group-relative RL fine-tuning with every objective of dfpo.OBJECTIVES. "
        "Writes a run folder (config.toml, metrics.jsonl, eval.jsonl, samples.jsonl, tb/, checkpoint.pt).",
    )
    p.add_argument("--config", default=None, help="TOML config file (see configs/)")
    p.add_argument("--set", action="append", metavar="KEY=VALUE", help="override a config key, e.g. --set optim.lr=1e-4 (repeatable)")
    p.add_argument("--resume", default=None, metavar="RUN_DIR", help="continue a run from its last checkpoint, exactly")
    p.add_argument("--quiet", action="store_true", help="no progress bar or status lines")
    p.add_argument(
        "--nproc",
        type=int,
        default=None,
        metavar="N",
        help="train on N processes (data parallel, train.parallel): relaunches itself with torchrun --nproc_per_node N",
    )
    p.set_defaults(func=_cmd_train)

    p = subparsers.add_parser(
        "compare",
        help="objectives on the LLM trainer over paired seeds: paired differences with bootstrap CIs and a matched-control check",
    )
    p.add_argument(
        "--objectives",
        default="gspo,dfpo_min",
        help="comma-separated labels, e.g. gspo,dfpo_min,dfpo_min:stopgrad=score (default gspo,dfpo_min)",
    )
    p.add_argument("--baseline", default=None, help="label every other one is compared with (default: the first)")
    p.add_argument("--seeds", type=int, default=10, help="paired seeds (default 10)")
    p.add_argument("--first-seed", type=int, default=0, help="first seed (default 0)")
    p.add_argument("--config", default="configs/tiny-cpu.toml", help="base config of every run (default configs/tiny-cpu.toml)")
    p.add_argument("--set", action="append", metavar="KEY=VALUE", help="config override for every run (repeatable)")
    p.add_argument("--jobs", type=int, default=1, help="runs trained at once (default 1)")
    p.add_argument("--out", default="runs/compare", help="output folder (default runs/compare)")
    p.set_defaults(func=_cmd_compare)
