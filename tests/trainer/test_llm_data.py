"""Tasks, JSONL loading and reward functions of the LLM trainer."""

import json
import time

import pytest

from dfpo.trainer.rewards.compute import RewardComputer, correctness_fn, equiv_match, exact_match, math_verify_match
from dfpo.trainer.tasks import Example, PromptSampler, load_jsonl, make_add_examples, sum_value, surface_form


def test_add_task_answers_are_sums():
    for ex in make_add_examples(50, 99, seed=3):
        a, b = (int(x) for x in ex.prompt[:-1].split("+"))
        assert ex.answer == str(a + b)


def test_equiv_task_accepts_every_correct_surface_form():
    ex = Example("37+45=", "82", {"a": 37, "b": 45})
    for text in ("82", "45+37", "80+2", "37+45", " 82"):
        assert equiv_match("", text, ex) == 1.0
    for text in ("83", "45+36", "8 2x", "", "+82"):
        assert equiv_match("", text, ex) == 0.0
    assert exact_match("", "45+37", ex) == 0.0
    assert [surface_form(t, ex) for t in ("82", "45+37", "80+2", "37+45", "x")] == ["number", "swap", "split", "echo", "invalid"]
    assert sum_value("1+2+3") == 6


def test_jsonl_errors_name_file_and_line(tmp_path):
    path = tmp_path / "d.jsonl"
    path.write_text(json.dumps({"prompt": "1+1=", "answer": "2"}) + "\n" + json.dumps({"prompt": "2+2="}) + "\n")
    with pytest.raises(ValueError, match=rf"{path}:2: missing field 'answer'"):
        load_jsonl(path)
    path.write_text("{not json\n")
    with pytest.raises(ValueError, match=rf"{path}:1: not valid JSON"):
        load_jsonl(path)
    path.write_text(json.dumps({"prompt": "q", "answer": 3, "id": 7}) + "\n\n")
    assert load_jsonl(path) == [Example("q", "3", {"id": 7})]


def test_math_verify_reward_reads_the_boxed_final_answer():
    ex = Example("q", "72")
    assert math_verify_match("", "first 70, so the answer is \\boxed{72}", ex) == 1.0
    assert math_verify_match("", "\\boxed{144/2}", ex) == 1.0
    assert math_verify_match("", "it is 72 ... no: \\boxed{71}", ex) == 0.0


# The reward functions these tests break on purpose run in worker processes, which import them by
# 'module:function': they live in tests/trainer/reward_fixtures.py.


def test_broken_reward_gives_zero_and_is_counted():
    from reward_fixtures import spec

    with RewardComputer(spec("raises"), workers=1) as rc:
        out = rc(["p", "p"], ["a", "b"], [Example("p", "a")] * 2)
    assert out.total == [0.0, 0.0] and out.errors == 2
    with RewardComputer(spec("nan"), workers=1) as rc:
        out = rc(["p"], ["a"], [Example("p", "a")])
    assert out.total == [0.0] and out.invalid == 1 and out.errors == 0


def test_slow_reward_times_out_to_zero_and_is_counted():
    from reward_fixtures import spec

    with RewardComputer(spec("sleeps_two_seconds"), timeout_s=0.1, workers=2) as rc:
        t0 = time.time()
        out = rc(["p", "p"], ["a", "b"], [Example("p", "a")] * 2)
        assert time.time() - t0 < 1.5
    assert out.total == [0.0, 0.0] and out.timeouts == 2


def test_format_reward_adds_weighted_regex_match():
    from dfpo.trainer.rewards.compute import RewardSpec

    rc = RewardComputer(RewardSpec("exact"), format_weight=0.5, format_regex=r"^\d+$")
    out = rc(["p"] * 3, ["5", "x", "6"], [Example("p", "5")] * 3)
    assert out.total == [1.5, 0.0, 0.5] and rc.worker_pids() == []  # exact runs in this process


def test_user_reward_callable_is_imported_and_bad_spec_rejected():
    from dfpo.trainer.rewards.compute import RewardSpec, reward_spec

    fn = correctness_fn("user", "add", "json:dumps")
    assert callable(fn)
    assert reward_spec("user", "add", "json:dumps") == RewardSpec("user", "json:dumps")
    assert reward_spec("auto", "add") == RewardSpec("exact") and reward_spec("auto", "gsm8k") == RewardSpec("math_verify")
    with pytest.raises(ValueError, match="cannot import module"):
        correctness_fn("user", "add", "no_such_module_xyz:f")
    with pytest.raises(ValueError, match="has no callable"):
        correctness_fn("user", "add", "json:nope")
    with pytest.raises(ValueError, match="must look like 'module:function'"):
        reward_spec("user", "add", "json.dumps")
    with pytest.raises(ValueError, match="cannot import module"):  # the same check, in a worker process
        RewardComputer(RewardSpec("user", "no_such_module_xyz:f"), workers=1)
    with pytest.raises(ValueError, match="has no callable"):
        RewardComputer(RewardSpec("user", "json:nope"), workers=1)


