"""Tasks and data: built-in offline tasks, JSONL files, reasoning-gym, HF datasets.

Every source yields ``Example(prompt, answer, meta)``. Built-in tasks:

- ``add``: "a+b=" -> the decimal sum ("37+45=" -> "82"); one correct surface form.
- ``equiv``: the same prompts, but a completion is correct when it is a sum of
  non-negative integers equal to a+b: "82", "45+37", "80+2" are all correct. This is the
  10+10-style task of several equivalent correct solutions (paper sec. 3, Prop. 3.1: drift
  between equivalent correct answers); ``surface_form`` names the form of a completion so
  the trainer can log how the policy spreads its mass over them.
- ``sum``: a chat model's task, "What is 12 + 7 + 30? Answer with just the number." (data.operands numbers in
  data.min_operand..data.max_operand) -> "49", scored by the last integer of the completion (``reward.kind =
  "last_int"``). A correct answer still has several surface forms ("49", "12 + 7 + 30 = 49", "The answer is
  49."): ``sum_surface_form`` names them for the same drift diagnostics.
- ``sum_template``: a task on which whole groups share tokens (issue 58): "What is 12 + 7 + 30? First write the sum
  as an equation, then the result." -> "49", scored as ``sum``; its supervised target (``template_answer``) restates
  the problem before the result, "12 + 7 + 30 = 49", so a policy warmed up on it writes the same tokens
  "12 + 7 + 30 = " in every completion of a group: the shared contexts of Prop. 3.1. ``answer_template`` is that
  prefix (the teacher-forced positions of ``eval/template_kl``), ``in_template`` whether a completion restates it.

What the trainer asks of a task, besides its examples: ``sft_target`` (the target of the tiny preset's warm start and
of ``warmup``'s), ``surface_form_shares`` (the ``forms/*`` metrics of the arithmetic tasks), ``answer_template`` and
``template_share`` (the template of ``sum_template``). How a prompt becomes token ids (the prompt
template, the tokenizer's chat template with data.system_prompt's system turn, the length limit) is ``prompts``.
"""

from __future__ import annotations

import json
import math
import os
import random
import re
import socket
from collections.abc import Callable
from dataclasses import dataclass, field
from decimal import Decimal
from pathlib import Path

from ..core.files import check_input_file, read_utf8


@dataclass(frozen=True)
class Example:
    prompt: str
    answer: str
    meta: dict = field(default_factory=dict)
    source: str = field(default="", compare=False)
    """Where the example comes from, e.g. 'data.jsonl:12' (named in errors about it)."""


def operand_space(operands: int, min_operand: int, max_operand: int) -> int:
    """How many distinct operand tuples the built-in tasks can draw: (max - min + 1) ** operands."""
    return (max_operand - min_operand + 1) ** operands


def check_operand_range(min_operand: int, max_operand: int) -> None:
    """ValueError of one sentence when data.min_operand is above data.max_operand."""
    if min_operand > max_operand:
        raise ValueError(
            f"data.min_operand={min_operand} is above data.max_operand={max_operand}; lower data.min_operand or raise data.max_operand"
        )


def _draw(rng: random.Random, operands: int, min_operand: int, max_operand: int) -> tuple[int, ...]:
    """One operand tuple, each operand ``rng.randint(min_operand, max_operand)`` in turn (with min_operand 0 and two
    operands: the draws ``add`` always made)."""
    return tuple(rng.randint(min_operand, max_operand) for _ in range(operands))


def _range_text(operands: int, min_operand: int, max_operand: int) -> str:
    """How the error messages name the operand settings: only the ones a task reads or the user changed."""
    parts = [f"data.operands={operands}"] if operands != 2 else []
    parts += [f"data.min_operand={min_operand}"] if min_operand else []
    return " and ".join([*parts, f"data.max_operand={max_operand}"])


