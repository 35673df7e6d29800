"""A user reward named by its file, 'path/to/file.py:function' (issue 47): loaded by path in the reward worker
processes, with no PYTHONPATH; every fault one sentence naming the value, before any batch (and before any model
loads in the trainer)."""

from __future__ import annotations

import re
import sys
import textwrap

import pytest

from dfpo.trainer.rewards.compute import RewardComputer, RewardSpec, correctness_fn, reward_spec
from dfpo.trainer.rewards.worker import is_file_spec, parse_user_fn
from dfpo.trainer.tasks import Example

REWARD_FILE = textwrap.dedent(
    """
    import os
    import sys

    def score(prompt, completion, answer):
        return float(completion.strip() == answer)

    def where(prompt, completion, answer):
        # 1 when this file's folder is not on sys.path: it was loaded by path, not imported
        return float(os.path.dirname(os.path.abspath(__file__)) not in sys.path)

    NOT_CALLABLE = 3
    """
)


def _batch(computer, completions, answer="14"):
    return computer(["p"] * len(completions), completions, [Example("p", answer)] * len(completions))


@pytest.fixture
def reward_dir(tmp_path, monkeypatch):
    """tmp_path/rewards/my_reward.py, with the current directory at tmp_path."""
    (tmp_path / "rewards").mkdir()
    (tmp_path / "rewards" / "my_reward.py").write_text(REWARD_FILE)
    monkeypatch.chdir(tmp_path)
    return tmp_path


@pytest.mark.parametrize("form", ["relative", "absolute"])
def test_a_reward_file_is_loaded_by_path_in_the_workers_the_trainer_uses(reward_dir, form):
    path = "rewards/my_reward.py" if form == "relative" else str(reward_dir / "rewards" / "my_reward.py")
    assert str(reward_dir) not in sys.path and str(reward_dir / "rewards") not in sys.path
    with RewardComputer(reward_spec("user", "sum", f"{path}:score"), workers=1) as computer:  # as train.py builds it
        assert len(computer.worker_pids()) == 1
        batch = _batch(computer, ["14", "13", " 14 "])
    assert batch.correct == [1.0, 0.0, 1.0] and batch.errors == 0
    with RewardComputer(reward_spec("user", "sum", f"{path}:where"), workers=1) as computer:
        assert _batch(computer, ["x"]).correct == [1.0]  # no PYTHONPATH, no sys.path entry for its folder


def test_a_relative_reward_file_is_the_one_the_starting_directory_names(reward_dir, tmp_path_factory, monkeypatch):
    """The workers load the file the trainer's current directory named, even a worker started after a chdir
    (one call per worker: a new worker for each call)."""
    computer = RewardComputer(RewardSpec("user", "rewards/my_reward.py:score"), workers=1, max_tasks_per_worker=1)
    try:
        monkeypatch.chdir(tmp_path_factory.mktemp("elsewhere"))
        batch = _batch(computer, ["14", "14", "2"])
    finally:
        computer.close()
    assert batch.correct == [1.0, 1.0, 0.0] and batch.errors == 0


def test_a_reward_file_works_in_this_process_and_as_a_further_reward_function(reward_dir):
    assert correctness_fn("user", "sum", "rewards/my_reward.py:score")("p", "14", Example("p", "14")) == 1.0
    with RewardComputer(RewardSpec("exact"), functions=["rewards/my_reward.py:score"], workers=1) as computer:
        batch = _batch(computer, ["14", "3"])
    assert batch.extra == ([1.0, 0.0],) and batch.total == [2.0, 0.0]


def test_which_values_name_a_file():
    for spec in ("r.py:f", "rewards/r.py:f", "/abs/r.py:f", "../pkg/mod:fn", "C:/x/r.py:f"):
        assert is_file_spec(spec), spec
    for spec in ("json:dumps", "package.module:function", "mod", ":fn"):
        assert not is_file_spec(spec), spec
    assert parse_user_fn("rewards/r.py:score") == ("rewards/r.py", "score")
    assert parse_user_fn("json:dumps") == ("json", "dumps")


