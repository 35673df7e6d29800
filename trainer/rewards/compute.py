"""Reward functions: correctness (exact, last_int, math-verify, equiv, reasoning-gym, user) + format.

A reward function has the signature ``fn(prompt: str, completion: str, example) -> float``; a user function
(``reward.kind = "user"``) is called as ``fn(prompt=, completion=, answer=) -> float``. ``RewardComputer``
computes a whole batch. Every failure scores 0 and is counted:

- ``reward/errors``: the call raised (``sys.exit`` and ``KeyboardInterrupt`` included, MemoryError at the
  worker's memory cap), its worker process died (``os._exit``, a signal; the warning names the exit code),
  the returned value's ``__float__`` raised, or the worker's result pipe carried a frame that fails the
  pool's checks (``BadWorkerFrame``, counted even when it came with no call);
- ``reward/timeouts``: the call was still running after ``timeout_s``;
- ``reward/invalid``: the value is not a finite number within +-1e6 (``nan``, ``inf``, ``10**400``, ``1e308``,
  a string, a list, None).

A broken reward never stops, hangs or poisons training, and SIGINT/SIGTERM keep working during a batch. When
more than half of a batch's calls fail, a warning naming the reward with the first failure of each kind is
printed (once per kind per run), with or without --quiet; so is a worker replaced for its memory (once per run).
A user reward that cannot be named or imported (``reward.user_fn`` not ``package.module:function`` or
``path/to/file.py:function``, a missing file or one that is not .py, a missing or non-callable function, a module or
file that raises or calls ``sys.exit`` at import) is a ValueError of one sentence naming it, before any batch (the
trainer builds its RewardComputer before any model loads; the first worker must be ready for it to return).

Departures / choices:
1. What runs where. User rewards, math-verify and reasoning-gym run in worker processes that can be killed
   (``pool.RewardPool``: bounded, started with the RewardComputer, reused for every batch). User code
   can do anything; the other two parse the policy's own output with sympy or generator code, which can run
   for minutes (math-verify on ``\\boxed{9^{9^{9^{9}}}}`` had not returned after 50 s). A call still running
   at its deadline has its worker killed, with every process its reward started, and a new worker started.
   exact, last_int and equiv run in this process: a string comparison, a sum of at most 64 characters, 0.01-0.15 ms
   per batch of 64 against 9-21 ms through two workers (a pipe round trip of ~0.15-0.3 ms a call;
   benchmarks/reward_pool.py); last_int's one regex scan of each completion took ~0.9 ms per batch of 64
   completions of 144 characters here (a loaded 2-core machine).
   math-verify costs about the same either way (0.19-0.43 s per batch of 64 here, 0.29-0.33 s through two
   workers on a shared 2-core machine); a built-in worker starts in ~0.2 s (math-verify's in ~1 s: sympy),
   once per run, a user-reward worker in ~0.3 s. The format regex runs here (it is the run's own configuration).
2. A worker rebuilds the reward from its name (a built-in kind, or kind=user's ``'package.module:function'``,
   imported with this process's ``sys.path``, or ``'path/to/file.py:function'``, the file loaded by its path made
   absolute in this process: no PYTHONPATH needed), never from a pickled closure. The value is converted to a float in
   the worker: only numbers and short strings come back.
3. math-verify runs with its own signal-based timeouts off (``parsing_timeout=None``,
   ``timeout_seconds=None``). In a worker the pool's deadlines replace them: its interval timer interrupts
   math-verify as math-verify's own alarm would, and the call counts as a timeout instead of scoring a
   silent 0. In this process (a direct call) signals would work only in the main thread.
4. A reward that hangs on every call costs ceil(n / workers) * timeout_s per batch of n: each call has its
   own deadline (the thread version shared one per round and left the hung threads running forever).
"""

from __future__ import annotations

import logging
import re
import sys
from collections.abc import Callable
from dataclasses import dataclass
from functools import cache
from typing import TYPE_CHECKING