def make_add_examples(
    n: int, max_operand: int, seed: int, exclude: set[tuple[int, int]] = frozenset(), min_operand: int = 0
) -> list[Example]:
    """n problems "a+b=" with operands in min_operand..max_operand, from a seeded generator, avoiding the
    (a, b) pairs in ``exclude`` (so an eval split can be held out)."""
    if len(exclude) >= operand_space(2, min_operand, max_operand):
        raise ValueError(f"data.eval_size leaves no train problems with {_range_text(2, min_operand, max_operand)}; lower data.eval_size")
    rng = random.Random(seed)
    out = []
    while len(out) < n:
        a, b = _draw(rng, 2, min_operand, max_operand)
        if (a, b) in exclude:
            continue
        out.append(add_example(a, b))
    return out


def add_example(a: int, b: int) -> Example:
    """The add/equiv problem "a+b=" -> "a+b's value"."""
    return Example(prompt=f"{a}+{b}=", answer=str(a + b), meta={"a": a, "b": b})


def held_out_tuples(n: int, operands: int, min_operand: int, max_operand: int, seed: int) -> list[tuple[int, ...]]:
    """n distinct operand tuples for the eval split of the built-in tasks, from a seeded generator."""
    space = operand_space(operands, min_operand, max_operand)
    if n >= space:
        raise ValueError(
            f"data.eval_size={n} must be below the {space} distinct problems of {_range_text(operands, min_operand, max_operand)}"
        )
    rng = random.Random(seed)
    tuples: list[tuple[int, ...]] = []
    seen = set()
    while len(tuples) < n:
        t = _draw(rng, operands, min_operand, max_operand)
        if t not in seen:
            seen.add(t)
            tuples.append(t)
    return tuples


def held_out_pairs(n: int, max_operand: int, seed: int, min_operand: int = 0) -> list[tuple[int, int]]:
    """n distinct (a, b) pairs for the eval split of add and equiv."""
    return held_out_tuples(n, 2, min_operand, max_operand, seed)  # type: ignore[return-value]


SUM_PROMPT = "What is {terms}? Answer with just the number."
"""The ``sum`` task's prompt; {terms} is the operands joined by " + "."""


def sum_example(operands: tuple[int, ...] | list[int]) -> Example:
    """The sum problem of ``operands``: "What is 12 + 7 + 30? Answer with just the number." -> "49"."""
    terms = " + ".join(str(x) for x in operands)
    return Example(prompt=SUM_PROMPT.format(terms=terms), answer=str(sum(operands)), meta={"operands": list(operands)})


SUM_TEMPLATE_PROMPT = "What is {terms}? First write the sum as an equation, then the result."
"""The ``sum_template`` task's prompt (issue 58's wording); {terms} as in SUM_PROMPT."""


def sum_template_example(operands: tuple[int, ...] | list[int]) -> Example:
    """The sum_template problem of ``operands``: "What is 12 + 7 + 30? First write the sum as an equation, then the
    result." -> "49" (scored by the last integer, as ``sum``)."""
    terms = " + ".join(str(x) for x in operands)
    return Example(prompt=SUM_TEMPLATE_PROMPT.format(terms=terms), answer=str(sum(operands)), meta={"operands": list(operands)})


TEMPLATE_TASKS = ("sum_template",)
"""Tasks whose answers restate the problem before the result (``answer_template``)."""


def answer_template(example: Example) -> str:
    """The template a ``sum_template`` answer starts with: the problem restated as an equation up to its result,
    "12 + 7 + 30 = " (the tokens every completion of a warmed-up group shares)."""
    return " + ".join(str(x) for x in example.meta["operands"]) + " = "


def template_answer(example: Example) -> str:
    """The supervised target of ``sum_template``: the template, then the result ("12 + 7 + 30 = 49")."""
    return answer_template(example) + example.answer


