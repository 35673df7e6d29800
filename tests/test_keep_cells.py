"""scripts/keep_cells.py: a long experiment's finished cells kept in the repository and put back, nothing overwritten."""

from __future__ import annotations

from script_modules import load_script

keep = load_script("scripts/keep_cells.py")


def _cell(root, label, seed, finished=True):
    cell = root / label / f"seed{seed}"
    cell.mkdir(parents=True)
    for name in (".dfpo-run.json", "config.toml", "metrics.jsonl", "eval.jsonl", "samples.jsonl", "tax_reference.pt"):
        (cell / name).write_text(f"{label} {seed} {name}")
    if finished:
        (cell / "summary.json").write_text("{}")
    return cell


def test_only_finished_cells_are_kept_and_only_what_compare_reads(tmp_path):
    runs = tmp_path / "runs" / "exp"
    _cell(runs, "gspo", 1)
    _cell(runs, "gspo", 2, finished=False)
    assert keep.transfer(runs, tmp_path / "kept") == (1, 0)
    kept = tmp_path / "kept" / "gspo" / "seed1"
    assert sorted(p.name for p in kept.iterdir()) == sorted(
        [".dfpo-run.json", "config.toml", "summary.json", "metrics.jsonl", "eval.jsonl", "samples.jsonl"]
    )
    assert not (tmp_path / "kept" / "gspo" / "seed2").exists()


def test_restore_puts_back_the_missing_cells_and_leaves_the_others_as_they_are(tmp_path):
    _cell(tmp_path / "kept", "gspo", 1)
    _cell(tmp_path / "kept", "gspo", 2)
    runs = tmp_path / "runs"
    (runs / "gspo" / "seed2").mkdir(parents=True)
    (runs / "gspo" / "seed2" / "summary.json").write_text("already here")
    assert keep.transfer(tmp_path / "kept", runs) == (1, 1)
    assert (runs / "gspo" / "seed1" / "metrics.jsonl").read_text() == "gspo 1 metrics.jsonl"
    assert (runs / "gspo" / "seed2" / "summary.json").read_text() == "already here"


def test_a_missing_folder_is_one_sentence(tmp_path, capsys):
    assert keep.main(["save", str(tmp_path / "nope")]) == 2
    assert keep.main(["restore", "no-such-experiment", str(tmp_path)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 2 and "is not a folder" in err[0] and "no kept cells named 'no-such-experiment'" in err[1]
