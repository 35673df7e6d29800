"""The findings ledger: every sentence README and docs write about an experiment is generated from a record, and
every record's verdicts are what its stored tables give (docs/attribution/findings.toml, docs/attribution/data/)."""

from __future__ import annotations

import math
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


def test_one_family_per_experiment_and_the_same_verdicts_on_every_page():
    """Issue 58: the Bonferroni family is one experiment's rows, so a page that shows more experiments changes no verdict."""
    readme = summaries(FINDINGS, EVIDENCE, "readme")
    page = summaries(FINDINGS, EVIDENCE, "attribution")
    for summary in (readme, page):
        rows = {r.key(): r for f in summary.findings for r in f.rows}
        assert summary.families == {e: sum(r.experiment == e for r in rows.values()) for e in {r.experiment for r in rows.values()}}
    shared = set(readme.verdicts) & set(page.verdicts)
    same_family = [k for k in shared if readme.families[k[0]] == page.families[k[0]]]
    assert all(readme.verdicts[k][i].word == page.verdicts[k][i].word for k in same_family for i in range(2))


def test_adding_an_experiment_changes_no_verdict_of_another():
    full = summaries(FINDINGS, EVIDENCE, "attribution")
    without = [f for f in full.findings if all(r.experiment != "smollm2" for r in f.rows)]
    fewer = Summary("x", without, EVIDENCE)
    assert all(fewer.verdicts[k] == full.verdicts[k] for k in fewer.verdicts)


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


# ----- the dfpo compare outcomes of issue 47: their phrases and the cut of their intervals ---------------------------


def _compare_evidence(values: dict[str, dict[str, list[float]]]) -> dict:
    """Stored ``dfpo compare`` evidence: {label: {metric: per-seed values}}, the same on both seed sets (seeds 0.. on the
    discovery set, 100.. on the confirmation set), every run reaching the threshold."""

    def records(offset: int) -> dict:
        return {
            label: {
                str(offset + i): {"kappa_reached": 1.0, **{m: v[i] for m, v in metrics.items()}}
                for i in range(len(next(iter(metrics.values()))))
            }
            for label, metrics in values.items()
        }

    return {
        "name": "synthetic",
        "title": "Synthetic comparison",
        "kind": "compare",
        "sets": {which: {"doc": {"records": records(offset)}, "controls": {}} for which, offset in zip(SETS, (0, 100))},
    }


NEW_OUTCOMES = ("tax_kl", "equiv_entropy", "shared_events", "residual_length", "cpu_s")


@pytest.mark.parametrize("metric", NEW_OUTCOMES)
def test_every_new_compare_outcome_has_a_phrase_and_a_row_reads_it(metric):
    from dfpo.core.findings import METRICS, Finding, Row, finding_sentences

    ev = _compare_evidence({"dfpo_min": {metric: [2.0, 2.2, 2.1, 2.3]}, "gspo": {metric: [1.0, 1.1, 0.9, 1.0]}})
    finding = Finding("f", "a topic", (Row("synthetic", "dfpo_min", "gspo", metric, ("higher", "higher")),))
    summary = Summary("attribution", [finding], {"synthetic": ev})
    assert summary.mismatches() == []
    (sentence,) = finding_sentences(summary, finding)
    assert sentence.startswith(f"Synthetic comparison, `dfpo_min` against gspo: {METRICS[metric]} higher: +")


def test_the_learning_tax_and_cpu_seconds_say_what_they_contain():
    from dfpo.core.findings import METRICS

    assert "Prop. 3.1" in METRICS["tax_kl"] and "top 256" in METRICS["tax_kl"] and "eval prompts" in METRICS["tax_kl"]
    assert METRICS["tax_kl"].startswith("learning-tax proxy") and "never get a gradient" in METRICS["tax_kl"]
    assert "equivalent correct answers" in METRICS["equiv_entropy"] and "last 10 steps" in METRICS["equiv_entropy"]
    assert "1/length" in METRICS["residual_length"] and "CPU seconds" in METRICS["cpu_s"]
    assert not any("|" in METRICS[m] for m in NEW_OUTCOMES)  # a name never breaks the markdown it is written into