def in_template(completion: str, example: Example) -> bool:
    """Whether ``completion`` restates its problem before a result: it starts (after whitespace) with the problem's
    operands in order joined by "+", then "=", then a number ("12 + 7 + 30 = 49", "12+7+30=48": yes, right or wrong;
    "49", "7 + 12 + 30 = 49", "The sum is 12 + 7 + 30 = 49": no)."""
    terms = r"\s*\+\s*".join(str(x) for x in example.meta["operands"])
    return re.match(rf"\s*{terms}\s*=\s*-?[0-9]", completion) is not None


def template_share(task: str, completions: list[str], examples: list[Example]) -> float | None:
    """The share of ``completions`` (one per entry of ``examples``) that are ``in_template``; None for a task without a
    template (every task but TEMPLATE_TASKS) or no completion."""
    if task not in TEMPLATE_TASKS or not completions:
        return None
    return sum(in_template(text, ex) for text, ex in zip(completions, examples)) / len(completions)


def make_sum_examples(
    n: int,
    operands: int,
    min_operand: int,
    max_operand: int,
    seed: int,
    exclude: set[tuple[int, ...]] = frozenset(),
    example: Callable[[tuple[int, ...]], Example] = sum_example,
) -> list[Example]:
    """n ``sum`` problems of ``operands`` numbers in min_operand..max_operand, from a seeded generator, avoiding the
    operand tuples in ``exclude`` (the eval split's; order counts: 3 + 4 and 4 + 3 are two problems); ``example``
    makes each problem (``sum_template_example`` for that task)."""
    if len(exclude) >= operand_space(operands, min_operand, max_operand):
        raise ValueError(
            f"data.eval_size leaves no train problems with {_range_text(operands, min_operand, max_operand)}; lower data.eval_size"
        )
    rng = random.Random(seed)
    out = []
    while len(out) < n:
        t = _draw(rng, operands, min_operand, max_operand)
        if t not in exclude:
            out.append(example(t))
    return out


def equiv_targets(a: int, b: int, rng: random.Random) -> str:
    """One supervised target of the equiv task: a random correct surface form of a+b."""
    form = rng.choice(("number", "swap", "split"))
    if form == "number":
        return str(a + b)
    if form == "swap":
        return f"{b}+{a}"
    c = a + b
    x = rng.randint(0, c)
    return f"{x}+{c - x}"


_SUM = re.compile(r"^\s*(\d+)(\s*\+\s*\d+)*\s*$")


def sum_value(text: str) -> int | None:
    """Value of a completion written as n or n+m+...; None when it is not such a sum."""
    if not _SUM.match(text) or len(text) > 64:
        return None
    return sum(int(x) for x in text.split("+"))


_NUMBER = re.compile(
    r"(?P<sign>(?<![0-9A-Za-z_)\]])[-\u2212])?(?<![0-9])(?P<int>[0-9]{1,3}(?:,[0-9]{3})+(?![0-9])|[0-9]+)(?P<frac>\.[0-9]+)?"
)
"""A number written in text: ASCII digits, with thousands separators when every group after the first has exactly three
digits ("1,014" is 1014; "1,2,3" is three numbers, "10,4" two), a decimal part, and a minus sign ("-" or U+2212) when the
sign does not follow a letter, digit or closing bracket ("x = -6" holds -6, "10-4" holds 10 and 4). Digits glued to
words count ("is14", "14th": 14)."""


def _number_value(match: re.Match) -> Decimal:
    sign = "-" if match["sign"] else ""
    return Decimal(sign + match["int"].replace(",", "") + (match["frac"] or ""))


def last_number(text: str) -> Decimal | None:
    """The value of the last number written in ``text`` (``_NUMBER``'s rules), None when it holds none."""
    last = None
    for last in _NUMBER.finditer(text):  # noqa: B007 - the last match is the point
        pass
    return None if last is None else _number_value(last)


