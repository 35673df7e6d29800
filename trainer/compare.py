"""``dfpo compare``: objectives on the LLM trainer over paired seeds, with matched controls.

    dfpo compare --objectives gspo,dfpo_min --seeds 32 --out runs/compare
    dfpo compare --objectives gspo_noclip,dfpo_min:stopgrad=score --baseline gspo_noclip --seeds 32 --first-seed 1000
    dfpo compare --objectives gspo_noclip,dfpo_min:stopgrad=score --match-step update --match-methods dfpo_min:stopgrad=score
    dfpo compare ... --first-seed 3000 --calibration-from runs/discovery/compare.json   # the same controls on a second set

Without ``--config`` the runs train configs/smollm2-cpu.toml (the packaged SmolLM2-135M-Instruct on the sum task).

Every label (a preset, optionally with ``:key=value`` overrides and ``@lr=VALUE``, the run's learning rate) trains once per seed
with everything else equal (same config, same seed: same warm start, same prompts, same held-out
eval problems). Each method is compared with the baseline on the same seed. The paired
differences get Student-t intervals over seeds, Bonferroni-adjusted over every interval of the
table (``dfpo.core.stats``: honest at small n, where a percentile bootstrap under-covers); a cell
is marked * only when its adjusted interval excludes 0. Every outcome's per-seed values are
printed too (and written to per_seed.csv). A run that never reached kappa has a censored steps to kappa
(printed >=N): that column gives Kaplan-Meier medians and the median paired difference with a censoring-aware
sign-test interval, and a warning (stderr and compare.md) names such runs, as it does fewer than 8 seeds. A
comparison whose two sides differ in the trust region (clip range, stop-gradient form, aggregation, advantage
scale, ...; see ``dfpo.core.loss.unmatched_components``) or in the learning rate is flagged in the table: a
difference it shows may come from the trust region or the step, not from the in-group transform.

Step-size-matched controls (``--match-step steps`` or ``update``): for each method of ``--match-methods`` (default:
every label with an in-group transform and a trust-region-matched control), that control at the learning rate where
its steps to kappa (restricted mean over the calibration seeds, a censored run counting its length + 1; refused when
every calibration run of a label is censored, since the mean is then the run length whatever the step) or its update
norm per step (``optim/update_norm``, which every run then logs) equals the method's, found by
``dfpo.core.calibration``'s secant search on ``--calibration-seeds`` seeds from ``--calibration-first-seed``
(disjoint from the reported ones; the calibration's runs go to OUT/calibration/). The table then shows each method
against both controls; a control whose own learning rate already matches is its own step-size-matched control (no
second label trains its runs again). ``--calibration-from`` reuses an earlier comparison's
controls (its compare.json), so a confirmation set runs the same experiment. compare.json holds everything the
tables are rendered from (``dfpo.trainer.compare_report``).

Runs go to OUT/<label>/seed<k>/ and are skipped when their summary.json exists, so a long
comparison can be interrupted and started again with the same command (by the same code: the CLI refuses an OUT that
other code trained, ``dfpo.trainer.run.code``). While a run trains, a line every ``PROGRESS_EVERY_S`` seconds says its
label, seed, the last step its metrics.jsonl logged out of train.steps and the seconds since it started; a line as
each run ends says whether it was trained, resumed or skipped. A run with a
checkpoint.pt is continued with ``dfpo train --resume`` and any other is started with
``dfpo train`` (which restarts a run folder of its own that died before its first checkpoint).
Nothing is deleted here. A run with ``train.save_every = 0`` (the experiments that keep no checkpoint) that
died before its end left its logs (metrics.jsonl, eval.jsonl, samples.jsonl, tb/'s events),
config.toml, the learning tax's tax_reference.pt and the mark, but no checkpoint.pt and no summary.json, so it
is started again by ``dfpo train`` in its folder; that process clears exactly those files
(``run.folder.startup_leftovers``: the mark must say no checkpoint was ever written, and anything it does not
recognise is refused with nothing deleted) and trains the run from step 0, its step-0 eval scoring pi_init again.
Such a run's steps are lost, not resumed (``dfpo train --resume`` on it is refused in one sentence). A folder whose
``train.save_final = false`` run finished holds summary.json and is skipped as done.

Before anything runs, every OUT/<label>/seed<k>/ that holds a run (a checkpoint or a summary) must hold the run of
that label and seed under this comparison's config: its identity (``run.folder.run_identity``, kept in the mark
dfpo train writes) is checked, and a folder holding another run, or one whose identity is unknown, is refused
naming both, so no run is resumed or reported under a label it does not have. Every setting of its config.toml must
equal the one this command would train it with (``check_settings``; only run_dir, where the folder is, may differ):
the identity leaves out what a resume may change, so a cell trained with train.steps=5 would otherwise be reported,
or resumed, under a command asking 6. Such a cell is refused in one sentence naming the setting and both values,
before anything trains; a cell other code finished is read under the same rule. A run that fails, and a run whose
files cannot be read (a torn metrics line: FILE:LINE), stop the comparison with one line.
"""

