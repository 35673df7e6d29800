"""`dfpo pilot`: the four gates a recipe must pass on its (warmed-up) model before any comparison uses it (issue 58).

A comparison of objectives on a real model says something about shared tokens only if the model writes them: if
its groups share no token, every objective's treatment of shared tokens is the same, and a null result is no
evidence. The pilot trains the recipe's control for ``PILOT_STEPS`` steps (the config as given, from its warm-up,
into OUT/control) and reads four gates from the run's logs:

1. ``pass@1`` in [0.15, 0.5]: the step-0 eval's avg@k (the mean correctness of k samples per held-out problem, an
   unbiased pass@1), so groups hold both rewards and the task can still be learnt;
2. ``template`` >= 0.5: the share of those samples that restate the problem before the result (``eval/template``);
3. ``whole-group shared positions`` >= 8 a step: the median over steps 1-5 of the positions whose prefix and token
   every completion of a group holds (``shared/whole_group_positions``, which the loss core logs where an objective
   takes them out; else the trainer's diagnostic of the same positions, ``diag/shared_positions``);
4. ``weight spread`` >= 1e-2: the median over steps 1-5 of the spread of the sequence weights inside a group
   (``weights/spread``) with ``PILOT_UPDATES`` optimiser steps per rollout, so that an objective's weights differ
   between members at all.

A recipe is used only if it passes all four. A gate whose metric the run did not log says "not measured" (never a
number it did not read) and does not pass. The result is stored as JSON (OUT/pilot.json: the gates, their values and
verdicts, the config) and ``pilot_table`` renders it as markdown for the docs (``dfpo pilot --show OUT/pilot.json``).
"""

from __future__ import annotations

import json
import statistics
from dataclasses import asdict, dataclass
from pathlib import Path

from ..core.files import write_run_file
from ..core.settings import finite_number
from .run.layout import RunDir
from .run.logs import JsonlLog

PILOT_STEPS = 5
"""Training steps of the pilot's control run (the gates read steps 1-5)."""
PILOT_UPDATES = 4
"""Optimiser steps per rollout the weight-spread gate is defined with (optim.epochs x prompts / minibatch_groups)."""
PASS_AT_1 = (0.15, 0.5)
TEMPLATE_MIN = 0.5
SHARED_POSITIONS_MIN = 8.0
WEIGHT_SPREAD_MIN = 1e-2
SHARED_KEYS = ("shared/whole_group_positions", "diag/shared_positions")
"""Where the third gate reads whole-group shared positions, in order: the loss core's count, then the trainer's."""
PILOT_FILE = "pilot.json"


@dataclass(frozen=True)
class Gate:
    """One gate: the value read (None: not measured), where from, and the interval it must lie in."""

    name: str
    key: str
    """The logged key the value was read from (or would have been)."""
    value: float | None
    low: float | None
    high: float | None = None
    why_unmeasured: str = ""
    """One sentence when ``value`` is None."""

    @property
    def verdict(self) -> str:
        """'pass', 'fail' or 'not measured'."""
        if self.value is None:
            return "not measured"
        inside = (self.low is None or self.value >= self.low) and (self.high is None or self.value <= self.high)
        return "pass" if inside else "fail"

    @property
    def bound(self) -> str:
        """The interval in words: '>= 0.5', 'in [0.15, 0.5]'."""
        if self.high is None:
            return f">= {self.low:g}"
        return f"in [{self.low:g}, {self.high:g}]"

    def sentence(self) -> str:
        """The gate in one sentence."""
        if self.value is None:
            return f"{self.name}: not measured ({self.why_unmeasured})."
        return f"{self.name} = {self.value:.4g} ({self.key}), must be {self.bound}: {self.verdict}."


def _finite(value) -> float | None:
    """A logged number, or None (absent, not a number, not finite: a log never holds NaN, but a file may)."""
    return float(value) if finite_number(value) else None


def step0_eval(evals: list[dict]) -> dict:
    """The step-0 evaluation's row ({} when the run logged none)."""
    return next((r for r in evals if r.get("step") == 0), {})


def pass_at_1_gate(evals: list[dict]) -> Gate:
    """Gate 1: the step-0 eval's avg@k (mean correctness of k samples per prompt: pass@1) in PASS_AT_1."""
    row = step0_eval(evals)
    key = next((k for k in sorted(row) if k.startswith("eval/avg@")), "eval/avg@k")
    value = _finite(row.get(key))
    why = "the run logged no step-0 evaluation (eval.every = 0?)" if not row else f"the step-0 evaluation holds no {key}"
    return Gate("pass@1", key, value, *PASS_AT_1, why_unmeasured=why if value is None else "")


def template_gate(evals: list[dict]) -> Gate:
    """Gate 2: the step-0 eval's share of samples in the template (``eval/template``) >= TEMPLATE_MIN."""
    row = step0_eval(evals)
    value = _finite(row.get("eval/template"))
    why = (
        ""
        if value is not None
        else "the step-0 evaluation holds no eval/template: the task has no answer template (data.task = 'sum_template' has)"
    )
    return Gate("template share", "eval/template", value, TEMPLATE_MIN, why_unmeasured=why)