@pytest.mark.parametrize(
    "metric, values, low, high",
    [
        ("tax_kl", [1e-4, 5e-3, 2e-5], 0.0, None),  # a KL against 0: its interval's lower end is cut at 0
        ("equiv_entropy", [1.0, 1.09, 0.2], 0.0, math.log(3)),
        ("shared_events", [0.0, 12.0, 1.0], 0.0, None),
        ("residual_length", [0.99, 0.2, 0.98], None, 1.0),
        ("cpu_s", [5.0, 900.0, 40.0], 0.0, None),
    ],
)
def test_a_rows_interval_against_0_is_cut_to_the_values_the_metric_can_take(metric, values, low, high):
    """Invariant: the cut interval lies inside the metric's support and inside the uncut t-interval, around the same mean."""
    from dfpo.core import stats
    from dfpo.core.findings import BOUNDS, Row, row_verdict

    assert BOUNDS[metric] == (low, high)
    ev = _compare_evidence({"m": {metric: values}, "c": {metric: [0.0] * len(values)}})
    v = row_verdict(ev, "confirmation", Row("synthetic", "m", "", metric, ("inconclusive", "inconclusive")), tests=3)
    raw = stats.paired_interval(values, tests=3)
    assert v.interval.mean == raw.mean and raw.low <= v.interval.low <= v.interval.high <= raw.high
    assert (low is None or v.interval.low >= low) and (high is None or v.interval.high <= high)
    assert (low is not None and raw.low < low) or (high is not None and raw.high > high)  # these values need the cut


def test_a_difference_of_two_bounded_values_is_cut_to_their_range_and_an_unbounded_one_is_not():
    from dfpo.core import stats
    from dfpo.core.findings import cut_interval

    wide = stats.Interval(0.5, -3.0, 4.0, 3, 0.95, 1)
    assert cut_interval(wide, (0.0, math.log(3)), paired=True).as_tuple() == (0.5, -math.log(3), math.log(3))
    assert cut_interval(wide, (0.0, None), paired=True).as_tuple() == (0.5, -3.0, 4.0)
    assert cut_interval(wide, (0.0, None), paired=False).as_tuple() == (0.5, 0.0, 4.0)
    assert cut_interval(wide, (None, None), paired=False) == wide


def test_the_real_model_sentence_names_each_replicated_effect_and_counts_the_rest():
    """What replicated on a language model is generated from its rows' verdicts: named when both sets agree, counted otherwise."""
    from dfpo.core.findings import Finding, Row, replication_sentence

    ev = _compare_evidence(
        {
            "m": {"eval": [0.9, 0.8, 0.85, 0.9], "residual": [0.5, 0.1, 0.6, 0.2]},
            "c": {"eval": [0.2, 0.25, 0.2, 0.3], "residual": [0.3, 0.4, 0.2, 0.5]},
        }
    )
    rows = (
        Row("synthetic", "m", "c", "eval", ("higher", "higher")),
        Row("synthetic", "m", "c", "residual", ("inconclusive", "inconclusive")),
    )
    summary = Summary("readme", [Finding("f", "a topic", rows)], {"synthetic": ev})
    assert summary.mismatches() == []
    assert replication_sentence(summary, "synthetic") == (
        "Synthetic comparison, 1 of the 2 rows replicated an effect on both seed sets (`m` against c: final eval accuracy higher); "
        "of the others, 1 not shown either way."
    )