def integer_answer(answer: str) -> Decimal:
    """The value of an answer that is one integer ("14", " -3 ", "1,014", "14.0"); ValueError of one sentence otherwise."""
    text = answer.strip().removeprefix("+")
    match = _NUMBER.fullmatch(text)
    value = None if match is None else _number_value(match)
    if value is None or value != value.to_integral_value():
        raise ValueError(f"the answer {answer!r} is not an integer; reward.kind = 'last_int' needs integer answers")
    return value


def last_int_correct(completion: str, answer: str) -> bool:
    """Whether the last number written in ``completion`` equals the integer ``answer`` (what ``reward.kind = "last_int"``
    scores 1): "To find 10 + 4, we simply add" ends in 4, not 14; "The answer is "14"." and "10 + 4 = 14" end in 14; a
    last number with a non-zero decimal part ("14.5") equals no integer."""
    value = last_number(completion)
    return value is not None and value == integer_answer(answer)


def surface_form(completion: str, example: Example) -> str:
    """Name of the surface form of a completion of an arithmetic prompt (equiv diagnostics); a ``sum`` problem's
    (meta "operands") is ``sum_surface_form``'s."""
    if "operands" in example.meta:
        return sum_surface_form(completion, example)
    text = completion.strip()
    if sum_value(text) is None:
        return "invalid"
    if "+" not in text:
        return "number"
    a, b = example.meta.get("a"), example.meta.get("b")
    parts = [int(x) for x in text.split("+")]
    if parts == [b, a]:
        return "swap"
    if parts == [a, b]:
        return "echo"
    return "split"


SURFACE_FORMS = ("number", "swap", "split", "echo", "invalid")
"""The surface forms ``surface_form`` names, in the order the ``forms/*`` metrics are logged."""

SUM_FORMS = ("number", "equation", "sentence", "wrong")
"""The surface forms ``sum_surface_form`` names, in the order the ``forms/*`` metrics of task sum are logged."""

_TERM = r"[0-9]{1,3}(?:,[0-9]{3})+(?![0-9])|[0-9]+"
_JUST_NUMBER = re.compile(rf"\s*-?(?:{_TERM})\s*\.?\s*")
_EQUATION = re.compile(rf"\s*((?:{_TERM})(?:\s*\+\s*(?:{_TERM}))+)\s*=\s*(-?(?:{_TERM}))\s*\.?\s*")


def sum_surface_form(completion: str, example: Example) -> str:
    """The surface form of a completion of a ``sum`` problem: 'wrong' when ``last_int_correct`` says it is not correct;
    else 'number' when it is just the integer (surrounding whitespace and one final period allowed: "19", " 19."),
    'equation' when it is just an equation of a sum equal to the answer ("12 + 7 = 19", "7 + 12 = 19.", "10 + 9 = 19":
    the terms need not be the problem's operands, but they must add up to the answer), 'sentence' for every other
    correct completion ("The answer is 19.", "12 + 7 = 19, so 19")."""
    if not last_int_correct(completion, example.answer):
        return "wrong"
    if _JUST_NUMBER.fullmatch(completion):
        return "number"
    equation = _EQUATION.fullmatch(completion)
    if equation and sum(int(t.replace(",", "")) for t in equation[1].split("+")) == int(equation[2].replace(",", "")):
        return "equation"
    return "sentence"


def form_entropy(forms: list[str]) -> float:
    """Entropy in nats of the distribution of ``forms`` (-sum_f p_f ln p_f over the forms present); 0 for fewer than two."""
    if len(forms) < 2:
        return 0.0
    shares = [forms.count(name) / len(forms) for name in set(forms)]
    return float(-sum(p * math.log(p) for p in shares))