from __future__ import annotations

import dataclasses
import json
import math
import subprocess
import sys
import threading
import time
import tomllib
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from ..core.calibration import Calibration, calibrate
from ..core.files import write_text_atomic
from ..core.labels import parse_run_label
from ..core.loss import objective_from_label, parse_objective_label, unmatched_components
from ..core.loss.objectives import format_override
from .compare_report import (
    ALWAYS_KEPT,
    CENSORED,
    CURVES,
    MIN_SEEDS,
    OUTCOMES,
    Records,
    plot_curves,
    plot_differences,
    render_compare,
    warnings_for,
)
from .compare_report import per_seed_csv as per_seed_csv
from .config import Config, config_text, config_to_dict, load_config
from .run.code import recorded_sources
from .run.folder import folder_identity, read_mark, run_identity
from .run.layout import RunDir
from .run.machine import recorded_machine
from .run.resume import flat_items, same_setting

__all__ = ["CENSORED", "MIN_SEEDS", "OUTCOMES", "Plan", "compare", "make_plan", "read_run", "render_compare", "run_dir"]


@dataclass(frozen=True)
class Plan:
    """What to run: labels, seeds, the base config file and its --set assignments; ``step_matched`` maps a
    step-size-matched control (CONTROL@lr=...) to the methods it was calibrated for (comma-separated)."""

    labels: tuple[str, ...]
    baseline: str
    seeds: tuple[int, ...]
    config: str
    sets: tuple[str, ...]
    out: Path
    step_matched: tuple[tuple[str, str], ...] = ()
    calibrations: tuple[Calibration, ...] = ()
    refuse_training: str = ""
    """Where set, the sentence that refuses to train a cell this plan has not finished (``dfpo.trainer.cli``'s
    ``mixed_code_refusal``): a finished experiment is still read and reported."""


def make_plan(objectives: str, baseline: str | None, seeds: int, first_seed: int, config: str, sets: list[str] | None, out: str) -> Plan:
    """Validate everything before any training: labels, baseline, seed count, config file."""
    labels = tuple(x.strip() for x in objectives.split(",") if x.strip())
    if len(labels) < 2:
        raise ValueError(f"--objectives needs at least two labels, got --objectives {objectives!r}")
    if len(set(labels)) != len(labels):
        raise ValueError(f"--objectives repeats a label: {objectives!r}")
    for label in labels:
        objective_from_label(parse_run_label(label).objective)  # raises, naming the bad label, its lr or component
    baseline = baseline or labels[0]
    if baseline not in labels:
        raise ValueError(f"--baseline {baseline!r} is not one of --objectives {list(labels)}")
    if seeds < 2:
        raise ValueError(f"--seeds must be >= 2 for a paired interval, got --seeds {seeds}")
    load_config(config, list(sets or []))  # a bad config or --set fails now
    return Plan(labels, baseline, tuple(range(first_seed, first_seed + seeds)), config, tuple(sets or []), Path(out))


def label_folder(label: str) -> str:
    """The folder name of an objective label's cells: 'dfpo_min:stopgrad=score' -> 'dfpo_min__stopgrad-score'."""
    return label.replace(":", "__").replace("=", "-")


def run_dir(plan: Plan, label: str, seed: int) -> Path:
    return plan.out / label_folder(label) / f"seed{seed}"


class RunFailed(ValueError):
    """A run of the comparison ended with an error (its own last error line says which). A ValueError: the command
    line prints it as one line, with no traceback."""


def run_sets(plan: Plan, label: str, seed: int) -> list[str]:
    """The --set assignments of one (label, seed) run: the plan's, then its seed, objective and folder."""
    run_label = parse_run_label(label)
    name, overrides = parse_objective_label(run_label.objective)
    sets = [*plan.sets, f"seed={seed}", f"objective.name={name}", f"run_dir={run_dir(plan, label, seed)}"]
    sets += [f"objective.overrides.{format_override(k, v)}" for k, v in overrides.items()]
    return sets + ([f"optim.lr={run_label.lr!r}"] if run_label.lr is not None else [])


def run_config(plan: Plan, label: str, seed: int) -> Config:
    """The config ``dfpo train`` resolves for one (label, seed) run."""
    return load_config(plan.config, run_sets(plan, label, seed))


def train_command(plan: Plan, label: str, seed: int) -> list[str]:
    """The ``dfpo train`` command of one (label, seed) run."""
    cmd = [sys.executable, "-m", "dfpo", "train", "--config", plan.config, "--quiet"]
    for item in run_sets(plan, label, seed):
        cmd += ["--set", item]
    return cmd


NOTHING_RUN = "nothing was run or reported. Move that folder away, or choose another --out"
"""The end of every sentence that refuses a cell folder before anything runs."""
PER_CELL_SETTINGS = ("run_dir",)
"""Config keys a cell may hold with another value than the command asks and still be reused: where the folder is
(an OUT that was moved). Its seed and objective are the cell's own and must equal the command's for that cell."""


