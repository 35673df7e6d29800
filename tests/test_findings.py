"""The findings ledger: every sentence README and docs write about an experiment is generated from a record, and
every record's verdicts are what its stored tables give (docs/attribution/findings.toml, docs/attribution/data/)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from script_modules import load_script

from dfpo.core.findings import (
    SETS,
    Summary,
    conclusion_problems,
    read_ledger,
    summaries,
)

ROOT = Path(__file__).resolve().parents[1]
LEDGER = ROOT / "docs" / "attribution"
FINDINGS, EVIDENCE = read_ledger(LEDGER)


def _script(name: str):
    return load_script(f"scripts/{name}.py")


@pytest.fixture(scope="module")
def attribution() -> Summary:
    return summaries(FINDINGS, EVIDENCE, "attribution")


# ----- the records against their stored tables -----------------------------------------------------------------


def test_the_ledger_has_findings_and_every_row_has_stored_evidence():
    assert FINDINGS and EVIDENCE
    for f in FINDINGS:
        assert f.rows, f.id
        for r in f.rows:
            assert r.experiment in EVIDENCE, f"{f.id}: no docs/attribution/data/{r.experiment}.json"
            assert set(EVIDENCE[r.experiment]["sets"]) == set(SETS)


@pytest.mark.parametrize("finding", FINDINGS, ids=lambda f: f.id)
def test_each_record_has_the_verdicts_its_stored_tables_give(finding, attribution):
    assert not [m for m in attribution.mismatches() if m.startswith(f"{finding.id}:")]


@pytest.mark.parametrize("finding", [f for f in FINDINGS if f.conclusion], ids=lambda f: f.id)
def test_each_conclusion_is_supported_by_its_rows(finding):
    assert not conclusion_problems(finding)


def test_one_family_for_a_summary_and_the_same_verdicts_on_every_page():
    readme = summaries(FINDINGS, EVIDENCE, "readme")
    page = summaries(FINDINGS, EVIDENCE, "attribution")
    assert readme.family == len({r.key() for f in readme.findings for r in f.rows})
    shared = set(readme.verdicts) & set(page.verdicts)
    assert all(readme.verdicts[k][i].word == page.verdicts[k][i].word for k in shared for i in range(2)) or readme.family != page.family


def test_the_two_seed_sets_of_every_experiment_are_disjoint():
    for name, ev in EVIDENCE.items():
        first, second = (ev["sets"][s]["seed_set"] for s in SETS)
        assert first != second, name
        if ev["kind"] == "compare":
            a, b = (set(ev["sets"][s]["doc"]["seeds"]) for s in SETS)
            assert not a & b, name


# ----- pages: generated, and nothing typed about an experiment -------------------------------------------------


def test_the_attribution_page_is_what_its_evidence_and_findings_render():
    page = _script("attribution_page")
    fresh = page.render(page.TEMPLATE.read_text())
    assert (ROOT / "docs" / "attribution.md").read_text() == fresh, "docs/attribution.md is stale: run python scripts/attribution_page.py"


def test_readmes_what_we_found_is_the_generated_findings_block():
    readme = (ROOT / "README.md").read_text()
    section = readme.split("## What we found", 1)[1].split("\n## ", 1)[0]
    block = re.search(r"<!-- BEGIN generated:findings -->\n(.*?)<!-- END generated:findings -->", section, re.S)
    assert block and block.group(1).strip() == _script("update_readme")._findings().strip()


EXPERIMENT_SENTENCE = [
    re.compile(r"[-+]?\d[\d.]*(e[-+]?\d+)?%?\s*\[\s*[-+]?\d[\d.]*(e[-+]?\d+)?%?,\s*[-+]?\d[\d.]*(e[-+]?\d+)?%?\s*\]"),  # a value [lo, hi]
    re.compile(r"\b(replicates?|replicated) (on|difference|effect)|\bon both seed sets\b|\bdiscovery-set effect\b", re.I),
    re.compile(r"\btrains (almost )?as (GSPO|gspo)\b|\bno change in\b|\b\d+% (fewer|lower|higher|more)\b", re.I),
    re.compile(r"\b(learning tax|entropy|Asym|steps?) (is|are|was|were) (lower|higher)\b", re.I),
    re.compile(r"\bthe speed-ups? came from\b|\bnothing (that )?replicates\b", re.I),
]
"""Shapes of a sentence that reports an experiment's result: an interval, a replication, an effect or its absence."""
GENERATED_PAGES = ("attribution.md", "ledger.md")


def _typed_text(path: Path) -> str:
    """The parts of a page a person types: outside generated blocks; nothing of a page generated whole."""
    if path.name in GENERATED_PAGES:
        return ""
    text = re.sub(r"<!-- BEGIN generated:(\w+) -->.*?<!-- END generated:\1 -->", "", path.read_text(), flags=re.S)
    return re.sub(r"\s+", " ", text)  # a sentence wrapped over lines reads as one


@pytest.mark.parametrize("page", [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))], ids=lambda p: p.name)
def test_no_sentence_about_an_experiment_is_typed_by_hand(page):
    """README and docs report experiments only through generated blocks (the findings ledger, the attribution page)."""
    typed = _typed_text(page)
    found = [m.group(0) for pattern in EXPERIMENT_SENTENCE for m in pattern.finditer(typed)]
    assert not found, f"{page.name} types a result by hand: {found[:3]}; generate it from docs/attribution/findings.toml"


def test_the_lint_catches_the_sentences_the_critic_found():
    for typed in (
        "tax +0.4% [-1.8, +2.5]",
        "ratio-form DFPO at GSPO's own clip range trains as GSPO",
        "no change in eval accuracy or steps",
        "the toy's learning tax is lower and the entropy over equivalent answers higher",
        "The earlier -12.7% tax at lr 1 was a discovery-set effect",
        "reaches the threshold in about 75% fewer steps",
    ):
        assert any(p.search(typed) for p in EXPERIMENT_SENTENCE), typed
