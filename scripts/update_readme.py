"""Regenerate the generated blocks of README.md and docs/*.md from the code (never hand-type them).

    python scripts/update_readme.py          # rewrite the files in place
    python scripts/update_readme.py --check  # exit 1 if a block is stale (tests/test_readme.py)

A block sits between `<!-- BEGIN generated:NAME -->` and `<!-- END generated:NAME -->`.

    python scripts/update_readme.py --store-run runs/smollm2-grpo-s0 --idle-steps 21-50 --machine-note "shared with other work"

stores what README's and docs/trainer.md's sentences about that run say (``RUN_TABLE``), read from its run folder;
the blocks ``smollm2_run`` and ``smollm2_table`` are then generated from the stored file, never from the run folder
(``runs/`` is not in the repository).
"""

from __future__ import annotations

import argparse
import functools
import json
import math
import pathlib
import re
import shlex
import statistics
import sys
import tomllib

from dfpo.app.pages import screenshot_gallery
from dfpo.commands import (
    atlas_table,
    cancellation_demo,
    components_table,
    config_reference,
    correction_table,
    estimators_table,
    objectives_table,
    param_atlas_block,
)
from dfpo.core.files import write_text_atomic
from dfpo.core.findings import METRICS, read_ledger, summaries, summary_markdown
from dfpo.core.metric_registry import markdown_table
from dfpo.core.registration import registered_sentences
from dfpo.theory.ledger import count_line, render_markdown, run_ledger
from dfpo.trainer.config import config_to_dict, load_config
from dfpo.trainer.probe.findings import REAL_MODEL, findings_block, real_model_block
from dfpo.trainer.run.machine import machine_line

ROOT = pathlib.Path(__file__).resolve().parents[1]
README = ROOT / "README.md"


def _objectives() -> str:
    table = objectives_table(markdown=True).split("\n\n")[0]
    return table


def _demo() -> str:
    return "```text\n" + cancellation_demo() + "\n```"


@functools.cache
def _claims():
    return tuple(run_ledger())  # about half a minute: once per call of this script


def _ledger_document() -> str:
    return render_markdown(_claims())


def _atlas() -> str:
    return atlas_table(markdown=True, own_aggregation=True)


def _corrections() -> str:
    return correction_table(markdown=True)


def _components() -> str:
    return components_table(markdown=True)


def _estimators() -> str:
    return estimators_table(markdown=True)


def _ledger_count() -> str:
    return count_line(_claims())


def _findings() -> str:
    """README's "What we found": the findings ledger (docs/attribution/findings.toml) on its stored evidence."""
    findings, evidence = read_ledger(ROOT / "docs" / "attribution")
    summary = summaries(findings, evidence, "readme")
    sets = {name: (ev["sets"]["discovery"]["seed_set"], ev["sets"]["confirmation"]["seed_set"]) for name, ev in evidence.items()}
    parts = {
        "toy": next((v for k, v in sets.items() if k.startswith("toy-")), None),
        "tiny LLM": sets.get("llm"),
        "SmolLM2-135M-Instruct": sets.get("smollm2"),
    }
    where = "; ".join(
        f"{what}: discovery {pair[0]}, confirmation {pair[1]}" if pair else f"{what}: none stored in this version"
        for what, pair in parts.items()
    )
    sentences = registered_sentences(ROOT, METRICS)
    registered = " ".join(sentences) + "\n\n" if sentences else ""
    return (
        registered + "Generated from the findings ledger ([docs/attribution/findings.toml](docs/attribution/findings.toml)) on the tables "
        f"stored in docs/attribution/data/ ({where}); the tables and the commands that printed them are in "
        "[docs/attribution.md](docs/attribution.md). " + summary_markdown(summary)
    )


def _config() -> str:
    return config_reference()


def _metrics() -> str:
    return markdown_table()


def _probe_findings() -> str:
    return findings_block(ROOT / "docs" / "probe")


