"""What ``log.param_drift`` costs a training step of the tiny preset, off beside on, in one run.

    python benchmarks/param_drift.py [--pairs 20] [--config configs/tiny-cpu.toml]

One trainer with ``log.param_drift = true`` and ``param_drift_every = 1``; its training steps alternate between the
drift stage switched off and on in an ABBA pattern (off, on, on, off, ...), interleaved step by step in one process so
a shared machine's load falls on both alike. The stage puts the parameters and the optimiser back, so the run is the
same whichever steps it probes. Each step is timed in wall-clock and in this process's CPU seconds (the trainer runs
on one thread); the script prints the median of each setting and the ratio on/off: the cost of a probed step. With
the default ``param_drift_every = 10`` a run probes one step in ten (and step 1), so it pays 1 + (ratio - 1) / 10 of
a step on average; that figure is printed too. Off (the default) builds no stage at all (``Trainer.drift_stage`` is
None, checked here). The warm start and the first two steps are left out. The run folder is temporary.
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

EVERY_DEFAULT = 10


def make_trainer(config: str, run_dir: Path, steps: int, drift: bool) -> Trainer:
    sets = [
        f"log.param_drift={str(drift).lower()}",
        "log.param_drift_every=1",
        f"run_dir={run_dir}",
        f"train.steps={steps}",
        f"train.save_every={steps}",
        "eval.every=0",
        "log.tensorboard=false",
        "log.progress=false",
    ]
    return Trainer(load_config(config, sets), quiet=True)


def timed_steps(trainer: Trainer, pairs: int, warmup: int = 2) -> dict[str, dict[str, list[float]]]:
    """Wall and CPU seconds of each step, by setting; steps alternate off, on, on, off (ABBA) after ``warmup``."""
    stage = trainer.drift_stage
    times = {name: {"wall": [], "cpu": []} for name in ("off", "on")}
    order = ["off"] * warmup + [name for k in range(pairs) for name in (("off", "on") if k % 2 == 0 else ("on", "off"))]
    for step, name in enumerate(order, start=1):
        trainer.drift_stage = stage if name == "on" else None
        wall, cpu = time.perf_counter(), time.process_time()
        trainer.train_step(step)
        wall, cpu = time.perf_counter() - wall, time.process_time() - cpu
        if step > warmup:
            times[name]["wall"].append(wall)
            times[name]["cpu"].append(cpu)
    trainer.drift_stage = stage
    return times


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--config", default="configs/tiny-cpu.toml")
    parser.add_argument("--pairs", type=int, default=20, help="off/on step pairs timed (default 20)")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="dfpo-bench-drift-") as tmp:
        off = make_trainer(args.config, Path(tmp) / "off", 1, drift=False)
        assert off.drift_stage is None, "log.param_drift = false must build no drift stage"
        off.close()
        trainer = make_trainer(args.config, Path(tmp) / "on", 2 * args.pairs + 2, drift=True)
        threads = torch.get_num_threads()
        torch.set_num_threads(trainer.cfg.threads or threads)
        try:
            times = timed_steps(trainer, args.pairs)
        finally:
            torch.set_num_threads(threads)
            trainer.close()
    print(f"{args.config}: {args.pairs} off/on step pairs, ABBA-interleaved in one process; torch threads {trainer.cfg.threads or threads}")
    print("log.param_drift = false: no drift stage built (Trainer.drift_stage is None)")
    print(
        f"{'clock':<6}{'off median s/step':>19}{'on median s/step':>18}{'probed step / off':>19}{f'run at every={EVERY_DEFAULT} / off':>24}"
    )
    for clock in ("wall", "cpu"):
        a, b = statistics.median(times["off"][clock]), statistics.median(times["on"][clock])
        ratio = b / a
        print(f"{clock:<6}{a:>19.4f}{b:>18.4f}{ratio:>19.3f}{1 + (ratio - 1) / EVERY_DEFAULT:>24.3f}")


if __name__ == "__main__":
    main()