def test_prompt_sampler_resumes_exactly():
    a = PromptSampler(7, seed=1)
    first = a.take(5)
    state = a.state_dict()
    rest = a.take(12)
    b = PromptSampler(7, seed=1)
    b.load_state_dict(state)
    assert b.take(12) == rest
    assert sorted(first + rest[:2]) == list(range(7))


def test_builtin_eval_split_is_held_out():
    from dfpo.trainer.config import DataConfig
    from dfpo.trainer.tasks import load_splits

    train, evals = load_splits(DataConfig(task="add", max_operand=9, train_size=500, eval_size=30), seed=0)
    assert len({e.prompt for e in evals}) == 30
    assert not {e.prompt for e in evals} & {e.prompt for e in train}
    with pytest.raises(ValueError, match="eval_size=100 must be below the 100 distinct problems"):
        load_splits(DataConfig(task="add", max_operand=9, eval_size=100), seed=0)


def test_files_that_are_not_utf8_are_named_with_their_line(tmp_path):
    from dfpo.trainer.config import load_config
    from dfpo.trainer.tasks import load_jsonl

    bad = tmp_path / "d.jsonl"
    bad.write_bytes(b'{"prompt": "a", "answer": "1"}\n{"prompt": "caf\xe9", "answer": "2"}\n')
    with pytest.raises(ValueError, match=r"d.jsonl:2: not UTF-8"):
        load_jsonl(bad)
    cfg = tmp_path / "c.toml"
    cfg.write_bytes(b"seed = 0\n# \xff\n")
    with pytest.raises(ValueError, match=r"c.toml:2: not UTF-8"):
        load_config(cfg)


@pytest.mark.parametrize("answer", ["true", "null", "[1]", '{"x": 1}'])
def test_an_answer_that_is_not_a_string_or_number_is_rejected(tmp_path, answer):
    from dfpo.trainer.tasks import load_jsonl

    path = tmp_path / "d.jsonl"
    path.write_text('{"prompt": "a", "answer": "1"}\n{"prompt": "b", "answer": ' + answer + "}\n")
    with pytest.raises(ValueError, match=r"d.jsonl:2: field 'answer' must be a string or number"):
        load_jsonl(path)


def test_duplicate_prompts_across_the_split_are_found():
    from dfpo.trainer.tasks import duplicate_prompts

    train = [Example("1+1=", "2"), Example("2+2=", "4")]
    assert duplicate_prompts(train, [Example("2+2=", "4"), Example("3+3=", "6")]) == ["2+2="]


def test_a_prompt_longer_than_the_context_names_file_and_line_or_is_truncated(tmp_path, capsys):
    import sys as _sys
    from pathlib import Path as _Path

    _sys.path.insert(0, str(_Path(__file__).parent))
    from test_llm_e2e import tiny_config

    from dfpo.trainer.train import Trainer

    data = tmp_path / "d.jsonl"
    rows = [{"prompt": f"{i}+1=", "answer": str(i + 1)} for i in range(8)] + [{"prompt": "9" * 400 + "+1=", "answer": "x"}]
    data.write_text("\n".join(json.dumps(r) for r in rows) + "\n" + json.dumps({"prompt": "0+1=", "answer": "1"}) + "\n")
    sets = ["data.task=jsonl", f'data.path="{data}"', "data.eval_size=2"]
    with pytest.raises(ValueError, match=r"d.jsonl:9: the prompt has 403 tokens"):
        Trainer(tiny_config(tmp_path, *sets), quiet=True).run()
    assert "eval prompt(s) also appear in the train split" in capsys.readouterr().err
    summary = Trainer(
        tiny_config(tmp_path, *sets, "data.truncate_prompts=true", 'run_dir="' + str(tmp_path / "run2") + '"'), quiet=True
    ).run()
    assert summary["steps"] == 2


# -- data that used to fail deep inside a library: named by file, line and field before any work -----------------


def test_a_json_line_nested_100000_deep_is_named_by_file_and_line(tmp_path):
    """json.loads recurses once per level: such a line used to end in a RecursionError traceback."""
    path = tmp_path / "d.jsonl"
    path.write_text('{"prompt": "a", "answer": "1"}\n{"prompt": ' + "[" * 100_000 + "]" * 100_000 + ', "answer": "1"}\n')
    with pytest.raises(ValueError, match=rf"^{path}:2: JSON nested too deeply to read"):
        load_jsonl(path)


