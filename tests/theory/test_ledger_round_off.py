"""The claims ledger states round-off as one bound, the same on every machine ("max |a.stilde| = 0 (within 1e-13)"),
never as "= <1e-13" (issue 57) and never as "= 0" on one CPU and "< 1e-13" on another (CI on a different CPU)."""

from __future__ import annotations

import re
from pathlib import Path

from dfpo.theory.ledger import run_ledger
from dfpo.theory.tabular import equals, fmt

ROOT = Path(__file__).resolve().parents[2]


def test_round_off_and_exact_zero_print_as_one_machine_independent_bound():
    assert {fmt(3e-15), fmt(-3e-15), fmt(0.0), fmt(-0.0)} == {"0 (within 1e-13)"}
    assert (fmt(0.09731), equals(-3e-15), equals(0.09731)) == ("0.0973", "= 0 (within 1e-13)", "= 0.0973")


def test_the_ledger_never_writes_equals_followed_by_a_bound():
    (claim,) = run_ledger(["eq-18"])  # max |a.stilde| over 600 projections: float round-off
    assert re.search(r"max \|a\.stilde\| over 600 loss-core projections = 0 \(within 1e-13\);", claim.evidence), claim.evidence
    stored = (ROOT / "docs" / "ledger.md").read_text()
    assert not re.search(r"< ?1e-13|> ?-1e-13", stored), "docs/ledger.md: regenerate with dfpo theory --markdown docs/ledger.md"
