"""Every outcome dfpo compare reports can be printed per seed (CI's slow compare tests failed with KeyError
'coef_whole': the outcome was added to OUTCOMES but not to VALUE_FORMATS, so no report could be written)."""

from __future__ import annotations

import math

import pytest

from dfpo.trainer.compare_report import OUTCOMES, VALUE_FORMATS, _value


@pytest.mark.parametrize("key", [key for key, _, _ in OUTCOMES])
def test_every_reported_outcome_has_a_per_seed_format(key):
    """Each outcome in the report's columns prints a finite per-seed value and 'n/a' for a missing one."""
    assert key in VALUE_FORMATS
    assert _value({key: 0.25, "kappa_reached": 1.0}, key) != "n/a"
    assert _value({key: math.nan}, key) == "n/a"
