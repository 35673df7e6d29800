"""Regenerate the explorer's screenshots (docs/screenshots/) from the pages as they are now.

    python scripts/screenshots.py --runs runs                  # after the README's main job
    python scripts/screenshots.py --runs runs --out /tmp/shots # somewhere else

Starts ``dfpo app`` on a free loopback port (its caches in a fresh temporary folder, so every page
computes what it shows), opens each page in headless Chromium (Debian's ``chromium``, driven by
Playwright) 1400 pixels wide, waits until the page has finished running and its charts are drawn,
and saves one PNG of each whole page of ``dfpo.app.pages.PAGES``, named by its number: the cancellation
page, the atlas, the toy lab (the default comparison, the Asym tab), the claims ledger (eq-55 opened), the
training runs (the first two runs of ``--runs``, smoothed over 10 steps) and the drift page (its default
inputs). The test run never writes here: tests/app/test_browser.py uses these functions with a temporary folder.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path

from dfpo.app.pages import PAGES, number, screenshot

ROOT = Path(__file__).resolve().parents[1]
CHROMIUM = shutil.which("chromium") or "/usr/bin/chromium"
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
VIEWPORT = {"width": 1400, "height": 1000}
MAX_HEIGHT = 6000
CONTENT_HEIGHT = """() => {
  const main = document.querySelector('[data-testid="stMainBlockContainer"]');
  return main ? main.getBoundingClientRect().top + main.scrollHeight + 40 : document.body.scrollHeight;
}"""
"""Height of the page's content in pixels (its main block; the data grids' own scrollers are much taller)."""


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@contextlib.contextmanager
def running_app(runs: list[Path], *, cache: Path, cwd: Path | None = None, timeout: float = 120) -> Iterator[tuple[str, subprocess.Popen]]:
    """``dfpo app`` on a free loopback port, its caches in ``cache``: yields (url, process); SIGTERM at the end."""
    port = free_port()
    cmd = [sys.executable, "-m", "dfpo", "app", "--port", str(port)] + [a for r in runs for a in ("--runs", str(r))]
    env = dict(os.environ, DFPO_APP_CACHE=str(cache), PYTHONUNBUFFERED="1")
    log = tempfile.TemporaryFile(mode="w+")
    proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, env=env, cwd=cwd, start_new_session=True)
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + timeout
        while True:
            try:
                if urllib.request.urlopen(f"{url}/_stcore/health", timeout=2).read() == b"ok":
                    break
            except OSError:
                pass
            if proc.poll() is not None or time.monotonic() > deadline:
                log.seek(0)
                raise RuntimeError(f"dfpo app did not answer on {url}: {log.read()[-2000:]}")
            time.sleep(0.5)
        yield url, proc
    finally:
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
        log.close()


def open_page(context, url: str, ready: str, timeout_ms: int = 300_000):
    """A new page of the browser context at ``url`` once the text ``ready`` shows (the first load can show only a skeleton)."""
    page = context.new_page()
    page.goto(url)
    page.get_by_text(ready).first.wait_for(timeout=timeout_ms)
    return page


def settle(page, timeout_ms: int = 300_000) -> None:
    """Wait until the script has finished and every visible chart has drawn; back to the top."""
    page.wait_for_timeout(500)
    page.locator('[data-testid="stStatusWidget"]').wait_for(state="detached", timeout=timeout_ms)
    charts = page.locator('[data-testid="stPlotlyChart"]')
    for i in range(charts.count()):
        if not charts.nth(i).is_visible():  # e.g. in a tab not shown
            continue
        charts.nth(i).scroll_into_view_if_needed()
        charts.nth(i).locator(".main-svg").first.wait_for(timeout=30_000)
    page.evaluate("() => { for (const e of document.querySelectorAll('*')) if (e.scrollTop) e.scrollTop = 0; }")
    page.wait_for_timeout(300)


def shot(page, out: Path, name: str) -> Path:
    """The whole page as ``out/name.png``: Streamlit scrolls inside its own container, so the window is
    made as tall as the content (at most MAX_HEIGHT) for the picture, then set back."""
    out.mkdir(parents=True, exist_ok=True)
    settle(page)  # and scrolled to the top
    height = page.evaluate(CONTENT_HEIGHT)
    page.set_viewport_size({"width": VIEWPORT["width"], "height": max(VIEWPORT["height"], min(int(height), MAX_HEIGHT))})
    settle(page)
    path = out / f"{name}.png"
    page.screenshot(path=str(path), full_page=True)
    page.set_viewport_size(VIEWPORT)
    return path


def type_into(page, label: str, text: str) -> None:
    box = page.get_by_label(label, exact=True)
    box.fill(text)
    box.press("Enter")


def _cancel(context, url: str):
    return open_page(context, url, "does not cancel")


def _atlas(context, url: str):
    return open_page(context, f"{url}/atlas", "cells cancel")


def _toy(context, url: str):
    page = open_page(context, f"{url}/toy", "Summary and the paper's predictions")
    page.get_by_role("tab", name="Asym (eq 23)").click()
    page.get_by_text("Asym (eq 23) (band").wait_for(timeout=30_000)
    return page


def _ledger(context, url: str):
    page = open_page(context, f"{url}/ledger", "claims shown")
    type_into(page, "Search (id, section, statement)", "eq-55")
    page.get_by_text("1 of").first.wait_for(timeout=30_000)
    page.get_by_text("eq-55: fails").first.click()
    page.locator("strong:has-text('Evidence'):visible").first.wait_for(timeout=30_000)
    return page


def _runs(context, url: str):
    page = open_page(context, f"{url}/runs", "Resolved config")
    page.get_by_role("slider").first.focus()  # smoothing: a trailing mean over 10 steps
    for _ in range(9):
        page.keyboard.press("ArrowRight")
    page.get_by_text("(trailing mean over 10 steps)").first.wait_for(timeout=60_000)
    return page


def _drift(context, url: str):
    return open_page(context, f"{url}/drift", "Parameter-space drift")  # its default inputs; shot() waits for the charts


SHOWCASE = {
    "page_cancel.py": _cancel,
    "page_atlas.py": _atlas,
    "page_toy.py": _toy,
    "page_ledger.py": _ledger,
    "page_runs.py": _runs,
    "page_drift.py": _drift,
}
"""How each page is opened for its screenshot, by script: every page of ``dfpo.app.pages.PAGES`` has one
(tests/app/test_pages.py checks it)."""


def tour(context, url: str, out: Path) -> list[Path]:
    """Every page of ``PAGES`` in its showcase state, one screenshot each, named as docs/app.md shows it
    (``context``: a browser context of VIEWPORT's size)."""
    written = []
    for page_info in PAGES:
        page = SHOWCASE[page_info.file](context, url)
        written.append(shot(page, out, screenshot(page_info).removesuffix(".png")))
        page.close()
    return written


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument(
        "--runs",
        action="append",
        default=None,
        metavar="DIR",
        help=f"folder of run folders for page {number('page_runs.py')} (repeatable; default ./runs)",
    )
    p.add_argument("--out", default=str(ROOT / "docs" / "screenshots"), help="folder for the PNGs (default docs/screenshots)")
    args = p.parse_args()
    runs = [Path(r).resolve() for r in (args.runs or ["runs"])]
    missing = [str(r) for r in runs if not r.is_dir()]
    if missing:
        p.error(f"--runs {missing[0]} is not a folder")
    if not Path(CHROMIUM).exists():
        p.error("Chromium is not installed (apt-get install chromium)")
    from playwright.sync_api import sync_playwright

    with tempfile.TemporaryDirectory() as cache, running_app(runs, cache=Path(cache)) as (url, _), sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=CHROMIUM, args=FLAGS)
        for path in tour(browser.new_context(viewport=VIEWPORT), url, Path(args.out)):
            print(f"wrote {path}")
        browser.close()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
