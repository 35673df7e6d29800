"""README.md: the two commands on top, generated blocks up to date, .ci/run runs the same tests."""

from __future__ import annotations

import pathlib
import re
import subprocess
import sys

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


def test_generated_blocks_are_current():
    out = subprocess.run([sys.executable, str(ROOT / "scripts/update_readme.py"), "--check"], capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr
