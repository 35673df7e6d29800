"""``dfpo toy``: the tabular softmax lab from the command line.

    dfpo toy run --task tenplusten --objectives gspo,dfpo_min,grpo_fix --seeds 4 --steps 100 --out runs/toy-demo
    dfpo toy run --objectives gspo,dfpo_min:stopgrad=score,gspo:clip=none --out runs/toy-labels
    dfpo toy ablate --task tenplusten --seeds 8 --out runs/toy-ablate
    dfpo toy ablate --task tenplusten --seeds 32 --seed 1 --discovery runs/toy-ablate --out runs/toy-ablate-seed1
    dfpo toy run --objectives gspo_noclip,dfpo_min:stopgrad=score:length_aware=true --match-step steps --out runs/toy-la
    dfpo toy spread --knob inner_steps --values 1,2,4,8,16 --seeds 16 --out runs/toy-spread
    dfpo toy sweep-g --task tenplusten --gs 2,4,8,16 --out runs/toy-sweep-g

An objective label is a preset with optional overrides of its own, after colons
(``dfpo_min:stopgrad=score:eps_low=0.2``); ``--override`` applies to every objective.

A label may carry its own learning rate after ``@`` (``gspo_noclip@lr=0.44``). ``--match-step steps|update``
adds, for every DFPO label with a trust-region-matched control, that control at the learning rate where its
effective step (steps to kappa, or the update norm) equals the method's, calibrated on a disjoint seed set
(``--calibration-seed``, default 1000 + ``--seed``; ``dfpo.toy.calibrate``); the tables then show both controls.

``--seed`` picks the seed set: the S runs of a command draw their initial noise and their samples
from one generator seeded with it, so commands with different ``--seed`` share no run. A
statement found on one seed set is checked on another with ``--discovery DIR`` (the first run's
folder): the tables then show both sets' verdicts.

Module-level imports stay light (argparse only); torch and the lab load inside the handlers.
"""

from __future__ import annotations

import argparse
import dataclasses

from ..core.files import check_output_dir
from ..core.settings import parse_value, setting_of, type_hints, type_name
from . import layout
from .config import ADAM_LR, ToyConfig
from .config import DEFAULT_OBJECTIVES as _DEFAULT_OBJECTIVES

DEFAULT_OBJECTIVES = ",".join(_DEFAULT_OBJECTIVES)

# The standard ablation: DFPO in both stop-gradient forms, each next to its matched GSPO control.
ABLATION = (
    "gspo",  # GSPO's clip range 3e-4 / 4e-4 ...
    "dfpo_min",  # ... and ratio-form DFPO at that range (matched with gspo)
    "gspo_noclip",  # no trust region ...
    "dfpo_min:stopgrad=score",  # ... and score-form DFPO, whose clipped sequences keep a gradient (matched with gspo_noclip)
    "dfpo_min:clip=none",  # ratio form without clipping (matched with gspo_noclip)
    "gspo:eps_low=0.2:eps_high=0.2",  # a clip range few sequences reach ...
    "dfpo_min:eps_low=0.2:eps_high=0.2",  # ... and DFPO at the same range
)
SPREAD_PAIR = ("gspo:eps_low=0.2:eps_high=0.2", "dfpo_min:eps_low=0.2:eps_high=0.2")

DESCRIPTIONS = {
    "toy": "The tabular softmax lab: a policy that is one softmax per context row, on token-level tasks small enough to "
    "enumerate (tenplusten, the paper's App. A example, and the parametric family), so the expected reward, the learning "
    "tax at the template rows every correct answer shares (Prop. 3.1), the drift between equivalent correct answers "
    "(Cor. 3.2) and the entropy are measured exactly. Every objective goes through the loss core the LLM trainer uses "
    "(dfpo.policy_loss). 'dfpo toy TOY_COMMAND --help' lists a command's options.",
    "run": "Trains every objective label (a preset, or a preset with components changed: dfpo_min:stopgrad=score; "
    "@lr=VALUE sets its own learning rate) on a toy task, --seeds runs each, all drawn from one generator seeded with "
    "--seed, and writes the run folder --out: config.json, metrics.jsonl (one line per objective, seed and step), "
    "metrics_mean.csv, summary.md (the tables and the paper's checks, also printed) and the PNG curves. --match-step adds "
    "each DFPO label's step-size-matched control; --discovery shows another seed set's verdicts beside these.",
    "ablate": "The standard ablation: 'dfpo toy run' with its objectives fixed to DFPO in both stop-gradient forms, each "
    "beside the GSPO control that shares its trust region: " + ", ".join(ABLATION) + ". Same options and run folder as "
    "'dfpo toy run', without --objectives.",
    "spread": "Does DFPO's in-group transform matter once the trust region is matched? Trains --baseline and --method "
    "(a matched pair: no trust-region component apart, dfpo.core.loss.unmatched_components; refused otherwise) at each "
    "of --values of one setting (--knob) that widens the spread of the sequence ratios within a group, and reports the "
    "paired difference (method - baseline) of steps to kappa (eq 19), final reward, learning tax and equivalent-set "
    "entropy against the measured spread (ratio/spread). Writes config.json, spread.json, summary.md and spread.png to --out.",
    "sweep-g": "The toy's analogue of the paper's Table 4, where DFPO's gain over GSPO grows with the group size G: trains "
    "--baseline and --method on paired seeds at each group size of --gs and reports the method's gain in final and mean "
    "expected reward, steps to kappa and learning tax, each interval Bonferroni-adjusted over the table. Writes "
    "summary.md, gains.json, one folder of metrics per G (G2/, G4/, ...) and gain_vs_G.png to --out.",
}
"""What ``--help`` says of ``dfpo toy`` and of each of its commands."""


