"""``dfpo toy --help`` and each toy command's --help say what the command does, as every other dfpo command's does."""

from __future__ import annotations

import argparse

import pytest

from dfpo.cli import build_parser, main
from dfpo.toy import layout
from dfpo.toy.cli import ABLATION, DESCRIPTIONS


def _commands(parser: argparse.ArgumentParser, path: tuple[str, ...] = ()):
    """(command path, parser) of every command and subcommand under ``parser``."""
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, sub in action.choices.items():
                yield (*path, name), sub
                yield from _commands(sub, (*path, name))


def _flat(text: str) -> str:
    """The text without its whitespace: argparse wraps a description at spaces and after hyphens."""
    return "".join(text.split())


def test_every_dfpo_command_has_a_help_description():
    commands = dict(_commands(build_parser()))
    assert ("toy", "sweep-g") in commands  # the walk reaches the toy's commands
    bare = [" ".join(path) for path, parser in commands.items() if not (parser.description or "").strip()]
    assert not bare, f"commands without a --help description: {bare}"


@pytest.mark.parametrize("argv", [["toy"], ["toy", "run"], ["toy", "ablate"], ["toy", "spread"], ["toy", "sweep-g"]])
def test_a_toy_commands_help_prints_its_description(argv, capsys):
    with pytest.raises(SystemExit) as exit_:
        main([*argv, "--help"])
    assert exit_.value.code == 0
    assert _flat(DESCRIPTIONS[argv[-1]]) in _flat(capsys.readouterr().out)


def test_the_ablations_description_names_its_objectives_in_order():
    text = DESCRIPTIONS["ablate"]
    positions = [text.index(label + ",") if label != ABLATION[-1] else text.index(label + ".") for label in ABLATION]
    assert positions == sorted(positions)


def test_the_run_description_names_the_files_a_run_folder_holds():
    for name in (layout.CONFIG, layout.METRICS, layout.METRICS_MEAN, layout.SUMMARY):
        assert name in DESCRIPTIONS["run"], name