RUN_TABLE = ROOT / "docs" / "trainer" / "smollm2-grpo-seed0.json"
"""One measured run of configs/smollm2-cpu.toml (GRPO, seed 0), stored by ``--store-run`` (``store_run``): what
README's SmolLM2 paragraph (block ``smollm2_run``) and docs/trainer.md's table of that run (``smollm2_table``) are
generated from."""
BASE_CONFIG = "configs/smollm2-cpu.toml"
STEP_KEYS = (
    "reward/mean",
    "entropy/rollout",
    "forms/equation",
    "forms/number",
    "diag/shared_events",
    "diag/shared_positions",
    "time/step_s",
    "time/rollout_s",
    "time/update_s",
)
"""What is stored of each line of the run's metrics.jsonl, besides its step (docs/metrics.md says what each holds)."""
SUMMARY_KEYS = (
    "kappa",
    "reward/steps_to_kappa",
    "reward/steps_to_kappa_ma10",
    "wall_s_start_up",
    "wall_s_process",
    "cpu_s_process",
)
"""What is stored of the run's summary.json (``dfpo train --help`` says what each holds)."""
MAIN_JOB_S = 180
"""The main job's budget in seconds (README: "10 steps ... in the main job's 3 minutes")."""
_PROSE = re.compile(r"[A-Za-z0-9 ,.;:()+/%-]{1,200}")
"""Text rendered as prose (the machine line): letters, digits and plain punctuation, nothing markdown or HTML reads."""
_CODE = re.compile(r"[A-Za-z0-9 ,.:/=_@'+-]{1,600}")
"""Text rendered inside a code span (the command, the run folder): no backtick, bar, angle bracket or newline."""
_DATE = re.compile(r"\d{4}-\d{2}-\d{2}T\d{2}:\d{2}:\d{2}[+-]\d{4}")


def _shown(path: pathlib.Path) -> str:
    """``path`` relative to the repository when it lies inside it."""
    return (path.relative_to(ROOT) if path.is_relative_to(ROOT) else path).as_posix()


