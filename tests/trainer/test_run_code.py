"""A run records the code that trained it, and dfpo compare refuses to add cells to an experiment other code trained."""

import json

from dfpo.cli import main
from dfpo.trainer.cli import mixed_code_refusal
from dfpo.trainer.run.code import code_record, recorded_sources, source_sha256
from dfpo.trainer.run.folder import foreign_code, read_mark, write_mark


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
    assert mixed_code_refusal(tmp_path) is None
    assert mixed_code_refusal(tmp_path / "does-not-exist") is None


def test_a_run_made_before_codes_were_recorded_is_named_as_such(tmp_path):
    _mark(tmp_path / "gspo" / "seed0", None)
    assert "records no source (made before dfpo recorded it)" in mixed_code_refusal(tmp_path)


def test_an_experiment_other_code_finished_is_reported_and_names_that_code(tmp_path, capsys):
    """Every cell finished by other code: compare trains nothing and reports them, naming the code that trained each."""
    from test_llm_compare import _write_run

    from dfpo.trainer.compare import make_plan, run_config, run_dir
    from dfpo.trainer.config import config_to_dict, config_to_toml
    from dfpo.trainer.run.folder import run_identity

    plan = make_plan("gspo,dfpo_min", None, 2, 10, "configs/tiny-cpu.toml", [], str(tmp_path / "out"))
    for label in plan.labels:
        for seed in plan.seeds:
            _write_run(run_dir(plan, label, seed), 0.3, [0.5] * 20, 12)
            mark = {"written_by": "dfpo train", "created": "2026-11-28T00:00:00+0000", "checkpointed": False}
            mark["code"] = [{"dfpo": "0.1.0", "source_sha256": "c" * 64}]
            mark["identity"] = run_identity(config_to_dict(run_config(plan, label, seed)))
            (run_dir(plan, label, seed) / ".dfpo-run.json").write_text(json.dumps(mark))
            (run_dir(plan, label, seed) / "config.toml").write_text(config_to_toml(run_config(plan, label, seed)))  # the settings it ran
    argv = ["compare", "--objectives", "gspo,dfpo_min", "--seeds", "2", "--first-seed", "10", "--config", "configs/tiny-cpu.toml"]
    assert main([*argv, "--out", str(tmp_path / "out")]) == 0
    out = capsys.readouterr().out
    assert "Trained by: source cccccccccccc (4 cells)." in out and "compare: gspo seed 10: done before, skipped" in out
