"""The built-in task ``sum`` ("What is a + b? Answer with just the number."), the ``last_int`` reward that scores it,
and its ``forms/*`` metrics (issue 47)."""

import math
import random

import pytest

from dfpo.trainer.config import DataConfig
from dfpo.trainer.rewards.compute import RewardComputer, RewardSpec, correctness_fn, last_int_match, reward_spec
from dfpo.trainer.tasks import (
    Example,
    last_int_correct,
    load_splits,
    make_add_examples,
    sum_example,
    sum_surface_form,
    surface_form,
    surface_form_shares,
)


def _sum(**kw) -> DataConfig:
    return DataConfig(task="sum", **kw)


# -- the task ------------------------------------------------------------------------------------------


def test_sum_prompts_say_the_operands_and_the_answer_is_their_decimal_sum():
    train, evals = load_splits(_sum(operands=3, min_operand=10, max_operand=40, train_size=200, eval_size=20), seed=1)
    for ex in train + evals:
        ops = ex.meta["operands"]
        assert len(ops) == 3 and all(10 <= x <= 40 for x in ops)
        assert ex.prompt == f"What is {ops[0]} + {ops[1]} + {ops[2]}? Answer with just the number."
        assert ex.answer == str(sum(ops))
    assert sum_example((12, 7, 30)).prompt == "What is 12 + 7 + 30? Answer with just the number."
    assert sum_example((12, 7, 30)).answer == "49"


def test_sum_eval_problems_are_held_out_distinct_and_seeded():
    """Invariant: no train problem has an eval problem's operand tuple; the same seed gives the same splits."""
    cfg = _sum(max_operand=9, train_size=500, eval_size=30)
    train, evals = load_splits(cfg, seed=0)
    held = {tuple(e.meta["operands"]) for e in evals}
    assert len(held) == 30
    assert not held & {tuple(e.meta["operands"]) for e in train}
    again = load_splits(cfg, seed=0)
    assert [e.prompt for e in again[0] + again[1]] == [e.prompt for e in train + evals]
    assert [e.prompt for e in load_splits(cfg, seed=1)[1]] != [e.prompt for e in evals]


def test_every_sum_operand_tuple_can_be_drawn_but_the_held_out_ones_are_never_trained_on():
    """Invariant: with 2 operands in 3..4 (4 tuples) and 1 held out, the train split draws exactly the other 3."""
    train, evals = load_splits(_sum(min_operand=3, max_operand=4, train_size=200, eval_size=1), seed=5)
    assert {tuple(e.meta["operands"]) for e in train} | {tuple(evals[0].meta["operands"])} == {(3, 3), (3, 4), (4, 3), (4, 4)}
    assert tuple(evals[0].meta["operands"]) not in {tuple(e.meta["operands"]) for e in train}


def test_an_eval_split_as_large_as_the_space_names_data_eval_size():
    with pytest.raises(
        ValueError,
        match=r"^data.eval_size=8 must be below the 8 distinct problems of data.operands=3 and data.min_operand=1 and data.max_operand=2$",
    ):
        load_splits(_sum(operands=3, min_operand=1, max_operand=2, eval_size=8), seed=0)
    with pytest.raises(ValueError, match=r"^data.eval_size=100 must be below the 100 distinct problems of data.max_operand=9$"):
        load_splits(_sum(max_operand=9, eval_size=100), seed=0)


@pytest.mark.parametrize("task", ["sum", "add", "equiv"])
def test_min_operand_above_max_operand_is_one_sentence_naming_both(task):
    with pytest.raises(ValueError, match=r"^data.min_operand=20 is above data.max_operand=10; lower data.min_operand or raise"):
        load_splits(DataConfig(task=task, min_operand=20, max_operand=10), seed=0)


@pytest.mark.parametrize("task", ["add", "equiv"])
def test_operands_other_than_two_for_add_or_equiv_is_one_sentence(task):
    with pytest.raises(ValueError, match=rf'^data.operands=3 applies to data.task = "sum"; "{task}" adds two numbers, so leave it at 2$'):
        load_splits(DataConfig(task=task, operands=3), seed=0)


