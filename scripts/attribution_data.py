"""Store what the attribution experiments measured, small and diffable: docs/attribution/data/NAME.json.

    python scripts/attribution_data.py            # after running every command of EXPERIMENTS (runs/ is not committed)
    python scripts/attribution_data.py --print    # the commands, one per line, in the order to run them

Each experiment ran on two disjoint seed sets (a discovery set and a confirmation set); its evidence file holds,
for each set, the command that produced it and what the tables are rendered from: a toy run's config and per-seed
summary (every label, every column, which seeds reached kappa), a toy sweep's rows (per-seed values at each knob
value), a comparison's compare.json. Numbers are kept to 6 significant digits; every table, verdict and sentence
of docs/attribution.md and of README's "What we found" is computed from these files (scripts/attribution_page.py,
dfpo.core.findings), so tests check them without re-running anything. The figures are copied from the runs.
"""

from __future__ import annotations

import argparse
import json
import math
import shlex
import shutil
import subprocess
import sys
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path

from dfpo.core.files import read_utf8, write_text_atomic
from dfpo.core.findings import REGISTERED_KIND

ROOT = Path(__file__).resolve().parents[1]
RUNS = ROOT / "runs"
DATA = ROOT / "docs" / "attribution" / "data"
FIGURES = ROOT / "docs" / "attribution"

RESIDUAL = "gspo,dfpo_min,gspo_noclip,dfpo_min:stopgrad=score,dfpo_min:stopgrad=score:length_aware=true"
LLM = "gspo,dfpo_min,gspo_noclip,dfpo_min:stopgrad=score"
LLM_SETS = "--config configs/tiny-cpu.toml --set eval.k=16 --set eval.every=50 --jobs 1"
SMOLLM2 = "grpo,gspo,gspo_noclip,dfpo_min,dfpo_min:stopgrad=score,dfpo_min:stopgrad=score:length_aware=true"
SMOLLM2_SETS = (
    "--config configs/smollm2-cpu.toml --baseline gspo --seeds 8 --set train.steps=12 --set optim.lr=1e-5 "
    "--set rollout.max_new_tokens=16 --set eval.every=12 --set train.save_every=0 --set train.save_final=false --set threads=1"
)
"""The real model's experiment: every cell (label, seed) trains configs/smollm2-cpu.toml once, shortened to fit about
6 hours of the 2-core machine (12 steps at lr 1e-5 with 16 new tokens: one such grpo run, seed 5000, went from 0.19
train reward at step 1 to 0.81-0.88 at steps 11-16 at 11-14 s a step on idle cores; at one thread beside other work
the first attempt's 22 cells took 250 to 316 s each, so about 100 cells (two sets of 6 labels x 8 seeds and the
calibration) take about 7 hours, more for each step-matched control that the calibration adds), and keeps no checkpoint (dfpo compare skips a cell whose summary.json exists, so the
experiment can be spread over several days); the step-size-matched controls of the two Min-Replace forms without a
trust region are calibrated on 2 calibration seeds of the discovery set and reused on the confirmation set, on the
update norm per step: in 12 steps no run's 10-step mean reward reaches kappa, so steps to kappa would match a
censored value to a censored value (the first attempt did: none of its 22 cells reached it, and it "matched" at the control's own learning rate). One torch thread a cell: with two, a cell on the shared 2-core
machine slowed 10 to 15 times whenever anything else ran there (OpenMP threads spinning against another process's;
a 32 x 32-token rollout of this model took 24 to 119 CPU seconds beside one other 2-thread process, 5.6 s alone), so
one thread keeps a cell near its own pace and leaves the other core to other work."""


@dataclass(frozen=True)
class Experiment:
    """One experiment: its kind of evidence, how the page names it, and the run folder and command of each seed set."""

    kind: str
    title: str
    discovery: tuple[str, str]
    confirmation: tuple[str, str]
    figure: tuple[str, str] | None = None
    """(file under runs/, name under docs/attribution/)."""
    machine: str = ""
    """Where its cells ran, declared here for cells whose code predates ``dfpo train`` recording it (their cost
    paragraph says "not recorded"); the page shows it beside that paragraph, named as declared."""


def _toy(
    name: str, args: str, disc: str = "--seeds 16 --seed 2", conf: str = "--seeds 32 --seed 3"
) -> tuple[tuple[str, str], tuple[str, str]]:
    first = f"dfpo toy {args} {disc} --out runs/{name}"
    second = f"dfpo toy {args} {conf} --discovery runs/{name} --out runs/{name}-seed3"
    return (f"{name}", first), (f"{name}-seed3", second)


