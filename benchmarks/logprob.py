"""Time and peak memory of per-token log-probs, forward + backward, side by side in one run.

    python benchmarks/logprob.py                      # V = 32k and 152k, T = 1k and 4k, H = 512
    python benchmarks/logprob.py --vocab 32768 --tokens 2048 8192 --hidden 896

Three ways to get d(sum_t g_t logp_t)/d(hidden, W) for T completion positions:
- floor:   the bare LM-head matmul h @ W^T and its backward (no softmax at all): the least any
           log-prob path can cost;
- naive:   full float32 (T, V) logits, log_softmax, gather, entropy (what a trainer does by default);
- chunked: ``dfpo.core.logprobs.token_logprobs`` (chunks of positions, logits recomputed in backward).
Each measurement runs in a fresh process, so peak memory (ru_maxrss above the inputs) is its own.
Times are the median of ``--repeats`` runs after one warm-up. A case whose naive path would need
more than ``--max-gib`` of logits is skipped and says so.
"""

from __future__ import annotations

import argparse
import json
import resource
import statistics
import subprocess
import sys
import time

import torch

from dfpo.core.logprobs import naive_token_logprobs, token_logprobs

VARIANTS = ("floor", "naive", "chunked")


def _rss_mib() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # Linux: KiB


def measure(variant: str, vocab: int, tokens: int, hidden: int, repeats: int, chunk: int, threads: int) -> dict:
    """One variant in this process: median seconds of forward+backward and peak MiB above the inputs."""
    torch.set_num_threads(threads)
    g = torch.Generator().manual_seed(0)
    h = (torch.randn(tokens, hidden, generator=g) / hidden**0.5).requires_grad_()  # (T, H)
    w = torch.randn(vocab, hidden, generator=g).requires_grad_()  # (V, H)
    targets = torch.randint(0, vocab, (tokens,), generator=g)  # (T,)
    upstream = torch.randn(tokens, generator=g)  # (T,) gradient of the loss w.r.t. logp

    def step():
        if variant == "floor":
            (h @ w.T).backward(torch.ones(tokens, vocab))  # the matmul and its two backward matmuls
        elif variant == "naive":
            logp, ent = naive_token_logprobs(h, w, targets)
            (logp * upstream).sum().backward()
        else:
            logp, ent = token_logprobs(h, w, targets, chunk_size=chunk, with_entropy=False)
            (logp * upstream).sum().backward()
        h.grad = w.grad = None

    base = _rss_mib()
    step()  # warm-up; also the peak of one step
    peak = _rss_mib() - base
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        step()
        times.append(time.perf_counter() - t0)
    return {"seconds": statistics.median(times), "peak_mib": peak}


def run_case(args, variant: str, vocab: int, tokens: int) -> dict:
    cmd = [
        sys.executable,
        __file__,
        "--child",
        variant,
        str(vocab),
        str(tokens),
        str(args.hidden),
        str(args.repeats),
        str(args.chunk),
        str(args.threads),
    ]
    out = subprocess.run(cmd, capture_output=True, text=True, check=True)
    return json.loads(out.stdout.strip().splitlines()[-1])


def main(argv: list[str] | None = None) -> int:
    if argv is None and len(sys.argv) > 1 and sys.argv[1] == "--child":
        v, vocab, tokens, hidden, repeats, chunk, threads = sys.argv[2:9]
        print(json.dumps(measure(v, int(vocab), int(tokens), int(hidden), int(repeats), int(chunk), int(threads))))
        return 0
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--vocab", type=int, nargs="+", default=[32768, 151936])
    p.add_argument("--tokens", type=int, nargs="+", default=[1024, 4096])
    p.add_argument("--hidden", type=int, default=512)
    p.add_argument("--chunk", type=int, default=1024, help="positions per chunk of token_logprobs")
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--max-gib", type=float, default=6.0, help="skip a case whose (T, V) float32 logits exceed this")
    args = p.parse_args(argv)
    print(f"forward+backward of per-token log-probs, H={args.hidden}, chunk={args.chunk}, {args.threads} threads, median of {args.repeats}")
    print(
        f"{'V':>7} {'T':>6} | {'floor s':>8} {'naive s':>8} {'chunk s':>8} {'chunk/floor':>11} | {'floor MiB':>9} {'naive MiB':>9} {'chunk MiB':>9} {'chunk/naive':>11}"
    )
    for vocab in args.vocab:
        for tokens in args.tokens:
            gib = tokens * vocab * 4 / 2**30
            if gib > args.max_gib:
                print(f"{vocab:>7} {tokens:>6} | skipped: (T, V) float32 logits are {gib:.1f} GiB > --max-gib {args.max_gib}")
                continue
            r = {v: run_case(args, v, vocab, tokens) for v in VARIANTS}
            f, n, c = r["floor"], r["naive"], r["chunked"]
            print(
                f"{vocab:>7} {tokens:>6} | {f['seconds']:>8.3f} {n['seconds']:>8.3f} {c['seconds']:>8.3f} {c['seconds'] / f['seconds']:>10.2f}x |"
                f" {f['peak_mib']:>9.0f} {n['peak_mib']:>9.0f} {c['peak_mib']:>9.0f} {c['peak_mib'] / max(n['peak_mib'], 1):>10.2f}x",
                flush=True,
            )
    return 0


if __name__ == "__main__":
    sys.exit(main())