def test_add_and_equiv_honour_min_operand_and_keep_their_draws_at_min_operand_0():
    """With min_operand 0 the add problems are the draws the task always made (randint(0, max) twice per problem);
    with min_operand 10 every operand is two-digit."""
    rng = random.Random(3)
    expected = [f"{rng.randint(0, 99)}+{rng.randint(0, 99)}=" for _ in range(50)]
    assert [e.prompt for e in make_add_examples(50, 99, seed=3)] == expected
    for task in ("add", "equiv"):
        train, evals = load_splits(DataConfig(task=task, min_operand=10, max_operand=99, train_size=300, eval_size=30), seed=0)
        assert all(10 <= x <= 99 for e in train + evals for x in (e.meta["a"], e.meta["b"]))
        assert not {e.prompt for e in evals} & {e.prompt for e in train}


# -- the last_int reward -------------------------------------------------------------------------------

TEN_PLUS_FOUR = sum_example((10, 4))


@pytest.mark.parametrize(
    "completion, score",
    [
        ("To find 10 + 4, we simply add", 0.0),  # a restatement: its last integer is 4 (math-verify scored it 1)
        ('The answer is "14".', 1.0),  # quoted (math-verify scored such an answer 0)
        ("10 + 4 = 14", 1.0),
        ("14.", 1.0),
        ("14", 1.0),
        ("", 0.0),
        ("no number at all", 0.0),
        ("14 is wrong, it is 15", 0.0),
        ("15? No: 14", 1.0),
        ("The answer is14", 1.0),  # digits glued to a word count
        ("14th", 1.0),
        ("14.5", 0.0),  # the last number is not an integer
        ("14.0", 1.0),  # ... but this one is 14
        ("114", 0.0),
        ("1,014", 0.0),  # one number: 1014
        ("-14", 0.0),
    ],
)
def test_last_int_scores_the_last_integer_written(completion, score):
    assert last_int_match("", completion, TEN_PLUS_FOUR) == score


@pytest.mark.parametrize(
    "completion, answer, score",
    [
        ("1,014", "1014", 1.0),  # thousands separators: groups of exactly three digits
        ("It is 1,014.", "1014", 1.0),
        ("1,2,14", "14", 1.0),  # not thousands groups: three numbers, the last 14
        ("10,14", "14", 1.0),
        ("x = -6", "-6", 1.0),  # a minus after a space or '=' is a sign
        ("4 - 10 = -6.", "-6", 1.0),
        ("10-6", "-6", 0.0),  # a minus after a digit is subtraction: the last number is 6
        ("10-6", "6", 1.0),
        ("x\u22126", "6", 1.0),  # ... after a letter too
        ("so \u22126", "-6", 1.0),  # U+2212 minus sign
        ("12", " 12 ", 1.0),  # the answer is read as a number too
        ("12", "12.0", 1.0),
    ],
)
def test_last_int_reads_thousands_separators_and_signs(completion, answer, score):
    assert last_int_match("", completion, Example("p", answer)) == score


def test_last_int_refuses_an_answer_that_is_not_an_integer():
    with pytest.raises(ValueError, match=r"^the answer '3.5' is not an integer; reward.kind = 'last_int' needs integer answers$"):
        last_int_correct("3.5", "3.5")


def test_last_int_is_what_auto_picks_for_sum_and_works_with_any_integer_task():
    assert reward_spec("auto", "sum") == RewardSpec("last_int")
    assert reward_spec("last_int", "jsonl") == RewardSpec("last_int")
    assert correctness_fn("last_int", "jsonl") is last_int_match
    with RewardComputer(reward_spec("auto", "sum")) as computer:  # in this process, as the trainer computes it
        batch = computer(["p"] * 3, ["10 + 4 = 14", "To find 10 + 4", "7"], [TEN_PLUS_FOUR, TEN_PLUS_FOUR, Example("p", "3.5")])
        assert computer.worker_pids() == []
    assert batch.correct == [1.0, 0.0, 0.0] and batch.errors == 1  # a non-integer answer is an error, scored 0


def test_last_int_rebuilt_in_a_worker_scores_the_same():
    """A worker rebuilds every built-in kind by name: last_int is one of them."""
    from dfpo.trainer.rewards.pool import RewardPool

    with RewardPool("last_int", workers=1) as pool:
        results = pool.run([("p", "10 + 4 = 14", "14", None), ("p", "To find 10 + 4", "14", None)])
    assert [r[:2] for r in results] == [(1.0, "ok"), (0.0, "ok")]


