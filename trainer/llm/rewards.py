"""Reward functions: correctness (exact, math-verify, equiv, reasoning-gym, user) + format.

A reward function has the signature ``fn(prompt: str, completion: str, example) -> float``.
``RewardComputer`` calls it for a whole batch at once, in up to ``max_workers`` daemon threads,
and waits at most ``timeout_s`` per round of ``max_workers`` calls. A call that raises (``sys.exit``
included), does not return in time, or returns something that is not a finite number within
+-1e6 gives reward 0 for that completion and is counted (``reward/errors``, ``reward/timeouts``,
``reward/invalid``): a broken reward never stops or hangs training, and never poisons a batch
with NaN. When more than half of a batch's calls fail, a warning with the first failure of each
kind is printed, with or without --quiet.

Departures / choices:
1. math-verify runs with its signal-based timeouts off (``parsing_timeout=None``,
   ``timeout_seconds=None``): signals do not work in threads; the thread timeout replaces them.
2. Threads, not processes: a reward function sees the process's imports and objects and costs
   no pickling. A call that never returns cannot be killed; its daemon thread is left behind
   (it cannot keep the process alive at exit), and the batch goes on without it. A function that
   hangs costs one timeout per batch (of up to ``max_workers`` completions), not one per completion.
"""

from __future__ import annotations

import importlib
import math
import queue
import re
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass

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


MAX_ABS_REWARD = 1e6
"""A reward outside +-MAX_ABS_REWARD (e.g. 1e308) is treated as invalid: it would swamp the group's advantages."""


def as_reward(raw: object) -> float | None:
    """A reward function's return value as a float, or None when it is not a finite number within bounds."""
    if isinstance(raw, (str, bytes)) or not hasattr(raw, "__float__"):
        return None
    try:
        value = float(raw)
    except (TypeError, ValueError):
        return None
    return value if math.isfinite(value) and abs(value) <= MAX_ABS_REWARD else None


@dataclass(frozen=True)
class RewardBatch:
    """Rewards of a batch of completions: ``total = correct + format_weight * format`` per completion."""

    total: list[float]
    correct: list[float]
    format: list[float]
    errors: int = 0
    """Calls of the reward function that raised (scored 0)."""
    timeouts: int = 0
    """Calls that ran past reward.timeout_s (scored 0)."""
    invalid: int = 0
    """Calls that returned something other than a finite number (scored 0)."""


class RewardComputer:
    """Correctness + format_weight * format; a batch's calls run concurrently with a time limit."""

    def __init__(
        self, correctness: RewardFn, *, format_weight: float = 0.0, format_regex: str = "", timeout_s: float = 5.0, max_workers: int = 64
    ):
        self.correctness = correctness
        self.format_weight = format_weight
        try:
            self.format_re = re.compile(format_regex) if format_weight else None
        except re.error as err:
            raise ValueError(f"reward.format_regex {format_regex!r} is not a valid regex: {err}") from None
        self.timeout_s = timeout_s
        self.max_workers = max_workers
        self._warned: set[str] = set()

    def _call_all(self, prompts: list[str], completions: list[str], examples: list[Example]) -> list[tuple[float, str, str]]:
        """(value, status, detail) per completion, status in ok | error | timeout | invalid."""
        n = len(prompts)
        results: list[tuple[object, BaseException | None] | None] = [None] * n
        todo: queue.SimpleQueue[int] = queue.SimpleQueue()
        for i in range(n):
            todo.put(i)

        def work() -> None:
            while True:
                try:
                    i = todo.get_nowait()
                except queue.Empty:
                    return
                try:
                    results[i] = (self.correctness(prompts[i], completions[i], examples[i]), None)
                except BaseException as err:  # noqa: BLE001 - sys.exit or KeyboardInterrupt from user code must not end the run
                    results[i] = (None, err)

        workers = [threading.Thread(target=work, daemon=True, name="dfpo-reward") for _ in range(min(self.max_workers, n))]
        for t in workers:
            t.start()
        deadline = time.monotonic() + self.timeout_s * math.ceil(n / max(1, len(workers)))
        for t in workers:
            t.join(max(0.0, deadline - time.monotonic()))
        out = []
        for r in list(results):
            if r is None:
                out.append((0.0, "timeout", f"no result within reward.timeout_s={self.timeout_s:g}"))
            elif r[1] is not None:
                out.append((0.0, "error", f"{type(r[1]).__name__}: {r[1]}"))
            else:
                value = as_reward(r[0])
                out.append(
                    (value, "ok", "")
                    if value is not None
                    else (0.0, "invalid", f"returned {r[0]!r:.80} (not a finite number within +-{MAX_ABS_REWARD:g})")
                )
        return out

    def _warn(self, results: list[tuple[float, str, str]]) -> None:
        """More than half the calls failed: the first failure of each kind, once per kind per run, on stderr."""
        failed = [(status, detail) for _, status, detail in results if status != "ok"]
        if 2 * len(failed) <= len(results):
            return
        for status, detail in failed:
            kind = detail.split(":")[0] if status == "error" else status
            if kind not in self._warned:
                self._warned.add(kind)
                print(
                    f"dfpo: warning: {len(failed)} of {len(results)} reward calls failed this step; first {status}: {detail}",
                    file=sys.stderr,
                    flush=True,
                )

    def __call__(self, prompts: list[str], completions: list[str], examples: list[Example]) -> RewardBatch:
        """The rewards of a batch of completions, one entry per completion, with the failure counts."""
        results = self._call_all(prompts, completions, examples)
        self._warn(results)
        correct = [value for value, _, _ in results]
        fmt = [float(bool(self.format_re.search(c))) if self.format_re is not None else 0.0 for c in completions]
        total = [c + self.format_weight * f for c, f in zip(correct, fmt)]
        counts = {k: sum(status == k for _, status, _ in results) for k in ("error", "timeout", "invalid")}
        return RewardBatch(total, correct, fmt, errors=counts["error"], timeouts=counts["timeout"], invalid=counts["invalid"])