from ...core.settings import finite_number
from ..tasks import Example, last_int_correct, sum_value
from .pool import DEFAULT_MEMORY_LIMIT_MB, RewardPool, check_pool_settings
from .worker import KINDS, MAX_ABS_REWARD, Outcome, as_reward, describe_error, load_user_fn, parse_user_fn, score

if TYPE_CHECKING:
    import torch

__all__ = [
    "MAX_ABS_REWARD",
    "REWARD_FUNCTIONS",
    "RewardBatch",
    "RewardComputer",
    "RewardSpec",
    "as_reward",
    "correctness_fn",
    "function_weights",
    "reward_matrix",
    "reward_spec",
    "reward_weights",
]

RewardFn = Callable[[str, str, Example], float]


def exact_match(prompt: str, completion: str, example: Example) -> float:
    """1 when the stripped completion equals the stripped answer."""
    return float(completion.strip() == example.answer.strip())


def equiv_match(prompt: str, completion: str, example: Example) -> float:
    """1 when the completion is a sum n(+m...) of integers whose value is the answer."""
    value = sum_value(completion)
    return float(value is not None and str(value) == example.answer.strip())


def last_int_match(prompt: str, completion: str, example: Example) -> float:
    """1 when the last number written in the completion is the integer answer (``tasks.last_int_correct``), else 0.

    A restatement of the problem cannot earn it ("To find 10 + 4, we simply add" ends in 4, not 14), unlike
    math-verify, which scored that 1 on the sum task; quotes and words around the answer do not cost it ("The answer
    is "14"." scores 1). "1,014" is 1014 (thousands separators), "-6" after a space or "=" is negative, "10-4" holds 4;
    digits glued to words count ("is14"). An answer that is not one integer raises (counted in reward/errors)."""
    return float(last_int_correct(completion, example.answer))


def _gold_text(answer: str) -> str:
    return answer if ("$" in answer or "\\boxed" in answer) else f"${answer}$"


def math_verify_match(prompt: str, completion: str, example: Example) -> float:
    """math-verify equivalence of the completion's final (boxed when present) answer and the gold.

    The gold is parsed first (math-verify's ``verify(gold, answer)`` is not symmetric).
    """
    from math_verify import parse, verify

    _quiet_math_verify_timeout_notice()
    gold = parse(_gold_text(example.answer), parsing_timeout=None)
    boxed = _last_boxed(completion)
    pred = parse(f"$\\boxed{{{boxed}}}$" if boxed is not None else completion, parsing_timeout=None)
    return float(bool(gold) and bool(pred) and verify(gold, pred, timeout_seconds=None))


@cache
def _quiet_math_verify_timeout_notice() -> None:
    """Drop math-verify's notice that its own timeouts are off (the pool's deadlines replace them), once per worker."""

    class _DropTimeoutNotice(logging.Filter):
        def filter(self, record: logging.LogRecord) -> bool:
            return not record.getMessage().startswith("Timeout is disabled")

    for name in ("math_verify.parser", "math_verify.grader"):
        logging.getLogger(name).addFilter(_DropTimeoutNotice())


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


def warm_up(kind: str) -> None:
    """Import and run once what a built-in kind needs (seconds for math-verify's sympy and reasoning-gym), so
    that a worker pays it while starting, not within its first call's deadline."""
    if kind == "math_verify":
        math_verify_match("", "\\boxed{1}", Example("", "1"))
    elif kind == "reasoning_gym":
        import reasoning_gym  # noqa: F401


def import_callable(spec: str) -> RewardFn:
    """'package.module:function' or 'path/to/file.py:function' -> an in-process reward calling it as fn(prompt=,
    completion=, answer=); ValueError naming what is wrong."""
    fn = load_user_fn(spec)

    def user(prompt: str, completion: str, example: Example) -> float:
        return fn(prompt=prompt, completion=completion, answer=example.answer)

    user.user_fn = spec  # RewardComputer runs it in a worker by this name
    return user


LOCAL_FUNCTIONS: dict[str, RewardFn] = {"exact": exact_match, "last_int": last_int_match, "equiv": equiv_match}
"""Kinds computed in this process (trusted, about a microsecond a call); every other kind runs in worker processes."""


