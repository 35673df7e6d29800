"""Fixtures shared by the loss core's tests."""

from __future__ import annotations

import pytest

from dfpo.core.loss import OBJECTIVES


@pytest.fixture
def registered():
    """Names a test registers in the objective registry (it appends them), removed again after it."""
    names: list[str] = []
    yield names
    for name in names:
        if name in OBJECTIVES:
            OBJECTIVES.remove(name)
