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

USER_DFPO_CACHE = os.environ.get("DFPO_CACHE")
"""DFPO_CACHE as the test session found it (None: unset, so ~/.cache/dfpo): only ``real_model_cache`` uses it."""


@pytest.fixture(scope="session", autouse=True)
def dfpo_test_cache(tmp_path_factory):
    """Every test (and every process it starts) converts models into a temporary DFPO_CACHE, never the user's
    ~/.cache/dfpo: a test that converts a fake GGUF without naming a cache used to leave it there. A test that sets
    DFPO_CACHE itself (monkeypatch) still does."""
    path = tmp_path_factory.mktemp("dfpo-cache")
    os.environ["DFPO_CACHE"] = str(path)
    yield path
    if USER_DFPO_CACHE is None:
        os.environ.pop("DFPO_CACHE", None)
    else:
        os.environ["DFPO_CACHE"] = USER_DFPO_CACHE


@pytest.fixture
def real_model_cache(monkeypatch):
    """For the slow tests of the real packaged model: DFPO_CACHE as the session found it, so the model the user
    converted once is read (and converted there on first use) instead of again into the session's temporary cache.
    Returns the models folder."""
    from dfpo.trainer.packaged_model import cache_root

    if USER_DFPO_CACHE is None:
        monkeypatch.delenv("DFPO_CACHE", raising=False)
    else:
        monkeypatch.setenv("DFPO_CACHE", USER_DFPO_CACHE)
    return cache_root()


@pytest.fixture
def one_thread():
    """Tiny tensors (toy tables, tiny models) run fastest and steadiest on one intra-op thread."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)
