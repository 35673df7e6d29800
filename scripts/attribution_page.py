"""Render docs/attribution.md from its template, the stored evidence and the findings ledger (nothing is typed).

    python scripts/attribution_page.py            # write docs/attribution.md
    python scripts/attribution_page.py --check    # exit 1 if it is stale (tests/test_findings.py)

Placeholders of scripts/attribution.tmpl.md: {DEMO} (``dfpo demo``), {FINDINGS} (the findings ledger's summary:
its multiplicity note and one item per finding, ``dfpo.core.findings``), {EXPERIMENT:name} (the commands of an
experiment's two seed sets and the tables they printed, re-rendered from docs/attribution/data/name.json by the
same functions that print them: ``dfpo.toy.report.render_summary``, ``dfpo.toy.spread.render_spread``,
``dfpo.trainer.compare_report.render_compare``), {SEEDS:name:set} (a seed set as the command names it), {SIGN_SEEDS}
(the fewest seeds a sign-test interval needs at the findings' Bonferroni level), {REGISTERED} (every experiment
registered before its data: its rows, pilot and, once stored, its answer; ``registered_section``).
Store new evidence first with scripts/attribution_data.py.
"""

from __future__ import annotations

import argparse
import importlib.util
import math
import re
import sys
from pathlib import Path

from dfpo.commands import cancellation_demo
from dfpo.core import stats
from dfpo.core.files import write_text_atomic
from dfpo.core.findings import read_ledger, summaries, summary_markdown
from dfpo.trainer.probe.findings import findings_block, template_block

ROOT = Path(__file__).resolve().parents[1]
TEMPLATE = ROOT / "scripts" / "attribution.tmpl.md"
PAGE = ROOT / "docs" / "attribution.md"
LEDGER = ROOT / "docs" / "attribution"
FIGURES = {
    "toy-residual-family": "toy-residual-family.png",
    "toy-ablate-family": "toy-ablate-family.png",
    "toy-ablate-tenplusten": "toy-ablate-tenplusten.png",
    "toy-spread-lr-family": "toy-spread-lr-family.png",
    "toy-spread-k-family-adam": "toy-spread-k-family-adam.png",
    "toy-spread-k": "toy-spread-k-tenplusten.png",
    "llm": "llm.png",
    "smollm2": "smollm2.png",
}
"""The figure of each experiment under docs/attribution/ (copied from its confirmation run)."""


def demote(text: str) -> str:
    """Headings of a command's output three levels down, under the page's sections."""
    return re.sub(r"^(#+) ", lambda m: "#" * (len(m.group(1)) + 3) + " ", text, flags=re.M)


def commands(*lines: str) -> str:
    return "```text\n" + "\n".join(lines) + "\n```"


def figure(name: str) -> str:
    fig = FIGURES.get(name)
    return f"\n\n![{name}](attribution/{fig})" if fig and (LEDGER / fig).is_file() else ""


def _toy_tables(ev: dict) -> str:
    import numpy as np

    from dfpo.core.calibration import Calibration
    from dfpo.toy.folder import config_from_dict
    from dfpo.toy.report import render_summary

    def load(which):
        data = ev["sets"][which]
        summary = {label: {k: np.asarray(v) for k, v in row.items()} for label, row in data["summary"].items()}
        return config_from_dict(data["config"]), summary, data

    d_config, d_summary, _ = load("discovery")
    config, summary, data = load("confirmation")
    notes = [Calibration.from_dict(c).sentence() for c in data.get("calibrations", [])]
    if data.get("wall_time_s") is not None:
        notes.append(f"- Wall time of the training: {data['wall_time_s']:.1f} s (a shared 2-core CPU machine).")
    lines = render_summary(config, summary, discovery=(d_summary, d_config), notes=notes)
    return "Printed by the second command (the confirmation set, with the discovery set's verdicts):\n\n" + demote("\n".join(lines))


