"""Regenerate the generated blocks of README.md and docs/*.md from the code (never hand-type them).

    python scripts/update_readme.py          # rewrite the files in place
    python scripts/update_readme.py --check  # exit 1 if a block is stale (tests/test_readme.py)

A block sits between `<!-- BEGIN generated:NAME -->` and `<!-- END generated:NAME -->`.
"""

from __future__ import annotations

import argparse
import functools
import pathlib
import re
import sys

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
from dfpo.core.findings import family_note, read_ledger, render_findings, summaries
from dfpo.core.metric_registry import markdown_table
from dfpo.theory.ledger import count_line, render_markdown, run_ledger
from dfpo.trainer.probe.findings import findings_block

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
    parts = {"toy": next((v for k, v in sets.items() if k.startswith("toy-")), None), "LLM": sets.get("llm")}
    where = "; ".join(
        f"{what}: discovery {pair[0]}, confirmation {pair[1]}" if pair else f"{what}: none stored in this version"
        for what, pair in parts.items()
    )
    return (
        "Generated from the findings ledger ([docs/attribution/findings.toml](docs/attribution/findings.toml)) on the tables "
        f"stored in docs/attribution/data/ ({where}); the tables and the commands that printed them are in "
        "[docs/attribution.md](docs/attribution.md). " + family_note(summary) + "\n\n" + render_findings(summary)
    )


def _config() -> str:
    return config_reference()


def _metrics() -> str:
    return markdown_table()


def _probe_findings() -> str:
    return findings_block(ROOT / "docs" / "probe")


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
}
FILES = {
    README: ("findings", "ledger_count"),
    ROOT / "docs" / "loss.md": ("objectives", "components", "estimators"),
    ROOT / "docs" / "cancellation.md": ("demo", "atlas", "corrections", "param_atlas", "probe_findings"),
    ROOT / "docs" / "attribution.md": ("probe_findings",),
    ROOT / "docs" / "probe.md": ("probe_findings",),
    ROOT / "docs" / "metrics.md": ("metrics",),
    ROOT / "docs" / "config.md": ("config",),
    ROOT / "docs" / "app.md": ("app_screenshots",),
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


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="exit 1 if a generated block is stale")
    args = parser.parse_args()
    stale = []
    fresh_files = {path: render(path.read_text(), names) for path, names in FILES.items()}
    fresh_files.update({path: make() for path, make in WHOLE.items()})
    for path, fresh in fresh_files.items():
        current = path.read_text() if path.exists() else ""
        if fresh == current:
            continue
        if args.check:
            stale.append(str(path.relative_to(ROOT)))
        else:
            write_text_atomic(path, fresh)
    if stale:
        print(f"stale generated blocks in {', '.join(stale)}: run python scripts/update_readme.py", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
