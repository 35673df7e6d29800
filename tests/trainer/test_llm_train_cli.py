"""The first hour of `dfpo train`: what it does without --config, --print-config, the start-up lines, the curves at
the end of a run, and the command-line mistakes that used to name the wrong thing."""

from __future__ import annotations

import json
import sys
import tomllib
from pathlib import Path

import pytest

from dfpo.cli import build_parser, main
from dfpo.trainer.config import Config, apply_overrides, config_from_dict, config_to_toml
from dfpo.trainer.run.layout import RunDir

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


def _with_a_per_step_line(step_metrics):
    """``step_metrics`` that first says one per-step line through the ``say`` it is given (as a dropped metric does)."""

    def wrapped(step, *args, **kwargs):
        kwargs["say"](f"per-step line {step}")
        return step_metrics(step, *args, **kwargs)

    return wrapped


def _lines(err: str) -> list[str]:
    """stderr's lines with their numbers of seconds and losses blanked, the start-up's long phase text cut."""
    import re

    return [re.sub(r"\d+\.\d+ s\b|\d+\.\d+|\d+ s\b", "#", line).split(": start-up")[0] for line in err.splitlines()]


def _evaluation_lines(step: int) -> list[str]:
    """The default mode's lines around an evaluation (QUICK: 4 eval prompts, eval.k = 2), numbers blanked."""
    return [
        f"dfpo train: evaluation at step {step}: avg@2 and pass@2 on 4 held-out prompts x 2 samples",
        f"dfpo train: evaluation at step {step} done in #: avg@2 #, pass@2 #, tax_kl #",
    ]


@pytest.mark.parametrize("flag", ["", "--quiet", "--silent"])
def test_what_each_mode_prints_on_stderr(tmp_path, capsys, monkeypatch, flag):
    """The two tiny runs of the README printed nothing for 106 s and 50 s with --quiet. Default: start-up phases,
    a line before and after each evaluation, per-step lines, progress lines with the time left (no bar here:
    log.progress = false), a last line; --quiet: the same without the evaluation and per-step lines; --silent:
    nothing on stderr, and summary.json still on stdout. A progress line is due after
    every step and every warm-up step here (PROGRESS_EVERY_S = 0)."""
    from dfpo.trainer import train as train_mod
    from dfpo.trainer.run import logs as runlog

    monkeypatch.setattr(runlog, "PROGRESS_EVERY_S", 0.0)
    monkeypatch.setattr(train_mod, "step_metrics", _with_a_per_step_line(train_mod.step_metrics))
    run = tmp_path / "run"
    assert main(["train", *([flag] if flag else []), *_sets(*QUICK, f"run_dir={run}")]) == 0
    out, err = capsys.readouterr()
    assert json.loads(out) == json.loads((run / RunDir.SUMMARY).read_text())
    if flag == "--silent":
        assert err == ""
        return
    expected = [
        "dfpo: no --config: training the built-in defaults (the tiny offline model on 'a+b=', into "
        f"{run}); dfpo train --print-config shows every key",
        "dfpo train",  # start-up 1/3
        "dfpo train",  # start-up 2/3: the warm-up, 3 steps
        "tiny preset: SFT step 1/3, loss #, # in the warm-up",
        "tiny preset: SFT step 2/3, loss #, # in the warm-up",
        "tiny preset: 3 SFT steps in #s, loss # -> #",
        "dfpo train",  # start-up 3/3
        *(_evaluation_lines(0) if not flag else []),
        *(["per-step line 1"] if not flag else []),
        "dfpo train: step 1/2, reward # (mean of the step's rollouts), # in the training loop, about # left",
        *(_evaluation_lines(1) if not flag else []),
        *(["per-step line 2"] if not flag else []),
        "dfpo train: step 2/2, reward # (mean of the step's rollouts), # in the training loop, about # left",
        *(_evaluation_lines(2) if not flag else []),
        f"dfpo train: done, 2 steps in # (# before the first); {run / RunDir.SUMMARY} written",
    ]
    assert _lines(err) == expected, err


def test_quiet_draws_no_progress_bar(tmp_path, capsys):
    """log.progress draws tqdm's bar by default; --quiet leaves it out (its progress lines stand in for it)."""
    sets = _sets(*QUICK, "log.progress=true", "eval.every=0")
    assert main(["train", *sets, f"--set=run_dir={tmp_path / 'a'}"]) == 0
    assert "2/2 [" in capsys.readouterr().err  # tqdm's "n/total [elapsed<remaining" on stderr
    assert main(["train", "--quiet", *sets, f"--set=run_dir={tmp_path / 'b'}"]) == 0
    assert "2/2 [" not in capsys.readouterr().err


def test_a_progress_line_is_due_once_per_period():
    """Every(s).due() is True at most once per s seconds of its clock, counted from construction."""
    from dfpo.trainer.run.logs import Every

    now = [100.0]
    every = Every(30.0, clock=lambda: now[0])
    seen = []
    for t in (100.0, 110.0, 129.9, 130.0, 130.5, 159.9, 160.0, 300.0):
        now[0] = t
        seen.append(every.due())
    assert seen == [False, False, False, True, False, False, True, True]


def test_the_help_says_the_progress_period_the_code_uses():
    from dfpo.trainer.run.logs import PROGRESS_EVERY_S

    train = build_parser()._subparsers._group_actions[0].choices["train"].format_help()
    assert f"every {PROGRESS_EVERY_S:.0f} s" in " ".join(train.split())


def test_summary_json_holds_the_process_wall_time_and_the_help_names_every_key(tmp_path):
    """A `dfpo train --silent` process timed from outside: wall_s_process is at most what an outside clock shows (less
    the interpreter's exit: 2 to 6 s on a loaded 2-core machine) and holds the start-up and the training loop; `dfpo
    train --help` names every key summary.json holds, and the machine those seconds ran on is recorded beside them."""
    import subprocess
    import time

    from tiny_run import train_command

    from dfpo.trainer.run.machine import machine_line

    cmd = [arg if arg != "--quiet" else "--silent" for arg in train_command(tmp_path / "run", [*QUICK, "eval.every=0"])]
    t0 = time.monotonic()
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
    outside = time.monotonic() - t0
    assert proc.returncode == 0 and proc.stderr == "", proc.stderr
    summary = json.loads(proc.stdout)
    assert summary == json.loads((tmp_path / "run" / RunDir.SUMMARY).read_text())
    assert 0 < summary["wall_s_start_up"] + summary["wall_s_training_loop"] < summary["wall_s_process"] <= outside
    assert summary["machine"] == machine_line() and "-core " in summary["machine"]
    train = " ".join(build_parser()._subparsers._group_actions[0].choices["train"].format_help().split())
    assert "summary.json" in train
    assert [key for key in summary if key not in train] == []


def test_the_process_age_counts_from_the_process_start_not_from_an_import():
    """A process that sleeps 1 s before importing run.logs: process_age_s counts that second too."""
    import subprocess
    import time

    code = "import time; time.sleep(1.0); from dfpo.trainer.run.logs import process_age_s; print(process_age_s())"
    t0 = time.monotonic()
    age = float(subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout)
    assert 1.0 <= age <= time.monotonic() - t0


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
    assert main(["train", "--silent", *_sets(*QUICK, f"model.name={name}", f"run_dir={run}")]) == 2  # no start-up line
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