EXPERIMENTS: dict[str, Experiment] = {
    "toy-residual-family": Experiment(
        "toy-run",
        "In the toy's family task",
        *_toy("toy-residual-family", f"run --task family --objectives {RESIDUAL} --steps 300 --match-step steps"),
        ("toy-residual-family-seed3/overview.png", "toy-residual-family.png"),
    ),
    "toy-ablate-family": Experiment(
        "toy-run",
        "In the toy's family task (standard ablation)",
        *_toy("toy-ablate-family", "ablate --task family --steps 300 --match-step steps"),
        ("toy-ablate-family-seed3/overview.png", "toy-ablate-family.png"),
    ),
    "toy-ablate-tenplusten": Experiment(
        "toy-run",
        "In the toy's tenplusten task (standard ablation)",
        *_toy("toy-ablate-tenplusten", "ablate --task tenplusten --steps 300 --match-step steps"),
        ("toy-ablate-tenplusten-seed3/overview.png", "toy-ablate-tenplusten.png"),
    ),
    "toy-spread-lr-family": Experiment(
        "toy-spread",
        "In the toy's family task (SGD, K = 8)",
        *_toy("toy-spread-lr-family", "spread --task family --knob lr --values 0.1,0.3,1,3 -K 8 --steps 200"),
        ("toy-spread-lr-family-seed3/spread.png", "toy-spread-lr-family.png"),
    ),
    "toy-spread-k-family-adam": Experiment(
        "toy-spread",
        "In the toy's family task (Adam, lr 0.05)",
        *_toy(
            "toy-spread-k-family-adam", "spread --task family --optimizer adam --lr 0.05 --knob inner_steps --values 1,2,4,8,16 --steps 200"
        ),
        ("toy-spread-k-family-adam-seed3/spread.png", "toy-spread-k-family-adam.png"),
    ),
    "toy-spread-k": Experiment(
        "toy-spread",
        "In the toy's tenplusten task (SGD, lr 0.5)",
        *_toy("toy-spread-k", "spread --task tenplusten --knob inner_steps --values 1,2,4,8,16 --steps 200"),
        ("toy-spread-k-seed3/spread.png", "toy-spread-k-tenplusten.png"),
    ),
    "llm": Experiment(
        "compare",
        "On the tiny LLM",
        ("llm-discovery", f"dfpo compare --objectives {LLM} --seeds 16 --first-seed 2000 {LLM_SETS} --out runs/llm-discovery"),
        ("llm-confirmation", f"dfpo compare --objectives {LLM} --seeds 24 --first-seed 3000 {LLM_SETS} --out runs/llm-confirmation"),
        ("llm-confirmation/compare.png", "llm.png"),
    ),
    "smollm2": Experiment(
        "compare",
        "On SmolLM2-135M-Instruct (sum task, CPU)",
        (
            "smollm2-discovery",
            f"dfpo compare --objectives {SMOLLM2} {SMOLLM2_SETS} --first-seed 5000 --match-step update --calibration-seeds 2 "
            "--match-methods dfpo_min:stopgrad=score,dfpo_min:stopgrad=score:length_aware=true --out runs/smollm2-discovery",
        ),
        (
            "smollm2-confirmation",
            f"dfpo compare --objectives {SMOLLM2} {SMOLLM2_SETS} --first-seed 6000 "
            "--calibration-from runs/smollm2-discovery/calibration.json --out runs/smollm2-confirmation",
        ),
        ("smollm2-confirmation/compare.png", "smollm2.png"),
        machine="2-core AMD EPYC, 23.5 GiB (the CPU machine of this project, shared with other work; one torch thread a cell)",
    ),
}