def _spread_tables(ev: dict) -> str:
    from dfpo.toy.spread import render_spread

    first, second = ev["sets"]["discovery"], ev["sets"]["confirmation"]
    a = render_spread(first["rows"], first["setup"])
    b = render_spread(second["rows"], second["setup"], discovery=(first["rows"], first["setup"]))
    return (
        "The discovery set, printed by the first command:\n\n"
        + demote("\n".join(a))
        + "\n\nThe confirmation set, printed by the second command:\n\n"
        + demote("\n".join(b))
    )


def _compare_doc(doc: dict) -> dict:
    """compare.json as stored (a missing or infinite number stored as null) with NaN back in place of null."""
    records = {
        label: {s: {k: (math.nan if v is None else v) for k, v in r.items()} for s, r in by.items()} for label, by in doc["records"].items()
    }
    return {**doc, "records": records}


def declared_machine(ev: dict, doc: dict) -> str:
    """A sentence naming the machine the experiment declares (scripts/attribution_data.py's ``machine``) when some of
    its cells did not record theirs; '' when every cell recorded it or nothing is declared."""
    from dfpo.trainer.run.machine import NOT_RECORDED, recorded_machine

    unrecorded = (doc.get("cost") or {}).get("machines", {}).get(NOT_RECORDED)
    if not unrecorded or not ev.get("machine"):
        return ""
    return (
        f"The {unrecorded} cells that did not record their machine ran on, as the experiment declares in "
        f"scripts/attribution_data.py: {recorded_machine(ev['machine'])}.\n\n"
    )


def _compare_tables(ev: dict) -> str:
    from dfpo.trainer.compare_report import render_compare

    parts = []
    for which, name in (("discovery", "first"), ("confirmation", "second")):
        doc = ev["sets"][which]["doc"]
        text = "\n".join(render_compare(_compare_doc(doc)))
        head, sep, rest = text.partition("Per seed (")
        if sep:
            text = (
                head
                + "<details><summary>Per-seed values (printed by the same command)</summary>\n\n"
                + sep
                + rest.rstrip()
                + "\n\n</details>"
            )
        curves = LEDGER / f"{ev['name']}-{which}-curves.png"  # scripts/attribution_data.py's curves_figure
        drawn = f"\n\n![{ev['name']} {which} set: reward and eval curves](attribution/{curves.name})" if curves.is_file() else ""
        parts.append(f"The {which} set, printed by the {name} command:\n\n" + declared_machine(ev, doc) + demote(text) + drawn)
    return "\n\n".join(parts)


TABLES = {"toy-run": _toy_tables, "toy-spread": _spread_tables, "compare": _compare_tables}


def not_rerun(name: str) -> str:
    """An experiment with no stored evidence: the commands that produce it, and no table, figure or sentence."""
    data = _script("attribution_data")
    if name not in data.EXPERIMENTS:
        raise ValueError(f"{{EXPERIMENT:{name}}}: no such experiment in scripts/attribution_data.py; known: {', '.join(data.EXPERIMENTS)}")
    exp = data.EXPERIMENTS[name]
    return (
        "Not re-run with the current code on the current seed sets: no evidence is stored "
        f"(`docs/attribution/data/{name}.json`), so this page shows no table and the findings read none. "
        "The commands that produce it (then `python scripts/attribution_data.py`):\n\n" + commands(exp.discovery[1], exp.confirmation[1])
    )