def _pairs(items: list[str] | None, flag: str, parse=None) -> dict[str, object]:
    """KEY=VALUE pairs (several per flag, comma separated, or the flag repeated); each value parsed by
    ``parse(key, text)``, by default untyped (``dfpo.core.settings.parse_value``: bool, int, float or text)."""

    parse = parse or parse_value
    out: dict[str, object] = {}
    for item in items or []:
        for pair in filter(None, item.split(",")):
            if "=" not in pair:
                raise ValueError(f"{flag} takes KEY=VALUE pairs, got {flag} {pair!r}")
            key, value = pair.split("=", 1)
            key = key.strip().replace("-", "_")
            out[key] = parse(key, value)
    return out


def _numbers(text: str, flag: str, cast=int) -> list:
    """'2,4,8' -> [2, 4, 8] (or floats with cast=float); ValueError naming the flag."""
    try:
        return [cast(x) for x in text.split(",") if x.strip()]
    except ValueError:
        kind = "integers" if cast is int else "numbers"
        raise ValueError(f"{flag} takes comma-separated {kind}, got {flag} {text!r}") from None


def _typed(key: str, type_: object):
    """An argparse ``type=`` that parses with ``dfpo.core.settings.parse_value``, named after the declared
    type so that argparse's own error reads as before ('argument --seeds: invalid int value: 'x'')."""

    def parse(text: str) -> object:
        return parse_value(key, text, type_)

    parse.__name__ = type_name(type_)
    return parse


def _add_common(p: argparse.ArgumentParser, *, group_size: bool = True) -> None:
    """The ToyConfig options (defaults and help from its fields), then the run-folder options."""

    hints = type_hints(ToyConfig)
    for f in dataclasses.fields(ToyConfig):
        meta, doc = f.metadata, setting_of(f).doc
        if not meta.get("cli", True) or (f.name == "group_size" and not group_size):  # sweep-g sets G itself
            continue
        flags = [f"--{meta.get('flag', f.name.replace('_', '-'))}"] + ([f"-{meta['short']}"] if meta.get("short") else [])
        if meta.get("pairs"):
            p.add_argument(*flags, dest=f.name, action="append", metavar="KEY=VALUE", help=doc)
        elif f.name == "lr":  # the default follows the optimiser
            p.add_argument(*flags, dest=f.name, type=_typed(f.name, float), default=None, help=f"{doc} (default {f.default} for sgd)")
        else:
            p.add_argument(*flags, dest=f.name, type=_typed(f.name, hints[f.name]), default=f.default, help=f"{doc} (default {f.default})")
    p.add_argument("--out", default=None, help="run folder to write (default runs/toy-TASK-MODE, or runs/toy-sweep-g-TASK-MODE)")
    p.add_argument("--no-plots", action="store_true", help="skip the PNG plots")
    p.add_argument("--force", action="store_true", help="overwrite an earlier run in --out (refused otherwise)")


def _add_match_step(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--match-step",
        default="none",
        choices=("none", "steps", "update"),
        help="add a step-size-matched control for every DFPO label with a matched control: that control at the learning rate "
        "where its steps to kappa (steps) or its update norm (update) equal the method's, calibrated on a disjoint seed set "
        "(with --discovery: the discovery run's controls)",
    )
    p.add_argument(
        "--calibration-seed", type=int, default=None, help="seed set the calibration trains on (default 1000 + --seed); not --seed"
    )
    p.add_argument(
        "--calibration-seeds", type=_typed("calibration_seeds", int), default=16, help="seeds of the calibration set (default 16)"
    )


def _add_discovery(p: argparse.ArgumentParser, files: str) -> None:
    p.add_argument(
        "--discovery",
        default=None,
        metavar="DIR",
        help=f"run folder ({files}) of the same command on another --seed: its verdicts are shown beside this run's, "
        "with whether they replicate",
    )


