"""The explorer in a real browser: ``dfpo app`` on a loopback port, each page opened in headless
Chromium (Debian's package, driven by Playwright), the inputs a user changes changed, every request
the browser makes recorded (none may leave the machine), a screenshot of each page.

Screenshots go to a temporary folder: ``scripts/screenshots.py`` (whose functions this test uses)
is the command that rewrites docs/screenshots/. Skipped, with the reason, only where Chromium or
Playwright is not installed; .ci/run installs both.
"""

from __future__ import annotations

import json
import os
import re
import time
from pathlib import Path
from urllib.parse import urlparse

import pytest
from script_modules import load_script

from dfpo.trainer.run.layout import RunDir

ROOT = Path(__file__).resolve().parents[2]
shots = load_script("scripts/screenshots.py", "dfpo_screenshots")

pytestmark = [
    pytest.mark.skipif(not Path(shots.CHROMIUM).exists(), reason="Chromium is not installed (apt-get install chromium; .ci/run does it)"),
    pytest.mark.slow,  # starts a server and a browser; the toy page trains for tens of seconds
]
LOCAL_HOSTS = {"127.0.0.1", "localhost", "::1"}
IMAGE_NAME = "![x](http:/127.0.0.1:8600/pixel.png)"
LINK_NAME = '<a href="http:/x">CLICK</a>'
"""Run folder names (each spans three folders) that are markup: an image request (to this machine, so the check
for requests leaving it would not see it) and a live link, wherever they are rendered instead of shown."""


def _fake_run(folder: Path, lr: float, rewards: list[float]) -> None:
    folder.mkdir(parents=True)
    (folder / RunDir.CONFIG).write_text(f'seed = 0\n\n[optim]\nlr = {lr}\n\n[objective]\nname = "gspo"\n')
    rows = [{"step": i + 1, "reward/mean": r, "clip/frac_high": 0.05 * i, "weights/asym": 0.5 - 0.05 * i} for i, r in enumerate(rewards)]
    (folder / RunDir.METRICS).write_text("\n".join(json.dumps(r) for r in rows) + "\n")
    (folder / RunDir.EVALS).write_text("\n".join(json.dumps({"step": s, "eval/avg@4": 0.25 + 0.01 * s}) for s in (0, 5, 10)) + "\n")
    (folder / RunDir.SAMPLES).write_text(json.dumps({"step": 10, "prompt": "3+4=", "completion": "7", "answer": "7", "reward": 1.0}) + "\n")


@pytest.fixture(scope="module")
def app(tmp_path_factory):
    """(url, server process id, the folder screenshots go to); the server's working folder holds runs/ and more/."""
    home = tmp_path_factory.mktemp("app")
    _fake_run(home / "runs" / "tiny-gspo", 3e-4, [0.3 + 0.03 * i for i in range(10)])
    _fake_run(home / "runs" / "tiny-dfpo_min", 1e-4, [0.3 + 0.025 * i for i in range(10)])
    _fake_run(home / "more" / "tiny-grpo", 1e-4, [0.2 + 0.04 * i for i in range(10)])
    _fake_run(home / "odd" / IMAGE_NAME, 2e-4, [0.1 + 0.05 * i for i in range(10)])
    _fake_run(home / "odd" / LINK_NAME, 3e-4, [0.1 + 0.04 * i for i in range(10)])
    with shots.running_app([Path("runs")], cache=home / "cache", cwd=home) as (url, proc):
        yield url, proc.pid, tmp_path_factory.mktemp("screenshots")


@pytest.fixture(scope="module")
def browser():
    playwright = pytest.importorskip(
        "playwright.sync_api", reason="Playwright is not installed (pip install playwright; the [dev] extra has it)"
    )
    with playwright.sync_playwright() as pw:
        b = pw.chromium.launch(executable_path=shots.CHROMIUM, args=shots.FLAGS)
        yield b
        b.close()


@pytest.fixture
def context(browser):
    """A fresh browser context for one test; every request it makes to a host other than this machine fails the test."""
    outside: list[str] = []

    def record(request) -> None:
        parsed = urlparse(request.url)
        if parsed.scheme not in ("data", "blob", "about") and parsed.hostname not in LOCAL_HOSTS:
            outside.append(request.url)

    ctx = browser.new_context(viewport=shots.VIEWPORT)
    ctx.on("request", record)
    yield ctx
    ctx.close()
    assert outside == [], f"requests left the machine: {outside}"


