"""The LM head plus a policy loss, forward + backward: time against the matmul floor and extra memory, side by side.

    python benchmarks/fused_head.py                               # B x T in {16 x 128, 8 x 2048}, V in {32k, 152k}, H = 512
    python benchmarks/fused_head.py --sizes 16x128 --vocab 32768 --rounds 3
    python benchmarks/fused_head.py --sizes 8x2048 --vocab 151936 --rounds 1 --modes floor fused fused_compiled liger_compiled
    python benchmarks/fused_head.py --device cuda --dtype bfloat16 --repeats 10   # on a GPU: every case in this process

Modes, each measurement in a fresh process on one thread; each round runs every mode once, in an order rotated from
round to round (interleaved), and a figure is the median over rounds; ``rounds x floor`` is the range of each round's
time over the floor's in the same round, and a time goal is read off a distribution-free 95% interval for the median
of those ratios (``median_interval``: below nine rounds, every round's range): met or missed where the interval is on
one side of the goal, inconclusive where it straddles it (this shared machine moves a whole step by several per cent
between rounds). ``--seed`` picks the input set, so that a reading can be repeated on a second, disjoint one. Times
are the process's CPU seconds (one thread: the work done, which other load on a shared machine changes least), wall
seconds beside them:
- floor:          the three LM-head matmuls alone, in chunks of 1024 positions into reused buffers: z = h W^T, then
                  z W and z^T h (no softmax, no loss). The least any exact method can take; every ratio is against it;
- floor_softmax:  the floor with PyTorch's in-place softmax over each block between its forward matmul and the
                  backward ones: the least any path built on that kernel can take where it writes the logits to
                  memory (its goal line, "reach", says whether the time goal is within reach of such a path here);
- floor_autograd: (h @ W.T).backward(ones) on the full (N, V) logits: the same three matmuls as autograd runs them
                  (the floor the issue quotes), where its (N, V) tensors fit the RAM (below);
- naive:          full float32 logits, log_softmax, gather, policy_loss (where its (N, V) tensors fit the RAM);
- chunked:        dfpo.token_logprobs, then policy_loss (each chunk's logits recomputed in the backward: four matmuls);
- fused:          dfpo.fused_policy_loss with its eager kernels; fused_compiled: compile=True (torch.compile, which
                  fused_policy_loss uses only for objectives that read entropies: for grpo, gspo and dfpo_min the
                  compiled rows run the eager kernels, see dfpo.core.fused);
- fused_once, fused_per_unit: dfpo.fused_policy_loss with solve_once=True (the coefficients solved once for the
                  batch, four matmuls per block: the GPU's default) and False (a solve per chunk of units: the CPU's);
- liger:          Liger-Kernel's LigerFusedLinearGRPOLoss, eager (compiled=False) and compiled (compiled=True): grpo as
                  loss_type='grpo', gspo as importance_sampling_level='sequence' at GSPO's clip range; it has no DFPO.
                  Skipped, saying so, when liger-kernel is not installed (pip install liger-kernel).
The objective rows: grpo, gspo and dfpo_min; naive and chunked run grpo only (their loss is a small part of their time).
``--modes`` and ``--objectives`` pick a subset (the larger sizes take minutes per mode on one thread).
The two full-logits modes are skipped, printing the GiB they would need, where ``FULL_LOGITS_TENSORS`` (N, V)
float32 tensors exceed ``--max-gib`` (default: the machine's available memory, MemAvailable, when the run starts).
On a GPU (``--device cuda``) every case runs in this one process, one after another in the same rotated order: a
figure is the median wall time of ``--repeats`` steps, each ended by ``torch.cuda.synchronize``, after two warm-up
steps (which compile, where a mode compiles), and extra memory is CUDA's peak allocated bytes during the timed steps
minus those allocated once the inputs exist (exact per process, so no process of its own is needed); the full-logits
modes are skipped where they would not fit the GPU's free memory. ``--dtype bfloat16`` makes h and W bfloat16, as in a
bf16 model's head: the matmuls run in bfloat16, and the fused and Liger modes compute their loss in float32.

Inputs: hidden states h ~ N(0, 1/H), W ~ N(0, 1) (logits ~ N(0, 1)), every position real, groups of G = 8 rows,
group-normalised advantages, old log-probs at the policy's typical log-prob plus noise (some ratios clipped).

Extra memory: the largest resident set (sampled every 2 ms during the timed steps, so a compiler's own peak during
the warm-up is not counted) minus the resident set once the inputs exist and the libraries are imported: every
mode imports the same ones first (``_import_libraries``: torch's compiler, liger-kernel when installed), so a
figure is what a step holds, not code loaded (importing torch._inductor alone is about 190 MiB of resident set;
it used to land in fused_compiled's figure, loaded at its first call, and not in Liger's, which liger-kernel's own
import had loaded before the baseline). Every mode makes W's gradient (V x H x 4 bytes), so that is in every figure.
Two shares of real tokens are printed for the fused rows: ``two_pass`` (``fused/two_pass``), 1 where the objective's
coupled unit did not fit the logits budget (max_logits_mib, default 2048; ``--max-logits-mib``) and the head ran twice
over it; ``scaled`` (``fused/row_scaled``), 1 where GSPO's completions, longer than a block, ran block by block and were
scaled once (a DFPO group over the budget: the share of its completions that the budget holds a (V, H) buffer for).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import signal
import statistics
import subprocess
import sys
import threading
import time
from collections.abc import Sequence

G = 8
CHUNK = 1024
BUDGET_MIB = 2048.0
"""fused_policy_loss's default ``max_logits_mib``, the fused modes' budget unless ``--max-logits-mib`` says otherwise."""
FULL_LOGITS_TENSORS = {"floor_autograd": 2, "naive": 4}
"""(N, V) float32 tensors the full-logits modes hold at once (measured at 16 x 128, V = 32k: floor_autograd the
logits and the ones it backpropagates, 1 + 1; naive about 4 times the logits' size above its inputs)."""
OBJECTIVE_ROWS = {
    "floor": [None],
    "floor_softmax": [None],
    "floor_autograd": [None],
    "naive": ["grpo"],
    "chunked": ["grpo"],
    "fused": ["grpo", "gspo", "dfpo_min"],
    "fused_compiled": ["grpo", "gspo", "dfpo_min"],
    "fused_once": ["grpo", "gspo", "dfpo_min"],
    "fused_per_unit": ["grpo", "gspo", "dfpo_min"],
    "liger": ["grpo"],
    "liger_compiled": ["grpo", "gspo"],
}
SOLVE_ONCE = {"fused_once": True, "fused_per_unit": False}
"""The fused modes that set ``solve_once`` (the others leave it to the device: once on a GPU, per unit on the CPU);
not run unless ``--modes`` names them."""


def _rss_mib() -> float:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 2**20


class _PeakRss:
    """The largest resident set while running, sampled every 2 ms by a thread (torch releases the GIL in its ops)."""

    def __enter__(self):
        self.peak, self._stop = _rss_mib(), threading.Event()
        self._thread = threading.Thread(target=self._watch, daemon=True)
        self._thread.start()
        return self

    def _watch(self):
        while not self._stop.wait(0.002):
            self.peak = max(self.peak, _rss_mib())

    def __exit__(self, *exc):
        self._stop.set()
        self._thread.join()
        self.peak = max(self.peak, _rss_mib())


def _import_libraries() -> None:
    """Import what any mode may load, the same in every mode, before the memory baseline: torch's compiler (which
    torch.compile loads at its first call) and liger-kernel when installed."""
    import torch._dynamo  # noqa: F401
    import torch._inductor.compile_fx  # noqa: F401

    try:
        import liger_kernel.chunked_loss  # noqa: F401
    except ImportError:
        pass


def _step_fn(mode: str, objective: str | None, B: int, T: int, H: int, V: int, chunk: int = CHUNK, budget_mib: float = BUDGET_MIB, device: str = "cpu", dtype: str = "float32", seed: int = 0, fused_module=None):  # fmt: skip
    """The inputs and a function running one forward + backward of ``mode`` on them; ``chunk``: the positions per
    logits block of the chunked and fused modes (the floor keeps ``CHUNK``, the fastest on this machine);
    ``budget_mib``: the fused modes' ``max_logits_mib``; ``device`` and ``dtype``: where h and W live and their
    dtype (the same random numbers on every device, drawn on the CPU); ``seed``: the input set (``--seed``);
    ``fused_module``: the module whose ``fused_policy_loss`` the fused modes time (default ``dfpo.core.fused``;
    fused_head_split.py ``--before`` passes an earlier revision's)."""
    import torch

    from dfpo.core import fused
    from dfpo.core.logprobs import naive_token_logprobs, token_logprobs
    from dfpo.core.loss import policy_loss, resolve_objective

    fused_policy_loss = (fused_module or fused).fused_policy_loss

    g, on, real = torch.Generator().manual_seed(seed), torch.device(device), getattr(torch, dtype)
    h = (torch.randn(B, T, H, generator=g) / H**0.5).to(on, real).requires_grad_()  # (B, T, H)
    w = torch.randn(V, H, generator=g).to(on, real).requires_grad_()  # (V, H)
    y = torch.randint(0, V, (B, T), generator=g).to(on)  # (B, T)
    mask = torch.ones(B, T, dtype=torch.bool, device=on)
    gid = (torch.arange(B) // G).to(on)
    adv = torch.randn(B, generator=g)
    adv = (adv - adv.view(-1, min(G, B)).mean(-1).repeat_interleave(min(G, B))) / adv.std().clamp(min=1e-4)  # (B,)
    adv = adv.to(on)
    old = (-(math.log(V) + 0.5) + 0.05 * torch.randn(B, T, generator=g)).to(on)  # (B, T)
    spec = resolve_objective(objective) if objective else None
    N = B * T

    def clear():
        h.grad = w.grad = None

    if mode in ("floor", "floor_softmax"):
        buf, hf = torch.empty(min(CHUNK, N), V, dtype=real, device=on), h.detach().reshape(N, H)
        gh, gw = torch.empty(N, H, dtype=real, device=on), torch.zeros(V, H, dtype=real, device=on)
        softmax = mode == "floor_softmax"

        def step():
            gw.zero_()
            for s in range(0, N, CHUNK):
                z = torch.mm(hf[s : s + CHUNK], w.detach().T, out=buf[: min(CHUNK, N - s)])  # (n, V)
                if softmax:  # p over the logits, as the fused eager kernels make it (their row scaling left out)
                    torch._softmax(z, -1, False, out=z)  # (n, V)
                gh[s : s + CHUNK] = z @ w.detach()  # (n, H)
                gw.addmm_(z.T, hf[s : s + CHUNK])  # (V, H)

        step.grads = gh, gw  # d hidden (N, H), d W (V, H): what a test checks the step against

    elif mode == "floor_autograd":
        ones = torch.ones(N, V, dtype=real, device=on)

        def step():
            (h.reshape(N, H) @ w.T).backward(ones)
            clear()

    elif mode in ("naive", "chunked"):

        def step():
            if mode == "naive":
                logp, _ = naive_token_logprobs(h, w, y)
            else:
                logp, _ = token_logprobs(h, w, y, chunk_size=chunk, with_entropy=False)
            loss, _ = policy_loss(spec, logp=logp, old_logp=old, advantages=adv, mask=mask, group_ids=gid)
            loss.backward()
            clear()

    elif mode.startswith("fused"):
        extra = {}

        def step():
            loss, metrics = fused_policy_loss(
                spec, hidden=h, lm_head_weight=w, targets=y, old_logp=old, advantages=adv, mask=mask, group_ids=gid,
                chunk_size=chunk, compile=mode == "fused_compiled", max_logits_mib=budget_mib, solve_once=SOLVE_ONCE.get(mode),
            )  # fmt: skip
            loss.backward()
            extra["two_pass"] = float(metrics["fused/two_pass"])
            extra["row_scaled"] = float(metrics["fused/row_scaled"])
            clear()

        step.extra = extra
    else:  # liger
        from liger_kernel.chunked_loss import LigerFusedLinearGRPOLoss

        level = "sequence" if objective == "gspo" else "token"
        loss_fn = LigerFusedLinearGRPOLoss(
            beta=0.0, compiled=mode == "liger_compiled", use_ref_model=False, epsilon_low=spec.eps_low, epsilon_high=spec.eps_high,
            loss_type="grpo", importance_sampling_level=level,
        )  # fmt: skip
        att = mask.long()

        def step():
            out = loss_fn(h, w, y, att, adv, old_per_token_logps=old)
            (out[0] if isinstance(out, tuple) else out).backward()
            clear()

    return step


def measure(
    mode: str,
    objective: str | None,
    B: int,
    T: int,
    H: int,
    V: int,
    repeats: int,
    threads: int,
    **options,
) -> dict:
    """One mode in this process, after one warm-up step (two on CUDA): median seconds of forward + backward (CPU
    seconds on the CPU, wall seconds to a ``torch.cuda.synchronize`` on CUDA) and wall seconds, and extra MiB. One
    CPU thread: the process's CPU time is the work done, what other processes on a shared machine change least (its
    wall time waits for them). ``options``: ``_step_fn``'s (chunk, budget_mib, device, dtype, seed)."""
    import torch

    torch.set_num_threads(threads)
    _import_libraries()
    step = _step_fn(mode, objective, B, T, H, V, **options)
    if options.get("device", "cpu") == "cuda":
        return _measure_cuda(step, repeats)
    base = _rss_mib()  # the inputs exist, the libraries are loaded
    step()  # warm-up (compiles, where a mode compiles)
    cpu, wall = [], []
    with _PeakRss() as rss:
        for _ in range(repeats):
            c0, t0 = time.process_time(), time.perf_counter()
            step()
            cpu.append(time.process_time() - c0)
            wall.append(time.perf_counter() - t0)
    out = {"seconds": statistics.median(cpu), "wall": statistics.median(wall), "extra_mib": rss.peak - base}
    out.update(getattr(step, "extra", {}))
    return out


def _measure_cuda(step, repeats: int) -> dict:
    """``step`` timed on the GPU: two warm-ups, then ``repeats`` steps, each from one synchronize to the next; extra
    memory: CUDA's peak allocated bytes over the timed steps minus the bytes allocated before them (the inputs)."""
    import torch

    step(), step()  # warm-up: compiles, autotunes, fills the caching allocator
    torch.cuda.synchronize()
    base = torch.cuda.memory_allocated()
    torch.cuda.reset_peak_memory_stats()
    wall = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        step()
        torch.cuda.synchronize()
        wall.append(time.perf_counter() - t0)
    extra = (torch.cuda.max_memory_allocated() - base) / 2**20
    out = {"seconds": statistics.median(wall), "wall": statistics.median(wall), "extra_mib": extra}
    out.update(getattr(step, "extra", {}))
    del step
    torch.cuda.empty_cache()
    return out


def available_gib(device: str = "cpu") -> float:
    """The memory new work can take, in GiB: on the CPU what the kernel says it can take without swapping
    (MemAvailable; inf when unknown), on CUDA the device's free memory."""
    if device == "cuda":
        import torch

        return torch.cuda.mem_get_info()[0] / 2**30
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) / 2**20
    except OSError:
        pass
    return math.inf


def _skip_reason(mode: str, B: int, T: int, V: int, max_gib: float) -> str | None:
    """Why ``mode`` cannot run at this size here, or None."""
    logits = B * T * V * 4 / 2**30
    copies = FULL_LOGITS_TENSORS.get(mode, 0)
    if copies and copies * logits > max_gib:
        return (
            f"needs about {copies * logits:.1f} GiB ({copies} (N, V) float32 tensors of {logits:.1f} GiB) "
            f"> {max_gib:.1f} GiB of memory available (--max-gib)"
        )
    if mode.startswith("liger"):
        try:
            import liger_kernel  # noqa: F401
        except ImportError:
            return "liger-kernel is not installed (pip install liger-kernel)"
    return None


def _child(argv: list[str]) -> int:
    mode, objective, B, T, H, V, repeats, threads, chunk, budget, dtype, seed = argv
    obj = None if objective == "-" else objective
    sizes = (int(B), int(T), int(H), int(V), int(repeats), int(threads))
    print(json.dumps(measure(mode, obj, *sizes, chunk=int(chunk), budget_mib=float(budget), dtype=dtype, seed=int(seed))))
    return 0


BLOCK_MODES = ("chunked", "fused", "fused_compiled", *SOLVE_ONCE)
"""The modes whose logits block ``--chunk`` sets; every other mode runs once whatever ``--chunk`` lists."""


def run_case(mode: str, objective: str | None, chunk: int, B: int, T: int, args) -> dict:
    """One measurement: on the CPU in a fresh process (its resident set is the figure), on CUDA in this one."""
    if args.device == "cuda":
        try:
            return measure(mode, objective, B, T, args.hidden, args.vocab_now, args.repeats, args.threads, chunk=chunk, budget_mib=args.max_logits_mib, device="cuda", dtype=args.dtype, seed=args.seed)  # fmt: skip
        except Exception as err:  # noqa: BLE001 -- one case's failure (out of memory, say) is its row, not the run's end
            import torch

            torch.cuda.empty_cache()
            return {"error": f"{type(err).__name__}: {str(err).splitlines()[0] if str(err) else ''}"[:160]}
    cmd = [sys.executable, __file__, "--child", mode, objective or "-", str(B), str(T), str(args.hidden), str(args.vocab_now), str(args.repeats), str(args.threads), str(chunk), str(args.max_logits_mib), args.dtype, str(args.seed)]  # fmt: skip
    out = subprocess.run(cmd, capture_output=True, text=True)
    if out.returncode:
        last = (out.stderr.strip().splitlines() or ["no output"])[-1]
        return {"error": last[:160]}
    return json.loads(out.stdout.strip().splitlines()[-1])


FLOOR_GOAL = 1.05
"""The issue's target: fused forward + backward at most this many times the floor's time, for ``GOAL_OBJECTIVES``
(the goal on the CPU, and on a GPU in float32; ``floor_goal``)."""
GPU_BF16_GOALS = ((4096, 1.10), (1024, 1.35))
"""Issue 48's goals on a GPU in bf16 (V = 152k, 8 x 2048): fused forward + backward at most 1.10x the floor at
H = 4096 and 1.35x at H = 1024, as (H, goal), largest H first (``floor_goal``)."""


def floor_goal(device: str, dtype: str, hidden: int) -> float:
    """The time goal the goal lines read against: on a GPU in bfloat16, issue 48's goal at the largest H it names that
    is at most ``hidden`` (below H = 1024, H = 1024's: it names none smaller); otherwise ``FLOOR_GOAL``."""
    if device != "cuda" or dtype != "bfloat16":
        return FLOOR_GOAL
    return next((goal for h, goal in GPU_BF16_GOALS if hidden >= h), GPU_BF16_GOALS[-1][1])


GOAL_OBJECTIVES = ("grpo", "gspo", "dfpo_min")
FLOORS = {
    "floor": "floor",
    "floor_autograd": "the issue's floor (h @ W.T, forward + backward, by autograd)",
}
"""The floors a time goal is read against, as the goal lines name them: ``floor`` (the three matmuls in reused blocks,
the least an exact method can take; every ``x floor`` is against it) and, where its row ran, ``floor_autograd`` (the
floor the issue's table is measured against, whose (N, V) logits must fit the memory)."""
REACH = "floor_softmax"
"""The mode whose own time goal says whether the goal is within reach of a path that writes the logits (``reach_line``)."""
REACH_MEANS = {
    "met": "a path that writes the logits to memory can meet the time goal here",
    "missed": "no path that writes the logits to memory and takes PyTorch's softmax over them meets the time goal here",
}
"""What the ``REACH`` row's verdict says of the goal; an inconclusive one says nothing."""
CONFIDENCE = 0.95
"""The least coverage asked of the interval a time goal is read off (``median_interval``)."""


def paired_ratios(times: list[float | None], floor: list[float | None]) -> list[float]:
    """Each round's time over the floor's time in the same round (rounds where either failed left out): the floor and
    the mode ran minutes apart at most, so a machine that slows down between rounds moves both."""
    return [t / f for t, f in zip(times, floor) if t is not None and f]


def median_coverage(n: int, k: int) -> float:
    """The chance that the k-th smallest and k-th largest of n independent draws enclose their distribution's median,
    whatever the distribution: 1 - 2 P(Binomial(n, 1/2) < k)."""
    return 1.0 - 2.0 * sum(math.comb(n, i) for i in range(k)) / 2**n


def median_interval(rounds: Sequence[float]) -> tuple[float, float, float]:
    """A distribution-free interval for the median of the paired ratios, and its coverage: the k-th smallest and k-th
    largest round, with the largest k whose ``median_coverage`` is at least ``CONFIDENCE``. Below six rounds no k
    reaches it and the interval is every round's range (coverage 1 - 2^(1-n): 50% for two rounds, 94% for five); up
    to eight rounds it is still the range (k = 1), so a goal is decided there only where every round agrees; from
    nine rounds on (k >= 2), the outermost rounds no longer undecide it, as they did when every round had to agree
    however many ran."""
    xs, n = sorted(rounds), len(rounds)
    k = 1
    while k + 1 <= (n + 1) // 2 and median_coverage(n, k + 1) >= CONFIDENCE:
        k += 1
    return xs[k - 1], xs[n - k], median_coverage(n, k)


def floor_verdict(x_floor: float, rounds: list[float], goal: float = FLOOR_GOAL) -> str:
    """The time goal read off the rounds' paired ratios (``median_interval``): met where the whole interval is within
    ``goal`` (``floor_goal``), missed where none of it is, inconclusive where it straddles the goal (the median alone
    would call noise a result). With no paired round (a failed floor), ``x_floor`` decides, as with one round."""
    if not rounds:
        return "met" if x_floor <= goal else "missed"
    low, high, _ = median_interval(rounds)
    verdict = "met" if high <= goal else "missed" if low > goal else "inconclusive"
    return f"{verdict} ({interval_note(rounds)})"


def interval_note(rounds: Sequence[float]) -> str:
    """How many ``rounds`` a verdict read and the interval it read (``median_interval``), as the goal lines say it."""
    low, high, coverage = median_interval(rounds)
    return f"{len(rounds)} round{'s' * (len(rounds) > 1)}: the median's {coverage:.0%} interval {low:.3f}x to {high:.3f}x"


def goal_line(
    subject: str,
    floor: str,
    x_floor: float,
    rounds: list[float],
    *,
    where: str = "",
    digits: int = 2,
    means: dict[str, str] | None = None,
    goal: float = FLOOR_GOAL,
) -> str:
    """One time-goal line: ``subject`` (e.g. ``goal fused grpo``) against the floor named by ``floor`` (a key of
    ``FLOORS``), read off ``rounds``, each round's ratio to that floor (``floor_verdict``). Its figure is the median of
    those ratios, the centre of the interval the verdict reads (the tables' ``x floor``, the ratio of the medians, can
    lie outside it); ``x_floor`` where no round paired. ``where``: how it was timed (the split timing's ", in one
    process"); ``means``: a sentence to add by the verdict's first word (``REACH_MEANS``), none for the others;
    ``goal``: the time goal (``floor_goal``)."""
    x = statistics.median(rounds) if rounds else x_floor
    verdict = floor_verdict(x, rounds, goal)
    line = f"{subject} <= {goal:.2f}x {FLOORS[floor]}{where}: {x:.{digits}f}x, {verdict}"
    said = (means or {}).get(verdict.split()[0])
    return f"{line}; {said}" if said else line


def reach_line(x_floor: float, rounds: list[float], *, where: str = "", digits: int = 2, goal: float = FLOOR_GOAL) -> str:
    """The ``REACH`` row's own time goal (``goal_line``), with what its verdict says of the goal for every path that
    writes the logits (``REACH_MEANS``)."""
    return goal_line(f"reach {REACH}", "floor", x_floor, rounds, where=where, digits=digits, means=REACH_MEANS, goal=goal)


def goal_lines(rows: dict, modes: Sequence[str] = ("fused", "fused_compiled"), goal: float = FLOOR_GOAL) -> list[str]:
    """The issue's goals read off one size's table: ``rows`` maps (mode, objective) to its medians
    (``x_floor``, ``extra_mib``), its per-round ratios to the floor (``rounds``, optional) and its seconds by round
    (``by_round``, None where a round failed; optional), from which the goal against ``floor_autograd`` is read where
    that row ran, and, first, where the ``REACH`` row ran, whether the goal is within reach of a path that writes the
    logits (``reach_line``). ``modes``: the modes
    the run asked for; a goal of one of them whose row is missing (a failed case) says so instead of passing, and the
    fused modes it did not ask for are left out (the A/B rows ``fused_once``, ``fused_per_unit`` whenever absent).
    ``goal``: the time goal every line reads against (``floor_goal``)."""
    reach = rows.get((REACH, None))
    out = [reach_line(reach["x_floor"], reach.get("rounds", []), goal=goal)] if reach is not None else []
    for mode in ("fused", "fused_compiled", *SOLVE_ONCE):
        for objective in GOAL_OBJECTIVES:
            row = rows.get((mode, objective))
            if row is None:
                if mode in modes and mode not in SOLVE_ONCE:
                    out.append(f"goal {mode} {objective} <= {goal:.2f}x floor: not measured")
                continue
            subject = f"goal {mode} {objective}"
            out.append(goal_line(subject, "floor", row["x_floor"], row.get("rounds", []), goal=goal))
            issue = rows.get(("floor_autograd", None))
            if issue is not None:  # each round against the autograd floor's time in the same round
                rounds = paired_ratios(row.get("by_round", []), issue.get("by_round", []))
                out.append(goal_line(subject, "floor_autograd", row["x_floor"] / issue["x_floor"], rounds, goal=goal))
            liger = rows.get(("liger_compiled", objective))
            if objective not in OBJECTIVE_ROWS["liger_compiled"]:
                out.append(f"goal {mode} {objective} faster than liger_compiled, in less memory: Liger has no {objective}")
                continue
            if liger is None:
                out.append(f"goal {mode} {objective} faster than liger_compiled, in less memory: no liger_compiled row")
                continue
            t, m = row["x_floor"] / liger["x_floor"], row["extra_mib"] / max(liger["extra_mib"], 1e-9)
            verdict = "met" if t < 1 and m < 1 else "missed"
            out.append(
                f"goal {mode} {objective} faster than liger_compiled, in less memory: time {t:.2f}x, extra memory {m:.2f}x, {verdict}"
            )
    return out


def torch_device_name(device: str) -> str:
    """What runs the steps, in words: the GPU's name on CUDA, "the CPU" otherwise."""
    if device != "cuda":
        return "the CPU"
    import torch

    return torch.cuda.get_device_name()


def main(argv: list[str] | None = None) -> int:
    if argv is None and len(sys.argv) > 1 and sys.argv[1] == "--child":
        return _child(sys.argv[2:])
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--sizes", nargs="+", default=["16x128", "8x2048"], help="B x T cases, e.g. 16x128")
    p.add_argument("--vocab", type=int, nargs="+", default=[32768, 151936])
    p.add_argument("--hidden", type=int, default=512)
    p.add_argument("--modes", nargs="+", default=[m for m in OBJECTIVE_ROWS if m not in SOLVE_ONCE], choices=list(OBJECTIVE_ROWS))
    objectives = sorted({o for rows in OBJECTIVE_ROWS.values() for o in rows if o})
    p.add_argument("--objectives", nargs="+", default=objectives, choices=objectives, help="objective rows to run")
    p.add_argument("--rounds", type=int, default=3, help="interleaved rounds (>= 1); a figure is the median over them")
    p.add_argument("--repeats", type=int, default=1, help="timed steps per process (>= 1), after one warm-up")
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--seed", type=int, default=0, help="the input set: h, W, targets, advantages and old log-probs (default 0)")
    p.add_argument(
        "--chunk",
        type=int,
        nargs="+",
        default=None,
        help="positions per logits block of the chunked and fused modes (default: fused_policy_loss's own at --hidden); "
        "several values run side by side in the same rounds",
    )
    p.add_argument("--device", choices=["cpu", "cuda"], default="cpu", help="cuda: every case in this process, timed on the GPU")
    p.add_argument("--dtype", choices=["float32", "bfloat16"], default="float32", help="h and W's dtype (bfloat16: a bf16 model's head)")
    p.add_argument(
        "--max-gib", type=float, default=None, help="memory the full-logits modes may take (default: MemAvailable; on CUDA its free memory)"
    )
    p.add_argument(
        "--max-logits-mib",
        type=float,
        default=BUDGET_MIB,
        help=f"the fused modes' max_logits_mib (default: fused_policy_loss's own, {BUDGET_MIB:g})",
    )
    args = p.parse_args(argv)
    for name in ("rounds", "repeats", "threads"):
        if getattr(args, name) < 1:
            p.error(f"--{name} must be at least 1, got {getattr(args, name)}")
    if not args.max_logits_mib >= 0:
        p.error(f"--max-logits-mib must be a number >= 0, got {args.max_logits_mib}")
    import torch

    from dfpo.core.fused import _half_precision_off_cpu, default_chunk_size

    if args.device == "cuda" and not torch.cuda.is_available():
        p.error("--device cuda: torch sees no CUDA device here (torch.cuda.is_available() is False); leave --device out to run on the CPU")
    head = torch.empty(0, device=args.device, dtype=getattr(torch, args.dtype))  # W's kind, for fused_policy_loss's own rule
    own = default_chunk_size(args.hidden, half_precision_off_cpu=_half_precision_off_cpu(head))
    args.chunk = args.chunk or [own]
    if min(args.chunk) < 1 or len(set(args.chunk)) != len(args.chunk):
        p.error(f"--chunk values must be distinct and at least 1, got {args.chunk}")
    if args.max_gib is None:
        args.max_gib = available_gib(args.device)
    where = torch_device_name(args.device)
    print(
        f"LM head + policy loss, forward + backward on {where}, {args.dtype} h and W, H={args.hidden}, {args.threads} CPU thread(s), {args.rounds} interleaved "
        f"round(s) x {args.repeats} timed step(s) after {'two warm-ups' if args.device == 'cuda' else 'a warm-up'}, "
        f"{'every case in this process' if args.device == 'cuda' else 'each mode in its own process'}; x floor = time / floor's; "
        f"chunked and fused blocks of {', '.join(map(str, args.chunk))} positions (fused_policy_loss's default at H={args.hidden}: "
        f"{own}; the floor's: {CHUNK}); fused max_logits_mib {args.max_logits_mib:g}; "
        f"{args.max_gib:.1f} GiB of memory available to the full-logits modes; input set {args.seed}"
        + ("; times in GPU wall seconds" if args.device == "cuda" else "")
    )
    for size in args.sizes:
        B, T = (int(x) for x in size.lower().split("x"))
        for vocab in args.vocab:
            args.vocab_now = vocab
            cases = [
                (m, o, c)
                for m in args.modes
                for o in OBJECTIVE_ROWS[m]
                if o is None or o in args.objectives
                for c in (args.chunk if m in BLOCK_MODES else [CHUNK])
            ]
            skipped = {c: _skip_reason(c[0], B, T, vocab, args.max_gib) for c in cases}
            runs = [c for c in cases if skipped[c] is None]
            results: dict = {c: [] for c in runs}
            for r in range(args.rounds):
                shift = r % max(len(runs), 1)
                for case in runs[shift:] + runs[:shift]:
                    results[case].append(run_case(*case, B, T, args))
            print(f"\nB x T = {B} x {T}, V = {vocab}")
            print(
                f"{'mode':16s} {'objective':9s} {'block':>5s} | {'gpu s' if args.device == 'cuda' else 'cpu s':>8s} {'x floor':>8s} {'rounds x floor':>14s} {'wall s':>8s} {'extra MiB':>9s} {'two_pass':>8s} {'scaled':>6s}"
            )
            floor_runs = [x.get("seconds") for x in results.get(("floor", None, CHUNK), [])]  # by round, None where failed
            floor = [x for x in floor_runs if x is not None]
            floor_s = statistics.median(floor) if floor else float("nan")
            rows = {}
            for case in cases:
                mode, objective, chunk = case
                label = f"{mode:16s} {objective or '-':9s} {chunk if mode in BLOCK_MODES else '-':>5} |"
                if skipped[case]:
                    print(f"{label} skipped: {skipped[case]}")
                    continue
                ok = [x for x in results[case] if "seconds" in x]
                if not ok:
                    print(f"{label} failed: {results[case][0]['error']}")
                    continue
                s = statistics.median(x["seconds"] for x in ok)
                wall = statistics.median(x["wall"] for x in ok)
                mib = statistics.median(x["extra_mib"] for x in ok)
                two = f"{ok[0]['two_pass']:.2f}" if "two_pass" in ok[0] else "-"
                scaled = f"{ok[0]['row_scaled']:.2f}" if "row_scaled" in ok[0] else "-"
                by_round = [x.get("seconds") for x in results[case]]  # None where a round failed
                rounds = paired_ratios(by_round, floor_runs)
                spread = f"{min(rounds):.2f}-{max(rounds):.2f}x" if rounds else "-"
                print(f"{label} {s:8.3f} {s / floor_s:7.2f}x {spread:>14s} {wall:8.3f} {mib:9.0f} {two:>8s} {scaled:>6s}", flush=True)
                rows[case] = {"x_floor": s / floor_s, "extra_mib": mib, "rounds": rounds, "by_round": by_round}
            for chunk in args.chunk:  # the goals at each block size, against the same floor and Liger rows
                if len(args.chunk) > 1:
                    print(f"blocks of {chunk} positions:")
                at_chunk = {(m, o): row for (m, o, c), row in rows.items() if m not in BLOCK_MODES or c == chunk}
                print("\n".join(goal_lines(at_chunk, args.modes, floor_goal(args.device, args.dtype, args.hidden))), flush=True)
    return 0


if __name__ == "__main__":
    signal.signal(signal.SIGPIPE, signal.SIG_DFL)  # piped into head: stop quietly when it closes, as a shell tool does
    sys.exit(main())
