"""The run folder: checked, locked and claimed before any expensive work; never cleared unless it is this trainer's.

Layout of RUN_DIR::

    .dfpo-run.json    the mark of dfpo train: written when it claims a new or empty folder
    .lock             flock held by the process training in the folder (its PID inside)
    config.toml       the resolved config (``--resume`` reads it back and checks it against the checkpoint)
    checkpoint.pt     the last good checkpoint, with checkpoint.json (step, config, SHA-256; ``checkpoint``)
    metrics.jsonl     one object per training step, flushed
    eval.jsonl        one object per evaluation
    samples.jsonl     sample completions
    summary.json      run-level metrics (Jitter2, Steps(reward >= kappa), final eval)
    tb/               TensorBoard events
    init_model/       the tiny preset after its warm-start (model + tokenizer)

A fresh start clears a folder only when all of these hold: it carries the mark, the mark says no checkpoint was
ever written in it, and everything in it is something dfpo train writes before its first checkpoint (a run killed
during start-up). Anything else that is not empty is refused, naming what is in the way, and nothing is deleted:
a project folder that happens to hold a ``config.toml``, a finished run whose checkpoint was pruned, a folder of
an older dfpo without the mark.
"""

from __future__ import annotations

import json
import os
import shutil
import time
from pathlib import Path

from dfpo.files import check_writable_folder
from dfpo.trainer.llm.checkpoint import _TMP, CHECKPOINT, CHECKPOINT_META, checkpoint_step, write_run_file

LOCK = ".lock"
MARK = ".dfpo-run.json"
STARTUP_FILES = frozenset({LOCK, MARK, "config.toml", "init_model", _TMP, CHECKPOINT_META})
"""What dfpo train writes in a run folder before its first checkpoint exists."""


def _is_own_temp_file(name: str) -> bool:
    """A temp file of ``write_text_atomic`` for one of the start-up files (``.config.toml.x1y2.tmp``)."""
    return name.startswith(".") and name.endswith(".tmp") and any(name.startswith(f".{f}.") for f in STARTUP_FILES)


def read_mark(run_dir: Path) -> dict | None:
    """The mark dfpo train left in ``run_dir`` (None: no mark, or not one of ours)."""
    try:
        mark = json.loads((Path(run_dir) / MARK).read_text())
    except (OSError, ValueError):
        return None
    return mark if isinstance(mark, dict) and mark.get("written_by") == "dfpo train" else None


def write_mark(run_dir: Path, *, checkpointed: bool) -> None:
    """Claim ``run_dir`` for dfpo train (``checkpointed``: a checkpoint has been written in it at least once)."""
    previous = read_mark(run_dir) or {}
    mark = {
        "written_by": "dfpo train",
        "created": previous.get("created", time.strftime("%Y-%m-%dT%H:%M:%S%z")),
        "checkpointed": checkpointed,
    }
    write_run_file(Path(run_dir) / MARK, json.dumps(mark, sort_keys=True) + "\n")


def startup_leftovers(run_dir: Path, *, resume: bool, steps: int) -> list[Path]:
    """What a run in ``run_dir`` may start from, checked without touching anything: the paths a fresh start
    clears (those of a run killed during its start-up), [] for an empty folder or a resume; ValueError naming the
    folder and the reason for everything else."""
    run_dir = Path(run_dir)
    has_checkpoint = (run_dir / CHECKPOINT).is_file()
    if resume:
        if not has_checkpoint:
            raise ValueError(
                f"--resume {run_dir}: no {CHECKPOINT} in it (the run stopped before its first checkpoint); start it again with --config"
            )
        step = checkpoint_step(run_dir)
        if step is not None and steps < step:
            raise ValueError(f"--resume {run_dir}: train.steps={steps} is below the checkpoint's step {step}; give train.steps >= {step}")
        return []
    contents = sorted(p for p in run_dir.iterdir() if p.name != LOCK) if run_dir.is_dir() else []
    if not contents:
        return []
    if has_checkpoint:
        raise ValueError(
            f"run_dir {str(run_dir)!r} holds a run (checkpoint at step {checkpoint_step(run_dir)}); continue it with "
            f"--resume {run_dir} or choose another folder (--set run_dir=...)"
        )
    names = ", ".join(p.name for p in contents[:5]) + (" ..." if len(contents) > 5 else "")
    mark = read_mark(run_dir)
    if mark is None:
        raise ValueError(
            f"run_dir {str(run_dir)!r} is not empty ({names}) and was not started by dfpo train (no {MARK}); nothing was "
            "deleted. Choose another folder (--set run_dir=...) or empty it yourself"
        )
    if mark.get("checkpointed"):
        raise ValueError(
            f"run_dir {str(run_dir)!r} holds a dfpo run whose {CHECKPOINT} is gone ({names}); its files are kept and nothing "
            f"was deleted. Put {CHECKPOINT} back to --resume it, or choose another folder (--set run_dir=...)"
        )
    foreign = [p.name for p in contents if p.name not in STARTUP_FILES and not _is_own_temp_file(p.name)]
    if foreign:
        raise ValueError(
            f"run_dir {str(run_dir)!r} holds a run that stopped before its first checkpoint, and files dfpo train did not "
            f"write ({', '.join(foreign[:5])}); nothing was deleted. Choose another folder (--set run_dir=...) or move them"
        )
    return contents


