"""What DFPO's in-group transform costs as G and the batch grow, next to the loss without it and to the
LM-head log-prob pass of the same tokens (a lower bound on any forward pass of a real model).

    python benchmarks/group_transform.py

Per (groups, G), T = 256 tokens a completion: median seconds of loss + backward for gspo (no transform) and
dfpo_orth_pos (the exact positive projection, the most expensive transform), and of the chunked log-probs
(``token_logprobs``, V = 32k, H = 1024) forward + backward for the same B * T positions.
"""

from __future__ import annotations

import statistics
import time

import torch

from dfpo import policy_loss
from dfpo.trainer.logprobs import token_logprobs


def _median(fn, repeats: int = 3) -> float:
    fn()
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def main() -> None:
    torch.set_num_threads(2)
    T, V, H = 256, 32768, 1024
    g = torch.Generator().manual_seed(0)
    print(f"T={T} tokens a completion; log-prob pass: V={V}, H={H}; 2 threads, CPU float32")
    print(
        f"{'groups':>6s} {'G':>4s} {'B':>6s} | {'gspo s':>8s} {'dfpo_orth_pos s':>15s} {'transform share':>15s} | {'log-prob pass s':>15s}"
    )
    w = torch.randn(V, H, generator=g) / H**0.5
    for groups, G in ((8, 4), (8, 16), (8, 64), (64, 8), (256, 8)):
        B = groups * G
        logp = (-1 - torch.rand(B, T, generator=g)).requires_grad_()
        old = logp.detach() + 0.01 * torch.randn(B, T, generator=g)
        kw = dict(
            old_logp=old,
            advantages=torch.randn(B, generator=g),
            mask=torch.ones(B, T, dtype=torch.bool),
            group_ids=torch.arange(groups).repeat_interleave(G),
        )

        def run(name, logp=logp, kw=kw):
            loss, _ = policy_loss(name, logp=logp, **kw, eps_low=0.2, eps_high=0.2)
            loss.backward()

        base, dfpo = _median(lambda: run("gspo")), _median(lambda: run("dfpo_orth_pos"))
        n = min(B * T, 16384)  # the log-prob pass on up to 16k positions, scaled to B * T
        h = torch.randn(n, H, generator=g).requires_grad_()
        y = torch.randint(0, V, (n,), generator=g)
        lp_s = _median(lambda h=h, y=y: token_logprobs(h, w, y, with_entropy=False)[0].sum().backward(), repeats=1) * (B * T / n)
        print(f"{groups:6d} {G:4d} {B:6d} | {base:8.4f} {dfpo:15.4f} {(dfpo - base) / dfpo:15.1%} | {lp_s:15.2f}")


if __name__ == "__main__":
    main()
