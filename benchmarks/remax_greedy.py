"""What ReMax's greedy baseline adds to a rollout of the tiny preset, without it beside with it, in one run.

    python benchmarks/remax_greedy.py [--pairs 20] [--config configs/tiny-cpu.toml]

One trainer with ``objective.overrides.adv_scale = "remax"``; its rollout stage is run again and again with the greedy
completion switched off and on in an ABBA pattern (off, on, on, off, ...), interleaved call by call in one process so a
shared machine's load falls on both alike (no optimiser step runs: the policy, and so the work, stays the same). Each
call is timed in wall-clock and in this process's CPU seconds (one thread); the script prints the median of each setting
and the ratio on/off: the cost of decoding and scoring one greedy completion per prompt beside sampling G of them. The
first two calls are left out. The run folder is temporary.
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from pathlib import Path

import torch

from dfpo.trainer.config import load_config
from dfpo.trainer.train import Trainer


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--pairs", type=int, default=20, help="ABBA pairs of rollouts (default 20)")
    parser.add_argument("--config", default="configs/tiny-cpu.toml")
    args = parser.parse_args()
    torch.set_num_threads(1)
    with tempfile.TemporaryDirectory() as tmp:
        sets = [f'run_dir="{Path(tmp) / "run"}"', 'objective.overrides.adv_scale="remax"', "train.steps=1", "eval.every=0",
                "log.tensorboard=false", "log.progress=false", "threads=1"]  # fmt: skip
        trainer = Trainer(load_config(args.config, sets), quiet=True)
        stage = trainer.rollout_stage
        assert stage.greedy_baseline, "the remax config builds a rollout stage with the greedy baseline"
        G, P = trainer.cfg.rollout.group_size, trainer.cfg.rollout.prompts_per_step
        order = [False, True, True, False] * ((args.pairs + 1) // 2)
        times: dict[bool, list[tuple[float, float]]] = {False: [], True: []}
        for i, greedy in enumerate([False, True] + order[: 2 * args.pairs]):
            stage.greedy_baseline = greedy
            wall, cpu = time.perf_counter(), time.process_time()
            rollout = stage.run(1, seed_per_group=False)
            wall, cpu = time.perf_counter() - wall, time.process_time() - cpu
            assert (rollout.greedy_rewards is not None) == greedy
            if i >= 2:  # the first two calls warm up
                times[greedy].append((wall, cpu))
    med = {k: (statistics.median(w for w, _ in v), statistics.median(c for _, c in v)) for k, v in times.items()}
    print(f"tiny preset ({args.config}), {P} prompts x G = {G} completions a rollout, {len(times[True])} rollouts each, ABBA")
    print(f"{'rollout':<26}{'wall s (median)':>18}{'cpu s (median)':>18}")
    print(f"{'sampling only':<26}{med[False][0]:>18.4f}{med[False][1]:>18.4f}")
    print(f"{'with greedy baseline':<26}{med[True][0]:>18.4f}{med[True][1]:>18.4f}")
    print(f"ratio with/without: wall {med[True][0] / med[False][0]:.3f}, cpu {med[True][1] / med[False][1]:.3f}")


if __name__ == "__main__":
    main()