def rounded(value):
    """``value`` with every float kept to 6 significant digits (JSON: infinities and NaN become None)."""
    if isinstance(value, float):
        return float(f"{value:.6g}") if math.isfinite(value) else None
    if isinstance(value, dict):
        return {k: rounded(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [rounded(v) for v in value]
    return value


def toy_run_set(folder: Path, command: str) -> dict:
    from dfpo.toy.checks import control_kinds
    from dfpo.toy.folder import read_config
    from dfpo.toy.report import read_metrics, summarise

    config, raw = read_config(folder)
    summary = summarise(read_metrics(folder), config.kappa)
    config_dict = {k: v for k, v in raw.items() if k not in ("task_shape", "wall_time_s", "calibrations")}
    return {
        "command": command,
        "seed_set": f"--seed {config.seed}, {config.seeds} seeds",
        "config": config_dict,
        "summary": {
            label: {k: [bool(x) if k == "reached" else float(x) for x in v] for k, v in row.items()} for label, row in summary.items()
        },
        "wall_time_s": raw.get("wall_time_s"),
        "calibrations": raw.get("calibrations", []),
        "controls": control_kinds(config.objectives, config),
    }


def toy_spread_set(folder: Path, command: str) -> dict:
    setup = json.loads(read_utf8(folder / "config.json"))
    rows = json.loads(read_utf8(folder / "spread.json"))
    return {
        "command": command,
        "seed_set": f"--seed {setup['config']['seed']}, {setup['config']['seeds']} seeds",
        "setup": setup,
        "rows": rows,
    }


def compare_set(folder: Path, command: str) -> dict:
    """compare.json of the comparison, written again by its own command (every run is done: nothing trains)."""
    argv = shlex.split(command)[1:]
    out = subprocess.run([sys.executable, "-m", "dfpo", *argv], cwd=ROOT, capture_output=True, text=True)
    if out.returncode != 0:
        raise SystemExit(f"attribution_data: {command} failed: {out.stderr.strip().splitlines()[-1:]}")
    doc = json.loads(read_utf8(folder / "compare.json"))
    seeds = doc["seeds"]
    return {"command": command, "seed_set": f"seeds {seeds[0]}..{seeds[-1]}, {len(seeds)} seeds", "doc": doc, "controls": doc["controls"]}


READERS = {"toy-run": toy_run_set, "toy-spread": toy_spread_set, "compare": compare_set}
REGISTERED = ROOT / "docs" / "attribution" / "registered"
"""Experiments registered before their data (dfpo.core.registration): NAME.toml holds the seed sets, the command and
the rows; ``--registered NAME`` stores docs/attribution/data/NAME.json from the sets' compare.json."""


def mark_created(mark: Path) -> datetime:
    """When a cell started: its run mark's ``created`` (written before the cell's first step; kept when the folder is
    copied), else the mark file's modification time."""
    try:
        created = json.loads(read_utf8(mark)).get("created")
        return datetime.fromisoformat(created)
    except (ValueError, TypeError, AttributeError):
        return datetime.fromtimestamp(mark.stat().st_mtime, tz=UTC)


def data_started(folders: list[Path]) -> datetime:
    """When the first cell of these comparison folders started: the oldest run mark (.dfpo-run.json) under any of them."""
    from dfpo.trainer.run.layout import RunDir

    marks = [mark_created(m) for f in folders for m in f.rglob(RunDir.MARK)]
    if not marks:
        raise SystemExit(f"attribution_data: no cell has started under {', '.join(map(str, folders))}")
    return min(marks)


def control_gates(reg, folder: Path, seeds: list[int]) -> list[dict]:
    """The pilot's four gates on each control cell of one seed set (the objective its stored pilot trained), read from
    the cells' logs (``dfpo.trainer.pilot.gates_over_cells``)."""
    from dfpo.trainer.compare import label_folder
    from dfpo.trainer.pilot import gates_over_cells, read_pilot
    from dfpo.trainer.run.layout import RunDir
    from dfpo.trainer.run.logs import JsonlLog

    control = label_folder(read_pilot(ROOT / reg.pilot)["objective"])
    runs = [RunDir(folder / control / f"seed{seed}") for seed in seeds]
    return gates_over_cells([(JsonlLog.read(run.evals), JsonlLog.read(run.metrics)) for run in runs])


def registered_evidence(name: str) -> dict:
    """A registered experiment's stored tables, naming the commit that registered it and when its data began."""
    from dfpo.core.registration import read_registration, row_status

    path = REGISTERED / f"{name}.toml"
    reg = read_registration(path)
    folders = [RUNS / s.name for s in reg.sets]
    missing = [f"{c}" for f, c in zip(folders, reg.commands(), strict=True) if not (f / "compare.json").is_file()]
    if missing:
        raise SystemExit(f"attribution_data: {name}: run first: {' ; '.join(missing)}")
    started = data_started(folders)
    status = row_status(path.relative_to(ROOT), ROOT, started)
    sets = {s.name: compare_set(f, c) for s, f, c in zip(reg.sets, folders, reg.commands(), strict=True)}
    gates = {s.name: control_gates(reg, f, s.seed_list()) for s, f in zip(reg.sets, folders, strict=True)} if reg.pilot else {}
    return rounded(
        {
            "name": name,
            "kind": REGISTERED_KIND,
            "title": reg.title,
            "machine": reg.machine,
            "registration": str(path.relative_to(ROOT)),
            "registering_commit": status.registering_commit,
            "registered_at": status.registered_at.isoformat(),
            "data_started": started.isoformat(),
            "registered_rows": sorted(list(k) for k in status.registered),
            "sets": sets,
            **({"gates": gates} if gates else {}),
        }
    )


def evidence(name: str, exp: Experiment) -> dict:
    sets = {}
    for which, (folder, command) in (("discovery", exp.discovery), ("confirmation", exp.confirmation)):
        sets[which] = READERS[exp.kind](RUNS / folder, command)
    declared = {"machine": exp.machine} if exp.machine else {}
    return rounded({"name": name, "kind": exp.kind, "title": exp.title, **declared, "sets": sets})


def dumps(value, depth: int = 0) -> str:
    """JSON with every list of numbers (a column over seeds) on one line: a changed number changes one line."""
    pad, inner = " " * depth, " " * (depth + 1)
    if isinstance(value, dict) and value:
        return "{\n" + ",\n".join(f"{inner}{json.dumps(k)}: {dumps(v, depth + 1)}" for k, v in value.items()) + f"\n{pad}}}"
    if isinstance(value, list) and any(isinstance(v, (dict, list)) for v in value):
        return "[\n" + ",\n".join(inner + dumps(v, depth + 1) for v in value) + f"\n{pad}]"
    return json.dumps(value)


def write_json(path: Path, doc: dict) -> None:
    write_text_atomic(path, dumps(doc) + "\n")


def curves_figure(name: str, which: str) -> Path:
    """Where a comparison's curves per outcome of one seed set are drawn (docs/attribution/NAME-WHICH-curves.png)."""
    return FIGURES / f"{name}-{which}-curves.png"


def draw_curves(stored: dict) -> None:
    """Each seed set's curves per outcome of a comparison, drawn from the stored evidence (not from runs/), where
    its compare.json kept them."""
    from dfpo.trainer.compare_report import plot_curves

    for which, data in stored["sets"].items():
        if stored["kind"] == "compare" and data["doc"].get("curves"):
            plot_curves(data["doc"], curves_figure(stored["name"], which))


def rows_figure(name: str) -> Path:
    """Where a registered experiment's per-row picture is drawn (docs/attribution/NAME-rows.png)."""
    return FIGURES / f"{name}-rows.png"


def draw_registered(name: str, stored: dict) -> None:
    """A registered experiment's pictures, from its stored tables: one panel per registered row (each outcome's paired
    differences on every set, ``dfpo.trainer.registered_figure``), and each seed set's curves per outcome (compare.CURVES, where its cells logged them)."""
    from dfpo.core.findings import METRICS
    from dfpo.core.registration import read_registration
    from dfpo.trainer.compare_report import plot_curves
    from dfpo.trainer.registered_figure import plot_registered

    plot_registered(read_registration(REGISTERED / f"{name}.toml"), stored, METRICS, rows_figure(name))
    for which, data in stored["sets"].items():
        if data["doc"].get("curves"):
            plot_curves(data["doc"], curves_figure(name, which))


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--print", action="store_true", help="print the commands to run, in order, and exit")
    parser.add_argument("--only", nargs="*", default=None, help="experiments to store (default: all)")
    parser.add_argument("--registered", default=None, help="store one registered experiment (docs/attribution/registered/NAME.toml)")
    args = parser.parse_args()
    if args.registered:
        stored = registered_evidence(args.registered)
        write_json(DATA / f"{args.registered}.json", stored)
        draw_registered(args.registered, stored)
        print(f"wrote docs/attribution/data/{args.registered}.json")
        return 0
    if args.print:
        for exp in EXPERIMENTS.values():
            print(exp.discovery[1])
            print(exp.confirmation[1])
        return 0
    names = args.only or list(EXPERIMENTS)
    missing = [
        f"runs/{folder}"
        for n in names
        for folder, _ in (EXPERIMENTS[n].discovery, EXPERIMENTS[n].confirmation)
        if not (RUNS / folder).is_dir()
    ]
    if missing:
        print(f"attribution_data: run these commands first (missing {', '.join(missing)}); see --print", file=sys.stderr)
        return 2
    DATA.mkdir(parents=True, exist_ok=True)
    for name in names:
        exp = EXPERIMENTS[name]
        stored = evidence(name, exp)
        write_json(DATA / f"{name}.json", stored)
        if exp.figure and (RUNS / exp.figure[0]).is_file():
            shutil.copyfile(RUNS / exp.figure[0], FIGURES / exp.figure[1])
        draw_curves(stored)
        print(f"wrote docs/attribution/data/{name}.json")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
