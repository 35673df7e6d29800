"""Prompts as token ids: a task's ``Example.prompt`` through ``data.prompt_template``, the tokenizer's chat template
with data.system_prompt's system turn ("auto" the template's own, "" none, cut out when the template adds one by
default: ``system_turn_cut``), and the prompt length limit the model's context leaves beside the completions.

What the trainer asks of it: ``encode_prompts`` (the rollout's and the preflight's prompt ids), ``prompt_char_limit``
(the most characters a prompt within the limit can have) and ``clip_long_prompts`` (the tiny preset's warm start with
data.truncate_prompts). ``tasks`` holds the examples and their scoring.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from .tasks import Example


def longest_token_chars(tok) -> int | None:
    """The most characters one token of ``tok`` can stand for: the longest entry of its vocabulary (a byte-level
    BPE entry has one symbol per byte, a byte is at most one character; added and special tokens count). None
    when the tokenizer does not list its vocabulary."""
    get_vocab = getattr(tok, "get_vocab", None)
    if get_vocab is None:
        return None
    try:
        vocab = get_vocab()
    except (NotImplementedError, AttributeError, TypeError):
        return None
    return max((len(t) for t in vocab), default=1) or 1


def prompt_char_limit(tok, max_tokens: int | None) -> int | None:
    """The most characters a prompt of at most ``max_tokens`` tokens can have: ``max_tokens`` times the longest
    token (``longest_token_chars``). A longer text has more tokens than that for certain, so it is refused (or cut)
    before tokenising: a 50 MB prompt is never handed to the tokenizer. None: no limit known."""
    if max_tokens is None:
        return None
    longest = longest_token_chars(tok)
    return None if longest is None else max_tokens * longest


def _too_long(where: str, length: str, max_tokens: int) -> ValueError:
    return ValueError(
        f"{where}: the prompt has {length} the {max_tokens} the model's context leaves beside rollout.max_new_tokens; "
        "shorten it, lower rollout.max_new_tokens, or set data.truncate_prompts = true"
    )


SYSTEM_SENTINEL = "DFPO-SYSTEM-SENTINEL-4b1e"
"""The system turn a prompt is rendered with when data.system_prompt = "" and the chat template adds a system turn
of its own: the turn is then cut out (``SystemTurnCut``)."""
USER_SENTINEL = "DFPO-USER-SENTINEL-9c2d"


def _render(tok, messages: list[dict], data) -> str:
    return tok.apply_chat_template(messages, add_generation_prompt=True, tokenize=False, enable_thinking=data.enable_thinking)


def _turns(system: str | None, user: str) -> list[dict]:
    return ([{"role": "system", "content": system}] if system is not None else []) + [{"role": "user", "content": user}]


@dataclass(frozen=True)
class SystemTurnCut:
    """How a prompt is rendered with no system turn by a chat template that adds one when the messages have none
    (SmolLM2's "You are a helpful AI assistant named SmolLM...", Llama 3.1's date lines): rendered with the sentinel
    system turn, it starts with ``head`` (what comes before the system turn, the turn itself, up to the user turn),
    which is replaced by ``pre`` (what comes before the system turn: a BOS token's text, or nothing)."""

    head: str
    pre: str

    def apply(self, rendered: str, where: str) -> str:
        if not rendered.startswith(self.head):
            raise _cannot_drop(f"{where}: the chat template renders this prompt's system turn unlike the others")
        return self.pre + rendered[len(self.head) :]


def _cannot_drop(why: str) -> ValueError:
    return ValueError(
        f'data.system_prompt = "" asks for no system turn, but {why}, so dfpo cannot cut it out; '
        'set data.system_prompt = "auto" (the template\'s own) or to a text'
    )


def system_turn_cut(tok, data) -> SystemTurnCut | None:
    """What data.system_prompt = "" needs: None when the chat template renders a lone user turn with no system turn,
    else the ``SystemTurnCut`` that removes the system turn it adds; ValueError of one sentence when it adds one that
    cannot be found.

    How: render the user turn alone (``plain``) and after a sentinel system turn (``marked``), with a sentinel user
    text. The system turn of ``marked`` starts at the last place before the sentinel where its header stands, and
    its header is the user turn's header with the role renamed ("<|im_start|>user\\n" -> "<|im_start|>system\\n"); the
    longest such header is taken. Cutting from there to the user turn must leave no system header; when what is left
    is ``plain``, the template adds no system turn of its own (None), else the cut is used, whatever the template
    adds by default (a default need not look like an explicit system turn). A template without such headers (Gemma
    folds a system prompt into the user turn) adds a system turn only if ``plain`` is ``marked`` with other text in
    the sentinel's place: then it is refused. Chosen over a list of known default prompts: it needs no list, and it
    checks what it cuts."""
    plain = _render(tok, _turns(None, USER_SENTINEL), data)
    try:
        marked = _render(tok, _turns(SYSTEM_SENTINEL, USER_SENTINEL), data)
    except Exception:  # noqa: BLE001 - a template that refuses a system turn (raise_exception) adds none of its own
        return None
    if marked.count(SYSTEM_SENTINEL) != 1 or marked.count(USER_SENTINEL) != 1:
        raise _cannot_drop("the chat template does not render a system turn's text once")
    cut = marked.index(SYSTEM_SENTINEL)
    before, after = marked[:cut], marked[cut + len(SYSTEM_SENTINEL) :]
    user_at = after.index(USER_SENTINEL)
    for start in range(user_at):  # the longest user-turn header first
        header = after[start:user_at]
        if header.count("user") != 1:
            continue
        twin = header.replace("user", "system")
        opens = before.rfind(twin)
        if opens < 0:
            continue
        found = SystemTurnCut(head=before + SYSTEM_SENTINEL + after[:start], pre=before[:opens])
        without = found.apply(marked, "the template")
        if twin in without:
            raise _cannot_drop("a system header is left after cutting out the system turn")
        return None if without == plain else found  # None: the user turn alone renders with no system turn
    if plain.startswith(before) and plain.endswith(after) and len(plain) > len(before) + len(after):
        raise _cannot_drop("the chat template adds a system turn of its own whose header dfpo cannot find")
    return None


def _no_template_for_system_prompt(data, has_template: bool) -> ValueError:
    why = 'data.chat_template = "off"' if has_template else "the tokenizer has no chat template"
    return ValueError(
        f"data.system_prompt = {data.system_prompt!r} needs a chat template to put it in a system turn, but {why}; "
        'set data.system_prompt = "auto" or write the text into data.prompt_template'
    )


def render_chat(tok, text: str, data, cut: SystemTurnCut | None, where: str) -> str:
    """``text`` as the user turn of the tokenizer's chat template, with data.system_prompt's system turn: "auto" the
    template's own choice, "" none at all (cut out by ``cut`` when the template adds one), any other text that text."""
    if data.system_prompt == "auto":
        return _render(tok, _turns(None, text), data)
    if data.system_prompt == "":
        return (
            _render(tok, _turns(None, text), data) if cut is None else cut.apply(_render(tok, _turns(SYSTEM_SENTINEL, text), data), where)
        )
    try:
        return _render(tok, _turns(data.system_prompt, text), data)
    except Exception as err:  # noqa: BLE001 - a template may refuse a system turn (raise_exception)
        raise ValueError(
            f"data.system_prompt = {data.system_prompt!r}: the tokenizer's chat template refuses a system turn "
            f'({type(err).__name__}: {err}); set data.system_prompt = "auto" or write the text into data.prompt_template'
        ) from None


def encode_prompts(tok, examples: list[Example], data, max_tokens: int | None = None) -> list[list[int]]:
    """Prompt token ids: ``data.prompt_template`` applied, then the tokenizer's chat template when it has one
    (data.chat_template = "auto"/"on") or plain text ("off", or no template), with data.system_prompt's system turn
    (``render_chat``; a system prompt other than "auto" or "" with no chat template is refused, not prepended: where
    it would go is the template's business). A prompt longer than ``max_tokens`` is an error naming its source, or
    keeps its last tokens with data.truncate_prompts.

    A prompt of more characters than ``prompt_char_limit`` is too long whatever the tokenizer makes of it: it is
    refused before tokenising, or (data.truncate_prompts) cut to its last 2 x that many characters first, which
    still hold at least 2 x ``max_tokens`` tokens, so the tokens kept lie far from the cut."""
    has_template = bool(getattr(tok, "chat_template", None))
    if data.chat_template == "on" and not has_template:
        raise ValueError('data.chat_template = "on" but the tokenizer has no chat template; set it to "auto" or "off"')
    use_template = has_template and data.chat_template != "off"
    if data.system_prompt not in ("auto", "") and not use_template:
        raise _no_template_for_system_prompt(data, has_template)
    cut = system_turn_cut(tok, data) if use_template and data.system_prompt == "" else None
    char_limit: int | None = None
    out = []
    for ex in examples:
        text = data.prompt_template.replace("{prompt}", ex.prompt)  # not str.format: LaTeX braces stay
        where = ex.source or f"prompt {ex.prompt[:40]!r}"
        if max_tokens is not None and len(text) > max_tokens:  # else no tokenizer can make it too long by characters
            char_limit = char_limit or prompt_char_limit(tok, max_tokens)
            if char_limit is not None and len(text) > char_limit:
                if not data.truncate_prompts:
                    per_token = char_limit // max_tokens
                    raise _too_long(where, f"{len(text)} characters (a token is at most {per_token} here), so more tokens than", max_tokens)
                text = text[-2 * char_limit :]
        if use_template:
            text = render_chat(tok, text, data, cut, where)
        ids = tok(text, add_special_tokens=False).input_ids
        if max_tokens is not None and len(ids) > max_tokens:
            if not data.truncate_prompts:
                raise _too_long(where, f"{len(ids)} tokens, more than", max_tokens)
            ids = ids[-max_tokens:]
        out.append(ids)
    return out


def clip_long_prompts(examples: list[Example], max_chars: int | None) -> list[Example]:
    """``examples`` with every prompt longer than ``max_chars`` cut to its last ``max_chars`` characters (None: as
    they are): what the tiny preset's warm start reads when data.truncate_prompts keeps a prompt's last tokens."""
    if max_chars is None:
        return examples
    return [ex if len(ex.prompt) <= max_chars else dataclasses.replace(ex, prompt=ex.prompt[-max_chars:]) for ex in examples]
