"""Reward functions: correctness (exact, math-verify, equiv, reasoning-gym, user) + format.

A reward function has the signature ``fn(prompt: str, completion: str, example) -> float``.
``RewardComputer`` calls it in a worker thread with a timeout: a call that raises, times out
or returns a non-finite value gives reward 0 for that completion and is counted
(``reward/errors``, ``reward/timeouts``), so a broken reward never stops training silently
and never poisons a batch with NaN.

Departures / choices:
1. math-verify runs with its signal-based timeouts off (``parsing_timeout=None``,
   ``timeout_seconds=None``): signals do not work in threads; the thread timeout replaces them.
2. A timed-out call cannot be killed (Python threads); its worker is abandoned and a fresh
   pool takes over, so later calls are not queued behind it.
"""

from __future__ import annotations

import concurrent.futures as cf
import importlib
import math
import re
from typing import Callable

from dfpo.trainer.llm.tasks import Example, sum_value

RewardFn = Callable[[str, str, Example], float]


def exact_match(prompt: str, completion: str, example: Example) -> float:
    """1 when the stripped completion equals the stripped answer."""
    return float(completion.strip() == example.answer.strip())


def equiv_match(prompt: str, completion: str, example: Example) -> float:
    """1 when the completion is a sum n(+m...) of integers whose value is the answer."""
    value = sum_value(completion)
    return float(value is not None and str(value) == example.answer.strip())


def _gold_text(answer: str) -> str:
    return answer if ("$" in answer or "\\boxed" in answer) else f"${answer}$"


def math_verify_match(prompt: str, completion: str, example: Example) -> float:
    """math-verify equivalence of the completion's final (boxed when present) answer and the gold.

    The gold is parsed first (math-verify's ``verify(gold, answer)`` is not symmetric).
    """
    from math_verify import parse, verify

    gold = parse(_gold_text(example.answer), parsing_timeout=None)
    boxed = _last_boxed(completion)
    pred = parse(f"$\\boxed{{{boxed}}}$" if boxed is not None else completion, parsing_timeout=None)
    return float(bool(gold) and bool(pred) and verify(gold, pred, timeout_seconds=None))


def _last_boxed(text: str) -> str | None:
    """Content of the last \\boxed{...} (balanced braces), or None."""
    start = text.rfind("\\boxed{")
    if start < 0:
        return None
    i, depth = start + len("\\boxed{"), 1
    for j in range(i, len(text)):
        if text[j] == "{":
            depth += 1
        elif text[j] == "}":
            depth -= 1
            if depth == 0:
                return text[i:j]
    return None


def reasoning_gym_match(prompt: str, completion: str, example: Example) -> float:
    """reasoning-gym's own scorer for the generator that made the example."""
    import reasoning_gym

    entry = example.meta["entry"]
    answer = _last_boxed(completion)
    answer = completion.strip() if answer is None else answer.strip()
    return float(reasoning_gym.get_score_answer_fn(example.meta["rg_name"])(answer, entry))


def import_callable(spec: str) -> RewardFn:
    """'module:function' -> the function; ValueError naming what is wrong."""
    module_name, _, attr = spec.partition(":")
    if not module_name or not attr:
        raise ValueError(f"reward.user_fn must look like 'module:function', got {spec!r}")
    try:
        module = importlib.import_module(module_name)
    except ImportError as err:
        raise ValueError(f"reward.user_fn {spec!r}: cannot import module {module_name!r} ({err})") from None
    fn = getattr(module, attr, None)
    if not callable(fn):
        raise ValueError(f"reward.user_fn {spec!r}: module {module_name!r} has no callable {attr!r}")

    def user(prompt: str, completion: str, example: Example) -> float:
        return fn(prompt=prompt, completion=completion, answer=example.answer)

    return user


def correctness_fn(kind: str, task: str, user_fn: str = "") -> RewardFn:
    """The correctness reward of a RewardConfig.kind ('auto' picks by task)."""
    if kind == "auto":
        kind = {"add": "exact", "equiv": "equiv", "reasoning_gym": "reasoning_gym"}.get(task, "math_verify")
    if kind == "exact":
        return exact_match
    if kind == "equiv":
        return equiv_match
    if kind == "math_verify":
        return math_verify_match
    if kind == "reasoning_gym":
        if task != "reasoning_gym":
            raise ValueError('reward.kind = "reasoning_gym" needs data.task = "reasoning_gym"')
        return reasoning_gym_match
    if kind == "user":
        return import_callable(user_fn)
    raise ValueError(f"reward.kind {kind!r} unknown")


class RewardComputer:
    """Correctness + format_weight * format, with per-call timeout and error counting."""

    def __init__(self, correctness: RewardFn, *, format_weight: float = 0.0, format_regex: str = "", timeout_s: float = 5.0):
        self.correctness = correctness
        self.format_weight = format_weight
        try:
            self.format_re = re.compile(format_regex) if format_weight else None
        except re.error as err:
            raise ValueError(f"reward.format_regex {format_regex!r} is not a valid regex: {err}") from None
        self.timeout_s = timeout_s
        self._pool = cf.ThreadPoolExecutor(max_workers=4, thread_name_prefix="reward")

    def _safe(self, prompt: str, completion: str, example: Example) -> tuple[float, str]:
        """(value, status) with status in ok | error | timeout."""
        future = self._pool.submit(self.correctness, prompt, completion, example)
        try:
            value = float(future.result(timeout=self.timeout_s))
        except cf.TimeoutError:
            self._pool.shutdown(wait=False, cancel_futures=True)
            self._pool = cf.ThreadPoolExecutor(max_workers=4, thread_name_prefix="reward")
            return 0.0, "timeout"
        except Exception:  # a broken user reward counts as 0, never crashes the run
            return 0.0, "error"
        if not math.isfinite(value):
            return 0.0, "error"
        return value, "ok"

    def __call__(self, prompts: list[str], completions: list[str], examples: list[Example]) -> dict:
        """Rewards of a batch: dict with lists 'total', 'correct', 'format' and counts 'errors', 'timeouts'."""
        correct, fmt, errors, timeouts = [], [], 0, 0
        for p, c, e in zip(prompts, completions, examples):
            value, status = self._safe(p, c, e)
            errors += status == "error"
            timeouts += status == "timeout"
            correct.append(value)
            fmt.append(float(bool(self.format_re.search(c))) if self.format_re is not None else 0.0)
        total = [c + self.format_weight * f for c, f in zip(correct, fmt)]
        return {"total": total, "correct": correct, "format": fmt, "errors": errors, "timeouts": timeouts}
