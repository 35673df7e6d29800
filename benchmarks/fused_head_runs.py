"""A tiny run with the fused LM head (the trainer's default) and without it: are the logs the same to round-off?

    python benchmarks/fused_head_runs.py                              # grpo-like, group- and batch-coupled: 30 steps each
    python benchmarks/fused_head_runs.py --objectives gspo --steps 50

Trains configs/tiny-cpu.toml twice per objective, ``optim.fused_head = "off"`` (token_logprobs, then policy_loss) and
``"eager"`` (dfpo.fused_policy_loss), same seed, into a temporary folder this script makes and removes, and prints for
each objective the largest relative difference |a - b| / max(1, |a|, |b|) of every numeric key of metrics.jsonl over
all steps (timings left out), largest first, and the keys only one side logs. The maths is the same both ways, so the
differences are float32 round-off carried through sampling and the optimiser.
"""

from __future__ import annotations

import argparse
import json
import math
import pathlib
import subprocess
import sys
import tempfile

ROOT = pathlib.Path(__file__).resolve().parents[1]
TIMING = ("time", "wall", "_s", "tok/s")


def largest_differences(a: list[dict], b: list[dict]) -> tuple[dict[str, float], set[str]]:
    """Per numeric key, the largest relative difference over steps (inf where one side is NaN and the other not);
    and the keys only one side has."""
    worst: dict[str, float] = {}
    one_side: set[str] = set()
    for x, y in zip(a, b, strict=True):
        one_side |= set(x) ^ set(y)
        for key in x.keys() & y.keys():
            u, v = x[key], y[key]
            if any(t in key for t in TIMING) or not all(isinstance(n, (int, float)) and not isinstance(n, bool) for n in (u, v)):
                continue
            if math.isnan(u) or math.isnan(v):
                d = 0.0 if math.isnan(u) and math.isnan(v) else math.inf
            else:
                d = abs(u - v) / max(1.0, abs(u), abs(v))
            worst[key] = max(worst.get(key, 0.0), d)
    return worst, one_side


def _train(run_dir: pathlib.Path, objective: str, mode: str, steps: int) -> list[dict]:
    cmd = [
        sys.executable, "-m", "dfpo", "train", "--config", str(ROOT / "configs" / "tiny-cpu.toml"), "--quiet",
        "--set", f"run_dir={run_dir}", "--set", f"objective.name={objective}", "--set", f"optim.fused_head={mode}",
        "--set", f"train.steps={steps}", "--set", "eval.every=0", "--set", f"train.save_every={steps}",
    ]  # fmt: skip
    subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL)
    return [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines() if line.strip()]


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--objectives", nargs="+", default=["dfpo_min", "gspo", "stapo"])
    p.add_argument("--steps", type=int, default=30)
    p.add_argument("--top", type=int, default=4, help="how many keys to print per objective")
    args = p.parse_args(argv)
    print(f"tiny-cpu, {args.steps} steps, seed 0: optim.fused_head off vs eager, largest relative differences of metrics.jsonl")
    with tempfile.TemporaryDirectory(prefix="dfpo-fused-runs-") as tmp:
        for objective in args.objectives:
            off = _train(pathlib.Path(tmp) / f"{objective}-off", objective, "off", args.steps)
            fused = _train(pathlib.Path(tmp) / f"{objective}-eager", objective, "eager", args.steps)
            worst, one_side = largest_differences(off, fused)
            top = sorted(worst.items(), key=lambda kv: -kv[1])[: args.top]
            shown = ", ".join(f"{k} {v:.1e}" for k, v in top)
            print(f"{objective:9s} {len(off)} steps each | {shown} | only one side: {', '.join(sorted(one_side)) or '-'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
