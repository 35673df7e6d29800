"""checkpoint.pt and checkpoint.json: written so that nothing is lost, read so that nothing damaged is trusted.

``checkpoint.pt`` holds the whole training state (trainable parameters, optimiser, scheduler, data cursor, RNG
states, the resolved config it was made with). ``checkpoint.json`` is its small, readable record: the step, the
world size that trained it, the config, and the SHA-256 and size of checkpoint.pt. It is read before any work
(the resume checks) and its checksum is verified before the checkpoint is loaded.

Write order (``save_checkpoint``): the new checkpoint goes to ``checkpoint.pt.tmp`` (hashed while written,
fsynced), then ``checkpoint.json`` is replaced by the new record, then the temp file is renamed over
checkpoint.pt. A kill between the last two renames leaves a record that names the temp file's checksum:
``load_checkpoint`` finishes the rename (roll forward). A failed write (a full disk) removes the temp files and
keeps the previous checkpoint and record untouched.

Departures / choices:
1. SHA-256 over the file bytes, computed while writing (no second read). Loading reads the file twice (hash,
   then ``torch.load``); on the sizes one host trains that costs about a second per GB.
2. A checkpoint written by an earlier dfpo (no checksum in its record) still loads; ``CheckpointMeta.sha256`` is
   None and the trainer says so.
"""

from __future__ import annotations

import errno
import hashlib
import json
import os
import random
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from dfpo.files import write_text_atomic

CHECKPOINT = "checkpoint.pt"
CHECKPOINT_META = "checkpoint.json"
"""The step, world size, config and checksum of checkpoint.pt, readable without loading the checkpoint."""
_TMP = CHECKPOINT + ".tmp"
FORMAT = 2
"""Version of checkpoint.json: 2 adds the checksum and the config (1: step and world size only)."""
DISK_FULL_ERRNOS = (errno.ENOSPC, errno.EDQUOT, errno.EFBIG)


class WriteFailed(RuntimeError):
    """A file of the run folder could not be written (a full disk, a quota, permissions); what was written
    before is kept. The message says what failed and what to do; the command line prints it without a traceback."""


def describe_write_error(path: Path, err: OSError) -> str:
    """``path: <the reason in words>`` for an OSError of a write."""
    if err.errno in DISK_FULL_ERRNOS:
        return f"{path}: no space left on the device (or the quota is used up): {err.strerror or err}"
    return f"{path}: {err.strerror or err}"


def write_run_file(path: Path, text: str) -> None:
    """``write_text_atomic`` for a file of the run folder: on failure the old file stays, the temp file is gone, and
    ``WriteFailed`` names the file and the reason."""
    try:
        write_text_atomic(path, text)
    except OSError as err:
        raise WriteFailed(f"writing {describe_write_error(path, err)}; the previous version of the file is kept") from None


@dataclass(frozen=True)
class CheckpointMeta:
    """What checkpoint.json records about checkpoint.pt."""

    step: int
    world_size: int | None = None
    sha256: str | None = None
    size: int | None = None
    config: dict | None = None


def read_meta(run_dir: Path) -> CheckpointMeta | None:
    """checkpoint.json of ``run_dir`` (None if there is none or it cannot be read)."""
    try:
        raw = json.loads((Path(run_dir) / CHECKPOINT_META).read_text())
        return CheckpointMeta(
            step=int(raw["step"]),
            world_size=None if raw.get("world_size") is None else int(raw["world_size"]),
            sha256=raw.get("sha256"),
            size=raw.get("size"),
            config=raw.get("config"),
        )
    except (OSError, ValueError, KeyError, TypeError):
        return None


def checkpoint_step(run_dir: Path) -> int | None:
    """The step of the run folder's checkpoint from checkpoint.json (None if there is none)."""
    meta = read_meta(run_dir)
    return None if meta is None else meta.step


class _HashingWriter:
    """A binary file wrapper that hashes and counts every byte written through it."""

    def __init__(self, fh):
        self.fh, self.hash, self.size = fh, hashlib.sha256(), 0

    def write(self, data) -> int:
        self.hash.update(data)
        self.size += len(data)
        return self.fh.write(data)

    def flush(self) -> None:
        self.fh.flush()


def file_sha256(path: Path, chunk: int = 1 << 22) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as fh:
        while block := fh.read(chunk):
            h.update(block)
    return h.hexdigest()


