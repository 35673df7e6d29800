"""``dfpo.core.drift_tables``: the cross share's side, and replication: a finding is written only when two disjoint
seed sets give the same decisive verdict, and its sentence is generated from the confirmation set's figures."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from dfpo.core import stats
from dfpo.core.drift_tables import cross_shares, figure_interval, findings_markdown, replication, share_table


def _doc(seeds: list[int], measured: dict[str, list[float]], share: dict[str, list[float]]) -> dict:
    records = [
        {
            "seed": s,
            "objective": label,
            "kind": "shared",
            "events": 3,
            "coef": 0.1,
            "direct": 1.0,
            "cross": 1.0,
            "measured": m,
            "cross_share": c,
        }
        for label in measured
        for s, m, c in zip(seeds, measured[label], share[label])
    ]
    return {"command": "dfpo probe", "objectives": list(measured), "controls": {"dfpo_min": "gspo"}, "seeds": seeds, "records": records}


LOWER = {"gspo": [1.0, 1.1, 0.9, 1.0, 1.2, 0.8], "dfpo_min": [0.5, 0.6, 0.4, 0.5, 0.7, 0.3]}
MIXED = {"gspo": [1.0, 1.1, 0.9, 1.0, 1.2, 0.8], "dfpo_min": [1.5, 0.6, 1.4, 0.5, 1.7, 0.3]}
SHARES = {"gspo": [0.8, 0.85, 0.9, 0.82, 0.88, 0.86], "dfpo_min": [0.2, 0.9, 0.4, 0.7, 0.1, 0.6]}


def test_the_cross_share_has_a_side_only_when_its_interval_excludes_one_half():
    sides = {s.objective: s.side for s in cross_shares(_doc(list(range(6)), LOWER, SHARES))}
    assert sides == {"gspo": "more than half", "dfpo_min": "inconclusive"}
    assert "| `gspo` | shared | 85% [" in share_table(_doc(list(range(6)), LOWER, SHARES))


def test_a_finding_both_seed_sets_agree_on_is_written_from_the_confirmation_figures():
    found = {f.key: f for f in replication(_doc(list(range(6)), LOWER, SHARES), _doc(list(range(6, 12)), LOWER, SHARES))}
    measured = found[("control", "dfpo_min", "gspo", "shared", "measured")]
    assert measured.replicated and measured.sentence.startswith("`dfpo_min` lowers the measured one-step drift of a shared token")
    assert "-0.5 [" in measured.sentence and "(6 seeds, control mean 1)" in measured.sentence
    assert found[("cross_share", "gspo", "shared")].replicated
    assert not found[("cross_share", "dfpo_min", "shared")].replicated  # inconclusive on both sets is no finding


@pytest.mark.parametrize("confirmation", [MIXED, {"gspo": LOWER["dfpo_min"], "dfpo_min": LOWER["gspo"]}])
def test_an_effect_the_second_seed_set_does_not_give_is_not_a_finding(confirmation):
    found = {f.key: f for f in replication(_doc(list(range(6)), LOWER, SHARES), _doc(list(range(6, 12)), confirmation, SHARES))}
    measured = found[("control", "dfpo_min", "gspo", "shared", "measured")]
    assert not measured.replicated and measured.sentence == ""


def test_the_findings_list_names_the_seed_sets_and_counts_what_did_not_replicate():
    md = findings_markdown([("tiny add", _doc(list(range(6)), LOWER, SHARES), _doc(list(range(6, 12)), MIXED, SHARES))])
    assert md.startswith("- **tiny add** (seeds 0-5 (discovery) and 6-11 (confirmation); `dfpo probe`):")
    assert "did not replicate and are not findings" in md and "could not be made" in md
    assert "lowers the measured" not in md


def test_a_comparison_that_did_not_replicate_is_named_with_both_verdicts_not_as_an_effect():
    md = findings_markdown([("tiny add", _doc(list(range(6)), LOWER, SHARES), _doc(list(range(6, 12)), MIXED, SHARES))])
    assert (
        "No finding: `dfpo_min` against `gspo` on the measured one-step drift of a shared token was reproduced (discovery) and inconclusive (confirmation)."
        in md
    )


def _split_doc(seeds: list[int], ratio: float) -> dict:
    """A document after the momentum/decay split: gspo's batch is mostly cross, its prediction mostly momentum."""
    records = [
        {
            "seed": s,
            "objective": "gspo",
            "kind": "shared",
            "events": 3,
            "direct": 0.1,
            "cross": 1.0,
            "momentum": 1.1,
            "decay": 0.0,
            "measured": 0.2,
            "error": 0.2 * ratio,
            "error_ratio": ratio + 0.01 * k,
            "cross_share": 0.45 + 0.005 * k,
            "batch_cross_share": 0.9 + 0.005 * k,
        }
        for k, s in enumerate(seeds)
    ]
    return {"command": "dfpo probe", "objectives": ["gspo"], "controls": {}, "seeds": seeds, "records": records}


