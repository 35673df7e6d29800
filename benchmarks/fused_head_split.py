"""Where the fused LM head's time goes, per objective, in one process on one thread: the floor beside it.

    python benchmarks/fused_head_split.py                         # B x T = 16 x 128, V = 32k, H = 512, 5 rounds
    python benchmarks/fused_head_split.py --before c3d175c        # and today's fused step against its code at c3d175c
                                                                  # (core/fused/ there, or core/fused.py before the split)

Each round runs the floor (the three LM-head matmuls alone, benchmarks/fused_head.py's ``floor``), the floor with a
softmax over each block (``floor_softmax``, whose "reach" line says whether the goal is within reach of a path that
writes the logits) and ``fused_policy_loss`` (eager kernels) for each objective once, in an order rotated from round
to round; a figure is the median over rounds of the process's CPU seconds, and ``rounds x floor`` the range of each
round's step over the floor's in the same round; below the table, benchmarks/fused_head.py's time goal is read off
those rounds (met, missed, or inconclusive where the 95% interval for their median straddles it:
``fused_head.median_interval``). ``--seed`` picks the input set (benchmarks/fused_head.py's). The fused step is
split by timing the functions it calls: ``head_logits`` (the forward matmul), ``_eager_stats_`` (softmax statistics),
``_eager_grad_`` (d loss / d logits, written over the block only for an entropy term or a half-precision head: a
float32 head's c goes on the (n, H) side, in "rest"), ``_Inputs.coefficients`` (autograd through ``policy_loss``: the
objective's own cost); "rest" is the step less those: the two gradient matmuls, gathers and page faults of fresh
gradients.
"""

from __future__ import annotations

import argparse
import signal
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

PARTS = ("head_logits", "_eager_stats_", "_eager_grad_", "coefficients")


def _timed(owner, name: str, spent: dict) -> None:
    """Wrap ``owner.name`` so that its CPU seconds add up in ``spent[name]``."""
    inner = getattr(owner, name)

    def wrapper(*args, **kwargs):
        t0 = time.process_time()
        try:
            return inner(*args, **kwargs)
        finally:
            spent[name] = spent.get(name, 0.0) + time.process_time() - t0

    setattr(owner, name, wrapper)


WHERE = ", in one process"
"""How the goal lines say these steps were timed (benchmarks/fused_head_verdicts.py reads it)."""


def goal_line(subject: str, floor: str, step_s: list[float], floor_s: list[float], means: dict[str, str] | None = None) -> str:
    """benchmarks/fused_head.py's time goal for ``subject`` (``goal fused grpo``, ``reach floor_softmax``) against one
    floor, read off the paired rounds; ``means``: ``fused_head.goal_line``'s."""
    import fused_head as bench

    x_floor = statistics.median(step_s) / statistics.median(floor_s)
    return bench.goal_line(subject, floor, x_floor, bench.paired_ratios(step_s, floor_s), where=WHERE, digits=3, means=means)


