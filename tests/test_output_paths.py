"""Destinations are checked before any work, and nothing already written is lost."""

from __future__ import annotations

import json
import os

import pytest

from dfpo.cli import main
from dfpo.core.files import check_output_dir, check_output_file, write_text_atomic
from dfpo.toy import layout as toy_layout


def test_toy_refuses_to_overwrite_an_earlier_run_unless_forced(tmp_path, capsys):
    out = tmp_path / "run"
    argv = ["toy", "run", "--objectives", "gspo", "--seeds", "2", "--steps", "2", "--no-plots", "--out", str(out)]
    assert main(argv) == 0
    before = (out / toy_layout.METRICS).read_text()
    assert main(argv) == 2
    assert "already holds a run (config.json); pass --force" in capsys.readouterr().err
    assert (out / toy_layout.METRICS).read_text() == before  # untouched
    assert main([*argv, "--force"]) == 0


@pytest.mark.parametrize("sub", [["run", "--objectives", "gspo"], ["ablate"], ["spread", "--values", "1"], ["sweep-g", "--gs", "2"]])
def test_toy_refuses_a_file_in_the_way_before_any_work(tmp_path, capsys, sub):
    blocker = tmp_path / "taken"
    blocker.write_text("keep me")
    assert main(["toy", *sub, "--seeds", "2", "--steps", "100000", "--out", str(blocker)]) == 2
    assert "is a file, expected a folder" in capsys.readouterr().err
    assert blocker.read_text() == "keep me"


def test_theory_checks_its_destinations_before_the_ledger_runs(tmp_path, capsys):
    assert main(["theory", "--json", str(tmp_path), "--only", "eq-30"]) == 2
    assert "is a directory, expected a file path" in capsys.readouterr().err
    assert main(["theory", "--markdown", str(tmp_path / "no" / "ledger.md"), "--only", "eq-30"]) == 2
    assert "does not exist" in capsys.readouterr().err
    path = tmp_path / "ledger.json"
    assert main(["theory", "--json", str(path), "--only", "eq-30"]) == 0
    assert [c["id"] for c in json.loads(path.read_text())["claims"]] == ["eq-30"]


def test_an_interrupted_write_leaves_the_old_file_whole(tmp_path, monkeypatch):
    path = tmp_path / "ledger.md"
    path.write_text("old ledger")

    def broken_replace(src, dst):
        raise OSError("disk full")

    monkeypatch.setattr(os, "replace", broken_replace)
    with pytest.raises(OSError, match="disk full"):
        write_text_atomic(path, "new ledger")
    assert path.read_text() == "old ledger"
    assert [p.name for p in tmp_path.iterdir()] == ["ledger.md"]  # no temporary file left behind


def test_output_checks_name_the_flag_and_the_path(tmp_path):
    with pytest.raises(ValueError, match=r"--json '.*x' is a directory"):
        (tmp_path / "x").mkdir()
        check_output_file("--json", tmp_path / "x")
    check_output_dir("--out", tmp_path / "new" / "deeper", force=False, marker="config.json")  # creatable: fine
    assert not (tmp_path / "new").exists()  # and nothing was created


@pytest.mark.skipif(os.geteuid() == 0, reason="root may write into read-only folders")
def test_a_read_only_folder_is_refused(tmp_path):
    ro = tmp_path / "ro"
    ro.mkdir()
    ro.chmod(0o500)
    with pytest.raises(ValueError, match="cannot be"):
        check_output_dir("--out", ro / "run", force=False, marker="config.json")


def _fsync_fails_for(monkeypatch, name: str) -> None:
    """``os.fsync`` of a file called ``name`` (or its temporary twin) fails as on a full disk (ENOSPC)."""
    import errno

    real = os.fsync

    def fsync(fd):
        if name in os.readlink(f"/proc/self/fd/{fd}"):
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        return real(fd)

    monkeypatch.setattr(os, "fsync", fsync)


@pytest.mark.skipif(not os.path.exists("/dev/full"), reason="needs /dev/full and /proc (Linux)")
@pytest.mark.parametrize("full", [toy_layout.METRICS, toy_layout.SUMMARY])
def test_a_full_disk_under_any_command_is_one_sentence_naming_the_file(tmp_path, capsys, monkeypatch, full):
    """A toy run whose disk is full when it writes one of its files (metrics.jsonl, written line by line, is a link to
    /dev/full; summary.md, written atomically, fails its fsync) ends in one line naming that file and the lack of
    space, exit status 1, no traceback, and no temporary file left behind."""
    out = tmp_path / "run"
    out.mkdir()
    if full == toy_layout.METRICS:
        (out / full).symlink_to("/dev/full")
    else:
        _fsync_fails_for(monkeypatch, full)
    assert main(["toy", "run", "--objectives", "gspo", "--seeds", "2", "--steps", "2", "--no-plots", "--out", str(out)]) == 1
    assert not list(out.glob(".*.tmp"))
    err = capsys.readouterr().err
    lines = [line for line in err.strip().splitlines() if not line.startswith("toy: training")]
    assert len(lines) == 1 and "Traceback" not in err, err
    assert "no space left on the device" in lines[0] and str(out / full) in lines[0], err