def surface_form_shares(task: str, completions: list[str], examples: list[Example]) -> dict[str, float]:
    """The ``forms/*`` metrics of a step's ``completions`` (one per entry of ``examples``); {} for tasks other than
    add, equiv and sum.

    add, equiv: ``forms/<form>``, the share of the completions in each of SURFACE_FORMS (how the policy spreads its
    mass over equivalent correct answers).
    sum, sum_template: ``forms/<form>``, the share of the completions in each of SUM_FORMS (``sum_surface_form``; they add up to 1),
    and ``forms/equiv_entropy``: the entropy in nats of the distribution of the forms number / equation / sentence
    among the step's CORRECT completions only (the 'wrong' ones left out; 0 when fewer than 2 are correct; at most
    ln 3 = 1.0986): the drift between equivalent correct answers (paper sec. 3, Prop. 3.1) as one number, which
    falls as the policy settles on one form. sum_template also: ``forms/template``, the share ``in_template``."""
    if task in ("equiv", "add"):
        forms = [surface_form(text, ex) for text, ex in zip(completions, examples)]
        return {f"forms/{name}": forms.count(name) / len(forms) for name in SURFACE_FORMS}
    if task in ("sum", *TEMPLATE_TASKS):
        forms = [sum_surface_form(text, ex) for text, ex in zip(completions, examples)]
        shares = {f"forms/{name}": forms.count(name) / len(forms) for name in SUM_FORMS}
        shares |= {"forms/equiv_entropy": form_entropy([f for f in forms if f != "wrong"])}
        share = template_share(task, completions, examples)
        return shares if share is None else shares | {"forms/template": share}
    return {}


def sft_target(task: str) -> Callable[[Example, random.Random], str]:
    """The supervised target of a warm start (the tiny preset's, ``warmup``'s): a random correct surface form of a+b
    for equiv (so that every form has mass to start from), the template then the result for sum_template
    ("12 + 7 + 30 = 49"), the answer for every other task."""
    if task == "equiv":
        return lambda ex, rng: equiv_targets(ex.meta["a"], ex.meta["b"], rng)
    if task in TEMPLATE_TASKS:
        return lambda ex, rng: template_answer(ex)
    return lambda ex, rng: ex.answer


def _text_problem(value: str) -> str | None:
    """Why a string read from JSON is not text (a lone surrogate from an escape such as "\\ud800"), or None."""
    try:
        value.encode("utf-8")
    except UnicodeEncodeError as err:
        return f"a lone surrogate {value[err.start]!r} at character {err.start}, which is not text; write the character itself or a valid pair of escapes"
    return None


def load_jsonl(path: str | Path, key: str = "data.path") -> list[Example]:
    """Read {prompt, answer} objects, one per line; errors name the file and line. Lines end at "\\n" (JSON Lines):
    U+2028, U+2029 or NEL inside a string are text, as JSON allows them unescaped. A UTF-8 byte order mark at the
    start is skipped. ``key``: the config key that named the file (in the error when it is not a readable file)."""
    check_input_file(key, path)
    p = Path(path)
    out = []
    for lineno, line in enumerate(read_utf8(p).removeprefix("\ufeff").split("\n"), start=1):
        line = line.removesuffix("\r")
        if not line.strip():
            continue
        try:
            obj = json.loads(line)
        except json.JSONDecodeError as err:
            raise ValueError(f"{p}:{lineno}: not valid JSON ({err.msg}); each line must be a JSON object") from None
        except RecursionError:
            raise ValueError(f"{p}:{lineno}: JSON nested too deeply to read; each line must be a flat {{prompt, answer}} object") from None
        if not isinstance(obj, dict):
            raise ValueError(f"{p}:{lineno}: expected a JSON object with fields 'prompt' and 'answer'")
        missing = [k for k in ("prompt", "answer") if k not in obj]
        if missing:
            raise ValueError(f"{p}:{lineno}: missing field {', '.join(repr(m) for m in missing)}; each line needs 'prompt' and 'answer'")
        if not isinstance(obj["prompt"], str) or not obj["prompt"]:
            raise ValueError(f"{p}:{lineno}: field 'prompt' must be a non-empty string")
        answer = obj["answer"]
        if isinstance(answer, bool) or not isinstance(answer, (str, int, float)):
            raise ValueError(f"{p}:{lineno}: field 'answer' must be a string or number, got {answer!r}")
        for name in ("prompt", "answer"):
            problem = _text_problem(obj[name]) if isinstance(obj[name], str) else None
            if problem:
                raise ValueError(f"{p}:{lineno}: field {name!r} holds {problem}")
        meta = {k: v for k, v in obj.items() if k not in ("prompt", "answer")}
        out.append(Example(prompt=obj["prompt"], answer=str(answer), meta=meta, source=f"{p}:{lineno}"))
    if not out:
        raise ValueError(f"{p}: no examples")
    return out