def check_identity(plan: Plan, label: str, seed: int) -> None:
    """ValueError unless OUT/LABEL/seedN, when it holds a run (a checkpoint or a summary), holds the run of ``label``
    and ``seed`` under the plan's config: its identity (``run_identity``) and every setting of its config.toml
    (``check_settings``); naming what it holds instead."""
    path = run_dir(plan, label, seed)
    if not (RunDir(path).checkpoint.is_file() or RunDir(path).summary.is_file()):
        return
    config = run_config(plan, label, seed)
    expected, found = run_identity(config_to_dict(config)), folder_identity(path)
    if found is None:
        raise ValueError(
            f"{path} holds a run whose identity is unknown (no identity in {RunDir.MARK} and no config in checkpoint.json: not a run "
            f"of dfpo train, or of one older than run identities); {NOTHING_RUN}"
        )
    if (found.get("objective"), found.get("seed")) != (expected["objective"], expected["seed"]):
        raise ValueError(
            f"{path} holds the run {found.get('objective')} seed {found.get('seed')}, not {expected['objective']} seed {seed}; {NOTHING_RUN}"
        )
    check_settings(path, config)
    # A cell trained before a setting existed hashed only the settings it had; check_settings has just found the new
    # ones at their defaults, so its identity is the one over its own keys.
    if found != expected and found != run_identity(config_to_dict(config), keys=set(stored_settings(path))):
        raise ValueError(
            f"{path} holds a run of {expected['objective']} seed {seed} with another config (config "
            f"{str(found.get('config_sha256'))[:12]}, not {expected['config_sha256'][:12]} of --config {plan.config}"
            f"{' --set ' + ' '.join(plan.sets) if plan.sets else ''}); {NOTHING_RUN}"
        )


def stored_settings(path: Path) -> dict:
    """The settings a cell was trained with: its config.toml (``dfpo train`` writes the resolved config there, and
    again with any --set of a resume) as dotted keys. ValueError naming the file when it is missing or unreadable.
    The file is parsed as TOML data; nothing in it runs."""
    file = RunDir(path).config
    if not file.is_file():
        raise ValueError(f"{path} holds a run but no {RunDir.CONFIG}, so the settings it was trained with are unknown; {NOTHING_RUN}")
    try:
        return flat_items(tomllib.loads(config_text(file)))
    except (OSError, ValueError) as err:  # tomllib.TOMLDecodeError and read_utf8's "not UTF-8" are ValueErrors
        raise ValueError(
            f"{file} cannot be read as TOML ({err}), so the settings its run was trained with are unknown; {NOTHING_RUN}"
        ) from None


def settings_differences(stored: dict, wanted: dict, defaults: dict | None = None) -> list[tuple[str, object, object]]:
    """(dotted key, the cell's value, the command's value) of every setting in which a cell's config (``stored``, flat)
    differs from the one this command would train it with (``wanted``, flat), ``PER_CELL_SETTINGS`` aside. A key only
    the command has is a setting added after the cell was trained: it counts as the same only where the command asks
    its default (``defaults``, flat: a new setting's default keeps the behaviour the cell was trained with); any other
    key only one side has is a difference (its value on the other side: ``MISSING``)."""
    keys = sorted((set(stored) | set(wanted)) - set(PER_CELL_SETTINGS))
    return [(k, stored.get(k, MISSING), wanted.get(k, MISSING)) for k in keys if not same_setting(k, stored, wanted, defaults or {})]


MISSING = "(not set)"
"""How a setting one config lacks is shown."""


def _setting(value: object) -> str:
    return (
        "true"
        if value is True
        else "false"
        if value is False
        else repr(value)
        if isinstance(value, str) and value != MISSING
        else str(value)
    )


def check_settings(path: Path, config: Config) -> None:
    """ValueError, in one sentence naming the setting and both values, unless the run in ``path`` was trained with
    every setting ``config`` has (``settings_differences``): a cell trained under other settings (train.steps,
    eval.every, ... which a resume may change and the run's identity leaves out) is never reused or reported under
    this command's settings."""
    diffs = settings_differences(stored_settings(path), flat_items(config_to_dict(config)), flat_items(config_to_dict(Config())))
    if not diffs:
        return
    (key, was, asks), rest = diffs[0], diffs[1:]
    more = "".join(f", {k}={_setting(a)} where it asks {_setting(b)}" for k, a, b in rest[:3])
    more += f" and {len(rest) - 3} more settings" if len(rest) > 3 else ""
    raise ValueError(
        f"{path} was trained with {key}={_setting(was)}, this command asks {_setting(asks)}{more}: nothing was run or reported; "
        f"use another --out for these settings, or run this command with the settings that folder was trained with"
    )


def resume_command(path: Path) -> list[str]:
    """The ``dfpo train --resume`` command continuing an interrupted run from its checkpoint.pt."""
    return [sys.executable, "-m", "dfpo", "train", "--resume", str(path), "--quiet"]


