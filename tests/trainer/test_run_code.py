"""A run records the code that trained it, and dfpo compare refuses to add cells to an experiment other code trained."""

import json

import pytest

from dfpo.cli import main
from dfpo.trainer.cli import check_one_code
from dfpo.trainer.run.code import code_record, foreign_code, recorded_sources, source_sha256
from dfpo.trainer.run.folder import read_mark, write_mark


def _mark(folder, code):
    folder.mkdir(parents=True)
    mark = {"written_by": "dfpo train", "created": "2026-11-28T00:00:00+0000", "checkpointed": False}
    if code is not None:
        mark["code"] = code
    (folder / ".dfpo-run.json").write_text(json.dumps(mark))


def test_the_fingerprint_is_a_sha256_of_the_training_source_and_stable():
    assert len(source_sha256()) == 64 and source_sha256() == source_sha256()
    assert code_record()["source_sha256"] == source_sha256()


def test_a_mark_records_every_code_that_trained_its_run_once(tmp_path):
    write_mark(tmp_path, checkpointed=False)
    write_mark(tmp_path, checkpointed=True)
    assert recorded_sources(read_mark(tmp_path)) == [source_sha256()]
    mark = read_mark(tmp_path)
    mark["code"] = [{"dfpo": "0.0.1", "source_sha256": "a" * 64}]
    (tmp_path / ".dfpo-run.json").write_text(json.dumps(mark))
    write_mark(tmp_path, checkpointed=True)  # resumed by this code
    assert recorded_sources(read_mark(tmp_path)) == ["a" * 64, source_sha256()]


def test_runs_of_other_code_or_of_none_recorded_are_foreign(tmp_path):
    _mark(tmp_path / "gspo" / "seed1", [code_record()])
    _mark(tmp_path / "gspo" / "seed2", [{"dfpo": "0.1.0", "source_sha256": "b" * 64}])
    _mark(tmp_path / "calibration" / "x" / "seed3", None)
    foreign, total = foreign_code(tmp_path)
    assert total == 3 and [p.name for p in foreign] == ["seed3", "seed2"]


def test_compare_refuses_an_out_other_code_trained_before_anything_trains(tmp_path, capsys):
    _mark(tmp_path / "out" / "gspo" / "seed0", [{"dfpo": "0.1.0", "source_sha256": "c" * 64}])
    code = main(
        ["compare", "--objectives", "gspo,dfpo_min", "--seeds", "2", "--config", "configs/tiny-cpu.toml", "--out", str(tmp_path / "out")]
    )
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and len(err) == 1
    assert "1 of its 1 runs were trained by other dfpo code than this one" in err[0]
    assert "records source cccccccccccc" in err[0] and "--allow-mixed-code" in err[0]
    assert not (tmp_path / "out" / "dfpo_min").exists()


def test_an_out_of_this_code_alone_passes(tmp_path):
    _mark(tmp_path / "gspo" / "seed0", [code_record()])
    check_one_code(tmp_path)
    check_one_code(tmp_path / "does-not-exist")


def test_a_run_made_before_codes_were_recorded_is_named_as_such(tmp_path):
    _mark(tmp_path / "gspo" / "seed0", None)
    with pytest.raises(ValueError, match=r"records no source \(made before dfpo recorded it\)"):
        check_one_code(tmp_path)