def _fsync_dir(folder: Path) -> None:
    fd = os.open(folder, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def save_checkpoint(run_dir: Path, state: dict, *, config: dict | None = None) -> Path:
    """Write ``state`` as checkpoint.pt and its record checkpoint.json (module docstring: the write order).

    ``config`` (the resolved config as a dict) is stored in both. On any failure the temp files are removed,
    the previous checkpoint and record stay as they were, and ``WriteFailed`` says so (other errors re-raised).
    """
    run_dir = Path(run_dir)
    path, tmp = run_dir / CHECKPOINT, run_dir / _TMP
    if config is not None:
        state = {**state, "config": config}
    meta_path = run_dir / CHECKPOINT_META
    old_meta = meta_path.read_text() if meta_path.is_file() else None
    meta_written = False
    try:
        with open(tmp, "wb") as fh:
            writer = _HashingWriter(fh)
            torch.save(state, writer)
            fh.flush()
            os.fsync(fh.fileno())
        meta = {"format": FORMAT, "step": int(state["step"]), "sha256": writer.hash.hexdigest(), "size": writer.size}
        if "world_size" in state:
            meta["world_size"] = int(state["world_size"])
        if config is not None:
            meta["config"] = config
        write_text_atomic(meta_path, json.dumps(meta, sort_keys=True))
        meta_written = True
        os.replace(tmp, path)
    except BaseException as err:
        tmp.unlink(missing_ok=True)
        if meta_written:  # the rename failed: the record must name the checkpoint that is there again
            _restore_meta(meta_path, old_meta)
        if isinstance(err, OSError):
            kept = checkpoint_step(run_dir)
            previous = f"the previous checkpoint (step {kept}) is kept" if kept is not None else "no earlier checkpoint exists"
            raise WriteFailed(
                f"writing checkpoint step {int(state['step'])} failed: {describe_write_error(path, err)}; {previous}. "
                f"Free space, then continue with: dfpo train --resume {run_dir}"
            ) from None
        raise
    _fsync_dir(run_dir)
    return path


def _restore_meta(meta_path: Path, old_text: str | None) -> None:
    """Put the previous checkpoint.json back (best effort: an error here must not hide the first one)."""
    try:
        if old_text is None:
            meta_path.unlink(missing_ok=True)
        else:
            write_text_atomic(meta_path, old_text)
    except OSError:
        pass


def _verified(run_dir: Path, meta: CheckpointMeta | None) -> None:
    """Check checkpoint.pt against the checksum of its record, finishing a rename a kill interrupted; ValueError
    if they differ."""
    path, tmp = run_dir / CHECKPOINT, run_dir / _TMP
    if meta is None or meta.sha256 is None:
        return
    if file_sha256(path) == meta.sha256:
        tmp.unlink(missing_ok=True)  # a write cut off before its record: never part of the run
        return
    if tmp.is_file() and file_sha256(tmp) == meta.sha256:  # killed between the record and the rename: roll forward
        os.replace(tmp, path)
        return
    raise ValueError(
        f"--resume {run_dir}: {CHECKPOINT} does not match the checksum in {CHECKPOINT_META} (step {meta.step}, sha256 "
        f"{meta.sha256[:12]}..., {meta.size} bytes; the file has {path.stat().st_size} bytes): it was damaged after it was "
        "written (bit flips, a partial copy). Nothing was loaded; restore the run folder from a copy or start the run again"
    )


def load_checkpoint(run_dir: Path) -> dict:
    """checkpoint.pt, verified against checkpoint.json's checksum, or a ValueError that says why it cannot be used
    (missing, empty, damaged, truncated)."""
    run_dir = Path(run_dir)
    path = run_dir / CHECKPOINT
    if not path.is_file():
        raise ValueError(f"--resume {run_dir}: no {CHECKPOINT} in it (the run stopped before its first checkpoint); start it again")
    if path.stat().st_size == 0:
        raise ValueError(f"--resume {run_dir}: {CHECKPOINT} is empty (a write was cut off); start the run again")
    _verified(run_dir, read_meta(run_dir))
    try:
        state = torch.load(path, map_location="cpu", weights_only=False)
    except Exception as err:  # truncated zip, bad pickle: torch raises several kinds
        raise ValueError(
            f"--resume {run_dir}: {CHECKPOINT} is truncated or corrupt ({type(err).__name__}: {err}); start the run again"
        ) from None
    if not isinstance(state, dict) or "step" not in state:
        raise ValueError(f"--resume {run_dir}: {CHECKPOINT} is not a dfpo checkpoint")
    return state


def seed_everything(seed: int) -> None:
    """Seed every generator ``rng_state`` saves (Python, NumPy, torch CPU and CUDA) from ``seed``."""
    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)


def rng_state() -> dict:
    """Every random generator the run draws from (Python, NumPy, torch CPU and CUDA)."""
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
