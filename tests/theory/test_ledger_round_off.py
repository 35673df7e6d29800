"""The claims ledger states round-off as a bound after its relation ("max |a.stilde| < 1e-13"), never as "= <1e-13"
(issue 57)."""

from __future__ import annotations

import re
from pathlib import Path

from dfpo.theory.ledger import run_ledger
from dfpo.theory.tabular import equals, fmt

ROOT = Path(__file__).resolve().parents[2]


def test_round_off_is_printed_as_a_bound_after_the_relation_it_states():
    assert (fmt(3e-15), fmt(-3e-15), fmt(0.0), fmt(0.09731)) == ("< 1e-13", "> -1e-13", "0", "0.0973")
    assert (equals(3e-15), equals(-3e-15), equals(0.0), equals(0.09731)) == ("< 1e-13", "> -1e-13", "= 0", "= 0.0973")


def test_the_ledger_never_writes_equals_followed_by_a_bound():
    (claim,) = run_ledger(["eq-18"])  # max |a.stilde| over 600 projections: float round-off
    assert re.search(r"max \|a\.stilde\| over 600 loss-core projections (< 1e-13|= 0);", claim.evidence), claim.evidence
    stored = (ROOT / "docs" / "ledger.md").read_text()
    assert not re.search(r"= ?-?< ?1e-13|= ?> ?-1e-13", stored), "docs/ledger.md: regenerate with dfpo theory --markdown docs/ledger.md"