def command_for(plan: Plan, label: str, seed: int) -> tuple[list[str], str]:
    """What to run for one (label, seed): resume it if it has a checkpoint, else train it from the start.

    Nothing is ever deleted here: a folder that died before its first checkpoint is restarted by
    ``dfpo train`` itself (it empties only a run folder it recognises), and anything else is refused.
    """
    path = run_dir(plan, label, seed)
    if RunDir(path).checkpoint.is_file():
        return resume_command(path), "resumed"
    return train_command(plan, label, seed), "trained"


PROGRESS_EVERY_S = 30.0
"""While a cell trains, compare prints its progress (``progress_line``) every this many seconds."""


def print_line(line: str) -> None:
    """A progress line on stdout, flushed: a pipe or a log file sees each line as it comes."""
    print(line, flush=True)


def run_one(plan: Plan, label: str, seed: int, *, progress=None, every_s: float = PROGRESS_EVERY_S) -> str:
    """Train (or resume) one run unless its summary.json exists; returns a status line. While it trains, ``progress``
    (when given) gets a ``progress_line`` every ``every_s`` seconds."""
    path = run_dir(plan, label, seed)
    if RunDir(path).summary.is_file():
        return f"compare: {label} seed {seed}: done before, skipped"
    if plan.refuse_training:
        raise ValueError(plan.refuse_training)
    cmd, how = command_for(plan, label, seed)
    steps, started = run_config(plan, label, seed).train.steps, time.monotonic()

    def tell() -> None:
        if progress is not None:
            progress(progress_line(label, seed, how, last_logged_step(RunDir(path).metrics), steps, time.monotonic() - started))

    code, stderr = run_watched(cmd, tell, every_s)
    if code != 0:
        raise RunFailed(f"{label} seed {seed} failed (exit {code}): {last_error(stderr)}")
    return f"compare: {label} seed {seed}: {how}"


def run_watched(cmd: list[str], tell, every_s: float) -> tuple[int, str]:
    """Run ``cmd`` to its end, calling ``tell()`` every ``every_s`` seconds while it runs; (exit status, stderr).
    Its output is read as it comes (a child that writes much never blocks on a full pipe)."""
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    while True:
        try:
            _, stderr = proc.communicate(timeout=every_s)  # a timeout loses no output: the next call goes on reading
            return proc.returncode, stderr
        except subprocess.TimeoutExpired:
            tell()
        except BaseException:  # an interrupt: the cell's process goes with compare (its run folder resumes next time)
            proc.kill()
            proc.wait()
            raise


def last_logged_step(metrics: Path) -> int:
    """The step of the last whole line of a metrics.jsonl that is being written (0 before the first step): only its
    last 64 KiB is read, and a line still being written, or one that is not a JSON object with an integer step, is
    skipped."""
    try:
        with open(metrics, "rb") as fh:
            fh.seek(max(0, fh.seek(0, 2) - 65536))
            tail = fh.read()
    except OSError:
        return 0
    for line in reversed(tail.split(b"\n")[:-1]):  # after the last newline: a line not yet whole
        try:
            row = json.loads(line)
        except ValueError:
            continue
        step = row.get("step") if isinstance(row, dict) else None
        if isinstance(step, int) and not isinstance(step, bool):
            return step
    return 0


def progress_line(label: str, seed: int, how: str, step: int, steps: int, elapsed_s: float) -> str:
    """One line of a cell's progress: ``compare: gspo seed 3: training, step 4/12, 150 s elapsed``."""
    doing = {"trained": "training", "resumed": "resuming"}.get(how, how)
    started = "" if step else " (starting up: no step logged yet)"
    return f"compare: {label} seed {seed}: {doing}, step {step}/{steps}{started}, {elapsed_s:.0f} s elapsed"


def last_error(stderr: str) -> str:
    """The error a failed ``dfpo train`` printed: its last ``dfpo: error:`` line, else its last line."""
    lines = [line.strip() for line in stderr.splitlines() if line.strip()]
    errors = [line.removeprefix("dfpo: error:").strip() for line in lines if line.startswith("dfpo: error:")]
    return (errors or lines or ["(nothing on stderr)"])[-1][-1000:]


def _read_summary(path: Path) -> dict:
    try:
        summary = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as err:
        raise ValueError(f"{path}: cannot be read as JSON ({err}); move {path.parent} away to train that run again") from None
    if not isinstance(summary, dict):
        raise ValueError(f"{path}: not a JSON object; move {path.parent} away to train that run again")
    return summary


def read_metrics_rows(path: Path) -> list[dict]:
    """The lines of a finished run's metrics.jsonl; ValueError naming FILE:LINE of one that is not a JSON object."""
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as err:
        raise ValueError(f"{path}: cannot be read ({err}); move {path.parent} away to train that run again") from None
    rows = []
    for number, line in enumerate(text.split("\n"), start=1):
        if not line.strip():
            continue
        try:
            row = json.loads(line)
        except json.JSONDecodeError as err:
            row, why = None, str(err)
        else:
            why = f"a JSON {type(row).__name__}"
        if not isinstance(row, dict):
            raise ValueError(
                f"{path}:{number}: not a JSON object ({why}): the log of a finished run is damaged; move {path.parent} away "
                "to train that run again"
            )
        rows.append(row)
    if not rows:
        raise ValueError(f"{path}: no step in it; move {path.parent} away to train that run again")
    return rows


