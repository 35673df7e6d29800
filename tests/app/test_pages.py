"""The explorer's page table (``dfpo.app.pages.PAGES``) is the one source of its page list, count and numbers:
the navigation, every page's docstring, docs/app.md, ``dfpo app --help``, ``dfpo --help``, the screenshots and
any "page N" written about the app agree with it, so adding, removing or moving a page fails here until they do."""

from __future__ import annotations

import ast
import re
import subprocess
from pathlib import Path

import pytest
from script_modules import load_script

from dfpo.app.pages import PAGES, number, screenshot
from dfpo.cli import build_parser

ROOT = Path(__file__).resolve().parents[2]
APP = ROOT / "app"
DOCS = (ROOT / "docs" / "app.md").read_text()
NUMBER_WORDS = ("zero", "one", "two", "three", "four", "five", "six", "seven", "eight", "nine", "ten", "eleven", "twelve")


def _help(*argv: str) -> str:
    parser = build_parser()
    if not argv:
        return parser.format_help()
    sub = next(a for a in parser._actions if a.dest == "command")
    return sub.choices[argv[0]].format_help()


def test_every_page_script_is_in_the_table_once_and_the_navigation_reads_the_table():
    scripts = sorted(p.name for p in APP.glob("page_*.py"))
    assert sorted(p.file for p in PAGES) == scripts  # no page left out of the navigation, none listed twice
    main = (APP / "main.py").read_text()
    assert "for page in PAGES" in main and not re.search(r"page_\w+\.py", main)  # no page script named in main.py besides the table
    assert [p.url_path for p in PAGES].count("") == 1 and PAGES[0].url_path == ""  # one default page, the first


def test_the_navigation_shows_the_tables_pages_in_its_order():
    pytest.importorskip("streamlit")
    from streamlit.testing.v1 import AppTest

    at = AppTest.from_file(str(APP / "main.py"), default_timeout=300).run()
    assert not at.exception, [e.value for e in at.exception]
    assert at.title[0].value == PAGES[0].title  # the first page of the table opens
    for page in PAGES[1:3]:
        at.switch_page(page.file).run()
        assert not at.exception and at.title[0].value == page.title


@pytest.mark.parametrize("page", PAGES, ids=lambda p: p.file)
def test_each_page_docstring_starts_with_its_number_in_the_navigation(page):
    doc = ast.get_docstring(ast.parse((APP / page.file).read_text()))
    assert doc.startswith(f"Page {number(page.file)}: "), doc.split("\n")[0]
    assert f'st.title("{page.title}")' in (APP / page.file).read_text()  # the page's own heading is its title in the table


@pytest.mark.parametrize("page", PAGES, ids=lambda p: p.file)
def test_no_page_holds_a_bare_string_that_streamlit_would_show(page):
    # Streamlit's "magic" writes every bare expression of a page script to the page: a string after a constant
    # (an attribute docstring) shows up as text above the title. The module docstring is the one it leaves out.
    tree = ast.parse((APP / page.file).read_text())
    bare = [n.lineno for n in tree.body[1:] if isinstance(n, ast.Expr) and isinstance(n.value, ast.Constant)]
    assert not bare, f"{page.file} lines {bare}: write a comment instead"


def test_docs_app_md_counts_lists_and_shows_every_page_in_order():
    word = re.search(r"^(\w+) pages, every number", DOCS, re.M).group(1)
    assert word.lower() == NUMBER_WORDS[len(PAGES)]
    listed = re.findall(r"^(\d+)\. \*\*([^*]+)\*\*", DOCS, re.M)
    assert listed == [(str(n), p.title) for n, p in enumerate(PAGES, 1)]
    shots = re.findall(r"!\[[^\]]*\]\(screenshots/([^)]+)\)", DOCS)
    assert shots == [screenshot(p) for p in PAGES]


def test_dfpo_app_help_says_what_each_page_shows_and_how_to_open_the_explorer():
    text = " ".join(_help("app").split())
    assert f"a Streamlit app of {len(PAGES)} pages" in text
    for n, page in enumerate(PAGES, 1):
        assert f"{n}. {page.title}: {' '.join(page.shows.split())}" in text
    assert "http://127.0.0.1:8501" in text and "open that address in a browser" in text and "--browser" in text


def test_dfpo_help_names_every_page_and_their_count():
    text = " ".join(_help().split())
    assert f"{len(PAGES)} pages:" in text
    assert all(page.title.lower() in text.lower() for page in PAGES)


def test_the_screenshot_tour_opens_every_page_and_names_each_shot_by_its_number():
    shots = load_script("scripts/screenshots.py", "dfpo_screenshots_pages")
    assert set(shots.SHOWCASE) == {p.file for p in PAGES}

    class Page:  # stands in for a browser page: records the file name each shot gets
        def close(self):
            pass

    taken = []
    shots.SHOWCASE = dict.fromkeys(shots.SHOWCASE, lambda context, url: Page())
    shots.shot = lambda page, out, name: taken.append(name) or out / f"{name}.png"
    shots.tour(None, "http://x", Path("/nowhere"))
    assert [f"{t}.png" for t in taken] == [screenshot(p) for p in PAGES]


PAGE_REFERENCE = re.compile(r"\b[Pp]ages? (\d+)(?: \(([^)]*)\))?((?:,? (?:and )?\d+(?: \([^)]*\))?)*)")
"""'page 5', 'Page 2:', 'pages 1 (cancellation by hand), 2 (atlas) and 4 (claims ledger)'."""


APP_TEXTS = ("app", "tests/app", "docs/app.md", "README.md", "scripts/screenshots.py", "benchmarks/app_latency.py", "dfpo/cli.py")
"""Where the explorer's pages are written about (elsewhere "page 5" is the paper's page, e.g. in docs/ledger.md)."""


def _app_text_files() -> list[Path]:
    out = subprocess.run(["git", "ls-files", *APP_TEXTS], cwd=ROOT, capture_output=True, text=True, check=True).stdout
    return [ROOT / f for f in out.split() if f.endswith((".py", ".md")) and (ROOT / f).is_file()]


def test_every_page_number_written_about_the_app_names_a_page_that_exists_by_its_title():
    wrong = []
    for path in _app_text_files():
        if path.name == "test_pages.py":
            continue
        for m in PAGE_REFERENCE.finditer(path.read_text(errors="replace")):
            refs = [(m.group(1), m.group(2))] + re.findall(r"(\d+)(?: \(([^)]*)\))?", m.group(3) or "")
            for n, name in refs:
                if not 1 <= int(n) <= len(PAGES):
                    wrong.append(f"{path.relative_to(ROOT)}: {m.group(0)!r} (there are {len(PAGES)} pages)")
                elif name and name.lower() not in PAGES[int(n) - 1].title.lower():
                    wrong.append(f"{path.relative_to(ROOT)}: {m.group(0)!r} (page {n} is {PAGES[int(n) - 1].title})")
    assert not wrong
