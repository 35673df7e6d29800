"""README.md: the two commands on top, generated blocks up to date, .ci/run runs the same tests."""

from __future__ import annotations

import pathlib
import re
import subprocess
import sys

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[1]
README = (ROOT / "README.md").read_text()


def _commands() -> list[str]:
    return re.findall(r"```bash\n(.*?)\n```", README, re.S)


def test_readme_opens_with_install_and_test_commands():
    install, test = _commands()[:2]
    assert "-c constraints.txt" in install and "pip install" in install
    assert test == ".venv/bin/python -m pytest"


def test_ci_runs_the_readme_test_command():
    ci = (ROOT / ".ci/run").read_text()
    assert ".venv/bin/pip install -q -c constraints.txt -e '.[all]'" in ci
    assert '.venv/bin/python -m pytest "$@"' in ci and "\nrun_pytest\n" in ci


def test_constraints_pin_torch():
    assert "torch==2.13.0" in (ROOT / "constraints.txt").read_text().split()


@pytest.mark.slow  # 86 s of the default suite's 14:19 (fresh-clone CI of 67e124d): it recomputes the atlases and the ledger
def test_generated_blocks_are_current():
    out = subprocess.run([sys.executable, str(ROOT / "scripts/update_readme.py"), "--check"], capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr


def _pages() -> list[pathlib.Path]:
    return [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]


def _links(page: pathlib.Path) -> list[str]:
    """Relative link and image targets of a markdown page, without #anchors."""
    targets = re.findall(r"\]\(([^)\s]+)\)", page.read_text())
    return [t.split("#")[0] for t in targets if not re.match(r"[a-z]+:", t) and not t.startswith("#")]


def test_readme_is_a_front_door():
    """The README stays short: the two commands, the finding, the parts, where to read on."""
    assert len(README.splitlines()) <= 150


def test_every_relative_link_resolves():
    broken = [f"{page.relative_to(ROOT)} -> {t}" for page in _pages() for t in _links(page) if not (page.parent / t).exists()]
    assert not broken


def test_every_docs_page_is_reachable_from_the_readme():
    seen, todo = set(), [ROOT / "README.md"]
    while todo:
        page = todo.pop()
        for t in _links(page):
            target = (page.parent / t).resolve()
            if target.suffix == ".md" and target not in seen and target.exists():
                seen.add(target)
                todo.append(target)
    unreachable = [p.name for p in sorted((ROOT / "docs").glob("*.md")) if p.resolve() not in seen]
    assert not unreachable