def early_rows(metrics: list[dict], steps: int = PILOT_STEPS) -> list[dict]:
    """The metrics rows of steps 1 .. ``steps``."""
    return [r for r in metrics if isinstance(r.get("step"), int) and 1 <= r["step"] <= steps]


def median_gate(name: str, keys: tuple[str, ...], low: float, metrics: list[dict], steps: int = PILOT_STEPS) -> Gate:
    """The median over steps 1 .. ``steps`` of the first of ``keys`` the run logged, which must be >= ``low``; not
    measured when no step logged any of them."""
    rows = early_rows(metrics, steps)
    for key in keys:
        values = [v for v in (_finite(r.get(key)) for r in rows) if v is not None]
        if values:
            return Gate(name, key, statistics.median(values), low)
    why = f"no step 1-{steps} of the control run logged {' or '.join(keys)}"
    return Gate(name, keys[0], None, low, why_unmeasured=why)


def gates(evals: list[dict], metrics: list[dict]) -> list[Gate]:
    """The four gates of a pilot run's eval.jsonl and metrics.jsonl rows."""
    return [
        pass_at_1_gate(evals),
        template_gate(evals),
        median_gate("whole-group shared positions a step", SHARED_KEYS, SHARED_POSITIONS_MIN, metrics),
        median_gate("weight spread in a group", ("weights/spread",), WEIGHT_SPREAD_MIN, metrics),
    ]


def updates_per_rollout(cfg) -> float:
    """K = optim.epochs x rollout.prompts_per_step / optim.minibatch_groups."""
    return cfg.optim.epochs * cfg.rollout.prompts_per_step / cfg.optim.minibatch_groups


def check_pilot_config(cfg) -> None:
    """ValueError of one sentence unless ``cfg`` takes PILOT_UPDATES optimiser steps per rollout (the weight-spread gate
    is defined there) and evaluates (the first two gates read the step-0 eval)."""
    k = updates_per_rollout(cfg)
    if k != PILOT_UPDATES:
        o, r = cfg.optim, cfg.rollout
        fit = o.epochs * r.prompts_per_step / PILOT_UPDATES
        hint = (
            f"set optim.minibatch_groups={int(fit)}"
            if fit == int(fit)
            else f"choose rollout.prompts_per_step and optim.minibatch_groups so that they give {PILOT_UPDATES}"
        )
        raise ValueError(
            f"the pilot's weight-spread gate is defined with {PILOT_UPDATES} optimiser steps per rollout, but optim.epochs="
            f"{o.epochs} x rollout.prompts_per_step={r.prompts_per_step} / optim.minibatch_groups={o.minibatch_groups} gives "
            f"{k:g}; {hint}"
        )


PILOT_SETS = ("train.save_every=0", "train.save_final=false", f"train.steps={PILOT_STEPS}", f"eval.every={PILOT_STEPS}")
"""What the pilot sets on the recipe's config: 5 steps, evaluated at step 0 and 5, no checkpoint."""


def pilot_sets(out: Path, objective: str | None = None) -> list[str]:
    """The --set lines the pilot adds to the recipe's: ``PILOT_SETS``, the run folder OUT/control, and the control's
    objective when named."""
    sets = [*PILOT_SETS, f"run_dir={json.dumps(str(Path(out) / 'control'))}"]
    return sets + ([f"objective.name={json.dumps(objective)}"] if objective else [])


def gates_over_cells(cells: list[tuple[list[dict], list[dict]]]) -> list[dict]:
    """The four gates on a comparison's control cells (each its eval.jsonl and metrics.jsonl rows), read as the pilot
    reads its run (steps 1-5, the step-0 eval): per gate its name, bound, how many cells it was measured on and passed
    on, and the median of the measured values (None where no cell measured it). The recipe's gates on the seeds
    actually run, beside the pilot's one run."""
    per_cell = [gates(evals, metrics) for evals, metrics in cells]
    out = []
    for found in zip(*per_cell, strict=True):
        measured = [g.value for g in found if g.value is not None]
        out.append(
            {
                "name": found[0].name,
                "bound": found[0].bound,
                "cells": len(found),
                "measured": len(measured),
                "passed": sum(g.verdict == "pass" for g in found),
                "median": statistics.median(measured) if measured else None,
            }
        )
    return out


def gates_sentence(summary: list[dict]) -> str:
    """``gates_over_cells`` in one sentence: each gate, how many cells passed it and the median measured."""
    parts = []
    for g in summary:
        if not g["measured"]:
            parts.append(f"{g['name']} not measured on any of the {g['cells']} cells")
            continue
        unmeasured = f", not measured on {g['cells'] - g['measured']}" if g["measured"] < g["cells"] else ""
        parts.append(f"{g['name']} {g['bound']} on {g['passed']} of {g['cells']} cells (median {g['median']:.3g}{unmeasured})")
    return "; ".join(parts)


