"""Assemble docs/attribution.md from what each command of scripts/attribution.tmpl.md printed.

    python scripts/attribution_page.py            # reads runs/<name>.out and runs/<name>/..., writes the page

Each command of the template is run first with its output kept, e.g.
``dfpo toy ablate ... --out runs/toy-ablate-family > runs/toy-ablate-family.out``, and for the LLM
comparison ``dfpo compare ... > runs/compare-fresh-gspo.out`` then ``cp runs/compare-fresh/compare.png
runs/compare-fresh-gspo.png`` (the same for ``--baseline gspo_noclip`` as compare-fresh-noclip).
Placeholders: {DEMO} (``dfpo demo``), {TOY:name} (a toy command's printed summary), {COMPARE:name}
(``dfpo compare``'s printed tables, per-seed values folded), {PNG:src:name} (a figure under runs/
copied to docs/attribution/name), {LLM_N} and {LLM_LAST} (the comparison's seeds). No number is typed.
"""

from __future__ import annotations

import re
import shutil
import sys
from pathlib import Path

from dfpo.commands import cancellation_demo
from dfpo.core.files import write_text_atomic

ROOT = Path(__file__).resolve().parents[1]
RUNS = ROOT / "runs"
TEMPLATE = ROOT / "scripts" / "attribution.tmpl.md"
PAGE = ROOT / "docs" / "attribution.md"
FIGURES = ROOT / "docs" / "attribution"


def demote(text: str) -> str:
    """Headings of a command's output three levels down, under the page's sections."""
    return re.sub(r"^(#+) ", lambda m: "#" * (len(m.group(1)) + 3) + " ", text, flags=re.M)


def toy_output(name: str) -> str:
    """The summary a toy command printed, without progress lines, figure links and the closing line."""
    text = (RUNS / f"{name}.out").read_text()
    skip = ("toy: training", "toy: wrote", "toy spread:", "![")
    lines = [ln for ln in text.splitlines() if not ln.startswith(skip) and ln.strip() != "## Plots"]
    return demote("\n".join(lines).strip())


def compare_output(name: str) -> str:
    """What ``dfpo compare`` printed, its per-seed tables folded into a details block."""
    text = (RUNS / f"{name}.out").read_text()
    text = "\n".join(ln for ln in text.splitlines() if not ln.startswith(("compare: ", "![")))
    head, sep, rest = text.partition("Per seed (N+:")
    if sep:
        text = (
            head + "<details><summary>Per-seed values (printed by the same command)</summary>\n\n" + sep + rest.rstrip() + "\n\n</details>"
        )
    return demote(text.strip())


def figure(src: str, name: str) -> str:
    FIGURES.mkdir(exist_ok=True)
    shutil.copyfile(RUNS / src, FIGURES / name)
    return f"![{name[:-4]}](attribution/{name})"


def llm_seeds() -> tuple[str, str]:
    """(number of paired seeds, last seed) from the comparison's first printed line."""
    first = (RUNS / "compare-fresh-gspo.out").read_text().split("# ", 1)[1].splitlines()[0]
    match = re.match(r"(\d+) paired seeds \((\d+)\.\.(\d+)\)", first)
    if match is None:
        raise ValueError(f"no seed range in the comparison's header: {first!r}")
    return match.group(1), match.group(3)


def render(template: str) -> str:
    n, last = llm_seeds()
    text = template.replace("{LLM_N}", n).replace("{LLM_LAST}", last).replace("{DEMO}", cancellation_demo())
    text = re.sub(r"\{TOY:([\w-]+)\}", lambda m: toy_output(m.group(1)), text)
    text = re.sub(r"\{COMPARE:([\w-]+)\}", lambda m: compare_output(m.group(1)), text)
    return re.sub(r"\{PNG:([\w./-]+):([\w.-]+)\}", lambda m: figure(m.group(1), m.group(2)), text)


def main() -> int:
    missing = sorted({m for m in re.findall(r"\{(?:TOY|COMPARE):([\w-]+)\}", TEMPLATE.read_text()) if not (RUNS / f"{m}.out").is_file()})
    if missing:
        print(f"attribution_page: run these commands first (no runs/<name>.out): {', '.join(missing)}", file=sys.stderr)
        return 2
    write_text_atomic(PAGE, render(TEMPLATE.read_text()))
    print(f"wrote {PAGE.relative_to(ROOT)}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
