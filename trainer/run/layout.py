"""The layout of a ``dfpo train`` run folder: the one place that spells its file names.

``RunDir(path)`` knows where each file of a run lives; the trainer, ``dfpo compare``, the explorer and the tests ask it
instead of joining names to a path. Standard library only, so the explorer reads run folders without torch.

    config.toml         the resolved config (written at start, rewritten on resume)
    metrics.jsonl       one line per step          eval.jsonl     one line per evaluation
    samples.jsonl       sample completions          summary.json   Jitter2, Steps to kappa, final eval
    checkpoint.pt       the whole training state    checkpoint.json its record: step, world size, config, SHA-256
    .dfpo-run.json      the mark: dfpo train made this folder, and which run it holds
    .lock               the process that trains here now
    init_model/         the tiny preset's warm-started model (safetensors)
    tb/                 TensorBoard events          curves.png     the run's curves
    tax_reference.pt    pi_init at the eval prompts' positions, scored at the step-0 eval (``stages.tax``)
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True)
class RunDir:
    """A run folder and the paths of its files (nothing is read or written here)."""

    path: Path

    CONFIG = "config.toml"
    METRICS = "metrics.jsonl"
    EVALS = "eval.jsonl"
    SAMPLES = "samples.jsonl"
    SUMMARY = "summary.json"
    CHECKPOINT = "checkpoint.pt"
    CHECKPOINT_META = "checkpoint.json"
    CHECKPOINT_TMP = CHECKPOINT + ".tmp"
    MARK = ".dfpo-run.json"
    LOCK = ".lock"
    INIT_MODEL = "init_model"
    TENSORBOARD = "tb"
    CURVES = "curves.png"
    TAX_REFERENCE = "tax_reference.pt"
    """Written by ``stages.tax`` (pi_init for eval/tax_kl), read by ``run.folder`` (a file a fresh start may clear)."""

    LOGS = (METRICS, EVALS, SAMPLES)
    """The JSON Lines logs, in the order the trainer opens them."""
    STARTUP_FILES = frozenset({LOCK, MARK, CONFIG, INIT_MODEL, CHECKPOINT_TMP, CHECKPOINT_META})
    """What a run writes before its first checkpoint (a folder holding only these may be started again)."""

    def __init__(self, path: str | os.PathLike | RunDir) -> None:
        object.__setattr__(self, "path", path.path if isinstance(path, RunDir) else Path(path))

    def __truediv__(self, name: str) -> Path:
        return self.path / name

    def __fspath__(self) -> str:
        return os.fspath(self.path)

    def __str__(self) -> str:
        return str(self.path)

    @property
    def config(self) -> Path:
        return self.path / self.CONFIG

    @property
    def metrics(self) -> Path:
        return self.path / self.METRICS

    @property
    def evals(self) -> Path:
        return self.path / self.EVALS

    @property
    def samples(self) -> Path:
        return self.path / self.SAMPLES

    @property
    def summary(self) -> Path:
        return self.path / self.SUMMARY

    @property
    def checkpoint(self) -> Path:
        return self.path / self.CHECKPOINT

    @property
    def checkpoint_meta(self) -> Path:
        return self.path / self.CHECKPOINT_META

    @property
    def checkpoint_tmp(self) -> Path:
        return self.path / self.CHECKPOINT_TMP

    @property
    def mark(self) -> Path:
        return self.path / self.MARK

    @property
    def lock(self) -> Path:
        return self.path / self.LOCK

    @property
    def init_model(self) -> Path:
        return self.path / self.INIT_MODEL

    @property
    def tensorboard(self) -> Path:
        return self.path / self.TENSORBOARD

    @property
    def curves(self) -> Path:
        return self.path / self.CURVES
