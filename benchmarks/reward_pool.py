"""Seconds per batch of 64 completions for each reward kind, in this process and in the worker pool.

    python benchmarks/reward_pool.py [--batches 5] [--workers 0]

Prints the pool's start-up (constructor until the first worker is ready, and until all are), then the median
milliseconds per batch of 64 over --batches batches, for: exact and equiv (in-process, as RewardComputer runs them,
and through the pool), math-verify (in-process and through the pool), and a trivial user reward (pool: the
round-trip cost). Completions are realistic: half correct, boxed answers for math-verify.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests" / "trainer"))  # reward_fixtures, for the user kind

from dfpo.trainer.rewards.compute import LOCAL_FUNCTIONS, RewardComputer, RewardSpec, math_verify_match  # noqa: E402
from dfpo.trainer.rewards.pool import RewardPool, default_workers  # noqa: E402
from dfpo.trainer.tasks import Example  # noqa: E402

N = 64


def batch(kind: str) -> tuple[list[str], list[str], list[Example]]:
    """64 (prompt, completion, example) of a kind, half of them correct."""
    examples = [Example(f"{i}+{i + 1}=", str(2 * i + 1), {"a": i, "b": i + 1}) for i in range(N)]
    if kind == "math_verify":
        completions = [f"We add them: {i} + {i + 1} = \\boxed{{{2 * i + 1 + i % 2}}}" for i in range(N)]
    elif kind == "equiv":
        completions = [f"{i + 1}+{i + i % 2}" for i in range(N)]
    else:
        completions = [str(2 * i + 1 + i % 2) for i in range(N)]
    return [e.prompt for e in examples], completions, examples


def median_batch_s(fn, batches: int) -> float:
    times = []
    for _ in range(batches):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def pool_row(kind: str, user_fn: str, workers: int, batches: int) -> str:
    prompts, completions, examples = batch(kind)
    t0 = time.perf_counter()
    pool = RewardPool(kind, user_fn, workers=workers, timeout_s=30.0)
    first = time.perf_counter() - t0
    pool.wait_ready()
    everyone = time.perf_counter() - t0
    tasks = [(p, c, e.answer, None) for p, c, e in zip(prompts, completions, examples)]
    try:
        s = median_batch_s(lambda: pool.run(tasks), batches)
    finally:
        pool.close()
    return f"| {kind} | pool ({pool.size} workers) | {1000 * s:.2f} | first ready {first:.2f} s, all {everyone:.2f} s |"


def local_row(kind: str, fn, batches: int) -> str:
    prompts, completions, examples = batch(kind)
    s = median_batch_s(lambda: [fn(p, c, e) for p, c, e in zip(prompts, completions, examples)], batches)
    return f"| {kind} | this process | {1000 * s:.2f} | - |"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--batches", type=int, default=5)
    parser.add_argument("--workers", type=int, default=0, help=f"0 = min(8, CPU count) = {default_workers()} here")
    args = parser.parse_args()
    print(f"| kind | where | ms per batch of {N} (median of {args.batches}) | start-up |")
    print("|---|---|---|---|")
    for kind in ("exact", "equiv"):
        print(local_row(kind, LOCAL_FUNCTIONS[kind], args.batches), flush=True)
        print(pool_row(kind, "", args.workers, args.batches), flush=True)
    print(local_row("math_verify", math_verify_match, args.batches), flush=True)
    print(pool_row("math_verify", "", args.workers, args.batches), flush=True)
    print(pool_row("user", "reward_fixtures:matches", args.workers, args.batches), flush=True)
    with RewardComputer(RewardSpec("exact")) as rc:  # what training runs for exact: in-process, no workers
        prompts, completions, examples = batch("exact")
        s = median_batch_s(lambda: rc(prompts, completions, examples), args.batches)
        print(f"| exact | RewardComputer | {1000 * s:.2f} | - |")


if __name__ == "__main__":
    main()
