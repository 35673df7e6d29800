"""What DFPO's in-group transform costs as G and the batch grow, next to the loss without it and to the
LM-head log-prob pass of the same tokens (a lower bound on any forward pass of a real model).

    python benchmarks/group_transform.py

Per (groups, G), T = 256 tokens a completion: median seconds of loss + backward for gspo (no transform) and
dfpo_orth_pos (the exact positive projection, the most expensive transform), and of the chunked log-probs
(``token_logprobs``, V = 32k, H = 1024) forward + backward for the same B * T positions. Memory: the bytes
each loss keeps for its backward pass (autograd's saved tensors, each storage counted once), gspo's and
dfpo_orth_pos's, next to the (B * T, H) float32 hidden states that any log-prob pass keeps for its own.
"""

from __future__ import annotations

import statistics
import time

import torch

from dfpo import policy_loss
from dfpo.core.logprobs import token_logprobs


def _median(fn, repeats: int = 3) -> float:
    fn()
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def saved_mib(fn) -> float:
    """MiB of the tensors autograd saves for backward while ``fn`` builds its graph (each storage once)."""
    seen: dict[int, int] = {}

    def pack(t):
        seen[t.untyped_storage().data_ptr()] = t.untyped_storage().nbytes()
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        out = fn()
    del out
    return sum(seen.values()) / 2**20


def main() -> None:
    torch.set_num_threads(2)
    T, V, H = 256, 32768, 1024
    g = torch.Generator().manual_seed(0)
    print(f"T={T} tokens a completion; log-prob pass: V={V}, H={H}; 2 threads, CPU float32")
    print(
        f"{'groups':>6s} {'G':>4s} {'B':>6s} | {'gspo s':>8s} {'dfpo_orth_pos s':>15s} {'transform share':>15s} | {'log-prob pass s':>15s}"
        f" | {'gspo MiB':>8s} {'dfpo MiB':>8s} {'hidden MiB':>10s}"
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

        def loss_of(name, logp=logp, kw=kw):
            return policy_loss(name, logp=logp, **kw, eps_low=0.2, eps_high=0.2)[0]

        def run(name):
            loss_of(name).backward()

        base, dfpo = _median(lambda: run("gspo")), _median(lambda: run("dfpo_orth_pos"))
        n = min(B * T, 16384)  # the log-prob pass on up to 16k positions, scaled to B * T
        h = torch.randn(n, H, generator=g).requires_grad_()
        y = torch.randint(0, V, (n,), generator=g)
        lp_s = _median(lambda h=h, y=y: token_logprobs(h, w, y, with_entropy=False)[0].sum().backward(), repeats=1) * (B * T / n)
        mem_base, mem_dfpo = saved_mib(lambda: loss_of("gspo")), saved_mib(lambda: loss_of("dfpo_orth_pos"))
        hidden_mib = B * T * H * 4 / 2**20
        print(
            f"{groups:6d} {G:4d} {B:6d} | {base:8.4f} {dfpo:15.4f} {(dfpo - base) / dfpo:15.1%} | {lp_s:15.2f}"
            f" | {mem_base:8.2f} {mem_dfpo:8.2f} {hidden_mib:10.0f}"
        )


if __name__ == "__main__":
    main()