def pilot_result(cfg, evals: list[dict], metrics: list[dict], warm_folder: Path | None) -> dict:
    """The stored pilot: each gate (value, key, bound, verdict, sentence), whether all four pass, the recipe."""
    from .config import config_to_dict

    found = gates(evals, metrics)
    return {
        "passed": all(g.verdict == "pass" for g in found),
        "gates": [asdict(g) | {"verdict": g.verdict, "bound": g.bound, "sentence": g.sentence()} for g in found],
        "objective": cfg.objective.name,
        "run_dir": cfg.run_dir,
        "warmup_folder": None if warm_folder is None else str(warm_folder),
        "steps": PILOT_STEPS,
        "updates_per_rollout": updates_per_rollout(cfg),
        "config": config_to_dict(cfg),
    }


def run_pilot(cfg, out: Path, *, quiet: bool = True) -> dict:
    """Train the control run of ``cfg`` (``pilot_sets`` applied), read its gates, write OUT/pilot.json; the result."""
    from .train import Trainer
    from .warmup import warm_folder

    check_pilot_config(cfg)
    Trainer(cfg, quiet=quiet).run()
    run = RunDir(cfg.run_dir)
    result = pilot_result(cfg, JsonlLog.read(run.evals), JsonlLog.read(run.metrics), warm_folder(cfg))
    write_run_file(Path(out) / PILOT_FILE, json.dumps(result, indent=2, sort_keys=True))
    return result


def read_pilot(path: Path) -> dict:
    """A stored pilot (JSON, read as data); ValueError of one sentence when it is not one."""
    path = Path(path)
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise ValueError(f"--show {path}: no such file; give the pilot.json a dfpo pilot wrote") from None
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as err:
        raise ValueError(
            f"--show {path}: not a readable JSON file ({type(err).__name__}); give the pilot.json a dfpo pilot wrote"
        ) from None
    ok = isinstance(data, dict) and isinstance(data.get("gates"), list) and all(isinstance(g, dict) for g in data["gates"])
    if not ok or not all({"name", "verdict", "sentence"} <= set(g) for g in data["gates"]):
        raise ValueError(
            f"--show {path}: not a pilot result (no list of gates with name, verdict and sentence); give the pilot.json a dfpo pilot wrote"
        )
    return data


def _cell(value) -> str:
    return "not measured" if _finite(value) is None else f"{value:.4g}"


def pilot_table(result: dict) -> str:
    """The pilot as markdown: one row per gate (value, bound, key, verdict) and the decision in one sentence."""
    rows = ["| gate | value | must be | read from | verdict |", "|---|---|---|---|---|"]
    for g in result["gates"]:
        rows.append(f"| {g['name']} | {_cell(g.get('value'))} | {g.get('bound', '')} | `{g.get('key', '')}` | {g['verdict']} |")
    failed = [g["name"] for g in result["gates"] if g["verdict"] != "pass"]
    verdict = (
        "All four gates pass: the recipe may be used for a comparison."
        if not failed
        else f"Not usable for a comparison: {', '.join(failed)} did not pass."
    )
    head = f"Pilot of {result.get('objective', '?')} ({result.get('steps', PILOT_STEPS)} steps, {_cell(result.get('updates_per_rollout'))} optimiser steps per rollout):"
    return "\n".join([head, "", *rows, "", verdict])


def pilot_command(args) -> int:
    """``dfpo pilot``: --show PILOT_JSON prints a stored pilot; else the recipe of --config (and --set) is piloted into
    --out. Exit status 0 when all four gates pass, 1 when one does not (or is not measured), 128 + N on signal N."""
    import sys

    if args.show is not None:
        given = [flag for flag, value in (("--config", args.config), ("--set", args.set), ("--objective", args.objective)) if value]
        if given:
            raise ValueError(f"--show prints a stored pilot and trains nothing; drop {', '.join(given)}")
        print(pilot_table(read_pilot(Path(args.show))))
        return 0
    if not (args.config or "").strip():
        raise ValueError("dfpo pilot needs --config FILE, the recipe to test (e.g. configs/smollm2-template.toml)")
    from .config import load_config
    from .run.signals import TrainingInterrupted
    from .stages.update import NonFiniteLossError

    cfg = load_config(args.config, [*(args.set or []), *pilot_sets(Path(args.out), args.objective)])
    check_pilot_config(cfg)  # before any work
    try:
        result = run_pilot(cfg, Path(args.out))
    except TrainingInterrupted as stopped:
        print(f"dfpo: pilot not finished: {stopped}", file=sys.stderr)
        return stopped.exit_code
    except NonFiniteLossError as err:
        print(f"dfpo: error: {err}", file=sys.stderr)
        return 1
    print(pilot_table(result))
    print(f"\n{Path(args.out) / PILOT_FILE} written", file=sys.stderr)
    return 0 if result["passed"] else 1
