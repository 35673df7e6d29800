"""The docs' drift findings come from stored probe documents on disjoint seed sets, and only from them."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from dfpo.trainer.probe.findings import STORED, findings_block, load_stored

DOCS = Path(__file__).resolve().parents[2] / "docs" / "probe"


def test_every_stored_pair_is_there_on_disjoint_seeds_and_reads_as_findings():
    pairs = load_stored(DOCS)
    assert len(pairs) == len(STORED)
    for _, discovery, confirmation in pairs:
        assert not set(discovery["seeds"]) & set(confirmation["seeds"])
        assert discovery["objectives"] == confirmation["objectives"]
    assert findings_block(DOCS).count("- **") == len(STORED)


def test_a_missing_document_or_an_overlapping_confirmation_set_is_one_sentence(tmp_path):
    with pytest.raises(ValueError, match="no stored probe document"):
        load_stored(tmp_path)
    for _, disc, conf in STORED:
        shutil.copy(DOCS / disc, tmp_path / disc)
        shutil.copy(DOCS / disc, tmp_path / conf)  # the confirmation set is the discovery set again
    with pytest.raises(ValueError, match="share seeds"):
        load_stored(tmp_path)
    assert json.loads((tmp_path / STORED[0][1]).read_text())["seeds"]


def test_the_real_model_paragraph_is_generated_from_its_stored_documents_alone():
    """The probe of SmolLM2 before training (two seed sets) and log.param_drift across training (one run per objective)."""
    from dfpo.trainer.probe import across
    from dfpo.trainer.probe.findings import REAL_MODEL, real_model_block

    text = real_model_block(DOCS, "figures/x.png")
    disc = json.loads((DOCS / f"{REAL_MODEL}-discovery.json").read_text())
    conf = json.loads((DOCS / f"{REAL_MODEL}-confirmation.json").read_text())
    drift = json.loads((DOCS / f"{REAL_MODEL}-drift.json").read_text())
    assert disc["settings"]["model"] == conf["settings"]["model"] == "smollm2-135m-instruct"
    from dfpo.trainer.probe.command import events_sentence
    from dfpo.trainer.probe.findings import pairs_sentence

    for which, doc in (("discovery", disc), ("confirmation", conf)):
        assert f"- {which} set: {events_sentence(doc)} {pairs_sentence(doc)}" in text and "found in a seed's batch" in text
    assert across.summary_sentence(drift) in text and text.endswith("(figures/x.png)")
    assert len(drift["runs"]) >= 2 and all(run["steps"] for run in drift["runs"].values())


def test_the_equivalent_pairs_sentence_counts_the_seeds_whose_batch_held_one():
    """A seed counts once however many pairs it held; a seed with none is counted out."""
    from dfpo.trainer.probe.findings import pairs_sentence

    records = [{"seed": s, "kind": "equivalent", "events": n} for s, n in ((0, 3.0), (0, 1.0), (1, 0.0), (2, 2.0))]
    records.append({"seed": 1, "kind": "shared", "events": 5.0})
    assert pairs_sentence({"seeds": [0, 1, 2], "records": records}) == "Equivalent pairs: in 2 of 3 seeds' batches."


def test_an_objectives_parts_are_the_means_over_seeds_of_its_shared_records():
    """parts_sentence: each figure averaged over the seeds that hold shared events; other kinds and labels left out."""
    from dfpo.trainer.probe.findings import parts_sentence

    def record(seed, label, kind, scale):
        figures = {"coef": 1.0, "direct": 2.0, "cross": 3.0, "momentum": 4.0, "measured": 5.0, "direct_share": 0.01, "error_ratio": 0.1}
        return {"seed": seed, "objective": label, "kind": kind, **{k: v * scale for k, v in figures.items()}}

    doc = {
        "records": [
            record(0, "a", "shared", 1),
            record(1, "a", "shared", 3),
            record(0, "b", "shared", 100),
            record(0, "a", "equivalent", 50),
        ]
    }
    assert (
        parts_sentence(doc, "a")
        == "`a`: coef 2, direct 4, cross 6, momentum 8, measured 10; the direct part is 2% of the first-order prediction; first-order error 20.0% of the measured change"
    )


def test_the_stored_template_probe_cancels_the_direct_part_of_the_whole_group_events():
    """Eq 2's cancellation on the real model: under the exact-cancellation arm the probed shared events' direct part is
    under 1% of gspo_noclip's on each stored seed set (the arm zeroes it on whole-group events; subset events remain)."""
    from dfpo.trainer.probe.findings import TEMPLATE, stored_pair, values

    _, disc, conf = stored_pair(DOCS, TEMPLATE)
    for doc in (disc, conf):
        control = values(doc, "gspo_noclip", "shared", "direct")
        cancelled = values(doc, "gspo_noclip:cancel=shared_whole", "shared", "direct")
        assert len(control) == len(cancelled) == 8
        assert sum(cancelled.values()) < 0.01 * sum(control.values())