@dataclass(frozen=True)
class RewardSpec:
    """Which correctness reward: a built-in kind by name, or kind 'user' with its 'module:function' or 'file.py:function'.
    A worker process rebuilds the reward from this."""

    kind: str
    user_fn: str = ""


def reward_spec(kind: str, task: str, user_fn: str = "") -> RewardSpec:
    """The RewardSpec of a RewardConfig.kind ('auto' picks by task); ValueError on an unknown kind or a bad pairing."""
    if kind == "auto":
        by_task = {"add": "exact", "equiv": "equiv", "sum": "last_int", "sum_template": "last_int", "reasoning_gym": "reasoning_gym"}
        kind = by_task.get(task, "math_verify")
    if kind not in KINDS:
        raise ValueError(f"reward.kind {kind!r} unknown")
    if kind == "reasoning_gym" and task != "reasoning_gym":
        raise ValueError('reward.kind = "reasoning_gym" needs data.task = "reasoning_gym"')
    if kind == "user":
        parse_user_fn(user_fn)
        return RewardSpec("user", user_fn)
    return RewardSpec(kind)


_BUILTIN_FUNCTIONS: dict[str, RewardFn] = {**LOCAL_FUNCTIONS, "math_verify": math_verify_match, "reasoning_gym": reasoning_gym_match}


def as_spec(correctness: RewardSpec | RewardFn) -> RewardSpec:
    """A RewardSpec, or the RewardSpec of a function ``correctness_fn`` returned (a built-in, or a user function
    by its 'module:function'); ValueError for any other callable: a worker cannot rebuild it."""
    if isinstance(correctness, RewardSpec):
        return correctness
    kind = next((k for k, fn in _BUILTIN_FUNCTIONS.items() if fn is correctness), None)
    if kind is not None:
        return RewardSpec(kind)
    if isinstance(getattr(correctness, "user_fn", None), str):
        return RewardSpec("user", correctness.user_fn)
    raise ValueError(
        f"RewardComputer needs a RewardSpec (see reward_spec) or a function from correctness_fn, got {correctness!r}: "
        "a worker process rebuilds the reward from its name"
    )


def correctness_fn(kind: str, task: str, user_fn: str = "") -> RewardFn:
    """The correctness reward of a RewardConfig.kind as a plain function in this process: no deadline, no
    worker (tests and trusted callers; training goes through RewardComputer)."""
    spec = reward_spec(kind, task, user_fn)
    return import_callable(spec.user_fn) if spec.kind == "user" else _BUILTIN_FUNCTIONS[spec.kind]


@dataclass(frozen=True)
class RewardBatch:
    """Rewards of a batch of completions: ``total = correct + format_weight * format + sum_k weight_k * extra[k]`` per
    completion, every reward function's values kept apart."""

    total: list[float]
    correct: list[float]
    format: list[float]
    errors: int = 0
    """Calls that raised, whose worker died, or whose value's __float__ raised (scored 0)."""
    timeouts: int = 0
    """Calls still running after reward.timeout_s (scored 0; a worker still running at the deadline is killed)."""
    invalid: int = 0
    """Calls that returned something other than a finite number within +-1e6 (scored 0)."""
    extra: tuple[list[float], ...] = ()
    """The values of each of ``reward.functions`` (one list per function, one value per completion)."""


REWARD_FUNCTIONS = ("correct", "format")
"""The reward functions every completion is scored by, in ``reward_matrix``'s first columns: the correctness reward
(``reward.kind``) and the format reward (``reward.format_regex``, weighted by ``reward.format_weight``); the columns of
``reward.functions`` follow, in their order."""


def reward_matrix(rewards: RewardBatch) -> torch.Tensor:
    """Each reward function's value per completion, (B, K) float32: correctness, format, then each of
    ``reward.functions``; what a multi-reward advantage (GDPO) normalises column by column."""
    import torch  # here, not at the top: a built-in reward's worker process imports this module and needs no torch

    return torch.tensor([rewards.correct, rewards.format, *rewards.extra], dtype=torch.float32).T.contiguous()  # (B, K)