def _jsonl(path: pathlib.Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def _field(row: dict, key: str, where: str):
    if key not in row:
        raise ValueError(f"{where} has no {key!r}; --store-run takes a finished run of {BASE_CONFIG} (the sum task)")
    return row[key]


def _flat(tree: dict, prefix: str = "") -> dict:
    out = {}
    for key, value in tree.items():
        out |= _flat(value, f"{prefix}{key}.") if isinstance(value, dict) else {f"{prefix}{key}": value}
    return out


def _setting(key: str, value) -> str:
    """``--set key=value`` for one config value, quoted as one shell word."""
    text = ("true" if value else "false") if isinstance(value, bool) else value if isinstance(value, str) else json.dumps(value)
    return "--set " + shlex.quote(f"{key}={text}")


def run_command(run_config: pathlib.Path, base: str = BASE_CONFIG) -> str:
    """A ``dfpo train`` command whose resolved config is the run's config.toml: ``base`` and, as --set, every key
    where the two resolve differently (the run folder keeps the config, not the command line it was started with)."""
    base_keys = _flat(config_to_dict(load_config(ROOT / base)))
    run_keys = _flat(config_to_dict(load_config(run_config)))
    sets = [_setting(key, value) for key, value in run_keys.items() if base_keys.get(key) != value]
    return " ".join(["dfpo train --config", base, *sets])


def this_machine(note: str, summary: dict) -> str:
    """The machine the run recorded in its summary.json (``dfpo.trainer.run.machine.machine_line``; a run older than
    that record: the machine this runs on), then ``note``."""
    recorded = summary.get("machine")
    line = recorded if isinstance(recorded, str) and recorded else machine_line()
    return ", ".join([line] + ([note] if note else []))


def store_run(folder: pathlib.Path, idle_steps: tuple[int, int], note: str) -> dict:
    """The stored table of one finished run folder: its per-step ``STEP_KEYS``, its evaluations (held-out avg@k and
    ``eval/tax_kl``), ``SUMMARY_KEYS``, when it started (.dfpo-run.json), a command that gives its config, its
    machine (``this_machine``) and ``idle_steps``: the steps the person storing it knows ran with the machine
    otherwise idle (a run folder cannot tell)."""
    config = tomllib.loads((folder / "config.toml").read_text())
    k = config["eval"]["k"]
    summary = json.loads((folder / "summary.json").read_text())
    metrics, evals = folder / "metrics.jsonl", folder / "eval.jsonl"
    run = _shown(folder.resolve())
    return {
        "about": "One dfpo train run, read from its run folder by the command in stored_by; README.md's SmolLM2 "
        "paragraph and docs/trainer.md's table of it are generated from this file (scripts/update_readme.py).",
        "stored_by": f"python scripts/update_readme.py --store-run {shlex.quote(run)} --idle-steps "
        f"{idle_steps[0]}-{idle_steps[1]} --machine-note {shlex.quote(note)}",
        "run": run,
        "created": json.loads((folder / ".dfpo-run.json").read_text())["created"],
        "command": run_command(folder / "config.toml"),
        "machine": this_machine(note, summary),
        "seed": config["seed"],
        "objective": config["objective"]["name"],
        "eval_k": k,
        "idle_steps": list(idle_steps),
        "summary": {key: _field(summary, key, f"{folder}/summary.json") for key in SUMMARY_KEYS},
        "steps": [{"step": row["step"]} | {key: _field(row, key, str(metrics)) for key in STEP_KEYS} for row in _jsonl(metrics)],
        "evals": [{key: _field(row, key, str(evals)) for key in ("step", f"eval/avg@{k}", "eval/tax_kl")} for row in _jsonl(evals)],
    }


def _bad(where: str, value, what: str) -> ValueError:
    return ValueError(f"{_shown(RUN_TABLE)}: {where} = {value!r:.60} is not {what}; re-make the file with the command in its stored_by")


def _number(where: str, value, none: bool = False):
    """``value`` when it is a finite number (an int or a float, not a bool; None too when ``none``)."""
    if value is None and none:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        raise _bad(where, value, "a finite number")
    return value


def _text(where: str, value, pattern: re.Pattern) -> str:
    if not isinstance(value, str) or not pattern.fullmatch(value):
        raise _bad(where, value, f"text of the form {pattern.pattern}")
    return value


def load_run_table(text: str) -> dict:
    """The stored run table, every figure checked to be a finite number and every text to be plain (``_PROSE``,
    ``_CODE``), so that nothing read from it renders as markup; ValueError of one sentence naming the bad field."""
    raw = json.loads(text)  # NaN and Infinity parse as floats and are refused by _number under their field's name
    if not isinstance(raw, dict):
        raise _bad("the file", raw, "a JSON object")
    k = _number("eval_k", raw.get("eval_k"))
    steps = raw.get("steps")
    if not isinstance(steps, list) or len(steps) < 6:
        raise _bad("steps", steps, "a list of 6 or more steps")
    idle = raw.get("idle_steps")
    if not isinstance(idle, list) or len(idle) != 2:
        raise _bad("idle_steps", idle, "[first, last]")
    return {
        "run": _text("run", raw.get("run"), _CODE),
        "command": _text("command", raw.get("command"), _CODE),
        "machine": _text("machine", raw.get("machine"), _PROSE),
        "date": _text("created", raw.get("created"), _DATE)[:10],
        "seed": _number("seed", raw.get("seed")),
        "eval_k": k,
        "idle_steps": [_number(f"idle_steps[{i}]", v) for i, v in enumerate(idle)],
        "summary": {
            key: _number(f"summary[{key!r}]", (raw.get("summary") or {}).get(key), none=key.startswith("reward/steps_to_kappa"))
            for key in SUMMARY_KEYS
        },
        "steps": [{key: _number(f"steps[{i}][{key!r}]", row.get(key)) for key in ("step", *STEP_KEYS)} for i, row in enumerate(steps)],
        "evals": [
            {key: _number(f"evals[{i}][{key!r}]", row.get(key)) for key in ("step", f"eval/avg@{k}", "eval/tax_kl")}
            for i, row in enumerate(raw.get("evals") or [])
        ],
    }


def _span(steps: list[int]) -> str:
    """'1-3' for consecutive steps, '0, 10, ..., 50' for more than three evenly spaced ones, else the list."""
    if len(steps) > 1 and steps == list(range(steps[0], steps[-1] + 1)):
        return f"{steps[0]}-{steps[-1]}"
    gaps = {b - a for a, b in zip(steps, steps[1:])}
    if len(steps) > 3 and len(gaps) == 1:
        return f"{steps[0]}, {steps[1]}, ..., {steps[-1]}"
    return ", ".join(str(s) for s in steps)


def _pct(x: float) -> str:
    return f"{100 * x:.0f}%"


def _pct_range(values: list[float]) -> str:
    low, high = _pct(min(values)), _pct(max(values))
    return low if low == high else f"{low[:-1]}-{high}"


def _tax(x: float) -> str:
    return "0" if x == 0 else f"{x:.3f}"


def _figures(t: dict) -> dict:
    """Every figure the generated sentences state, as text, from the loaded table ``t``."""
    steps, evals, summary, k = t["steps"], t["evals"], t["summary"], t["eval_k"]
    first, last = steps[0], steps[-1]
    lo, hi = t["idle_steps"]
    idle = [s for s in steps if lo <= s["step"] <= hi]
    busy = [s for s in steps if not lo <= s["step"] <= hi]
    head, tail = steps[:3], steps[-3:]
    median = {key: statistics.median(s[key] for s in idle) for key in ("time/step_s", "time/rollout_s", "time/update_s")}
    ten_steps = summary["wall_s_start_up"] + 10 * median["time/step_s"]
    ma10 = summary["reward/steps_to_kappa_ma10"]
    whole_zero = sum(s["diag/shared_positions"] == 0 for s in steps)
    number_zero = sum(s["forms/number"] == 0 for s in steps)
    return {
        "seed": f"{t['seed']}",
        "k": f"{k}",
        "kappa": f"{summary['kappa']:g}",
        "first_step": f"{first['step']}",
        "last_step": f"{last['step']}",
        "n_steps": f"{len(steps)}",
        "reward_first": f"{first['reward/mean']:.2f}",
        "reward_last": f"{last['reward/mean']:.2f}",
        "ma10": f"reached {summary['kappa']:g} at step {ma10}" if ma10 is not None else f"did not reach {summary['kappa']:g}",
        "eval_steps": _span([e["step"] for e in evals]),
        "eval_step_list": ", ".join(f"{e['step']}" for e in evals),
        "avg": ", ".join(f"{e[f'eval/avg@{k}']:.2f}" for e in evals),
        "tax": ", ".join(_tax(e["eval/tax_kl"]) for e in evals),
        "head": _span([s["step"] for s in head]),
        "tail": _span([s["step"] for s in tail]),
        "entropy_head": ", ".join(f"{s['entropy/rollout']:.2f}" for s in head),
        "entropy_tail": ", ".join(f"{s['entropy/rollout']:.2f}" for s in tail),
        "eq_head": ", ".join(_pct(s["forms/equation"]) for s in head),
        "eq_tail": ", ".join(_pct(s["forms/equation"]) for s in tail),
        "eq_head_range": _pct_range([s["forms/equation"] for s in head]),
        "eq_tail_range": _pct_range([s["forms/equation"] for s in tail]),
        "number_zero": f"{number_zero}",
        "number_max": _pct(max(s["forms/number"] for s in steps)),
        "events_median": f"{statistics.median(s['diag/shared_events'] for s in steps):g}",
        "whole_zero": f"{whole_zero}",
        "whole_median": f"{statistics.median(s['diag/shared_positions'] for s in steps):g}",
        "idle": _span([s["step"] for s in idle]),
        "busy": _span([s["step"] for s in busy]),
        "busy_range": f"{min(s['time/step_s'] for s in busy):.0f} to {max(s['time/step_s'] for s in busy):.0f}" if busy else "",
        "step_s": f"{median['time/step_s']:.1f}",
        "rollout_s": f"{median['time/rollout_s']:.1f}",
        "update_s": f"{median['time/update_s']:.1f}",
        "step1": f"{first['time/step_s']:.1f} s (rollout {first['time/rollout_s']:.1f}, update {first['time/update_s']:.1f})",
        "start_up": f"{summary['wall_s_start_up']:.0f}",
        "fit": "do not fit" if ten_steps > MAIN_JOB_S else f"fit only if their evaluations take less than {MAIN_JOB_S - ten_steps:.0f} s",
        "wall": f"{summary['wall_s_process']:.0f}",
        "cpu": f"{summary['cpu_s_process']:.0f}",
    }


def _idle_steps(text: str | None) -> tuple[int, int]:
    found = re.fullmatch(r"(\d+)-(\d+)", text or "")
    if not found or int(found[1]) > int(found[2]):
        raise ValueError(f"--idle-steps {text!r} is not FIRST-LAST (e.g. 21-50); name the steps that ran with the machine otherwise idle")
    return int(found[1]), int(found[2])


def _stored_text(folder: pathlib.Path, idle_steps: str | None, note: str) -> str:
    """The stored table of ``folder`` as JSON text, checked as the generator will read it (``load_run_table``)."""
    table = store_run(folder, _idle_steps(idle_steps), note)
    text = json.dumps(table, indent=1, allow_nan=False) + "\n"
    _figures(load_run_table(text))
    return text


def _read_table(path: pathlib.Path) -> dict:
    if not path.is_file():
        raise ValueError(
            f"no stored run table {path}: store one with python scripts/update_readme.py --store-run RUN_DIR --idle-steps FIRST-LAST"
        )
    return load_run_table(path.read_text())


def smollm2_run(path: pathlib.Path = RUN_TABLE) -> str:
    """README's SmolLM2 paragraph, its figures from the stored run table."""
    t = _read_table(path)
    f = _figures(t)
    return (
        'It trains GRPO on "What is a + b? Answer with just the number." (a, b in 0..9, last-integer reward). '
        f"One run (seed {f['seed']}, {t['date']}, {t['machine']}): train reward {f['reward_first']} at step "
        f"{f['first_step']}, {f['reward_last']} at step {f['last_step']} (its 10-step mean {f['ma10']}); held-out "
        f"avg@{f['k']} {f['avg']} at steps {f['eval_steps']}; the correct answers drifted to one form "
        f'("3 + 4 = 7": {f["eq_head_range"]} of completions at steps {f["head"]}, {f["eq_tail_range"]} at steps '
        f"{f['tail']}). A step took {f['step_s']} s with the cores otherwise idle (median of steps {f['idle']}), after "
        f"{f['start_up']} s of start-up, so 10 steps and their evaluations {f['fit']} in the main job's 3 minutes. "
        "[docs/trainer.md](docs/trainer.md#a-real-model-offline) has memory, LoRA and the conversion; these figures "
        f"are generated from the run's stored table, [{_shown(RUN_TABLE)}]({_shown(RUN_TABLE)})."
    )


def smollm2_table(path: pathlib.Path = RUN_TABLE) -> str:
    """docs/trainer.md's table of the stored SmolLM2 run."""
    t = _read_table(path)
    f = _figures(t)
    busy = f"; steps {f['busy']} ran beside other work, {f['busy_range']} s" if f["busy"] else ""
    rows = [
        (
            f"train reward, step {f['first_step']} -> step {f['last_step']}",
            f"{f['reward_first']} -> {f['reward_last']}; its 10-step mean {f['ma10']} (`reward/steps_to_kappa_ma10`)",
        ),
        (f"held-out avg@{f['k']} at steps {f['eval_step_list']}", f["avg"]),
        (
            f"{METRICS['tax_kl'].split(' (')[0]} `eval/tax_kl` (KL at the eval prompts' own positions, which never get a gradient) at the same steps",
            f["tax"],
        ),
        (f"rollout entropy, steps {f['head']} -> {f['tail']}", f"{f['entropy_head']} -> {f['entropy_tail']}"),
        (
            f'share of the "a + b = c" form, steps {f["head"]} -> {f["tail"]}',
            f"{f['eq_head']} -> {f['eq_tail']} (`forms/equation`; the bare number, `forms/number`: 0% on "
            f"{f['number_zero']} of {f['n_steps']} steps, at most {f['number_max']})",
        ),
        (
            "`diag/shared_events` a step",
            f"median {f['events_median']} (the whole-group rule, `diag/shared_positions`: median {f['whole_median']}, "
            f"0 on {f['whole_zero']} of {f['n_steps']} steps)",
        ),
        (
            "seconds a step, machine otherwise idle",
            f"{f['step_s']} (median of steps {f['idle']}: rollout {f['rollout_s']}, update {f['update_s']}){busy}",
        ),
        (f"step {f['first_step']}", f["step1"]),
        (
            "whole run",
            f"{f['wall']} s wall ({f['start_up']} s of it start-up), {f['cpu']} s CPU (`summary.json`: `wall_s_process`, "
            "`cpu_s_process`, `wall_s_start_up`)",
        ),
    ]
    return "\n".join(
        [
            f"Measured here ({t['machine']}; `{t['run']}`, seed {f['seed']}, {t['date']}; stored in "
            f"[trainer/{RUN_TABLE.name}](trainer/{RUN_TABLE.name}), from which `scripts/update_readme.py` "
            "generates this table):",
            "",
            "| | figure |",
            "|---|---|",
            *(f"| {name} | {value} |" for name, value in rows),
            "",
            f"The run's config is what `{t['command']}` resolves to.",
        ]
    )


BLOCKS = {
    "objectives": _objectives,
    "components": _components,
    "estimators": _estimators,
    "demo": _demo,
    "atlas": _atlas,
    "corrections": _corrections,
    "ledger_count": _ledger_count,
    "findings": _findings,
    "metrics": _metrics,
    "config": _config,
    "probe_findings": _probe_findings,
    "param_atlas": param_atlas_block,
    "app_screenshots": screenshot_gallery,
    "smollm2_run": smollm2_run,
    "smollm2_table": smollm2_table,
    "smollm2_probe": lambda: real_model_block(ROOT / "docs" / "probe", f"figures/{REAL_MODEL}-drift.png"),
}
FILES = {
    README: ("findings", "ledger_count", "smollm2_run"),
    ROOT / "docs" / "loss.md": ("objectives", "components", "estimators"),
    ROOT / "docs" / "cancellation.md": ("demo", "atlas", "corrections", "param_atlas", "probe_findings"),
    ROOT / "docs" / "attribution.md": ("probe_findings",),
    ROOT / "docs" / "probe.md": ("probe_findings",),
    ROOT / "docs" / "metrics.md": ("metrics",),
    ROOT / "docs" / "config.md": ("config",),
    ROOT / "docs" / "app.md": ("app_screenshots",),
    ROOT / "docs" / "trainer.md": ("smollm2_table", "smollm2_probe"),
}
"""Each generated file and the blocks it must hold."""
WHOLE = {ROOT / "docs" / "ledger.md": _ledger_document}
"""Files generated whole (the ledger document is what `dfpo theory --markdown docs/ledger.md` writes)."""


def render(text: str, names=tuple(BLOCKS)) -> str:
    for name in names:
        make = BLOCKS[name]
        if f"<!-- BEGIN generated:{name} -->" not in text:
            raise ValueError(f"no generated block {name!r}")
        pattern = re.compile(rf"(<!-- BEGIN generated:{name} -->\n)(?:.*?\n)?(<!-- END generated:{name} -->)", re.S)
        if pattern.search(text):
            body = make()
            text = pattern.sub(lambda m, body=body: m.group(1) + body + "\n" + m.group(2), text)
    return text


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="exit 1 if a generated block is stale")
    parser.add_argument("--store-run", metavar="RUN_DIR", help=f"first store this finished run's table in {_shown(RUN_TABLE)}")
    parser.add_argument(
        "--idle-steps", metavar="FIRST-LAST", help="with --store-run: the steps that ran with the machine otherwise idle (e.g. 21-50)"
    )
    parser.add_argument("--machine-note", default="", help="with --store-run: words after the machine line (e.g. 'shared with other work')")
    args = parser.parse_args(argv)
    if args.store_run:
        try:
            RUN_TABLE.parent.mkdir(parents=True, exist_ok=True)
            write_text_atomic(RUN_TABLE, _stored_text(pathlib.Path(args.store_run), args.idle_steps, args.machine_note))
        except (OSError, KeyError, ValueError) as err:
            print(f"--store-run {args.store_run}: {err}", file=sys.stderr)
            return 2
    stale = []
    fresh_files = {path: render(path.read_text(), names) for path, names in FILES.items()}
    fresh_files.update({path: make() for path, make in WHOLE.items()})
    for path, fresh in fresh_files.items():
        current = path.read_text() if path.exists() else ""
        if fresh == current:
            continue
        if args.check:
            stale.append(_shown(path))
        else:
            write_text_atomic(path, fresh)
    if stale:
        print(f"stale generated blocks in {', '.join(stale)}: run python scripts/update_readme.py", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
