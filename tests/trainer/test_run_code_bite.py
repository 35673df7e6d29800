"""Tests that bite the run's code fingerprint (issue 57 item 11, mutation/realmodel.toml): a change to any source file of
the loss core or the trainer, nested ones included, or a file's name, changes ``source_sha256``; a mark's malformed
code records are not read as fingerprints."""

from __future__ import annotations

import importlib
import pathlib

import pytest

from dfpo.trainer.run import code


def _fingerprint_with(monkeypatch, target: pathlib.Path) -> str:
    """``source_sha256`` computed afresh as if ``target``'s bytes had one more line (nothing is written)."""
    real = pathlib.Path.read_bytes

    def read_bytes(self):
        data = real(self)
        return data + b"# changed\n" if self.resolve() == target.resolve() else data

    monkeypatch.setattr(pathlib.Path, "read_bytes", read_bytes)
    try:
        return code.source_sha256.__wrapped__()
    finally:
        monkeypatch.setattr(pathlib.Path, "read_bytes", real)


@pytest.mark.parametrize(
    "module",
    ["dfpo.core.stats", "dfpo.core.loss.core", "dfpo.core.fused.head", "dfpo.trainer.sampler", "dfpo.trainer.stages.update"],
)
def test_a_change_to_any_training_source_file_changes_the_fingerprint(monkeypatch, module):
    """The loss core's and the trainer's files, at their top level and in their subpackages, are all fingerprinted."""
    target = pathlib.Path(importlib.import_module(module).__file__)
    assert code.source_sha256.__wrapped__() == code.source_sha256()
    assert _fingerprint_with(monkeypatch, target) != code.source_sha256()


def test_renaming_a_module_changes_the_fingerprint(tmp_path, monkeypatch):
    """Two trees with the same bytes under different file names (what the code imports) have different fingerprints."""
    package = tmp_path / "dfpo_fingerprint_probe"
    package.mkdir()
    (package / "__init__.py").write_text("")
    (package / "a.py").write_text("X = 1\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setattr(code, "TRAINING_PACKAGES", ("dfpo_fingerprint_probe",))
    before = code.source_sha256.__wrapped__()
    (package / "a.py").rename(package / "b.py")
    after = code.source_sha256.__wrapped__()
    assert before != after
    (package / "b.py").rename(package / "a.py")
    assert code.source_sha256.__wrapped__() == before


def test_a_code_record_without_a_string_fingerprint_is_not_read_as_one():
    mark = {"code": [{"source_sha256": None}, {"source_sha256": 5}, {"dfpo": "0.1"}, "junk", {"source_sha256": "a" * 64}]}
    assert code.recorded_sources(mark) == ["a" * 64]
    assert code.recorded_sources({"code": "not a list"}) == [] and code.recorded_sources(None) == []
