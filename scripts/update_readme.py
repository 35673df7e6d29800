"""Regenerate the generated blocks of README.md and docs/*.md from the code (never hand-type them).

    python scripts/update_readme.py          # rewrite the files in place
    python scripts/update_readme.py --check  # exit 1 if a block is stale (tests/test_readme.py)

A block sits between `<!-- BEGIN generated:NAME -->` and `<!-- END generated:NAME -->`.
"""

from __future__ import annotations

import argparse
import pathlib
import re
import sys

ROOT = pathlib.Path(__file__).resolve().parents[1]
README = ROOT / "README.md"


def _objectives() -> str:
    from dfpo.commands import objectives_table

    table = objectives_table(markdown=True).split("\n\n")[0]
    return table


def _demo() -> str:
    from dfpo.commands import cancellation_demo

    return "```text\n" + cancellation_demo() + "\n```"


def _ledger() -> str:
    try:
        from dfpo.theory.ledger import ledger_summary_markdown
    except ImportError:
        return "_The claims ledger has not landed yet._"
    return ledger_summary_markdown()


def _atlas() -> str:
    from dfpo.commands import atlas_table

    return atlas_table(markdown=True, own_aggregation=True)


def _metrics() -> str:
    from dfpo.trainer.metric_registry import markdown_table

    return markdown_table()


BLOCKS = {"objectives": _objectives, "demo": _demo, "atlas": _atlas, "ledger": _ledger, "metrics": _metrics}
FILES = {README: ("objectives", "demo", "atlas", "ledger"), ROOT / "docs" / "metrics.md": ("metrics",)}
"""Each generated file and the blocks it must hold."""


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
    for path, names in FILES.items():
        current = path.read_text()
        fresh = render(current, names)
        if fresh == current:
            continue
        if args.check:
            stale.append(str(path.relative_to(ROOT)))
        else:
            path.write_text(fresh)
    if stale:
        print(f"stale generated blocks in {', '.join(stale)}: run python scripts/update_readme.py", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