def _logged(rows: list[dict], key: str) -> list[float]:
    """The values of ``key`` in ``rows`` where it was logged as a number."""
    return [float(r[key]) for r in rows if isinstance(r.get(key), (int, float)) and not isinstance(r.get(key), bool)]


def _mean(values: list[float]) -> float:
    return float(np.mean(values)) if values else math.nan


def _number(value) -> float:
    return float(value) if isinstance(value, (int, float)) and not isinstance(value, bool) else math.nan


def read_run(path: Path) -> dict[str, float]:
    """The outcomes of one finished run from its summary.json and metrics.jsonl.

    ``kappa_reached`` is 1.0 when the 10-step mean train reward reached eval.kappa, else 0.0: then
    ``steps_to_kappa`` is the run's length + 1, a lower bound (censored). ``tax_kl`` is the final eval's
    ``eval/tax_kl``; ``equiv_entropy`` the mean of ``forms/equiv_entropy`` over those of the last 10 steps that logged it;
    ``shared_events``, ``residual`` and ``residual_length`` the means over the steps that logged
    ``diag/shared_events``, ``diag/shared_residual`` and ``diag/shared_residual_length``; ``update_norm`` the mean of
    ``optim/update_norm`` (log.update_norm); ``reward_rise5`` the mean train reward of the last 5 steps minus that of
    the first 5 (NaN under 10 steps); ``cpu_s`` the summary's
    ``cpu_s_process`` (CPU seconds of the run's last ``dfpo train`` process: a resumed run's last session);
    ``template_kl`` and ``greedy_eval`` the final eval's ``eval/template_kl`` (the learning tax at the template's
    positions, Prop. 3.1) and ``eval/greedy_acc`` (eval.greedy); ``shared_whole``, ``residual_whole`` and
    ``weights_spread`` the means of ``diag/shared_positions`` (positions a whole group shares),
    ``diag/shared_residual_whole`` (eq 2's residual there) and ``weights/spread``; ``coef_whole`` the mean of
    ``diag/shared_coef_whole`` (the coefficient mass there: 0 under exact cancellation). An outcome the logs do not hold is
    NaN (its cells read n/a).
    """
    summary = _read_summary(RunDir(path).summary)
    rows = read_metrics_rows(RunDir(path).metrics)
    final = summary.get("final_eval") or {}
    avg = [v for k, v in final.items() if k.startswith("eval/avg@")]
    steps = summary.get("reward/steps_to_kappa_ma10")
    residual = _logged(rows, "diag/shared_residual")
    entropy = [r["entropy/rollout"] for r in rows[-10:] if isinstance(r.get("entropy/rollout"), (int, float))]
    jitter = summary.get("reward/jitter2")
    return {
        "eval": avg[0] if avg else math.nan,
        "reward_last10": float(np.mean([r["reward/mean"] for r in rows[-10:]])),
        "steps_to_kappa": float(steps if steps is not None else len(rows) + 1),
        "kappa_reached": float(steps is not None),
        "jitter2": float(jitter) if isinstance(jitter, (int, float)) else math.nan,
        "entropy_last10": float(np.mean(entropy)) if entropy else math.nan,
        "residual": float(np.mean(residual)) if residual else math.nan,
        "clip_frac": float(np.mean([r.get("clip/frac_low", 0.0) + r.get("clip/frac_high", 0.0) for r in rows])),
        "asym": float(np.mean([r.get("weights/asym", 0.0) for r in rows])),
        "tax_kl": _number(final.get("eval/tax_kl")),
        "equiv_entropy": _mean(_logged(rows[-10:], "forms/equiv_entropy")),
        "shared_events": _mean(_logged(rows, "diag/shared_events")),
        "residual_length": _mean(_logged(rows, "diag/shared_residual_length")),
        "update_norm": _mean(_logged(rows, "optim/update_norm")),
        "reward_rise5": reward_rise(rows, 5),
        "cpu_s": _number(summary.get("cpu_s_process")),
        "template_kl": _number(final.get("eval/template_kl")),
        "greedy_eval": _number(final.get("eval/greedy_acc")),
        "shared_whole": _mean(_logged(rows, "diag/shared_positions")),
        "residual_whole": _mean(_logged(rows, "diag/shared_residual_whole")),
        "coef_whole": _mean(_logged(rows, "diag/shared_coef_whole")),
        "weights_spread": _mean(_logged(rows, "weights/spread")),
    }