class RunFolderLock:
    """Exclusive use of a run folder: ``flock`` on RUN_DIR/.lock, the holder's PID written in it.

    The operating system releases the lock when its process dies, however it dies, so a lock
    left by a killed run is simply taken over; a live holder makes ``acquire`` fail at once.
    """

    def __init__(self, run_dir: Path):
        self.path = Path(run_dir) / LOCK
        self._fh = None
        self.created_folder = False  # set by prepare_run_folder when it made the folder
        self.created_file = False

    def acquire(self) -> None:
        import fcntl

        self.created_file = not self.path.exists()
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
        """Release, and take back what this run added to a folder it is giving up: the whole folder if it made it and
        wrote nothing but its lock and mark, else the lock file if it made that (a refused folder is left as found)."""
        self.release()
        folder = self.path.parent
        if self.created_folder and folder.is_dir() and {p.name for p in folder.iterdir()} <= {LOCK, MARK}:
            for name in (LOCK, MARK):
                (folder / name).unlink(missing_ok=True)
            folder.rmdir()
        elif self.created_file:
            self.path.unlink(missing_ok=True)


class NullLock:
    """The run folder lock of a process that is not rank 0 (rank 0 holds the real one)."""

    def release(self) -> None:
        pass

    def abandon(self) -> None:
        pass


def check_run_folder(run_dir: Path, *, resume: bool, steps: int) -> None:
    """Every check of ``prepare_run_folder`` that needs no lock held afterwards, with no side effect beyond a
    moment's lock: run before launching several processes, so a refusal is one message before any work."""
    run_dir = Path(run_dir)
    check_writable_folder("run_dir", run_dir)
    if not run_dir.is_dir():
        return
    if (run_dir / LOCK).exists():
        probe = RunFolderLock(run_dir)
        probe.acquire()  # ValueError naming the holder when another process trains here
        probe.release()
    startup_leftovers(run_dir, resume=resume, steps=steps)


def prepare_run_folder(run_dir: Path, *, resume: bool, steps: int) -> RunFolderLock:
    """Check, lock and claim a run folder before any expensive work; return the held lock.

    Refused at once, naming the folder: a file in the way, a folder that cannot be written, a folder another
    process is using, anything ``startup_leftovers`` refuses. A new or empty folder gets the mark; a fresh start
    over a run of this trainer that was killed during its start-up clears what that run wrote.
    """
    run_dir = Path(run_dir)
    check_writable_folder("run_dir", run_dir)
    created = not run_dir.exists()
    run_dir.mkdir(parents=True, exist_ok=True)
    lock = RunFolderLock(run_dir)
    lock.created_folder = created
    lock.acquire()
    try:
        leftovers = startup_leftovers(run_dir, resume=resume, steps=steps)
        for p in leftovers:  # a run of ours killed during start-up: start it again
            if p.name == MARK:
                continue
            if p.is_dir() and not p.is_symlink():
                shutil.rmtree(p)
            else:
                p.unlink()
        write_mark(run_dir, checkpointed=resume)  # a resumed folder holds a checkpoint: never a start-up leftover
        return lock
    except BaseException:
        lock.abandon()
        raise
