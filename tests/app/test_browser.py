"""The explorer in a real browser: ``dfpo app`` on a loopback port, each page opened in headless
Chromium (Debian's package, driven by Playwright), one interaction each, a screenshot each.

Screenshots land in docs/screenshots/ (the README shows the first page). Skipped, with the
reason, only where Chromium or Playwright is not installed; .ci/run installs both.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest

CHROMIUM = shutil.which("chromium") or "/usr/bin/chromium"
ROOT = Path(__file__).resolve().parents[2]
SHOTS = ROOT / "docs" / "screenshots"
FLAGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]

pytestmark = [
    pytest.mark.skipif(not Path(CHROMIUM).exists(), reason="Chromium is not installed (apt-get install chromium; .ci/run does it)"),
]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _fake_run(folder: Path, lr: float, rewards: list[float]) -> None:
    folder.mkdir(parents=True)
    (folder / "config.toml").write_text(f'seed = 0\n\n[optim]\nlr = {lr}\n\n[objective]\nname = "gspo"\n')
    rows = [{"step": i + 1, "reward/mean": r, "clip/frac_high": 0.05 * i, "weights/asym": 0.5 - 0.05 * i} for i, r in enumerate(rewards)]
    (folder / "metrics.jsonl").write_text("\n".join(json.dumps(r) for r in rows) + "\n")
    (folder / "eval.jsonl").write_text("\n".join(json.dumps({"step": s, "eval/avg@4": 0.25 + 0.01 * s}) for s in (0, 5, 10)) + "\n")
    (folder / "samples.jsonl").write_text(
        json.dumps({"step": 10, "prompt": "3+4=", "completion": "7", "answer": "7", "reward": 1.0}) + "\n"
    )


@pytest.fixture(scope="module")
def app_url(tmp_path_factory):
    runs = tmp_path_factory.mktemp("runs")
    _fake_run(runs / "tiny-gspo", 3e-4, [0.3 + 0.03 * i for i in range(10)])
    _fake_run(runs / "tiny-dfpo_min", 1e-4, [0.3 + 0.025 * i for i in range(10)])
    port = _free_port()
    proc = subprocess.Popen(
        [sys.executable, "-m", "dfpo", "app", "--headless", "--port", str(port), "--runs", str(runs)],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, start_new_session=True,
    )  # fmt: skip
    url = f"http://127.0.0.1:{port}"
    deadline = time.time() + 60
    while time.time() < deadline:
        try:
            if urllib.request.urlopen(f"{url}/_stcore/health", timeout=2).read() == b"ok":
                break
        except OSError:
            time.sleep(0.5)
    else:
        os.killpg(proc.pid, signal.SIGTERM)
        pytest.fail(f"dfpo app did not answer on {url}: {proc.stdout.read().decode()[-2000:]}")
    yield url
    os.killpg(proc.pid, signal.SIGTERM)
    proc.wait(timeout=20)


@pytest.fixture(scope="module")
def browser():
    playwright = pytest.importorskip(
        "playwright.sync_api", reason="Playwright is not installed (pip install playwright; the [dev] extra has it)"
    )
    with playwright.sync_playwright() as pw:
        b = pw.chromium.launch(executable_path=CHROMIUM, args=FLAGS)
        yield b
        b.close()


def _open(browser, url: str, ready: str):
    page = browser.new_page(viewport={"width": 1400, "height": 1000})
    page.goto(url)
    page.get_by_text(ready).first.wait_for(timeout=120_000)  # the first load can show only a skeleton
    return page


def _settle(page) -> None:
    """Wait until the script has finished and every chart has drawn."""
    page.wait_for_timeout(500)
    page.locator('[data-testid="stStatusWidget"]').wait_for(state="detached", timeout=120_000)
    charts = page.locator('[data-testid="stPlotlyChart"]')
    for i in range(charts.count()):
        if not charts.nth(i).is_visible():  # e.g. in a tab not shown
            continue
        charts.nth(i).scroll_into_view_if_needed()
        charts.nth(i).locator(".main-svg").first.wait_for(timeout=30_000)
    page.mouse.wheel(0, -100000)
    page.wait_for_timeout(300)


def _shot(page, name: str) -> None:
    SHOTS.mkdir(parents=True, exist_ok=True)
    _settle(page)
    page.screenshot(path=str(SHOTS / f"{name}.png"), full_page=True)


def _type(page, label: str, text: str) -> None:
    box = page.get_by_label(label)
    box.fill(text)
    box.press("Enter")


def test_cancellation_page(app_url, browser):
    page = _open(browser, app_url, "does not cancel")
    _shot(page, "1-cancellation")
    _type(page, "Rewards, one per completion", "1, 1, 1, 1")
    page.get_by_text("all rewards are equal").wait_for(timeout=30_000)
    page.close()


def test_atlas_page(app_url, browser):
    page = _open(browser, f"{app_url}/atlas", "cells cancel")
    _shot(page, "2-atlas")
    _type(page, "seed", "7")
    page.get_by_text("cells cancel").wait_for(timeout=60_000)
    page.close()


def test_toy_page(app_url, browser):
    page = _open(browser, f"{app_url}/toy", "Summary and the paper's predictions")
    page.get_by_role("tab", name="Asym (eq 23)").click()
    page.get_by_text("Asym (eq 23) (band").wait_for(timeout=30_000)
    _shot(page, "3-toy")
    page.close()


def test_ledger_page(app_url, browser):
    page = _open(browser, f"{app_url}/ledger", "claims shown")
    _type(page, "Search (id, section, statement)", "eq-55")
    page.get_by_text("1 of").first.wait_for(timeout=30_000)
    page.get_by_text("eq-55: fails").first.click()  # a rerun can briefly leave the old element beside the new
    page.locator("strong:has-text('Evidence'):visible").first.wait_for(timeout=30_000)  # the opened record, not a collapsed one
    _shot(page, "4-ledger")
    page.close()


def test_runs_page(app_url, browser):
    page = _open(browser, f"{app_url}/runs", "Resolved config")
    _shot(page, "5-runs")
    _type(page, "Another folder to search for run folders", "/no/such/folder")
    page.get_by_text("/no/such/folder is not a folder.").wait_for(timeout=30_000)
    page.close()