def read_curve(path: Path) -> dict[str, list]:
    """One finished run's curves (``CURVES``), each ``[step, value]`` for every logged row of its log that holds the
    key: ``reward`` the mean train reward of each step, ``eval`` the held-out avg@k of each evaluation (step 0
    included), and where the run logged them greedy accuracy, the learning tax at the template's positions, the
    prompt-position proxy, rollout entropy and the entropy over equivalent answers; a value that is not a finite
    number is left out, and a curve no row logged is not kept (except ``ALWAYS_KEPT``, kept empty)."""
    logs = {
        "metrics": read_metrics_rows(RunDir(path).metrics),
        "evals": read_metrics_rows(RunDir(path).evals) if RunDir(path).evals.is_file() else [],
    }

    def pick(row: dict, key: str):
        return next((v for k, v in row.items() if k.startswith(key)), None) if key.endswith("@") else row.get(key)

    def points(rows: list[dict], key: str) -> list[list[float]]:
        found = [(row.get("step"), pick(row, key)) for row in rows]
        return [[int(step), float(v)] for step, v in found if isinstance(step, int) and math.isfinite(_number(v))]

    curves = {name: points(logs[log], key) for name, log, key, _ in CURVES}
    return {name: pts for name, pts in curves.items() if pts or name in ALWAYS_KEPT}


def reward_rise(rows: list[dict], k: int) -> float:
    """The mean train reward (``reward/mean``) of the last ``k`` steps minus that of the first ``k``; NaN when the
    run has fewer than 2k steps (the two windows would overlap)."""
    if len(rows) < 2 * k:
        return math.nan
    return float(np.mean([r["reward/mean"] for r in rows[-k:]]) - np.mean([r["reward/mean"] for r in rows[:k]]))


def differs(plan: Plan, method: str, control: str) -> list[str]:
    """What ``control`` differs in from ``method`` beyond the in-group transform: [] (a trust-region-matched control),
    ['step size'] (step-size-matched: its lr was calibrated to the method's step), or the components and 'lr'."""
    rm, rb = parse_run_label(method), parse_run_label(control)
    differ = list(unmatched_components(objective_from_label(rm.objective), objective_from_label(rb.objective)))
    calibrated = method in dict(plan.step_matched).get(control, "").split(",")
    if rm.lr != rb.lr and not calibrated:
        differ.append("lr")
    return ["step size"] if calibrated and not differ else differ


def trust_region_control(plan: Plan, method: str) -> str | None:
    """The label of ``plan`` that is ``method``'s trust-region-matched control (no in-group transform, nothing else
    differs, the same learning rate), or None."""
    if method not in plan.labels or objective_from_label(parse_run_label(method).objective).transform == "none":
        return None
    for b in plan.labels:
        if b != method and objective_from_label(parse_run_label(b).objective).transform == "none" and differs(plan, method, b) == []:
            return b
    return None


def default_match_methods(plan: Plan) -> list[str]:
    """Every label with an in-group transform and a trust-region-matched control in the plan."""
    return [m for m in plan.labels if trust_region_control(plan, m) is not None]


def comparison_pairs(plan: Plan) -> list[tuple[str, str]]:
    """Every label against the baseline; every method against its trust-region-matched control when that is not the
    baseline; every method against its step-size-matched control."""
    pairs = [(label, plan.baseline) for label in plan.labels if label != plan.baseline]
    pairs += [(m, c) for m in plan.labels if (c := trust_region_control(plan, m)) not in (None, plan.baseline)]
    pairs += [(m, control) for control, methods in plan.step_matched for m in methods.split(",")]
    return list(dict.fromkeys(pairs))


def matched_components(plan: Plan) -> dict[str, list[str]]:
    """'METHOD - CONTROL' -> ``differs`` for every pair of the table."""
    return {f"{m} - {b}": differs(plan, m, b) for m, b in comparison_pairs(plan)}


def control_kinds(plan: Plan) -> dict[str, list[str]]:
    """``differs`` for every ordered pair of labels (what a finding may compare)."""
    return {f"{m} - {b}": differs(plan, m, b) for m in plan.labels for b in plan.labels if m != b}


def calibration_sentence(plan: Plan, cal: Calibration) -> str:
    """How a control was calibrated, in one sentence; a control whose own learning rate matched trains no second label."""
    return cal.sentence(own_lr=cal.label not in plan.labels)


def experiment_cost(plan: Plan) -> dict:
    """What the comparison's finished cells cost and what they ran on: the compared runs and the calibration's (under
    OUT/calibration/), from each cell's summary.json: ``wall_s_process`` and ``cpu_s_process`` (its last ``dfpo train``
    process) summed over the cells that recorded both, its ``machine`` (``recorded_machine``) and the code that trained
    it (``trained_by``) counted."""
    compared = [run_dir(plan, label, s) for label in plan.labels for s in plan.seeds]
    calibration = sorted(p for p in (plan.out / "calibration").glob("*/seed*") if p.is_dir())
    finished = [(path, kind) for kind, paths in (("compared", compared), ("calibration", calibration)) for path in paths]
    finished = [(path, kind) for path, kind in finished if RunDir(path).summary.is_file()]
    summaries = [(_read_summary(RunDir(path).summary), kind) for path, kind in finished]
    timed = [(_number(s.get("wall_s_process")), _number(s.get("cpu_s_process"))) for s, _ in summaries]
    timed = [(wall, cpu) for wall, cpu in timed if math.isfinite(wall) and math.isfinite(cpu)]
    return {
        "cells": {kind: sum(k == kind for _, k in summaries) for kind in ("compared", "calibration")},
        "timed_cells": len(timed),
        "wall_s": sum(wall for wall, _ in timed),
        "cpu_s": sum(cpu for _, cpu in timed),
        "machines": dict(Counter(recorded_machine(s.get("machine")) for s, _ in summaries).most_common()),
        "codes": dict(Counter(trained_by(path) for path, _ in finished).most_common()),
    }


