"""Run folder: resolved config, JSONL logs flushed per line, TensorBoard, atomic checkpoints.

Layout of RUN_DIR::

    config.toml       the resolved config (``--resume`` reads it back)
    metrics.jsonl     one object per training step, flushed
    eval.jsonl        one object per evaluation
    samples.jsonl     sample completions
    summary.json      run-level metrics (Jitter2, Steps(reward >= kappa), final eval)
    (on several processes rank 0 alone writes the folder and holds its lock)
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


class NullLog:
    """A JsonlLog that writes nothing (the logs of every process but rank 0)."""

    def write(self, record: dict) -> None:
        pass

    def close(self) -> None:
        pass


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
                raise ValueError(
                    "log.tensorboard = true needs the tensorboard package (pip install tensorboard), or set it false"
                ) from None
        if wandb_project:
            try:
                import wandb
            except ImportError:
                raise ValueError(
                    f'log.wandb_project = {wandb_project!r} but wandb is not installed; pip install wandb or set it to ""'
                ) from None
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


CHECKPOINT_META = "checkpoint.json"
"""The step (and world size) of checkpoint.pt, readable without loading the checkpoint (checked before any work)."""
LOCK = ".lock"


def save_checkpoint(run_dir: Path, state: dict) -> Path:
    """torch.save to a temp file, fsync, then rename over checkpoint.pt (atomic on POSIX); then the
    small checkpoint.json with its step and the number of processes that trained it, the same way."""
    path = run_dir / CHECKPOINT
    tmp = run_dir / (CHECKPOINT + ".tmp")
    with open(tmp, "wb") as fh:
        torch.save(state, fh)
        fh.flush()
        os.fsync(fh.fileno())
    os.replace(tmp, path)
    meta_tmp = run_dir / (CHECKPOINT_META + ".tmp")
    meta = {"step": int(state["step"])} | ({"world_size": int(state["world_size"])} if "world_size" in state else {})
    meta_tmp.write_text(json.dumps(meta))
    os.replace(meta_tmp, run_dir / CHECKPOINT_META)
    return path


def checkpoint_step(run_dir: Path) -> int | None:
    """The step of the run folder's checkpoint from checkpoint.json (None if there is none)."""
    try:
        return int(json.loads((run_dir / CHECKPOINT_META).read_text())["step"])
    except (OSError, ValueError, KeyError, TypeError):
        return None


def load_checkpoint(run_dir: Path) -> dict:
    """checkpoint.pt, or a ValueError that says why it cannot be used (missing, empty, truncated)."""
    path = run_dir / CHECKPOINT
    if not path.is_file():
        raise ValueError(f"--resume {run_dir}: no {CHECKPOINT} in it (the run stopped before its first checkpoint); start it again")
    if path.stat().st_size == 0:
        raise ValueError(f"--resume {run_dir}: {CHECKPOINT} is empty (a write was cut off); start the run again")
    try:
        state = torch.load(path, map_location="cpu", weights_only=False)
    except Exception as err:  # truncated zip, bad pickle: torch raises several kinds
        raise ValueError(
            f"--resume {run_dir}: {CHECKPOINT} is truncated or corrupt ({type(err).__name__}: {err}); start the run again"
        ) from None
    if not isinstance(state, dict) or "step" not in state:
        raise ValueError(f"--resume {run_dir}: {CHECKPOINT} is not a dfpo checkpoint")
    return state


