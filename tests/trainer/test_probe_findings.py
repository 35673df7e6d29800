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