def _script(name: str):
    """A module of scripts/ (they are not a package)."""
    spec = importlib.util.spec_from_file_location(name, ROOT / "scripts" / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module  # a dataclass looks its module up there
    spec.loader.exec_module(module)
    return module


def experiment(name: str, evidence: dict) -> str:
    if name not in evidence:
        return not_rerun(name)
    ev = evidence[name]
    cmds = commands(ev["sets"]["discovery"]["command"], ev["sets"]["confirmation"]["command"])
    return cmds + "\n\n" + TABLES[ev["kind"]](ev) + figure(name)


def registered_pictures(reg) -> list[str]:
    """Markdown image lines of a stored registered experiment: its per-row picture, then each seed set's curves, where
    ``scripts/attribution_data.py --registered`` drew them."""
    names = [f"{reg.experiment}-rows.png"] + [f"{reg.experiment}-{s.name}-curves.png" for s in reg.sets]
    return [f"![{name[:-4]}](attribution/{name})" for name in names if (LEDGER / name).is_file()]


def registered_section() -> str:
    """Each experiment registered before its data (docs/attribution/registered/): what it found (or that nothing is
    stored yet), its commands, its rows as registered, the pilot its recipe passed, and one sentence per row once its
    tables are stored (``dfpo.core.registration``), and what each seed set cost on which machines, as its cells recorded."""
    import json

    from dfpo.core.findings import METRICS
    from dfpo.core.registration import evaluate_stored, mechanism_lines, read_registration, registered_sentences, row_sentence, rows_table
    from dfpo.trainer.compare_report import cost_lines
    from dfpo.trainer.pilot import gates_sentence, pilot_table, read_pilot

    parts = []
    paths = sorted((LEDGER / "registered").glob("*.toml"))
    for path, opening in zip(paths, registered_sentences(ROOT, METRICS, docs=""), strict=True):
        reg = read_registration(path)
        block = [f"### {reg.title}", "", opening, "", commands(*reg.commands()), "", rows_table(reg)]
        if reg.pilot:
            block += ["", pilot_table(read_pilot(ROOT / reg.pilot))]
        stored = LEDGER / "data" / f"{reg.experiment}.json"
        if stored.is_file():
            doc = json.loads(stored.read_text(encoding="utf-8"))
            results = evaluate_stored(reg, doc)
            block += [""] + [f"- {row_sentence(r, METRICS.get(r.row.metric, r.row.metric))}" for r in results]
            block += [f"- {line}" for line in mechanism_lines(reg, doc)]
            block += [""] + [f"- `{name}`: {' '.join(cost_lines(data['doc'].get('cost'))).strip()}" for name, data in doc["sets"].items()]
            gates = doc.get("gates", {})
            block += [f"- the pilot's gates on `{name}`'s control cells: {gates_sentence(summary)}." for name, summary in gates.items()]
            block += ["", *registered_pictures(reg)]
        parts.append("\n".join(block))
    return "\n\n".join(parts)


def seed_set(evidence: dict, name: str, which: str) -> str:
    return evidence[name]["sets"][which]["seed_set"]


def render(template: str) -> str:
    findings, evidence = read_ledger(LEDGER)
    summary = summaries(findings, evidence, "attribution")
    text = template.replace("{DEMO}", cancellation_demo())
    text = text.replace("{PROBE}", findings_block(ROOT / "docs" / "probe"))  # the block update_readme.py keeps fresh
    text = text.replace("{FINDINGS}", summary_markdown(summary))
    text = text.replace("{REGISTERED}", registered_section())
    text = text.replace("{TEMPLATE_PROBE}", template_block(ROOT / "docs" / "probe"))
    text = text.replace("{SIGN_SEEDS}", str(stats.sign_test_min_seeds(summary.level_of("smollm2"))))
    text = re.sub(r"\{SEEDS:([\w-]+):(\w+)\}", lambda m: seed_set(evidence, m.group(1), m.group(2)), text)
    return re.sub(r"\{EXPERIMENT:([\w-]+)\}", lambda m: experiment(m.group(1), evidence), text)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="exit 1 if docs/attribution.md is not what the evidence renders")
    args = parser.parse_args()
    fresh = render(TEMPLATE.read_text())
    if args.check:
        if not PAGE.is_file() or PAGE.read_text() != fresh:
            print("docs/attribution.md is stale: run python scripts/attribution_page.py", file=sys.stderr)
            return 1
        return 0
    write_text_atomic(PAGE, fresh)
    print(f"wrote {PAGE.relative_to(ROOT)}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