def _faults(reward_dir):
    here = reward_dir
    (here / "rewards" / "raises.py").write_text("raise RuntimeError('no')\n")
    (here / "rewards" / "exits.py").write_text("import sys\nsys.exit(3)\n")
    (here / "rewards" / "folder.py").mkdir()
    return [
        (
            "rewards/missing.py:score",
            rf"reward.user_fn 'rewards/missing.py:score': no file {here}/rewards/missing.py "
            rf"\(a relative path is read from the current directory, {here}\)$",
        ),  # fmt: skip
        (
            "rewards/my_reward.txt:score",
            r"reward.user_fn 'rewards/my_reward.txt:score' names 'rewards/my_reward.txt', which is not a "
            r"\.py file; name a Python file as 'path/to/file.py:function'$",
        ),  # fmt: skip
        ("rewards/folder.py:score", rf"reward.user_fn 'rewards/folder.py:score': {here}/rewards/folder.py is not a regular file"),
        (
            "rewards/my_reward.py:nothing",
            rf"reward.user_fn 'rewards/my_reward.py:nothing': file {here}/rewards/my_reward.py defines no 'nothing'$",
        ),
        (
            "rewards/my_reward.py:NOT_CALLABLE",
            rf"reward.user_fn 'rewards/my_reward.py:NOT_CALLABLE': 'NOT_CALLABLE' in file "
            rf"{here}/rewards/my_reward.py is a int, not a function$",
        ),  # fmt: skip
        (
            "rewards/raises.py:score",
            rf"reward.user_fn 'rewards/raises.py:score': running file {here}/rewards/raises.py raised RuntimeError: no$",
        ),
        (
            "rewards/exits.py:score",
            rf"reward.user_fn 'rewards/exits.py:score': running file {here}/rewards/exits.py raised SystemExit\(3\)",
        ),
        ("rewards/my_reward.py:score.x", r"reward.user_fn must look like 'module:function'.*got 'rewards/my_reward.py:score.x'$"),
    ]


def test_each_fault_of_a_reward_file_is_one_sentence_naming_the_value(reward_dir):
    for spec, message in _faults(reward_dir):
        with pytest.raises(ValueError, match="^" + message) as raised:
            RewardComputer(RewardSpec("user", spec), workers=1)  # the trainer's route: in the worker, or before it starts
        assert "\n" not in str(raised.value)
        with pytest.raises(ValueError, match="^" + message):
            correctness_fn("user", "sum", spec)  # in this process
        as_further = message.replace("reward.user_fn", "reward.functions entry", 1)
        with pytest.raises(ValueError, match="^" + as_further):
            RewardComputer(RewardSpec("exact"), functions=[spec], workers=1)


def test_the_trainer_refuses_a_bad_reward_file_in_one_line_before_any_model_loads(reward_dir, capsys, monkeypatch):
    from dfpo.cli import main
    from dfpo.trainer import train

    def no_model(*args, **kwargs):
        raise AssertionError("a model was loaded")

    monkeypatch.setattr(train, "load_policy", no_model)  # the trainer's one way to a model
    config = reward_dir / "c.toml"
    for spec in ("rewards/missing.py:score", "rewards/my_reward.py:nothing", "rewards/my_reward.txt:score"):
        config.write_text(f'run_dir = "{reward_dir / "run"}"\n[reward]\nkind = "user"\nuser_fn = "{spec}"\n')
        assert main(["train", "--config", str(config)]) == 2
        err = capsys.readouterr().err
        errors = [line for line in err.splitlines() if not line.startswith("dfpo train: start-up")]
        assert len(errors) == 1 and re.search(re.escape(repr(spec)), errors[0]) and "Traceback" not in err, err
        assert not (reward_dir / "run").exists()


def test_a_reward_functions_entry_that_is_not_a_python_file_is_refused_by_the_config(tmp_path):
    from dfpo.trainer.config import apply_overrides, config_from_dict

    with pytest.raises(ValueError, match=r"^reward.functions entry 'rewards/r.txt:f' names 'rewards/r.txt', which is not a \.py file"):
        config_from_dict(apply_overrides({}, [f'run_dir="{tmp_path}"', 'reward.functions=["rewards/r.txt:f"]']))
