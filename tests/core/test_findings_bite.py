"""Tests that bite the real model's replication sentence (issue 57 item 11, mutation/realmodel.toml): it reads its
own experiment's rows, each once, and a replicated effect carries its metric's caveat."""

from __future__ import annotations

from dfpo.core.findings import SETS, Finding, Row, Summary, agreement, replication_sentence


def _evidence(name: str, values: dict[str, dict[str, list[float]]]) -> dict:
    """Stored ``dfpo compare`` evidence named ``name``: {label: {metric: per-seed values}}, the same on both seed sets,
    every run reaching the threshold."""

    def records(offset: int) -> dict:
        return {
            label: {str(offset + i): {"kappa_reached": 1.0, **{m: v[i] for m, v in metrics.items()}} for i in range(4)}
            for label, metrics in values.items()
        }

    return {
        "name": name,
        "title": f"Experiment {name}",
        "kind": "compare",
        "sets": {which: {"doc": {"records": records(offset)}, "controls": {}} for which, offset in zip(SETS, (0, 100))},
    }


HIGHER = {"m": {"eval": [0.9, 0.8, 0.85, 0.9]}, "c": {"eval": [0.2, 0.25, 0.2, 0.3]}}
UNCLEAR = {"m": {"eval": [0.5, 0.1, 0.6, 0.2]}, "c": {"eval": [0.3, 0.4, 0.2, 0.5]}}


def test_the_sentence_reads_only_its_own_experiments_rows():
    rows_a = (Row("a", "m", "c", "eval", ("higher", "higher")),)
    rows_b = (Row("b", "m", "c", "eval", ("inconclusive", "inconclusive")),)
    summary = Summary(
        "readme", [Finding("f", "t", rows_a), Finding("g", "t", rows_b)], {"a": _evidence("a", HIGHER), "b": _evidence("b", UNCLEAR)}
    )
    assert summary.mismatches() == []
    assert replication_sentence(summary, "a") == (
        "Experiment a, 1 of the 1 rows replicated an effect on both seed sets (`m` against c: final eval accuracy higher)."
    )
    assert (
        replication_sentence(summary, "b")
        == "Experiment b, none of the 1 rows replicated an effect on both seed sets (1 not shown either way)."
    )


def test_a_row_two_findings_read_is_counted_once():
    row = Row("a", "m", "c", "eval", ("higher", "higher"))
    summary = Summary("readme", [Finding("f", "t", (row,)), Finding("g", "t", (row,))], {"a": _evidence("a", HIGHER)})
    assert replication_sentence(summary, "a").startswith("Experiment a, 1 of the 1 rows replicated an effect")


def test_a_replicated_effect_under_length_aware_min_replace_carries_its_caveat():
    method = "dfpo_min:length_aware=true"
    values = {method: {"residual_length": [-0.08, -0.1, -0.06, -0.09]}, "gspo": {"residual_length": [0.05, 0.06, 0.04, 0.05]}}
    row = Row("a", method, "gspo", "residual_length", ("lower", "lower"))
    summary = Summary("readme", [Finding("f", "t", (row,))], {"a": _evidence("a", values)})
    assert summary.mismatches() == []
    sentence = replication_sentence(summary, "a")
    assert sentence.startswith(
        "Experiment a, 1 of the 1 rows replicated an effect on both seed sets (`dfpo_min:length_aware=true` against gspo: "
    )
    assert sentence.endswith(" lower (lower by construction)).")


AGREEMENT = {
    # discovery: lower, higher, negligible, inconclusive; one confirmation word a line
    "lower": ("effect", "did not replicate", "did not replicate", "not shown"),
    "higher": ("did not replicate", "effect", "did not replicate", "not shown"),
    "negligible": ("did not replicate", "did not replicate", "negligible", "not shown"),
    "inconclusive": ("not shown", "not shown", "not shown", "not shown"),
}
"""agreement(discovery, confirmation) for every pair, by hand: the same effect on both sets, negligible on both,
inconclusive on either (not shown), else two different conclusive words (did not replicate)."""


def test_every_pair_of_verdict_words_has_its_agreement():
    words = ("lower", "higher", "negligible", "inconclusive")
    for c, row in AGREEMENT.items():
        assert [agreement(d, c) for d in words] == list(row), c