def test_both_cross_shares_are_tested_and_worded_of_what_they_are_shares():
    doc = _split_doc(list(range(6)), 0.1)
    assert [s.side for s in cross_shares(doc)] == ["less than half"]
    assert [s.side for s in cross_shares(doc, "batch_cross_share")] == ["more than half"]
    found = {f.key: f for f in replication(doc, _split_doc(list(range(6, 12)), 0.1))}
    assert "more than half of this batch's own gradient's part" in found[("batch_cross_share", "gspo", "shared")].sentence
    assert "less than half of the first-order prediction" in found[("cross_share", "gspo", "shared")].sentence
    table = share_table(doc)
    assert "of the first-order prediction" in table and "of the drift" not in table and "predates" not in table
    assert "predates the momentum/decay split" in share_table(_doc(list(range(6)), LOWER, SHARES))
    with pytest.raises(ValueError, match="rule 3 reads one of"):
        cross_shares(doc, "momentum_share")


def test_the_first_order_error_is_flagged_above_the_limit_only():
    from dfpo.core import probe
    from dfpo.core.drift_tables import FIRST_ORDER_ERROR_LIMIT, first_order_flags, summary_table

    assert FIRST_ORDER_ERROR_LIMIT == probe.FIRST_ORDER_ERROR_LIMIT
    assert first_order_flags(_split_doc(list(range(4)), 0.1)) == []
    (flag,) = first_order_flags(_split_doc(list(range(3)), 5.1))
    assert flag.startswith("First-order error: under `gspo`, for a shared token, mean abs(measured - predicted) exceeds 0.5x")
    assert "on 3 of 3 seeds (0, 1, 2; worst 5.12x on seed 2, mean over seeds 5.11x)" in flag and "not of the measured drift" in flag
    one = _split_doc(list(range(8)), 0.1)
    one["records"][3]["error_ratio"] = 5.1  # one seed past the limit is enough for a flag
    (flag,) = first_order_flags(one)
    assert "on 1 of 8 seeds (3; worst 5.1x on seed 3" in flag
    head = summary_table(_split_doc(list(range(4)), 0.1)).splitlines()[0]
    assert "abs momentum" in head and "error / abs measured" in head and "abs coef" not in head  # a figure no record holds is left out


@given(st.lists(st.floats(0.0, 1.0), min_size=2, max_size=12), st.sampled_from(["cross_share", "momentum_share", "batch_cross_share"]))
def test_a_share_interval_stays_in_0_1_and_still_holds_the_mean(vals, figure):
    """A share's interval never leaves [0, 1], and the mean over seeds stays inside it."""
    iv = figure_interval(vals, figure)
    assert 0.0 <= iv.low <= iv.mean + 1e-12 and iv.mean - 1e-12 <= iv.high <= 1.0


def test_a_magnitude_interval_is_cut_at_0_only_where_the_t_interval_crosses_it():
    wide = figure_interval([0.001, 0.1], "cross")  # the t-interval of 2 seeds reaches far below 0
    assert wide.low == 0.0 and wide.high == stats.paired_interval([0.001, 0.1]).high
    tight = figure_interval([1.0, 1.1, 0.9], "measured")
    assert tight.as_tuple() == stats.paired_interval([1.0, 1.1, 0.9]).as_tuple()