def load_reasoning_gym(name: str, n: int, seed: int) -> list[Example]:
    """Problems generated offline by reasoning-gym (e.g. 'gsm_symbolic'); meta keeps the entry."""
    try:
        import reasoning_gym
    except ImportError:
        raise ValueError('data.task = "reasoning_gym" needs the reasoning-gym package: pip install reasoning-gym') from None
    try:
        ds = reasoning_gym.create_dataset(name, size=n, seed=seed)
    except Exception as err:  # unknown generator names raise various errors
        raise ValueError(f"data.name {name!r}: reasoning-gym cannot create it ({err})") from None
    return [Example(prompt=e["question"], answer=str(e["answer"]), meta={"rg_name": name, "entry": e}) for e in ds]


def _gsm8k_answer(text: str) -> str:
    return text.split("####")[-1].strip().replace(",", "") if "####" in text else text.strip()


def hub_reachable(timeout: float = 3.0) -> bool:
    """Whether huggingface.co answers (and HF_HUB_OFFLINE is not set)."""
    if os.environ.get("HF_HUB_OFFLINE", "") not in ("", "0") or os.environ.get("TRANSFORMERS_OFFLINE", "") not in ("", "0"):
        return False
    try:
        socket.create_connection(("huggingface.co", 443), timeout=timeout).close()
        return True
    except OSError:
        return False


def _in_hub_cache(name: str) -> bool:
    """Whether the HF hub cache holds a snapshot of dataset ``name``."""
    try:
        from huggingface_hub import scan_cache_dir

        return any(r.repo_id == name and r.repo_type == "dataset" for r in scan_cache_dir().repos)
    except Exception:
        return False


def load_hf(name: str, subset: str, split: str, prompt_field: str, answer_field: str) -> list[Example]:
    """A HF dataset split (local cache first, then the hub when reachable)."""
    try:
        import datasets
    except ImportError:
        raise ValueError('data.task = "hf" needs the datasets package: pip install datasets') from None
    offline_msg = (
        f"data.name {name!r}: not in the local cache and the Hugging Face hub is not reachable. "
        'Export it to JSONL ({"prompt", "answer"} per line) on a machine with network and use '
        'data.task = "jsonl", data.path = "FILE.jsonl"; or use data.task = "reasoning_gym" offline.'
    )
    if not Path(name).exists() and not hub_reachable() and not _in_hub_cache(name):
        raise ValueError(offline_msg)  # fail fast instead of datasets' retries
    try:
        ds = datasets.load_dataset(name, subset or None, split=split)
    except Exception as err:
        if not hub_reachable():
            raise ValueError(offline_msg) from None
        raise ValueError(f"data.name {name!r} split {split!r}: {err}") from None
    cols = ds.column_names
    for f in (prompt_field, answer_field):
        if f not in cols:
            raise ValueError(f"data.name {name!r}: no field {f!r} (fields: {cols}); set data.prompt_field / data.answer_field")
    return [Example(prompt=row[prompt_field], answer=_gsm8k_answer(str(row[answer_field]))) for row in ds]


def eval_split_seed(data, seed: int) -> int:
    """The seed of the eval split of a generated task: data.eval_seed when set (>= 0: the same held-out problems for
    every run seed, so every cell of an experiment and a warm-up from its own seed hold out the same ones), else the
    run's seed + 10007."""
    return data.eval_seed if data.eval_seed >= 0 else seed + 10_007