def test_the_real_model_sentence_says_when_nothing_replicated():
    from dfpo.core.findings import Finding, Row, replication_sentence

    ev = _compare_evidence({"m": {"eval": [0.5, 0.1, 0.6, 0.2]}, "c": {"eval": [0.3, 0.4, 0.2, 0.5]}})
    summary = Summary(
        "readme", [Finding("f", "a topic", (Row("synthetic", "m", "c", "eval", ("inconclusive", "inconclusive")),))], {"synthetic": ev}
    )
    assert replication_sentence(summary, "synthetic") == (
        "Synthetic comparison, none of the 1 rows replicated an effect on both seed sets (1 not shown either way)."
    )


def test_readme_says_what_replicated_on_the_real_model():
    readme = (ROOT / "README.md").read_text()
    assert re.search(r"On SmolLM2-135M-Instruct \(sum task, CPU\), (\d+ of the \d+|none of the \d+) rows replicated", readme)


# ----- issue 57: what the real model's sentences may say -------------------------------------------------------------


def test_a_signed_metric_reads_in_its_own_units_beside_the_control_mean_and_length_aware_carries_its_caveat():
    """residual_length takes either sign: its change is never a percent of a control mean near 0, and under length-aware
    Min-Replace it is lower by construction (CAVEATS); under another method it carries no caveat."""
    from dfpo.core.findings import Finding, Row, finding_sentences

    values = {"residual_length": [-0.08, -0.1, -0.06, -0.09]}
    for method, caveat in (("dfpo_min:length_aware=true", True), ("dfpo_min", False)):
        ev = _compare_evidence({method: values, "gspo": {"residual_length": [0.05, 0.06, 0.04, 0.05]}})
        finding = Finding("f", "a topic", (Row("synthetic", method, "gspo", "residual_length", ("lower", "lower")),))
        (sentence,) = finding_sentences(Summary("attribution", [finding], {"synthetic": ev}), finding)
        phrase = sentence.split(": ", 1)[1]
        assert "lower: -0.133 [" in phrase and "(control mean +0.05)" in phrase and "%" not in phrase
        assert ("lower by construction" in phrase) == caveat


def test_the_stored_length_part_of_the_residual_is_in_absolute_units_computed_from_its_records():
    import numpy as np

    from dfpo.core.findings import finding_sentences

    page = summaries(FINDINGS, EVIDENCE, "attribution")
    (finding,) = [f for f in page.findings if any(r.metric == "residual_length" for r in f.rows)]
    text = " ".join(finding_sentences(page, finding))
    (row,) = [r for r in finding.rows if r.metric == "residual_length"]
    records = EVIDENCE[row.experiment]["sets"]["confirmation"]["doc"]["records"]
    seeds = sorted(records[row.control], key=int)
    method = np.array([records[row.method][s]["residual_length"] for s in seeds])
    control = np.array([records[row.control][s]["residual_length"] for s in seeds])
    assert f"lower: {np.mean(method - control):+.3g} [" in text and f"(control mean {np.mean(control):+.3g})" in text
    assert "lower by construction" in text and not re.search(r"residual \(eq 2's residual due.*?lower: [-+][\d.]+%", text)


def test_a_topic_says_step_size_matched_only_where_the_stored_tables_match_the_step_size():
    """A finding's topic calling its control step-size-matched needs every row's control to be step-size-matched in the
    stored tables (the score form's gspo_noclip is only trust-region-matched: its step size is said as a figure)."""
    from dfpo.core.findings import control_text

    for f in FINDINGS:
        if "step-size-matched" in f.topic:
            for r in f.rows:
                assert "step-size-matched" in control_text(EVIDENCE[r.experiment], "confirmation", r), (f.id, r.key())