# -- forms/* ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "completion, form",
    [
        ("14", "number"),
        (" 14.\n", "number"),
        ("10 + 4 = 14", "equation"),
        ("4 + 10 = 14.", "equation"),
        ("7 + 7 = 14", "equation"),  # a sum equal to the answer, other terms
        ("5 + 5 = 14", "sentence"),  # its terms do not add up to the answer: not an equation of the sum
        ("10 + 4 = 14, so 14", "sentence"),
        ("The answer is 14.", "sentence"),
        ("13", "wrong"),
        ("To find 10 + 4, we simply add", "wrong"),
        ("", "wrong"),
    ],
)
def test_sum_surface_forms(completion, form):
    assert sum_surface_form(completion, TEN_PLUS_FOUR) == form
    assert surface_form(completion, TEN_PLUS_FOUR) == form  # surface_form reads a sum problem by its operands


def test_sum_form_shares_and_the_entropy_over_correct_completions():
    """Invariant: the four shares add up to 1; the entropy counts the correct completions only (in nats)."""
    texts = ["14", "14", "10 + 4 = 14", "The answer is 14", "13", "nothing"]
    shares = surface_form_shares("sum", texts, [TEN_PLUS_FOUR] * len(texts))
    assert shares == {
        "forms/number": 2 / 6,
        "forms/equation": 1 / 6,
        "forms/sentence": 1 / 6,
        "forms/wrong": 2 / 6,
        "forms/equiv_entropy": pytest.approx(-(0.5 * math.log(0.5) + 2 * 0.25 * math.log(0.25))),
    }
    one_form = surface_form_shares("sum", ["14", "14.", "3"], [TEN_PLUS_FOUR] * 3)
    assert one_form["forms/equiv_entropy"] == 0.0
    one_correct = surface_form_shares("sum", ["14", "3", "2"], [TEN_PLUS_FOUR] * 3)
    assert one_correct["forms/equiv_entropy"] == 0.0  # fewer than 2 correct
    even = surface_form_shares("sum", ["14", "10 + 4 = 14", "It is 14"], [TEN_PLUS_FOUR] * 3)
    assert even["forms/equiv_entropy"] == pytest.approx(math.log(3))


def test_add_and_equiv_form_keys_are_unchanged():
    ex = Example("37+45=", "82", {"a": 37, "b": 45})
    shares = surface_form_shares("equiv", ["82", "45+37", "x"], [ex] * 3)
    assert list(shares) == ["forms/number", "forms/swap", "forms/split", "forms/echo", "forms/invalid"]
    assert surface_form_shares("jsonl", ["82"], [ex]) == {}


# -- through the trainer ---------------------------------------------------------------------------------


def test_a_tiny_run_on_the_sum_task_logs_its_forms_and_the_last_int_reward(tmp_path):
    """The tiny offline model on task sum (reward auto = last_int): every step logs the four form shares, adding up
    to 1, forms/equiv_entropy within [0, ln 3], and reward/correct equal to 1 - forms/wrong (both from last_int)."""
    import json

    from tiny_run import TINY_MODEL_SETS

    from dfpo.trainer.config import apply_overrides, config_from_dict
    from dfpo.trainer.run.layout import RunDir
    from dfpo.trainer.train import Trainer

    sets = [
        *TINY_MODEL_SETS,
        *("data.task=sum", "data.operands=3", "data.min_operand=1", "data.train_size=50", "data.eval_size=4"),
        *("rollout.prompts_per_step=2", "rollout.group_size=4", "rollout.max_new_tokens=3", "train.steps=2", "threads=1"),
        *("log.tensorboard=false", "log.progress=false", "train.save_final=false", f'run_dir="{tmp_path / "run"}"'),
    ]
    Trainer(config_from_dict(apply_overrides({}, sets)), quiet=True).run()
    rows = [json.loads(line) for line in (tmp_path / "run" / RunDir.METRICS).read_text().splitlines()]
    assert len(rows) == 2
    for row in rows:
        assert sum(row[f"forms/{f}"] for f in ("number", "equation", "sentence", "wrong")) == pytest.approx(1.0)
        assert 0.0 <= row["forms/equiv_entropy"] <= math.log(3) + 1e-9
        assert row["reward/correct"] == pytest.approx(1.0 - row["forms/wrong"])