@pytest.mark.parametrize(
    "field, line", [("prompt", '{"prompt": "a\\ud800b", "answer": "1"}'), ("answer", '{"prompt": "a", "answer": "\\udfff"}')]
)
def test_a_lone_surrogate_is_named_by_file_line_and_field(tmp_path, field, line):
    """JSON lets an escape name half a surrogate pair, which is not text: the tokenizer used to fail with a TypeError."""
    path = tmp_path / "d.jsonl"
    path.write_text('{"prompt": "ok", "answer": "1"}\n' + line + "\n")
    with pytest.raises(ValueError, match=rf"^{path}:2: field '{field}' holds a lone surrogate"):
        load_jsonl(path)


def test_a_byte_order_mark_at_the_start_of_a_jsonl_file_is_skipped(tmp_path):
    path = tmp_path / "d.jsonl"
    path.write_text('\ufeff{"prompt": "1+1=", "answer": "2"}\n', encoding="utf-8")
    assert load_jsonl(path) == [Example("1+1=", "2")]


@pytest.mark.parametrize("key", ["data.path", "data.eval_path"])
def test_a_directory_or_a_fifo_given_as_a_data_file_is_named_as_such(tmp_path, key):
    """Both used to say 'no such file'; a FIFO would make a reader wait forever."""
    import os

    from dfpo.trainer.config import DataConfig
    from dfpo.trainer.tasks import load_splits

    good = tmp_path / "d.jsonl"
    good.write_text("".join(json.dumps({"prompt": f"{i}+1=", "answer": str(i + 1)}) + "\n" for i in range(8)))
    folder, fifo = tmp_path / "folder", tmp_path / "fifo"
    folder.mkdir()
    os.mkfifo(fifo)
    for path, says in [(folder, "is a directory, expected a file"), (fifo, "is not a regular file"), (tmp_path / "none", ": no such file")]:
        files = {"path": str(good), "eval_path": str(good)} | {key.removeprefix("data."): str(path)}
        with pytest.raises(ValueError, match=rf"^{key} '{path}'{says}" if says.startswith(":") else rf"^{key} '{path}' {says}"):
            load_splits(DataConfig(task="jsonl", **files), seed=0)


class _TokenizerSpy:
    """A tokenizer that remembers the longest text it was given."""

    def __init__(self, tok):
        self.tok, self.longest = tok, 0

    def __getattr__(self, name):
        return getattr(self.tok, name)

    def __call__(self, text, **kwargs):
        self.longest = max(self.longest, len(text))
        return self.tok(text, **kwargs)


def test_a_prompt_too_long_in_characters_is_refused_before_it_is_tokenised():
    """A 50 MB one-line prompt used to be tokenised whole before the length check: 13 GB of memory, then a panic in
    the tokenizer. More characters than the limit's tokens x the longest token (5 characters here: '<pad>') cannot fit."""
    from dfpo.trainer.config import DataConfig
    from dfpo.trainer.policy import build_char_tokenizer
    from dfpo.trainer.prompts import encode_prompts, prompt_char_limit

    tok = _TokenizerSpy(build_char_tokenizer())
    assert prompt_char_limit(tok, 253) == 253 * 5
    huge = Example("9" * 1_000_000, "9", source="big.jsonl:7")
    with pytest.raises(
        ValueError, match=r"^big.jsonl:7: the prompt has 1000000 characters \(a token is at most 5 here\), so more tokens than the 253"
    ):
        encode_prompts(tok, [Example("1+1=", "2"), huge], DataConfig(), 253)
    assert tok.longest == len("1+1=")  # the long prompt never reached the tokenizer


def test_a_prompt_too_long_in_characters_is_cut_before_tokenising_when_truncation_is_asked():
    """data.truncate_prompts keeps the last tokens; the tokenizer sees at most 2 x the character limit, so the tokens
    kept lie far from the cut and are the ones a whole tokenisation would keep."""
    from dfpo.trainer.config import DataConfig
    from dfpo.trainer.policy import build_char_tokenizer
    from dfpo.trainer.prompts import encode_prompts

    tok = _TokenizerSpy(build_char_tokenizer())
    prompt = "".join(str(i % 10) for i in range(1_000_000)) + "+1="
    (ids,) = encode_prompts(tok, [Example(prompt, "1")], DataConfig(truncate_prompts=True), 253)
    assert tok.longest <= 2 * 253 * 5
    assert tok.decode(ids) == prompt[-253:]
