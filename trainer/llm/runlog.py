"""Run folder: resolved config, JSONL logs flushed per line, TensorBoard, atomic checkpoints.

Layout of RUN_DIR::

    config.toml       the resolved config (``--resume`` reads it back)
    metrics.jsonl     one object per training step, flushed
    eval.jsonl        one object per evaluation
    samples.jsonl     sample completions
    summary.json      run-level metrics (Jitter2, Steps(reward >= kappa), final eval)
    tb/               TensorBoard events
    init_model/       the tiny preset after its warm-start (model + tokenizer)
    checkpoint.pt     the last good checkpoint, replaced atomically
"""

from __future__ import annotations

import json
import math
import os
import random
from pathlib import Path

import numpy as np
import torch

CHECKPOINT = "checkpoint.pt"


def finite_only(metrics: dict) -> tuple[dict, list[str]]:
    """Drop non-finite numbers (NaN never reaches a log); return (clean, dropped keys)."""
    clean, dropped = {}, []
    for k, v in metrics.items():
        if isinstance(v, float) and not math.isfinite(v):
            dropped.append(k)
        else:
            clean[k] = v
    return clean, dropped


class JsonlLog:
    """Append-only JSONL, one flushed line per record; ``truncate`` keeps records with key <= limit."""

    def __init__(self, path: Path):
        self.path = path
        self._fh = open(path, "a")

    def write(self, record: dict) -> None:
        self._fh.write(json.dumps(record, sort_keys=True) + "\n")
        self._fh.flush()

    def close(self) -> None:
        self._fh.close()

    @staticmethod
    def truncate(path: Path, keep) -> None:
        """Rewrite ``path`` atomically with only the records for which ``keep(record)`` holds."""
        if not path.exists():
            return
        kept = []
        for line in path.read_text().splitlines():
            try:
                rec = json.loads(line)
            except json.JSONDecodeError:  # a line cut by a kill: drop it
                continue
            if keep(rec):
                kept.append(json.dumps(rec, sort_keys=True))
        tmp = path.with_suffix(path.suffix + ".tmp")
        tmp.write_text("".join(line + "\n" for line in kept))
        os.replace(tmp, path)

    @staticmethod
    def read(path: Path) -> list[dict]:
        if not path.exists():
            return []
        out = []
        for line in path.read_text().splitlines():
            try:
                out.append(json.loads(line))
            except json.JSONDecodeError:
                continue
        return out


class Scalars:
    """TensorBoard (and wandb when asked and installed) scalar sink."""

    def __init__(self, run_dir: Path, tensorboard: bool, wandb_project: str, purge_step: int | None, config: dict):
        self.tb = None
        self.wandb = None
        if tensorboard:
            try:
                from torch.utils.tensorboard import SummaryWriter

                self.tb = SummaryWriter(str(run_dir / "tb"), purge_step=purge_step)
            except ImportError:
                raise ValueError("log.tensorboard = true needs the tensorboard package (pip install tensorboard), or set it false") from None
        if wandb_project:
            try:
                import wandb
            except ImportError:
                raise ValueError(f"log.wandb_project = {wandb_project!r} but wandb is not installed; pip install wandb or set it to \"\"") from None
            self.wandb = wandb.init(project=wandb_project, dir=str(run_dir), config=config, resume="allow", id=run_dir.name)

    def log(self, metrics: dict, step: int) -> None:
        nums = {k: v for k, v in metrics.items() if isinstance(v, (int, float)) and not isinstance(v, bool)}
        if self.tb is not None:
            for k, v in nums.items():
                self.tb.add_scalar(k, v, step)
            self.tb.flush()
        if self.wandb is not None:
            self.wandb.log(nums, step=step)

    def close(self) -> None:
        if self.tb is not None:
            self.tb.close()
        if self.wandb is not None:
            self.wandb.finish()


def rng_state() -> dict:
    state = {"python": random.getstate(), "numpy": np.random.get_state(), "torch": torch.get_rng_state()}
    if torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def set_rng_state(state: dict) -> None:
    random.setstate(state["python"])
    np.random.set_state(state["numpy"])
    torch.set_rng_state(state["torch"])
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])


def save_checkpoint(run_dir: Path, state: dict) -> Path:
    """torch.save to a temp file, fsync, then rename over checkpoint.pt (atomic on POSIX)."""
    path = run_dir / CHECKPOINT
    tmp = run_dir / (CHECKPOINT + ".tmp")
    with open(tmp, "wb") as fh:
        torch.save(state, fh)
        fh.flush()
        os.fsync(fh.fileno())
    os.replace(tmp, path)
    return path


def load_checkpoint(run_dir: Path) -> dict:
    path = run_dir / CHECKPOINT
    if not path.is_file():
        raise ValueError(f"--resume {run_dir}: no {CHECKPOINT} in it (the run stopped before its first checkpoint); start it again")
    return torch.load(path, map_location="cpu", weights_only=False)