def reward_weights(format_weight: float, extra_weights: tuple[float, ...] | list[float] = ()) -> torch.Tensor:
    """The weight of each ``reward_matrix`` column (K,): 1 for correctness, ``reward.format_weight`` for the format
    reward, then ``reward.weights``, so that ``reward_matrix(r) @ reward_weights(...)`` is the total reward (TRL's
    ``reward_weights``)."""
    import torch

    return torch.tensor([1.0, format_weight, *extra_weights], dtype=torch.float32)


def function_weights(functions: list[str] | tuple[str, ...], weights: list[float] | tuple[float, ...]) -> tuple[float, ...]:
    """Each of ``reward.functions``' weight in the total: ``reward.weights``, or 1 each when it is empty; ValueError of one
    sentence when the two lists differ in length or a weight is not a finite number."""
    if not weights:
        return (1.0,) * len(functions)
    if len(weights) != len(functions) or not all(finite_number(w) for w in weights):
        raise ValueError(
            f"reward.weights must be {len(functions)} finite numbers, one per reward.functions entry (or empty: 1 each), got {weights!r}"
        )
    return tuple(float(w) for w in weights)


def _local_outcome(fn: RewardFn, prompt: str, completion: str, example: Example) -> Outcome:
    try:
        return score(fn(prompt, completion, example))
    except Exception as err:  # noqa: BLE001 - a built-in that raises scores 0 like any reward
        return 0.0, "error", describe_error(err)


