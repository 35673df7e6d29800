"""Shared pytest configuration: Hypothesis profiles and small batch builders."""

from __future__ import annotations

import os

import pytest
import torch
from hypothesis import HealthCheck, settings

settings.register_profile("default", max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
settings.register_profile("ci", max_examples=40, deadline=None, derandomize=True, suppress_health_check=[HealthCheck.too_slow])
settings.register_profile("thorough", max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])
# CI runs the property tests a second time with this profile: new examples every run, printed so a failure can be replayed.
settings.register_profile(
    "fresh", max_examples=40, deadline=None, derandomize=False, print_blob=True, suppress_health_check=[HealthCheck.too_slow]
)
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "ci" if os.environ.get("CI") else "default"))

torch.set_num_threads(max(1, min(2, os.cpu_count() or 1)))


@pytest.fixture
def one_thread():
    """Tiny tensors (toy tables, tiny models) run fastest and steadiest on one intra-op thread."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)