def main(argv: list[str] | None = None) -> int:
    import fused_head as bench

    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--size", default="16x128")
    p.add_argument("--vocab", type=int, default=32768)
    p.add_argument("--hidden", type=int, default=512)
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--objectives", nargs="+", default=["grpo", "gspo", "dfpo_min"])
    p.add_argument("--seed", type=int, default=0, help="the input set (default 0)")
    p.add_argument(
        "--floors",
        nargs="+",
        choices=list(bench.FLOORS),
        default=["floor"],
        help="the floors the goal is read against (floor always runs: every ratio is against it; floor_autograd, asked "
        "for, where its (N, V) logits fit the memory available, which the other cases in this process share: its fresh "
        "(N, V) tensors slow the other cases of this process, see docs/throughput.md; fused_head.py runs it in a process of its own)",
    )
    p.add_argument("--chunk", type=int, default=None, help="positions per fused logits block (default: fused_policy_loss's own)")
    p.add_argument(
        "--before",
        metavar="REV",
        default=None,
        help="also time the fused path as it was at git revision REV (core/fused/, or core/fused.py before the split; read "
        "with git show from this checkout), objective by "
        "objective in the same rounds, and read the current step against it",
    )
    args = p.parse_args(argv)
    if args.rounds < 1:
        p.error(f"--rounds must be at least 1, got {args.rounds}")
    before = _module_at(args.before) if args.before else None  # a bad revision is refused before any timing
    import torch

    from dfpo.core import fused

    torch.set_num_threads(1)
    B, T = (int(x) for x in args.size.lower().split("x"))
    spent: dict[str, float] = {}
    for name in PARTS[:3]:
        _timed(fused, name, spent)
    _timed(fused._Inputs, "coefficients", spent)
    autograd = "floor_autograd" in args.floors
    too_big = bench._skip_reason("floor_autograd", B, T, args.vocab, bench.available_gib()) if autograd else None
    floors = [("floor", None)] + ([("floor_autograd", None)] if autograd and too_big is None else [])
    cases = floors + [(bench.REACH, None)] + [("fused", o) for o in args.objectives]
    cases += [(BEFORE, o) for o in args.objectives] if before else []
    chunk = args.chunk or fused.default_chunk_size(args.hidden)
    steps = {
        (mode, o): bench._step_fn("fused" if mode == BEFORE else mode, o, B, T, args.hidden, args.vocab, chunk, seed=args.seed,
                                  fused_module=before if mode == BEFORE else None)
        for mode, o in cases
    }  # fmt: skip
    for step in steps.values():
        step()  # warm-up
    seconds = {c: [] for c in cases}
    parts = {c: {k: [] for k in PARTS} for c in cases}
    for r in range(args.rounds):
        for case in cases[r % len(cases) :] + cases[: r % len(cases)]:
            spent.clear()
            t0 = time.process_time()
            steps[case]()
            seconds[case].append(time.process_time() - t0)
            for k in PARTS:
                parts[case][k].append(spent.get(k, 0.0))
    print(
        f"B x T = {B} x {T}, V = {args.vocab}, H = {args.hidden}; fused blocks of {chunk} positions, the floor's {bench.CHUNK}; "
        f"one process, one thread, median of {args.rounds} interleaved rounds; input set {args.seed}; CPU s"
    )
    if too_big:
        print(f"floor_autograd left out: {too_big}")
    print(
        f"{'mode':14s} {'objective':9s} | {'step':>7s} {'x floor':>7s} {'rounds x floor':>14s} | "
        + " ".join(f"{k.strip('_'):>12s}" for k in PARTS)
        + f" {'rest':>7s}"
    )
    floor = statistics.median(seconds[("floor", None)])
    verdicts = [goal_line(f"reach {bench.REACH}", "floor", seconds[(bench.REACH, None)], seconds[("floor", None)], bench.REACH_MEANS)]
    for case in cases:
        s = statistics.median(seconds[case])
        med = {k: statistics.median(parts[case][k]) for k in PARTS}
        rounds = bench.paired_ratios(seconds[case], seconds[("floor", None)])
        spread = f"{min(rounds):.3f}-{max(rounds):.3f}x"
        if case[1] is None or case[0] == BEFORE:  # a floor, the floor with a softmax, or code not split: no parts
            cells = " ".join(f"{'-':>12s}" for _ in PARTS) + f" {'-':>7s}"
        else:
            cells = " ".join(f"{med[k]:12.4f}" for k in PARTS) + f" {s - sum(med.values()):7.3f}"
            if case[1] in bench.GOAL_OBJECTIVES:
                for against in floors:
                    verdicts.append(goal_line(f"goal fused {case[1]}", against[0], seconds[case], seconds[against]))
        print(f"{case[0]:14s} {case[1] or '-':9s} | {s:7.3f} {s / floor:6.3f}x {spread:>14s} | {cells}")
    print("\n".join(verdicts))
    for objective in args.objectives if before else []:
        now, then = seconds[("fused", objective)], seconds[(BEFORE, objective)]
        print(before_line(objective, args.before, bench.paired_ratios(now, then), before.__dfpo_source__))
    return 0


