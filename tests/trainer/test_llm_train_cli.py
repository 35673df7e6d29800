"""The first hour of `dfpo train`: what it does without --config, --print-config, the start-up lines, the curves at
the end of a run, and the command-line mistakes that used to name the wrong thing."""

from __future__ import annotations

import sys
import tomllib
from pathlib import Path

import pytest

from dfpo.cli import build_parser, main
from dfpo.trainer.config import Config, apply_overrides, config_from_dict, config_to_toml
from dfpo.trainer.layout import RunDir

sys.path.insert(0, str(Path(__file__).parent))
from test_llm_e2e import TINY  # noqa: E402

QUICK = [*TINY, "train.steps=2", "eval.every=1"]
"""The tiny test model, two steps, an eval each step: a whole run in seconds."""


def _sets(*assignments: str) -> list[str]:
    return [arg for a in assignments for arg in ("--set", a)]


def test_help_says_what_train_does_without_a_config():
    """`dfpo --help` promised the tiny preset by default while `dfpo train` without --config exited 2."""
    top = build_parser().format_help()
    assert "without --config: the built-in defaults, the tiny offline model" in " ".join(top.split())
    train = build_parser()._subparsers._group_actions[0].choices["train"].format_help()
    assert "--print-config" in train and "without it, every key's default" in " ".join(train.split())


def test_print_config_prints_every_key_resolved_and_trains_nothing(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    assert main(["train", "--print-config", *_sets("optim.lr=0.001", "objective.name=gspo")]) == 0
    printed = tomllib.loads(capsys.readouterr().out)
    assert config_from_dict(printed) == config_from_dict(apply_overrides({}, ["optim.lr=0.001", "objective.name=gspo"]))
    assert printed["model"]["sft_steps"] == Config().model.sft_steps  # defaults are printed, not only what was set
    assert list(tmp_path.iterdir()) == []  # no run folder


def test_print_config_of_a_config_file_applies_the_file_then_set(tmp_path, capsys):
    path = tmp_path / "c.toml"
    path.write_text("seed = 7\n[rollout]\ngroup_size = 4\n")
    assert main(["train", "--config", str(path), "--print-config", *_sets("rollout.group_size=6")]) == 0
    assert config_from_dict(tomllib.loads(capsys.readouterr().out)) == config_from_dict({"seed": 7, "rollout": {"group_size": 6}})


def test_train_without_a_config_trains_the_built_in_defaults_and_draws_its_curves(tmp_path, capsys):
    """What verl's trainer does with no config: its built-in one. Every key not set is the documented default; the
    start-up says what it does phase by phase, and the run ends with curves.png beside its logs."""
    run = tmp_path / "run"
    assert main(["train", *_sets(*QUICK, f"run_dir={run}")]) == 0
    err = capsys.readouterr().err
    assert "no --config: training the built-in defaults" in err
    assert config_from_dict(tomllib.loads((run / RunDir.CONFIG).read_text())) == config_from_dict(
        apply_overrides({}, [*QUICK, f'run_dir="{run}"'])
    )
    phases = [line for line in err.splitlines() if "start-up" in line]
    assert [p.split(":")[1].strip() for p in phases] == ["start-up 1/3", "start-up 2/3", "start-up 3/3"]
    assert "warming it up: 3 supervised steps of 8 prompts" in phases[1]
    assert (run / RunDir.CURVES).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_quiet_prints_no_start_up_lines(tmp_path, capsys):
    assert main(["train", "--quiet", *_sets(*QUICK, "train.steps=1", "eval.every=0", f"run_dir={tmp_path / 'run'}")]) == 0
    assert capsys.readouterr().err == ""


@pytest.mark.parametrize(
    "args, message",
    [
        (["--resume", ""], "--resume needs the run folder to continue, got an empty path"),
        (["--config", ""], "--config needs a TOML file, got an empty path; leave --config out to train the built-in defaults"),
    ],
)
def test_an_empty_path_is_named_as_empty(args, message, capsys):
    """`--resume ""` used to say "--config FILE.toml is required"."""
    assert main(["train", *args]) == 2
    assert capsys.readouterr().err == f"dfpo: error: {message}\n"


def test_resume_of_a_file_says_it_is_not_a_run_folder(tmp_path, capsys):
    path = tmp_path / "notes.txt"
    path.write_text("x\n")
    assert main(["train", "--resume", str(path)]) == 2
    assert capsys.readouterr().err == f"dfpo: error: --resume {path} is a file, not a run folder\n"


@pytest.mark.parametrize(
    "name, says",
    [
        ("../../..", r"is a folder without a model in it \(no config.json\)"),
        ("./no/such/model", r": no such folder"),
        ("{file}", r"is a file; name a model folder"),
    ],
)
def test_a_model_name_that_names_no_model_folder_names_the_key(tmp_path, capsys, name, says):
    """`model.name=../../..` used to end in the tokenizer's own error, naming no key."""
    file = tmp_path / "weights.bin"
    file.write_text("")
    name = name.format(file=file)
    run = tmp_path / "run"
    assert main(["train", "--quiet", *_sets(*QUICK, f"model.name={name}", f"run_dir={run}")]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "Traceback" not in err
    assert err.startswith(f"dfpo: error: model.name {name!r}")
    assert __import__("re").search(says, err), err
    assert not run.exists()


def test_curves_are_drawn_again_on_demand(tmp_path, capsys):
    run = tmp_path / "run"
    assert main(["train", "--quiet", *_sets(*QUICK, f"run_dir={run}")]) == 0
    (run / RunDir.CURVES).unlink()
    capsys.readouterr()
    assert main(["train", "--curves", str(run)]) == 0
    assert capsys.readouterr().out.strip() == str(run / RunDir.CURVES) and (run / RunDir.CURVES).is_file()
    assert main(["train", "--curves", str(run), "--config", "x.toml"]) == 2
    assert "--curves RUN_DIR draws an existing run and trains nothing; drop --config" in capsys.readouterr().err
    assert main(["train", "--curves", str(tmp_path / "none")]) == 2
    assert f"--curves {tmp_path / 'none'}: no such folder" in capsys.readouterr().err


def test_the_printed_config_is_what_config_to_toml_writes(capsys):
    assert main(["train", "--print-config"]) == 0
    assert capsys.readouterr().out == config_to_toml(Config())