def trained_by(path: Path) -> str:
    """The code that trained a run, in words: the source fingerprints its .dfpo-run.json records (``run.code``)."""
    sources = recorded_sources(read_mark(path) or {})
    return "source " + " then ".join(s[:12] for s in sources) if sources else "no source recorded"


def document(plan: Plan, records: Records) -> dict:
    """Everything compare.md is rendered from (written as compare.json; the attribution page stores it as evidence)."""
    return {
        "seeds": list(plan.seeds),
        "config": plan.config,
        "sets": list(plan.sets),
        "labels": list(plan.labels),
        "baseline": plan.baseline,
        "pairs": [list(p) for p in comparison_pairs(plan)],
        "matched": matched_components(plan),
        "controls": control_kinds(plan),
        "step_matched": dict(plan.step_matched),
        "calibrations": [{**dataclasses.asdict(c), "sentence": calibration_sentence(plan, c)} for c in plan.calibrations],
        "records": {k: {str(s): r for s, r in v.items()} for k, v in records.items()},
    }


def run_all(plan: Plan, *, jobs: int, progress, every_s: float = PROGRESS_EVERY_S) -> Records:
    """Train every (label, seed) run of ``plan`` (``jobs`` at a time) and read their outcomes. ``progress`` gets a
    line as each cell ends and, while one trains, its ``progress_line`` every ``every_s`` seconds."""
    tasks = [(label, seed) for seed in plan.seeds for label in plan.labels]  # seed-major: pairs finish together
    for label, seed in tasks:  # before anything runs: no run is resumed or reported under a label it does not have
        check_identity(plan, label, seed)
    plan.out.mkdir(parents=True, exist_ok=True)
    lock = threading.Lock()

    def say(line: str) -> None:  # one whole line at a time from every worker
        with lock:
            progress(line)

    with ThreadPoolExecutor(max_workers=max(1, jobs)) as pool:
        for line in pool.map(lambda t: run_one(plan, *t, progress=say, every_s=every_s), tasks):
            say(line)
    return {label: {s: read_run(run_dir(plan, label, s)) for s in plan.seeds} for label in plan.labels}


CALIBRATION_FILE = "calibration.json"
"""OUT/calibration.json: the step-size-matched controls as soon as they are calibrated (compare.json repeats them at the
end), so a confirmation set can start with ``--calibration-from`` before the discovery set has finished."""
UPDATE_NORM_SET = "log.update_norm=true"
"""The --set every run of a comparison matched on the update norm carries: each logs ``optim/update_norm``."""


def with_update_norm(plan: Plan, criterion: str) -> Plan:
    """``plan`` whose runs log their update norm when ``criterion`` needs it (and the table's update-norm row then
    compares every label's step size)."""
    if criterion != "update" or UPDATE_NORM_SET in plan.sets:
        return plan
    return dataclasses.replace(plan, sets=(*plan.sets, UPDATE_NORM_SET))


def calibration_value(label: str, records: dict[int, dict[str, float]], criterion: str, kappa: float) -> float:
    """The calibration criterion of ``label`` over its calibration runs: the restricted mean of steps to kappa
    (a run that never reached it counts its length + 1) or the mean update norm per step. ValueError when every
    run is censored (the restricted mean is then the run length whatever the step size: it measures nothing) or a
    run logged no update norm."""
    if criterion == "steps":
        if not any(r["kappa_reached"] for r in records.values()):
            raise ValueError(
                f"cannot calibrate the step size on steps to kappa: no calibration run of {label} reached its 10-step mean "
                f"train reward of kappa {kappa:g} within train.steps, so every value is the run length + 1 whatever the step: "
                "use --match-step update, more train.steps or a lower eval.kappa"
            )
        return float(np.mean([r["steps_to_kappa"] for r in records.values()]))
    values = [r["update_norm"] for r in records.values()]
    if not all(math.isfinite(v) for v in values):
        raise ValueError(f"cannot calibrate on the update norm: a calibration run of {label} logged no optim/update_norm")
    return float(np.mean(values))