class RewardComputer:
    """Correctness + format_weight * format of a batch. Kinds other than exact, last_int and equiv run in up to
    ``workers`` worker processes (0 = min(8, CPU count)), each call with a deadline of ``timeout_s``; a worker
    is replaced after ``max_tasks_per_worker`` calls (0 = never) and its memory is capped at ``memory_limit_mb``
    (0 = no cap; see ``worker``). ``close()`` (or leaving a ``with`` block) kills the workers and what
    their rewards started; interpreter exit does too."""

    def __init__(
        self,
        correctness: RewardSpec | RewardFn,
        *,
        format_weight: float = 0.0,
        format_regex: str = "",
        timeout_s: float = 5.0,
        workers: int = 0,
        max_tasks_per_worker: int = 0,
        memory_limit_mb: int = DEFAULT_MEMORY_LIMIT_MB,
        functions: tuple[str, ...] | list[str] = (),
        weights: tuple[float, ...] | list[float] = (),
    ):
        self.function_weights = function_weights(functions, weights)
        for fn in functions:
            try:
                parse_user_fn(fn)
            except ValueError as err:  # the sentence names reward.user_fn, the setting of kind=user
                raise ValueError(str(err).replace("reward.user_fn", "reward.functions entry", 1)) from None
        correctness = as_spec(correctness)
        check_pool_settings(timeout_s, workers, max_tasks_per_worker, memory_limit_mb)
        self.spec = correctness
        self.format_weight = format_weight
        try:
            self.format_re = re.compile(format_regex) if format_weight else None
        except re.error as err:
            raise ValueError(f"reward.format_regex {format_regex!r} is not a valid regex: {err}") from None
        self.timeout_s = timeout_s
        self._warned: set[str] = set()
        self._local = LOCAL_FUNCTIONS.get(correctness.kind)
        self.name = correctness.user_fn if correctness.kind == "user" else correctness.kind
        self._pool = None
        if self._local is None:
            limits = {"max_tasks_per_worker": max_tasks_per_worker, "memory_limit_mb": memory_limit_mb}
            self._pool = RewardPool(correctness.kind, correctness.user_fn, workers=workers, timeout_s=timeout_s, **limits)
        pool_settings = {"timeout_s": timeout_s, "workers": workers, "max_tasks_per_worker": max_tasks_per_worker}
        self._extra: list[RewardComputer] = []
        """One computer per ``reward.functions`` entry, each with its own worker processes (a user reward's)."""
        for fn in functions:
            try:
                self._extra.append(RewardComputer(RewardSpec("user", fn), memory_limit_mb=memory_limit_mb, **pool_settings))
            except ValueError as err:  # the pool's sentence names reward.user_fn, the setting of kind=user
                self.close()
                raise ValueError(str(err).replace("reward.user_fn", "reward.functions entry", 1)) from None

    def __enter__(self) -> RewardComputer:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def close(self) -> None:
        """Kill the worker processes, if any (and what their rewards started); idempotent."""
        if self._pool is not None:
            self._pool.close()
        for computer in self._extra:
            computer.close()

    def wait_ready(self) -> None:
        """Wait until every worker is ready (the constructor waits for the first only); for timings and tests."""
        if self._pool is not None:
            self._pool.wait_ready()
        for computer in self._extra:
            computer.wait_ready()

    def worker_pids(self) -> list[int]:
        """Process ids of the live workers ([] for the in-process kinds)."""
        return ([] if self._pool is None else self._pool.pids()) + [pid for c in self._extra for pid in c.worker_pids()]

    def _call_all(self, prompts: list[str], completions: list[str], examples: list[Example]) -> tuple[list[Outcome], list[str]]:
        """(value, status, detail) per completion, status in ok | error | timeout | invalid; and the errors that
        came with no call (a worker's bad frame while it was idle)."""
        if self._pool is None:
            return [_local_outcome(self._local, p, c, ex) for p, c, ex in zip(prompts, completions, examples)], []
        with_meta = self.spec.kind == "reasoning_gym"  # the only kind that reads more than the answer
        tasks = [(p, c, ex.answer, ex.meta if with_meta else None) for p, c, ex in zip(prompts, completions, examples)]
        results = self._pool.run(tasks)
        for notice in self._pool.take_notices():
            print(f"dfpo: warning: {notice}; said once per run", file=sys.stderr, flush=True)
        return results, self._pool.take_stray_errors()

    def _warn(self, results: list[Outcome]) -> None:
        """More than half the calls failed: the first failure of each kind, once per kind per run, on stderr."""
        failed = [(status, detail) for _, status, detail in results if status != "ok"]
        if 2 * len(failed) <= len(results):
            return
        for status, detail in failed:
            kind = detail.split(":")[0] if status == "error" else status
            if kind not in self._warned:
                self._warned.add(kind)
                print(
                    f"dfpo: warning: {len(failed)} of {len(results)} reward calls failed this step ({self.name}); first {status}: {detail}",
                    file=sys.stderr,
                    flush=True,
                )

    def __call__(self, prompts: list[str], completions: list[str], examples: list[Example]) -> RewardBatch:
        """The rewards of a batch of completions, one entry per completion, with the failure counts."""
        if not len(prompts) == len(completions) == len(examples):
            raise ValueError(
                f"{len(prompts)} prompts, {len(completions)} completions and {len(examples)} examples: one of each per completion"
            )
        results, stray_errors = self._call_all(prompts, completions, examples)
        self._warn(results + [(0.0, "error", detail) for detail in stray_errors])
        correct = [value for value, _, _ in results]
        fmt = [float(bool(self.format_re.search(c))) if self.format_re is not None else 0.0 for c in completions]
        total = [c + self.format_weight * f for c, f in zip(correct, fmt)]
        counts = {k: sum(status == k for _, status, _ in results) for k in ("error", "timeout", "invalid")}
        counts["error"] += len(stray_errors)
        extra = []
        for computer, weight in zip(self._extra, self.function_weights):  # each further function, its failures counted too
            part = computer(prompts, completions, examples)
            extra.append(part.correct)
            total = [t + weight * v for t, v in zip(total, part.correct)]
            counts["error"], counts["timeout"], counts["invalid"] = (
                counts["error"] + part.errors,
                counts["timeout"] + part.timeouts,
                counts["invalid"] + part.invalid,
            )
        return RewardBatch(
            total, correct, fmt, errors=counts["error"], timeouts=counts["timeout"], invalid=counts["invalid"], extra=tuple(extra)
        )
