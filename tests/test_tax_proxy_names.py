"""Every place that names the LLM's eval/tax_kl calls it a proxy of the learning tax (issue 57 follow-up).

eval/tax_kl is a KL at the eval prompts' own positions, which never get a gradient; Prop. 3.1's learning tax is paid
at the completion contexts a group shares (the toy's template rows, the LLM's eval/template_kl). A title or a
description that calls eval/tax_kl 'learning tax' bare says more than it measures."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from dfpo.core.findings import METRICS
from dfpo.core.metric_registry import lookup
from dfpo.trainer.compare_report import OUTCOMES

ROOT = Path(__file__).resolve().parents[1]
BARE = re.compile(r"learning tax(?!-)(?! proxy)", re.I)
"""'learning tax' not followed by ' proxy' (nor by '-', as in 'learning-tax proxy')."""


def _says_proxy(text: str) -> bool:
    return "proxy" in text.lower()


def test_dfpo_compares_tax_kl_column_is_titled_a_proxy():
    title = dict((key, t) for key, t, _ in OUTCOMES)["tax_kl"]
    assert _says_proxy(title) and "Prop. 3.1" not in title


def test_the_registry_describes_eval_tax_kl_as_a_proxy_and_template_kl_as_the_tax():
    assert _says_proxy(lookup("eval/tax_kl").meaning)
    assert not _says_proxy(lookup("eval/template_kl").meaning) and "Prop. 3.1" in lookup("eval/template_kl").meaning


def test_the_findings_name_of_tax_kl_is_a_proxy():
    assert METRICS["tax_kl"].startswith("learning-tax proxy")


def test_docs_metrics_md_heads_its_tax_kl_section_a_proxy():
    headings = [line for line in (ROOT / "docs" / "metrics.md").read_text().splitlines() if line.startswith("#") and "eval/tax_kl" in line]
    assert headings and all(_says_proxy(h) for h in headings)


@pytest.mark.parametrize("page", ["docs/attribution.md", "docs/metrics.md"])
def test_no_page_titles_eval_tax_kl_the_learning_tax_bare(page):
    """No line that names the SmolLM2 tax (eval/tax_kl, or the eval prompts' positions) calls it 'learning tax' bare."""
    lines = (ROOT / page).read_text().splitlines()
    llm = [line for line in lines if "eval/tax_kl" in line or "eval prompts' positions" in line or "eval prompts' own positions" in line]
    assert llm, f"{page} no longer names eval/tax_kl: this test reads nothing"
    bare = [line[:160] for line in llm if BARE.search(line) and "template_kl" not in line]
    assert not bare, bare
