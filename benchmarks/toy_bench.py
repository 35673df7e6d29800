"""Speed of the toy lab: run with ``python benchmarks/toy_bench.py``.

1. The default comparison: 6 objectives x 8 seeds x 300 steps, G = 8, K = 4 on ``tenplusten``
   (target < 60 s on 2 cores), beside a naive per-seed loop (one seed at a time, same code
   path with S = 1) timed on a slice and extrapolated, in the same process.
2. One exact-mode expected-gradient step over ~10^5 enumerated completions (``family`` with
   k = 4, 9 distractors, 10 answers: 10^5 completions; target < 100 ms): population
   advantages, the loss core on the whole enumeration, the closed-form table gradient.
"""

from __future__ import annotations

import argparse
import time

import torch

from dfpo import resolve_objective
from dfpo.toy.cli import toy_threads
from dfpo.toy.policy import gather_tokens, init_params, log_policy, table_gradient
from dfpo.toy.tasks import enumerate_completions, family
from dfpo.toy.train import ToyConfig, loss_coefficients, make_batch, run, validate

OBJECTIVES = ("gspo", "dfpo_min", "dfpo_orth_pos", "grpo", "grpo_fix", "stapo")


def bench_comparison(steps: int, seeds: int, naive_steps: int) -> None:
    config = ToyConfig(objectives=OBJECTIVES, seeds=seeds, steps=steps, group_size=8, inner_steps=4)
    validate(config)
    t0 = time.perf_counter()
    run(config)
    batched = time.perf_counter() - t0
    print(
        f"default comparison, batched seeds: {len(OBJECTIVES)} objectives x {seeds} seeds x {steps} steps (G=8, K=4): {batched:.1f} s (target < 60 s)"
    )
    one = ToyConfig(objectives=OBJECTIVES, seeds=1, steps=naive_steps, group_size=8, inner_steps=4)
    t0 = time.perf_counter()
    run(one)
    per_seed = (time.perf_counter() - t0) * steps / naive_steps
    naive = per_seed * seeds
    print(
        f"naive per-seed loop (S=1 runs, {naive_steps} steps timed, extrapolated to {seeds} seeds x {steps} steps): "
        f"{naive:.1f} s  -> batching speed-up {naive / batched:.1f}x"
    )


def bench_exact_step(repeats: int) -> None:
    task = family(k=4, distractors=9, n_correct=5, n_wrong=5, prompts=1)
    enum = enumerate_completions(task, limit=2 * 10**5)
    config = ToyConfig(task="family", objectives=("dfpo_min",), mode="exact", seeds=1, exact_limit=2 * 10**5)
    theta = init_params(task, 1, noise=0.3, generator=torch.Generator().manual_seed(0))
    logpi_old = log_policy(theta, task.legal)
    theta_new = theta + 0.05 * torch.randn(theta.shape, generator=torch.Generator().manual_seed(1))  # ratios != 1
    for name in ("dfpo_min", "gspo", "grpo", "dfpo_orth", "dfpo_orth_pos"):
        spec = resolve_objective(name)
        times = []
        for _ in range(repeats + 1):
            t0 = time.perf_counter()
            batch = make_batch(task, spec, logpi_old, config, 0, enum, torch.Generator())
            logpi = log_policy(theta_new, task.legal)
            r = batch.roll
            lp = torch.where(r.mask, gather_tokens(logpi, r.rows, r.tokens), torch.zeros(()))
            coef, _ = loss_coefficients(spec, lp, batch.old_logp, batch.adv, r.mask, r.group, batch.entropy, batch.n_groups, task.max_len)
            grad = table_gradient(coef, logpi, r.rows, r.tokens, r.mask)
            assert bool(torch.isfinite(grad).all())
            times.append(time.perf_counter() - t0)
        best = min(times[1:]) * 1e3
        median = sorted(times[1:])[len(times[1:]) // 2] * 1e3
        print(
            f"exact-mode expected-gradient step, {enum.size} completions x {task.max_len} tokens, {name}: best {best:.1f} ms, median {median:.1f} ms (target < 100 ms)"
        )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--steps", type=int, default=300)
    parser.add_argument("--seeds", type=int, default=8)
    parser.add_argument("--naive-steps", type=int, default=60, help="steps of the per-seed loop actually timed")
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument(
        "--threads", type=int, default=None, help="torch intra-op threads for both parts (default: as `dfpo toy` runs each mode)"
    )
    args = parser.parse_args()
    for mode, bench in (
        ("exact", lambda: bench_exact_step(args.repeats)),
        ("sampled", lambda: bench_comparison(args.steps, args.seeds, args.naive_steps)),
    ):
        torch.set_num_threads(args.threads or toy_threads(mode))
        print(f"torch {torch.__version__}, {mode} mode: {torch.get_num_threads()} intra-op thread(s)")
        bench()


if __name__ == "__main__":
    main()