def _config(args: argparse.Namespace, objectives: tuple[str, ...], group_size: int):
    """The ToyConfig of parsed options: every command-line field by name, the pairs parsed, G and lr resolved."""
    from ..core.loss.objectives import parse_override

    values = {f.name: getattr(args, f.name) for f in dataclasses.fields(ToyConfig) if f.metadata.get("cli", True) and hasattr(args, f.name)}
    values["task_options"] = _pairs(args.task_options, "--task-opt")
    values["overrides"] = _pairs(args.overrides, "--override", parse_override)  # each in its component's type, as in a label
    values["group_size"] = group_size
    if values["lr"] is None:
        values["lr"] = ADAM_LR if args.optimizer == "adam" else ToyConfig.lr
    return ToyConfig(objectives=objectives, **values)


def _objectives(text: str) -> tuple[str, ...]:
    names = tuple(x.strip() for x in text.split(",") if x.strip())
    if not names:
        raise ValueError(f"--objectives must name at least one objective, got --objectives {text!r}")
    return names


def _cmd_run(args: argparse.Namespace) -> int:
    config = _config(args, _objectives(args.objectives), args.group_size)
    args.out = args.out or f"runs/toy-{args.task}-{args.mode}"
    import time

    import torch

    from .report import write_run
    from .train import run, validate

    validate(config)  # every bad option fails here, before any compute
    from .report import read_discovery

    check_output_dir("--out", args.out, force=args.force, marker=layout.CONFIG)
    torch.set_num_threads(toy_threads(config.mode))
    config, calibrations = _step_matched(args, config)
    discovery = read_discovery(args.discovery, config) if args.discovery else None
    start = time.perf_counter()
    task, results = run(
        config, progress=lambda name: print(f"toy: training {name} ({config.seeds} seeds x {config.steps} steps)", flush=True)
    )
    elapsed = time.perf_counter() - start
    summary = write_run(
        args.out,
        config,
        task,
        results,
        plots=not args.no_plots,
        findings=[*(c.sentence() for c in calibrations), f"- Wall time of the training: {elapsed:.1f} s."],
        discovery=discovery,
        extra={"wall_time_s": round(elapsed, 1), "calibrations": [dataclasses.asdict(c) for c in calibrations]},
    )
    print(summary.read_text())
    print(f"toy: wrote {args.out} in {elapsed:.1f} s")
    return 0


def _step_matched(args: argparse.Namespace, config):
    """``config`` with its step-size-matched controls (``--match-step``) and their calibrations: calibrated here on
    the calibration seed set, or, with ``--discovery``, taken from the discovery run (the same controls on both sets)."""
    import dataclasses

    from .calibrate import Calibration, step_matched_controls
    from .folder import read_config

    if args.match_step == "none":
        return config, []
    if args.calibration_seeds < 2:
        raise ValueError(f"--calibration-seeds must be >= 2, got --calibration-seeds {args.calibration_seeds}")
    if args.discovery:
        earlier, raw = read_config(args.discovery)
        if earlier.match_step != args.match_step:
            raise ValueError(
                f"--discovery {args.discovery!r} calibrated its controls on {earlier.match_step!r}, not --match-step {args.match_step}"
            )
        base = [o for o in earlier.objectives if o not in earlier.step_matched]
        if tuple(base) != config.objectives:
            raise ValueError(f"--discovery {args.discovery!r} ran the objectives {base}, not {list(config.objectives)}")
        print(f"toy: step-size-matched controls from {args.discovery}: {', '.join(earlier.step_matched)}", flush=True)
        cals = [Calibration.from_dict(c) for c in raw.get("calibrations", [])]
        return dataclasses.replace(
            config, objectives=earlier.objectives, match_step=earlier.match_step, step_matched=earlier.step_matched
        ), cals
    seed = args.calibration_seed if args.calibration_seed is not None else 1000 + config.seed
    return step_matched_controls(config, args.match_step, seed=seed, seeds=args.calibration_seeds, progress=lambda t: print(t, flush=True))


def _cmd_ablate(args: argparse.Namespace) -> int:
    args.objectives = ",".join(ABLATION)
    args.out = args.out or f"runs/toy-ablate-{args.task}-{args.mode}"
    return _cmd_run(args)