def load_splits(data, seed: int) -> tuple[list[Example], list[Example]]:
    """(train, eval) examples of a DataConfig. Cheap for built-in tasks; raises ValueError on bad input."""
    task, eval_seed = data.task, eval_split_seed(data, seed)
    if task in ("add", "equiv"):  # eval problems are held out: no train problem has their (a, b)
        check_operand_range(data.min_operand, data.max_operand)
        if data.operands != 2:
            raise ValueError(f'data.operands={data.operands} applies to data.task = "sum"; "{task}" adds two numbers, so leave it at 2')
        pairs = held_out_pairs(data.eval_size, data.max_operand, eval_seed, data.min_operand)
        evals = [add_example(a, b) for a, b in pairs]
        train = make_add_examples(data.train_size, data.max_operand, seed, exclude=set(pairs), min_operand=data.min_operand)
        return train, evals
    if task in ("sum", "sum_template"):  # the same: no train problem has an eval problem's operand tuple
        check_operand_range(data.min_operand, data.max_operand)
        make = sum_example if task == "sum" else sum_template_example
        held = held_out_tuples(data.eval_size, data.operands, data.min_operand, data.max_operand, eval_seed)
        train = make_sum_examples(data.train_size, data.operands, data.min_operand, data.max_operand, seed, exclude=set(held), example=make)
        return train, [make(t) for t in held]
    if task == "jsonl":
        train = load_jsonl(data.path)
        if data.eval_path:
            return train, load_jsonl(data.eval_path, "data.eval_path")
        if len(train) <= data.eval_size:
            raise ValueError(
                f"data.path {data.path!r} has {len(train)} examples, not more than data.eval_size={data.eval_size}; "
                "lower data.eval_size or give data.eval_path"
            )
        return train[data.eval_size :], train[: data.eval_size]
    if task == "reasoning_gym":
        train = load_reasoning_gym(data.name, data.train_size, seed)
        evals = load_reasoning_gym(data.name, data.eval_size, eval_seed)
        return train, evals
    if task == "hf":
        train = load_hf(data.name, data.subset, data.split, data.prompt_field, data.answer_field)
        evals = load_hf(data.name, data.subset, data.eval_split, data.prompt_field, data.answer_field)
        return train, evals[: data.eval_size]
    raise ValueError(f"data.task {task!r} unknown")


class PromptSampler:
    """Seeded, resumable order over the train split: state is (epoch, position) only.

    Each epoch is a permutation drawn from ``random.Random(seed * 1_000_003 + epoch)``, so a
    resumed run that restores (epoch, position) draws exactly the same prompts.
    """

    def __init__(self, n: int, seed: int, shuffle: bool = True):
        self.n, self.seed, self.shuffle = n, seed, shuffle
        self.epoch, self.position = 0, 0
        self._order = self._permutation(0)

    def _permutation(self, epoch: int) -> list[int]:
        order = list(range(self.n))
        if self.shuffle:
            random.Random(self.seed * 1_000_003 + epoch).shuffle(order)
        return order

    def take(self, k: int) -> list[int]:
        out = []
        while len(out) < k:
            if self.position >= self.n:
                self.epoch, self.position = self.epoch + 1, 0
                self._order = self._permutation(self.epoch)
            out.append(self._order[self.position])
            self.position += 1
        return out

    def state_dict(self) -> dict:
        return {"epoch": self.epoch, "position": self.position}

    def load_state_dict(self, state: dict) -> None:
        self.epoch, self.position = int(state["epoch"]), int(state["position"])
        self._order = self._permutation(self.epoch)


def duplicate_prompts(train: list[Example], evals: list[Example]) -> list[str]:
    """Prompts that appear in both splits (an eval on them measures memorisation, not generalisation)."""
    seen = {ex.prompt for ex in train}
    return sorted({ex.prompt for ex in evals if ex.prompt in seen})
