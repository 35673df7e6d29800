"""Values that pass a first look but used to fail after work had started: refused up front, naming the value, or
handled exactly (a seed at its bound, a string with control characters, JSON Lines with U+2028)."""

from __future__ import annotations

import json
import sys
import time
import tomllib
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from dfpo.trainer.config import config_from_dict, config_to_toml, load_config
from dfpo.trainer.tasks import load_jsonl
from dfpo.trainer.train import Trainer

sys.path.insert(0, str(Path(__file__).parent))
from test_llm_e2e import tiny_config  # noqa: E402


@pytest.mark.parametrize("seed", [2**63 - 1, 2**32, -1])
def test_a_seed_numpy_cannot_take_is_refused_naming_the_key(seed):
    with pytest.raises(ValueError, match=rf"seed must be in \[0, 4294967295\], got {seed}"):
        load_config(None, [f"seed={seed}"])


def test_the_largest_seed_trains(tmp_path):
    summary = Trainer(tiny_config(tmp_path, f"seed={2**32 - 1}", "train.steps=1", "eval.every=0"), quiet=True).run()
    assert summary["steps"] == 1


def test_max_new_tokens_beyond_the_context_is_refused_before_any_work(tmp_path):
    t0 = time.monotonic()
    with pytest.raises(ValueError, match=r"rollout.max_new_tokens=100000 leaves no room for a prompt in the model's context of 256 tokens"):
        Trainer(tiny_config(tmp_path, "rollout.max_new_tokens=100000", "model.sft_steps=100000"), quiet=True)
    assert time.monotonic() - t0 < 30  # no warm-up ran (100000 SFT steps would take minutes)
    assert not (tmp_path / "run").exists()  # the refused run leaves no folder behind


def test_an_over_long_prompt_is_named_before_the_warm_up(tmp_path):
    data = tmp_path / "data.jsonl"
    rows = [{"prompt": "1+2=", "answer": "3"}] * 8 + [{"prompt": "9" * 300, "answer": "9"}]
    data.write_text("".join(json.dumps(r) + "\n" for r in rows))
    t0 = time.monotonic()
    with pytest.raises(ValueError, match=rf"{data}:9: the prompt has 300 tokens, more than the 253"):
        Trainer(tiny_config(tmp_path, "data.task=jsonl", f'data.path="{data}"', "model.sft_steps=100000"), quiet=True)
    assert time.monotonic() - t0 < 30


@given(st.text(min_size=0, max_size=40))
def test_any_string_setting_round_trips_through_config_toml(text):
    """Every string, control characters and line separators included, is written so that config.toml reads back equal."""
    cfg = config_from_dict({"run_dir": text, "data": {"prompt_template": "{prompt}" + text}})
    assert config_from_dict(tomllib.loads(config_to_toml(cfg))) == cfg


@pytest.mark.parametrize("separator", ["\u2028", "\u2029", "\x85"])
def test_json_lines_with_unicode_line_separators_inside_strings_are_read(tmp_path, separator):
    """JSON allows these characters unescaped inside strings; JSON Lines ends a line at \\n only."""
    path = tmp_path / "data.jsonl"
    path.write_text(f'{{"prompt": "a{separator}b=", "answer": "1"}}\n{{"prompt": "c=", "answer": "2"}}\r\n', encoding="utf-8")
    examples = load_jsonl(path)
    assert [e.prompt for e in examples] == [f"a{separator}b=", "c="]
    assert [e.source for e in examples] == [f"{path}:1", f"{path}:2"]