def test_the_update_norm_match_is_a_figure_computed_from_the_stored_tables():
    import numpy as np

    from dfpo.core.findings import Row, control_text

    ev = EVIDENCE["smollm2"]
    row = Row("smollm2", "dfpo_min:stopgrad=score", "gspo_noclip", "eval", ("inconclusive", "inconclusive"))
    change = {}
    for which in SETS:
        records = ev["sets"][which]["doc"]["records"]
        seeds = sorted(records[row.control], key=int)
        m, c = ([records[label][s]["update_norm"] for s in seeds] for label in (row.method, row.control))
        change[which] = 100 * (np.mean(m) / np.mean(c) - 1)
    text = control_text(ev, "confirmation", row)
    within = math.ceil(max(abs(v) for v in change.values()))
    assert text.startswith("against its trust-region-matched control gspo_noclip (") and f"within {within}% of the control's" in text
    assert f"{change['confirmation']:+.1f}% on the confirmation set, {change['discovery']:+.1f}% on the discovery set" in text


def test_a_synthetic_update_norm_two_percent_above_the_controls_reads_within_2_percent():
    from dfpo.core.findings import Row, update_norm_text

    ev = _compare_evidence({"m": {"update_norm": [1.02, 2.04]}, "c": {"update_norm": [1.0, 2.0]}})
    ev["sets"] = {w: {**s, "controls": {"m - c": []}} for w, s in ev["sets"].items()}
    text = update_norm_text(ev, Row("synthetic", "m", "c", "eval", ("inconclusive", "inconclusive")))
    assert "within 2% of the control's: +2.0% on the confirmation set, +2.0% on the discovery set" in text
    without = _compare_evidence({"m": {"eval": [0.5, 0.6]}, "c": {"eval": [0.5, 0.6]}})
    assert update_norm_text(without, Row("synthetic", "m", "c", "eval", ("inconclusive", "inconclusive"))) == ""


@pytest.mark.parametrize("page", ["README.md", "docs/attribution.md", "docs/trainer.md"])
def test_the_real_models_tax_is_named_a_proxy_wherever_a_page_prints_it(page):
    """SmolLM2's eval/tax_kl is a KL at the prompt positions, which never get a gradient: never 'learning tax' bare.
    The one KL called a learning tax is the one at the answer template's positions (eval/template_kl, Prop. 3.1's)."""
    text = (ROOT / page).read_text()
    called_tax = re.findall(r"learning tax \(KL of pi_init([^,;)]*)", text)
    assert set(called_tax) <= {" to the policy at the answer template's positions"}, set(called_tax)
    assert "learning tax `eval/tax_kl`" not in text


def test_a_stored_registered_experiment_shows_its_pictures_and_a_pending_one_none(tmp_path, monkeypatch):
    """Issue 58 item 7: once its tables are stored, a registered experiment's section embeds the per-row picture and
    each seed set's curves that attribution_data.py --registered drew; before that, no picture is named."""
    page = _script("attribution_page")
    reg = type("Reg", (), {"experiment": "x", "sets": [type("S", (), {"name": "x-a"})(), type("S", (), {"name": "x-b"})()]})()
    monkeypatch.setattr(page, "LEDGER", tmp_path)
    assert page.registered_pictures(reg) == []
    for name in ("x-rows.png", "x-x-a-curves.png", "x-x-b-curves.png"):
        (tmp_path / name).write_bytes(b"\x89PNG")
    assert page.registered_pictures(reg) == [
        "![x-rows](attribution/x-rows.png)",
        "![x-x-a-curves](attribution/x-x-a-curves.png)",
        "![x-x-b-curves](attribution/x-x-b-curves.png)",
    ]


def test_the_findings_ledger_leaves_a_registered_experiments_tables_to_its_registration(tmp_path):
    """read_ledger: data/NAME.json of kind registered-compare (judged by its registered rows) is not a findings pair."""
    import shutil

    from dfpo.core.findings import REGISTERED_KIND

    (tmp_path / "data").mkdir()
    shutil.copy(LEDGER / "findings.toml", tmp_path / "findings.toml")
    (tmp_path / "data" / "pair.json").write_text('{"kind": "compare", "sets": {}}')
    (tmp_path / "data" / "stage.json").write_text(f'{{"kind": "{REGISTERED_KIND}", "sets": {{}}}}')
    _, evidence = read_ledger(tmp_path)
    assert list(evidence) == ["pair"]
