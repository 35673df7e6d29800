"""Regenerate the generated blocks of README.md from the code (never hand-type them).

    python scripts/update_readme.py          # rewrite README.md in place
    python scripts/update_readme.py --check  # exit 1 if a block is stale (tests/test_readme.py)

A block sits between `<!-- BEGIN generated:NAME -->` and `<!-- END generated:NAME -->`.
"""

from __future__ import annotations

import argparse
import pathlib
import re
import sys

README = pathlib.Path(__file__).resolve().parents[1] / "README.md"


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


BLOCKS = {"objectives": _objectives, "demo": _demo, "atlas": _atlas, "ledger": _ledger}


def render(text: str) -> str:
    for name, make in BLOCKS.items():
        if f"<!-- BEGIN generated:{name} -->" not in text:
            raise ValueError(f"README.md has no generated block {name!r}")
        pattern = re.compile(rf"(<!-- BEGIN generated:{name} -->\n)(?:.*?\n)?(<!-- END generated:{name} -->)", re.S)
        if pattern.search(text):
            body = make()
            text = pattern.sub(lambda m, body=body: m.group(1) + body + "\n" + m.group(2), text)
    return text


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="exit 1 if README.md is stale")
    args = parser.parse_args()
    current = README.read_text()
    fresh = render(current)
    if args.check:
        if fresh != current:
            print("README.md has stale generated blocks: run python scripts/update_readme.py", file=sys.stderr)
            return 1
        return 0
    README.write_text(fresh)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
