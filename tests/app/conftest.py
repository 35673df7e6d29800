"""The app's tests store what the app caches (ledger, default toy comparison) in a temporary folder, never ~/.cache."""

from __future__ import annotations

import pytest

from dfpo.app.cache import CACHE_ENV


@pytest.fixture(scope="session")
def app_cache_dir(tmp_path_factory):
    return tmp_path_factory.mktemp("app-cache")


@pytest.fixture(autouse=True)
def app_cache(app_cache_dir, monkeypatch):
    monkeypatch.setenv(CACHE_ENV, str(app_cache_dir))
    return app_cache_dir