def _server_cpu_seconds(pid: int) -> float:
    """CPU time used so far by the processes of ``dfpo app``'s process group (the Streamlit server and its threads)."""
    total, tick = 0.0, os.sysconf("SC_CLK_TCK")
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            fields = (entry / "stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if int(fields[2]) == pid:  # process group id (dfpo app is a session leader)
            total += (int(fields[11]) + int(fields[12])) / tick
    return total


def _choose(page, label: str, option: str) -> None:
    page.get_by_label(label, exact=True).click()  # a Streamlit selectbox opens a list of options
    page.get_by_role("option", name=option, exact=True).click()


def _value(page, label: str) -> str:
    return page.get_by_label(label, exact=True).input_value()


def test_cancellation_page_switches_objectives_and_draws_a_seed(app, context):
    url, _, out = app
    page = shots.open_page(context, url, "does not cancel")
    shots.shot(page, out, "1-cancellation")
    _choose(page, "Objective", "grpo_fix")
    page.get_by_text("Components (the grpo_fix preset's own").wait_for(timeout=30_000)
    shots.settle(page)
    assert _value(page, "eps_low") == "1" and _value(page, "eps_high") == "0.2"
    _choose(page, "Objective", "dapo")
    page.get_by_text("Components (the dapo preset's own").wait_for(timeout=30_000)
    shots.settle(page)
    assert _value(page, "eps_high") == "0.28"
    seed = _value(page, "seed of the other tokens' ratios")
    page.get_by_role("button", name="random").click()
    shots.settle(page)
    assert page.locator('[data-testid="stException"]').count() == 0
    assert _value(page, "seed of the other tokens' ratios") != seed
    shots.type_into(page, "Rewards, one per completion", "1, 1, 1, 1")
    page.get_by_text("all rewards are equal").wait_for(timeout=30_000)
    page.close()


def test_cancellation_page_refuses_a_seed_out_of_range_and_keeps_its_inputs_across_pages(app, context):
    """Before the fix the browser held back seed 70000 (the box drawn red) while the page kept showing the old seed's
    numbers, and leaving the page reset every input."""
    url, _, _ = app
    page = shots.open_page(context, url, "does not cancel")
    shots.type_into(page, "seed of the other tokens' ratios", "70000")
    page.get_by_text("seed must be a whole number from 0 to 65536, got seed=70000").wait_for(timeout=30_000)
    shots.settle(page)
    assert page.locator('[data-testid="stMetric"]').count() == 0  # no number of the old seed left
    shots.type_into(page, "seed of the other tokens' ratios", "2.5")
    page.get_by_text("seed must be a whole number from 0 to 65536, got seed=2.5").wait_for(timeout=30_000)
    shots.type_into(page, "seed of the other tokens' ratios", "3")
    shots.type_into(page, "Rewards, one per completion", "1, 0, 0, 1")
    page.get_by_text("verdict").first.wait_for(timeout=30_000)
    _choose(page, "Objective", "grpo_fix")
    page.get_by_text("Components (the grpo_fix preset's own").wait_for(timeout=30_000)
    shots.settle(page)
    page.get_by_role("link", name="Claims ledger").click()
    page.get_by_text("claims shown").first.wait_for(timeout=300_000)
    page.get_by_role("link", name="Cancellation by hand").click()
    page.get_by_text("Components (the grpo_fix preset's own").wait_for(timeout=30_000)
    shots.settle(page)
    assert _value(page, "seed of the other tokens' ratios") == "3" and _value(page, "Rewards, one per completion") == "1, 0, 0, 1"
    page.close()


def test_atlas_page(app, context):
    url, _, out = app
    page = shots.open_page(context, f"{url}/atlas", "cells cancel")
    shots.shot(page, out, "2-atlas")
    shots.type_into(page, "seed", "7")
    shots.settle(page)  # the atlas of seed 7 computed
    page.get_by_text("cells cancel").wait_for(timeout=60_000)
    page.close()


def _seconds_until_idle(pid: int, timeout: float = 30.0, window: float = 2.0, busy: float = 0.3) -> float:
    """Seconds until the server uses less than ``busy`` s of CPU in a ``window`` (a training run uses a whole core); inf if never."""
    start = time.monotonic()
    while time.monotonic() - start < timeout:
        before = _server_cpu_seconds(pid)
        time.sleep(window)
        if _server_cpu_seconds(pid) - before < busy:
            return time.monotonic() - start
    return float("inf")


def test_toy_page_both_stops_end_the_computation_and_a_bad_input_is_named(app, context):
    url, pid, out = app
    running = re.compile(r"training \S+: \d+ of (\d+) steps")
    page = shots.open_page(context, f"{url}/toy", "Toy lab")
    page.get_by_text(running).first.wait_for(timeout=120_000)  # the default comparison runs, with a progress bar
    page.get_by_test_id("stBaseButton-header").get_by_text("Stop").click()  # Streamlit's own Stop, top right
    # before: the page froze mid-run (its bar and its Stop still shown) and the run went on for a 5 s grace
    page.get_by_text(re.compile(r"Stopped after \d+ of 600 steps: below, what those steps show")).wait_for(timeout=30_000)
    assert page.locator('[data-testid="stProgress"]').count() == 0
    assert page.get_by_test_id("stButton").get_by_role("button", name="Stop").count() == 0
    page.get_by_role("tab", name="expected reward E[R]").wait_for(timeout=30_000)  # the steps that finished
    idle = _seconds_until_idle(pid)
    assert idle < 5, "the server kept computing after Streamlit's Stop"  # before the grace: 11 more minutes of CPU

    shots.type_into(page, "steps", "2.5")  # before: the box rounded it to 2 and the page trained 2 steps
    page.get_by_text("the number of steps must be a whole number, got steps=2.5").wait_for(timeout=30_000)
    page.get_by_label("steps", exact=True).fill("2000")
    shots.type_into(page, "seeds", "2")
    page.get_by_text(re.compile(r"training \S+: \d+ of 8000 steps")).first.wait_for(timeout=120_000)
    page.get_by_test_id("stButton").get_by_role("button", name="Stop").click()  # the page's Stop button
    page.get_by_text(re.compile(r"Stopped after \d+ of 8000 steps: below, what those steps show")).wait_for(timeout=30_000)
    page.get_by_role("tab", name="expected reward E[R]").wait_for(timeout=30_000)
    idle = _seconds_until_idle(pid)
    assert idle < 5, "the server kept computing after the page's Stop"

    shots.type_into(page, "lr", "1e6")
    page.get_by_text("the learning rate lr must be between 1e-06 and 100 on this page, got lr=1e+06").wait_for(timeout=30_000)
    assert page.locator('[data-testid="stProgress"]').count() == 0
    page.get_by_label("objectives (labels: preset[:key=value...])", exact=True).fill("gspo,dfpo_min")
    page.get_by_label("lr", exact=True).fill("0.5")
    shots.type_into(page, "steps", "30")
    page.get_by_text(re.compile(r"training \S+: \d+ of 60 steps")).first.wait_for(timeout=120_000)  # per training step
    page.get_by_text("Summary and the paper's predictions").wait_for(timeout=300_000)
    assert page.locator('[data-testid="stProgress"]').count() == 0
    page.get_by_role("tab", name="Asym (eq 23)").click()
    page.get_by_text("Asym (eq 23) (band").wait_for(timeout=30_000)
    shots.shot(page, out, "3-toy")
    page.close()


def test_ledger_page(app, context):
    url, _, out = app
    page = shots.open_page(context, f"{url}/ledger", "claims shown")
    shots.type_into(page, "Search (id, section, statement)", "eq-55")
    page.get_by_text("1 of").first.wait_for(timeout=30_000)
    page.get_by_text("eq-55: fails").first.click()  # a rerun can briefly leave the old element beside the new
    page.locator("strong:has-text('Evidence'):visible").first.wait_for(timeout=30_000)  # the opened record, not a collapsed one
    shots.shot(page, out, "4-ledger")
    page.close()


def test_runs_page_shows_run_folder_names_as_text(app, context):
    """Before the fix a run folder named like a markdown image made the browser request the image, and one named
    like an HTML link became a live link in the eval legend."""
    url, _, _ = app
    fetched: list[str] = []
    context.on("request", lambda request: fetched.append(request.url) if "pixel" in request.url else None)
    page = shots.open_page(context, f"{url}/runs", "Resolved config")
    shots.type_into(page, "Another folder to search for run folders", "odd")
    page.get_by_text("odd (2)").first.wait_for(timeout=30_000)
    runs = page.locator('[data-testid="stMultiSelect"]').first
    for name in (IMAGE_NAME, LINK_NAME):
        runs.click()
        page.get_by_role("option", name=name, exact=True).click()
        shots.settle(page)
    page.keyboard.press("Escape")
    page.get_by_text("Sample completions").wait_for(timeout=30_000)
    shots.settle(page)
    main = page.locator('[data-testid="stMain"]')
    assert main.locator("img").count() == 0 and main.locator("a[href*='http:']").count() == 0
    assert main.get_by_text(IMAGE_NAME + ", step 10", exact=True).count() == 1  # the samples heading, as text
    legends = page.locator(".legendtext").evaluate_all("texts => texts.map(t => t.textContent)")  # SVG text
    assert f"{LINK_NAME} eval/avg@4" in legends and IMAGE_NAME in legends  # Plotly shows the names as they are
    assert fetched == []
    page.close()


def test_runs_page_takes_a_relative_folder_and_keeps_the_selection(app, context):
    url, _, out = app
    page = shots.open_page(context, f"{url}/runs", "Resolved config")
    shots.shot(page, out, "5-runs")
    chosen = page.locator('[data-testid="stMultiSelect"]').first
    assert "tiny-dfpo_min" in chosen.inner_text() and "tiny-gspo" in chosen.inner_text()
    shots.type_into(page, "Another folder to search for run folders", "more")  # relative to the server's folder
    page.get_by_text("more (1)").first.wait_for(timeout=30_000)
    shots.settle(page)
    assert page.locator('[data-testid="stException"]').count() == 0
    assert "tiny-dfpo_min" in chosen.inner_text() and "tiny-gspo" in chosen.inner_text()  # the selection survived
    shots.type_into(page, "Another folder to search for run folders", "/no/such/folder")
    page.get_by_text("/no/such/folder is not a folder").wait_for(timeout=30_000)
    page.close()