BEFORE = "fused_before"
"""The mode of ``--before``'s cases: ``fused_policy_loss`` as it was at an earlier revision."""


def _module_at(rev: str):
    """The fused path as it was at git revision ``rev`` of this checkout, imported as ``dfpo.core._fused_before``, and
    what it was read from: the package core/fused/ (every file ``git ls-tree`` lists under it, written out with
    ``git show`` into a temporary folder) where ``rev`` has one, else the single file core/fused.py (before the split).
    Its relative imports reach today's package; SystemExit with one sentence where git cannot show it or where it does
    not import against today's package (a revision whose code needs helpers since changed)."""
    import importlib.util
    import subprocess
    import tempfile

    root = Path(__file__).resolve().parent.parent

    def git(*args: str) -> subprocess.CompletedProcess:
        return subprocess.run(["git", *args], cwd=root, capture_output=True, text=True)

    listed = git("ls-tree", "-r", "--name-only", rev, "--", PACKAGE)
    files = [f for f in listed.stdout.splitlines() if f.endswith(".py")] if listed.returncode == 0 else []
    source = PACKAGE if files else "core/fused.py"
    shown = {f: git("show", f"{rev}:{f}") for f in files or [source]}
    for f, out in shown.items():
        if out.returncode != 0:
            raise SystemExit(
                f"--before {rev!r}: git cannot show {f} at that revision ({out.stderr.strip()}); name a commit of this checkout"
            )
    import dfpo.core

    name = "dfpo.core._fused_before"
    for loaded in [k for k in sys.modules if k == name or k.startswith(name + ".")]:
        del sys.modules[loaded]  # an earlier --before's files: the parts of a package are looked up by name
    with tempfile.TemporaryDirectory() as folder:
        for f, out in shown.items():
            path = Path(folder) / Path(f).relative_to(Path(source).parent if files else "core")
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(out.stdout)
        if files:
            package = Path(folder) / Path(PACKAGE).name
            spec = importlib.util.spec_from_file_location(name, package / "__init__.py", submodule_search_locations=[str(package)])
        else:
            spec = importlib.util.spec_from_file_location(name, Path(folder) / "fused.py")
        module = importlib.util.module_from_spec(spec)
        module.__package__ = name if files else dfpo.core.__name__
        sys.modules[name] = module  # dataclasses look their module up while it loads
        try:
            spec.loader.exec_module(module)
        except Exception as err:  # noqa: BLE001 -- any failure of old code against today's package: one sentence
            del sys.modules[name]
            raise SystemExit(
                f"--before {rev!r}: {source} at that revision does not import against today's package "
                f"({type(err).__name__}: {err}); name a later commit"
            ) from None
    module.__dfpo_source__ = source
    return module


PACKAGE = "core/fused/"
"""Where the fused path lives since it was split into files of one concern (before: the single file core/fused.py)."""


def before_line(objective: str, rev: str, rounds: list[float], source: str = "core/fused.py") -> str:
    """The current fused step of ``objective`` against its code at ``rev`` (read from ``source``: core/fused.py, or the
    package core/fused/), read off the paired rounds like a goal: faster or slower where the median's interval lies
    wholly on one side of 1, else not shown either way."""
    import fused_head as bench

    low, high, _ = bench.median_interval(rounds)
    said = "faster" if high < 1.0 else "slower" if low > 1.0 else "not shown either way"
    x = statistics.median(rounds)
    return f"now against before fused {objective} ({source} at {rev}), in one process: {x:.3f}x, {said} ({bench.interval_note(rounds)})"


if __name__ == "__main__":
    signal.signal(signal.SIGPIPE, signal.SIG_DFL)  # piped into head: stop quietly when it closes
    sys.exit(main())