def _cmd_spread(args: argparse.Namespace) -> int:
    values = _numbers(args.values, "--values", float)
    if not values:
        raise ValueError(f"--values must list at least one value, got --values {args.values!r}")
    config = _config(args, (args.baseline, args.method), args.group_size)
    args.out = args.out or f"runs/toy-spread-{args.task}-{args.knob}"
    import dataclasses

    import torch

    from .spread import KNOBS, spread_sweep
    from .train import validate

    if args.knob not in KNOBS:
        raise ValueError(f"--knob must be one of {KNOBS}, got --knob {args.knob!r}")
    for v in values:  # every configuration of the sweep is checked before any compute
        validate(dataclasses.replace(config, **{args.knob: type(getattr(config, args.knob))(v)}))
    from .spread import read_spread_discovery

    discovery = read_spread_discovery(args.discovery, config, args.knob, values, args.baseline, args.method) if args.discovery else None

    check_output_dir("--out", args.out, force=args.force, marker="spread.json")
    torch.set_num_threads(toy_threads(args.mode))
    path = spread_sweep(
        config,
        args.knob,
        values,
        args.out,
        baseline=args.baseline,
        method=args.method,
        plots=not args.no_plots,
        progress=lambda t: print(t, flush=True),
        discovery=discovery,
    )
    print(path.read_text())
    return 0


def toy_threads(mode: str) -> int:
    """Intra-op threads: 1 for sampled mode (tiny tensors, threads only add overhead), every core
    for exact mode (10^5-completion tensors split well)."""
    import os

    return 1 if mode == "sampled" else max(1, os.cpu_count() or 1)


def _cmd_sweep_g(args: argparse.Namespace) -> int:
    gs = _numbers(args.gs, "--gs")
    if not gs or min(gs) < 2:
        raise ValueError(f"--gs must list group sizes >= 2, got --gs {args.gs!r}")
    objectives = (args.baseline, args.method)
    configs = [_config(args, objectives, g) for g in gs]
    args.out = args.out or f"runs/toy-sweep-g-{args.task}-{args.mode}"
    import torch

    from .sweep import sweep_group_size
    from .train import validate

    for c in configs:
        validate(c)

    check_output_dir("--out", args.out, force=args.force, marker="gains.json")
    torch.set_num_threads(toy_threads(args.mode))
    path = sweep_group_size(
        configs, args.out, baseline=args.baseline, method=args.method, plots=not args.no_plots, progress=lambda t: print(t, flush=True)
    )
    print(path.read_text())
    return 0


def register(subparsers: argparse._SubParsersAction) -> None:
    """Add ``dfpo toy`` with its ``run``, ``ablate``, ``spread`` and ``sweep-g`` subcommands, each described (``DESCRIPTIONS``)."""
    toy = subparsers.add_parser(
        "toy", help="tabular softmax lab: learning tax, equivalent-answer drift, entropy collapse", description=DESCRIPTIONS["toy"]
    )
    sub = toy.add_subparsers(dest="toy_command", metavar="TOY_COMMAND")
    toy.set_defaults(func=lambda args: (toy.print_help(), 0)[1])

    p = sub.add_parser("run", help="train every objective on a toy task and write a run folder", description=DESCRIPTIONS["run"])
    p.add_argument(
        "--objectives", default=DEFAULT_OBJECTIVES, help=f"comma-separated labels, PRESET[:KEY=VALUE...] (default {DEFAULT_OBJECTIVES})"
    )
    _add_common(p)
    _add_discovery(p, "config.json and metrics.jsonl")
    _add_match_step(p)
    p.set_defaults(func=_cmd_run)

    p = sub.add_parser(
        "ablate",
        help="the standard ablation: DFPO in both stop-gradient forms next to matched GSPO controls",
        description=DESCRIPTIONS["ablate"],
    )
    _add_common(p)
    _add_discovery(p, "config.json and metrics.jsonl")
    _add_match_step(p)
    p.set_defaults(func=_cmd_ablate)

    p = sub.add_parser(
        "spread",
        help="paired effect of a DFPO variant over its matched baseline as the within-group ratio spread grows",
        description=DESCRIPTIONS["spread"],
    )
    p.add_argument(
        "--knob", default="inner_steps", help="config field to sweep: inner_steps, lr, group_size or init_noise (default inner_steps)"
    )
    p.add_argument("--values", default="1,2,4,8,16", help="values of the knob (default 1,2,4,8,16)")
    p.add_argument("--baseline", default=SPREAD_PAIR[0], help=f"baseline label (default {SPREAD_PAIR[0]})")
    p.add_argument("--method", default=SPREAD_PAIR[1], help=f"method label, matched with the baseline (default {SPREAD_PAIR[1]})")
    _add_common(p)
    _add_discovery(p, "config.json and spread.json")
    p.set_defaults(func=_cmd_spread)

    p = sub.add_parser(
        "sweep-g", help="gain of a DFPO variant over GSPO as the group size grows (the toy's Table 4)", description=DESCRIPTIONS["sweep-g"]
    )
    p.add_argument("--gs", default="2,4,8,16", help="group sizes (default 2,4,8,16)")
    p.add_argument("--baseline", default="gspo", help="baseline objective (default gspo)")
    p.add_argument("--method", default="dfpo_min", help="method objective (default dfpo_min)")
    _add_common(p, group_size=False)
    p.set_defaults(func=_cmd_sweep_g)