class RunFolderLock:
    """Exclusive use of a run folder: ``flock`` on RUN_DIR/.lock, the holder's PID written in it.

    The operating system releases the lock when its process dies, however it dies, so a lock
    left by a killed run is simply taken over; a live holder makes ``acquire`` fail at once.
    """

    def __init__(self, run_dir: Path):
        self.path = Path(run_dir) / LOCK
        self._fh = None
        self.created_folder = False  # set by prepare_run_folder when it made the folder

    def acquire(self) -> None:
        import fcntl

        fh = open(self.path, "a+")
        try:
            fcntl.flock(fh.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            fh.seek(0)
            holder = fh.read().strip() or "unknown"
            fh.close()
            raise ValueError(
                f"run_dir {str(self.path.parent)!r} is in use by process {holder} (another dfpo train); wait for it or stop it"
            ) from None
        fh.seek(0)
        fh.truncate()
        fh.write(str(os.getpid()))
        fh.flush()
        self._fh = fh

    def release(self) -> None:
        if self._fh is not None:
            self._fh.close()  # closing the file drops the flock
            self._fh = None

    def abandon(self) -> None:
        """Release, and remove the folder again if this run made it and nothing else was written."""
        self.release()
        folder = self.path.parent
        if self.created_folder and folder.is_dir() and {p.name for p in folder.iterdir()} <= {LOCK}:
            self.path.unlink(missing_ok=True)
            folder.rmdir()


class NullLock:
    """The run folder lock of a process that is not rank 0 (rank 0 holds the real one)."""

    def release(self) -> None:
        pass

    def abandon(self) -> None:
        pass


def missing_steps(rows: list[dict], last: int) -> list[int]:
    """Steps 1..last that have no line in a metrics log (lost to a crash)."""
    have = {r.get("step") for r in rows}
    return [s for s in range(1, last + 1) if s not in have]


def prepare_run_folder(run_dir: Path, *, resume: bool, steps: int) -> RunFolderLock:
    """Check and lock a run folder before any expensive work; return the held lock.

    Refused at once, naming the folder: a file in the way, a folder that cannot be written, a
    folder another process is using, a fresh start into a folder that holds a run (use --resume)
    or into one that is not a dfpo run, a resume without a checkpoint, or a resume whose
    ``train.steps`` is below the checkpoint's step. A run folder that was started but stopped
    before its first checkpoint (config.toml, no checkpoint.pt) is emptied and started again.
    """
    from dfpo.files import check_writable_folder

    run_dir = Path(run_dir)
    check_writable_folder("run_dir", run_dir)
    created = not run_dir.exists()
    run_dir.mkdir(parents=True, exist_ok=True)
    lock = RunFolderLock(run_dir)
    lock.created_folder = created
    lock.acquire()
    try:
        has_checkpoint = (run_dir / CHECKPOINT).is_file()
        if resume:
            if not has_checkpoint:
                raise ValueError(
                    f"--resume {run_dir}: no {CHECKPOINT} in it (the run stopped before its first checkpoint); start it again with --config"
                )
            step = checkpoint_step(run_dir)
            if step is not None and steps < step:
                raise ValueError(
                    f"--resume {run_dir}: train.steps={steps} is below the checkpoint's step {step}; give train.steps >= {step}"
                )
            return lock
        contents = [p for p in run_dir.iterdir() if p.name != LOCK]
        if contents and has_checkpoint:
            raise ValueError(
                f"run_dir {str(run_dir)!r} holds a run (checkpoint at step {checkpoint_step(run_dir)}); continue it with "
                f"--resume {run_dir} or choose another folder (--set run_dir=...)"
            )
        if contents and not (run_dir / "config.toml").is_file():
            raise ValueError(
                f"run_dir {str(run_dir)!r} exists, is not empty and is not a dfpo run folder; choose another (--set run_dir=...)"
            )
        for p in contents:  # a run that stopped before its first checkpoint: start it again
            if p.is_dir() and not p.is_symlink():
                import shutil

                shutil.rmtree(p)
            else:
                p.unlink()
        return lock
    except BaseException:
        lock.abandon()
        raise


class TrainingInterrupted(Exception):
    """SIGINT or SIGTERM stopped the run after a step; a checkpoint of that step was written."""

    def __init__(self, signum: int, step: int, run_dir: Path):
        import signal as _signal

        self.signum, self.step, self.run_dir = signum, step, run_dir
        name = _signal.Signals(signum).name
        super().__init__(f"{name}: stopped after step {step}, checkpoint written; resume with: dfpo train --resume {run_dir}")

    @property
    def exit_code(self) -> int:
        return 128 + self.signum  # the shell's convention: 130 for SIGINT, 143 for SIGTERM


class GracefulStop:
    """While active, SIGINT and SIGTERM only record themselves (``signum``); the training loop
    checks it between steps, finishes the step it is in, writes a checkpoint and stops."""

    def __init__(self):
        self.signum: int | None = None
        self._old: dict = {}

    def __enter__(self) -> GracefulStop:
        import signal
        import threading

        if threading.current_thread() is threading.main_thread():
            for sig in (signal.SIGINT, signal.SIGTERM):
                self._old[sig] = signal.signal(sig, self._record)
        return self

    def _record(self, signum, frame) -> None:
        self.signum = signum

    def __exit__(self, *exc) -> None:
        import signal

        for sig, handler in self._old.items():
            signal.signal(sig, handler)