def step_matched_plan(
    plan: Plan, methods: list[str], *, seeds: tuple[int, ...], criterion: str = "steps", jobs: int = 1, progress=None
) -> Plan:
    """``plan`` with, for each method, its trust-region-matched control at the learning rate where the control's
    ``criterion`` (steps to kappa, or the update norm per step) equals the method's on the calibration seeds
    (``dfpo.core.calibration``; runs under OUT/calibration/). A control whose own learning rate already matches
    (within the tolerance) is its own step-size-matched control: no second label trains the same runs again."""
    progress = progress or print_line
    if set(seeds) & set(plan.seeds):
        raise ValueError(f"the calibration seeds {seeds[0]}..{seeds[-1]} overlap the comparison's seeds: calibrate on a disjoint set")
    plan = with_update_norm(plan, criterion)
    base = run_config(plan, plan.labels[0], plan.seeds[0])
    lr0, kappa = float(base.optim.lr), float(base.eval.kappa)
    labels, matched, calibrations = list(plan.labels), {}, []
    for method in methods:
        control = trust_region_control(plan, method)
        if control is None:
            raise ValueError(f"--match-methods {method!r} has no trust-region-matched control among --objectives {list(plan.labels)}")
        probe = dataclasses.replace(plan, labels=(), seeds=seeds, out=plan.out / "calibration", step_matched=(), calibrations=())

        def evaluate(label: str, probe=probe) -> float:
            probe = dataclasses.replace(probe, labels=(label,), baseline=label)
            return calibration_value(label, run_all(probe, jobs=jobs, progress=progress)[label], criterion, kappa)

        seed_set = f"seeds {seeds[0]}..{seeds[-1]}"
        cal = calibrate(method, control, criterion, lr0=lr0, evaluate=evaluate, seed_set=seed_set, max_evals=5, rtol=0.02)
        calibrations.append(cal)
        if cal.lr == (parse_run_label(control).lr or lr0):
            continue  # the control itself takes the method's step: its trust-region pair is also the step-matched one
        matched[cal.label] = ",".join([*filter(None, matched.get(cal.label, "").split(",")), method])
        if cal.label not in labels:
            labels.append(cal.label)
    plan = dataclasses.replace(plan, labels=tuple(labels), step_matched=tuple(matched.items()), calibrations=tuple(calibrations))
    doc = {k: v for k, v in document(plan, {}).items() if k in ("step_matched", "calibrations")}
    plan.out.mkdir(parents=True, exist_ok=True)
    write_text_atomic(plan.out / CALIBRATION_FILE, json.dumps(doc, indent=2) + "\n")
    return plan


def calibrated_plan(plan: Plan, path: Path) -> Plan:
    """``plan`` with the step-size-matched controls of an earlier comparison (its compare.json, or its calibration.json
    as soon as they were calibrated): the same controls on a second seed set, so the two sets compare the same
    experiment."""
    try:
        doc = json.loads(Path(path).read_text(encoding="utf-8"))
        cals = tuple(Calibration.from_dict({k: v for k, v in c.items() if k != "sentence"}) for c in doc["calibrations"])
        step_matched = tuple((str(k), str(v)) for k, v in doc["step_matched"].items())
    except (OSError, UnicodeDecodeError, json.JSONDecodeError, KeyError, TypeError) as err:
        raise ValueError(f"--calibration-from {path}: not the compare.json of a comparison with --match-step ({err})") from None
    if not cals:
        raise ValueError(f"--calibration-from {path}: that comparison calibrated no step-size-matched control")
    labels = tuple(dict.fromkeys([*plan.labels, *(c for c, _ in step_matched)]))
    plan = with_update_norm(plan, cals[0].criterion if cals else "steps")
    return dataclasses.replace(plan, labels=labels, step_matched=step_matched, calibrations=cals)


def compare(plan: Plan, *, jobs: int = 1, progress=None, warn=None, every_s: float = PROGRESS_EVERY_S) -> Path:
    """Train every (label, seed) run (``jobs`` at a time; ``progress``, default stdout, gets a line as each ends and
    every ``every_s`` seconds while one trains), then write OUT/compare.md, compare.json, compare.png, curves.png,
    per_seed.csv and records.json; each warning goes to ``warn`` (default: stderr) and into compare.md."""
    warn = warn or (lambda text: print(text, file=sys.stderr))
    progress = progress or print_line
    records = run_all(plan, jobs=jobs, progress=progress, every_s=every_s)
    curves = {label: {str(s): read_curve(run_dir(plan, label, s)) for s in plan.seeds} for label in plan.labels}
    doc = {**document(plan, records), "cost": experiment_cost(plan), "curves": curves}
    plan.out.mkdir(parents=True, exist_ok=True)
    warnings = warnings_for(records)
    for text in warnings:
        warn(text)
    plot_differences(doc, plan.out / "compare.png")
    plot_curves(doc, plan.out / "curves.png")
    lines = [*render_compare(doc, warnings=warnings), "![paired differences](compare.png)", "", "![curves per outcome](curves.png)"]
    write_text_atomic(plan.out / "per_seed.csv", per_seed_csv(records))
    write_text_atomic(plan.out / "records.json", json.dumps(doc["records"], indent=2))
    write_text_atomic(plan.out / "compare.json", json.dumps(doc, indent=2) + "\n")
    path = plan.out / "compare.md"
    write_text_atomic(path, "\n".join(lines) + "\n")
    return path
