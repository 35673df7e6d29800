"""Which rule picked a probe's shared events, where it is shown: probe.json's ``shared_events``, probe.md's line on
it (with the events found before the cap), the drift page's note for a document stored before the subset rule, and
log.param_drift's ``drift/shared_found`` keys."""

from __future__ import annotations

import copy
import json
from pathlib import Path

import torch

from dfpo.app.drift import doc_table
from dfpo.core.loss import group_advantages
from dfpo.core.metric_registry import lookup
from dfpo.core.param_atlas import SharedWeightsLM
from dfpo.core.probe import DriftBatch, document_rule, probe_step
from dfpo.trainer.probe.report import events_sentence, render_markdown
from dfpo.trainer.probe.seeds import SHARED_RULE
from dfpo.trainer.probe.stage import drift_metrics

STORED = Path(__file__).resolve().parents[2] / "docs" / "probe" / "add-discovery.json"


def test_a_stored_document_reads_as_the_whole_group_rule():
    doc = json.loads(STORED.read_text())
    assert "shared_events" not in doc and document_rule(doc) == "whole"
    md = render_markdown(doc)
    assert "Shared events: the whole-group rule" in md and "no shared_events field" in md
    assert any("whole-group rule" in n for n in doc_table(doc).notes)


def test_a_subset_document_says_how_many_events_were_found_before_the_cap():
    doc = copy.deepcopy(json.loads(STORED.read_text()))
    doc["shared_events"] = SHARED_RULE
    found = {0: (30, 2), 1: (7, 0), 2: (12, 1)}
    doc["seeds"] = sorted(found)
    doc["records"] = [r for r in doc["records"] if r["seed"] in found]
    for r in doc["records"]:
        if r["kind"] == "shared":
            r["found"], r["found_whole"] = found[r["seed"]]
    line = events_sentence(doc)
    assert "subset rule" in line and "median 12 (min 7, max 30, 3 seeds)" in line and "median 1 (min 0, max 2)" in line
    assert line in render_markdown(doc)
    assert not any("whole-group rule" in n for n in doc_table(doc).notes)


def test_param_drift_logs_the_events_found_before_the_cap():
    model = SharedWeightsLM(max_len=6, seed=0)
    gen = torch.Generator().manual_seed(0)
    tokens = torch.randint(0, 2, (8, 5), generator=gen)  # (B, T): two groups of 4 over 2 tokens, many subset events
    mask = torch.ones(8, 5, dtype=torch.bool)
    group_ids = torch.arange(2).repeat_interleave(4)
    adv = group_advantages(torch.tensor([1.0, 0, 1, 0, 0, 1, 1, 0], dtype=torch.float64), group_ids)
    with torch.no_grad():
        old = model(tokens)
    batch = DriftBatch(tokens=tokens, mask=mask, group_ids=group_ids, advantages=adv, old_logp=old)
    score = lambda rows: (model(tokens[rows]), None)  # noqa: E731
    report = probe_step(score, torch.optim.SGD(model.parameters(), lr=0.01), batch, "grpo", max_events=3)
    out = drift_metrics(report, old, mask)
    assert out["drift/shared_events"] == 3 < out["drift/shared_found"] == report.found
    assert out["drift/shared_found_whole"] == report.found_whole <= report.found
    assert all(lookup(key) is not None for key in out)


def test_the_stored_findings_name_the_whole_group_rule():
    from dfpo.trainer.probe.findings import findings_block, titled

    block = findings_block(STORED.parent)
    assert block.count("whole-group shared events, as stored before the probe took eq 2's subset events") >= 3
    doc = json.loads(STORED.read_text())
    assert titled("t", {**doc, "shared_events": "subset"}, {**doc, "shared_events": "subset"}) == "t"
