"""The explorer's pages, in the order of its navigation: the one table that ``main.py`` builds the navigation from
and that ``dfpo app --help``, ``dfpo --help``, docs/app.md and the screenshots read their page list, count and
numbers from (no Streamlit here, so the command line stays light). tests/app/test_pages.py fails when a page
number, count or list written elsewhere disagrees with it.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Page:
    """One page of the explorer."""

    file: str
    """Its script, in app/."""
    url_path: str
    """Its path after the server's address ("" for the first page)."""
    title: str
    icon: str
    """A material icon of the navigation (its font is served by the app itself)."""
    shows: str
    """What it shows, in a few words (for the command line's help)."""
    shot: str
    """The stem of its screenshot in docs/screenshots/, after its number."""


PAGES = (
    Page("page_cancel.py", "", "Cancellation by hand", ":material/calculate:", "one group's coefficients on a shared token", "cancellation"),
    Page("page_atlas.py", "atlas", "Cancellation atlas", ":material/grid_on:", "where every objective cancels a shared token", "atlas"),
    Page("page_toy.py", "toy", "Toy lab", ":material/science:", "train objectives on the tabular toy, curves and predictions", "toy"),
    Page("page_ledger.py", "ledger", "Claims ledger", ":material/fact_check:", "every claim of the paper with its verdict and evidence", "ledger"),
    Page("page_runs.py", "runs", "Training runs", ":material/monitoring:", "run folders side by side (curves, evals, configs, samples)", "runs"),
    Page("page_drift.py", "drift", "Parameter-space drift", ":material/scatter_plot:", "how one optimiser step moves shared tokens, part by part", "drift"),
)  # fmt: skip
"""Every page, in the navigation's order: page n is ``PAGES[n - 1]``."""


def number(file: str) -> int:
    """The page number (1-based, the navigation's order) of the page whose script is ``file``."""
    return next(n for n, page in enumerate(PAGES, 1) if page.file == file)


def screenshot(page: Page) -> str:
    """The file name of ``page``'s screenshot in docs/screenshots/: its number, then its stem."""
    return f"{number(page.file)}-{page.shot}.png"


def page_list() -> str:
    """One line per page, numbered: its title and what it shows (``dfpo app --help``)."""
    return "\n".join(f"  {n}. {page.title}: {page.shows}" for n, page in enumerate(PAGES, 1))


def short_list() -> str:
    """The pages' titles on one line (``dfpo --help``)."""
    return ", ".join(page.title[0].lower() + page.title[1:] for page in PAGES)


def screenshot_gallery() -> str:
    """docs/app.md's screenshots, one image per page in the navigation's order (scripts/update_readme.py)."""
    return "\n".join(f"![{n}. {page.title}](screenshots/{screenshot(page)})" for n, page in enumerate(PAGES, 1))
