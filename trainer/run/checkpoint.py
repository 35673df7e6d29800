"""checkpoint.pt and checkpoint.json: written so that nothing is lost, read so that nothing damaged is trusted and
nothing in them runs.

``checkpoint.pt`` holds the whole training state (trainable parameters, optimiser, scheduler, data cursor, RNG
states, the resolved config it was made with) as tensors and plain data (numbers, strings, lists, tuples, dicts).
``checkpoint.json`` is its small, readable record: the step, the world size that trained it, the config, and the
SHA-256 and size of checkpoint.pt. It is read before any work (the resume checks) and its checksum is verified
before the checkpoint is loaded.

Reading (``check_checkpoint`` before any work, ``load_checkpoint`` when the model is there):
1. No record, no load. A checkpoint.json that is missing, empty, torn or without a checksum is refused, saying
   which: checkpoint.pt cannot be verified then, and nothing unverified is loaded (there is no checksum inside
   checkpoint.pt to fall back on; copy checkpoint.json with it).
2. Nothing in a checkpoint runs. ``torch.load(weights_only=True)``: a pickle that asks for any other object (a
   function to call, a class to build) is refused naming the file, never executed. The checksum proves the file is
   intact, not who wrote it. ``check_checkpoint`` lists what a file would ask for before any work
   (``torch.serialization.get_unsafe_globals_in_checkpoint`` reads the pickle, it does not run it).
3. Format 2 (before this one) kept NumPy's RNG key as an ndarray; ``OLD_RNG_TYPES`` allows exactly that (an
   ndarray of uint32, the allow-list transformers' Trainer uses for its own RNG files), so runs started then
   resume. Format 3 writes it as a list of ints and needs nothing allowed.

Write order (``save_checkpoint``): the new checkpoint goes to ``checkpoint.pt.tmp`` (hashed while written,
fsynced), then ``checkpoint.json`` is replaced by the new record, then the temp file is renamed over
checkpoint.pt. A kill between the last two renames leaves a record that names the temp file's checksum:
``load_checkpoint`` finishes the rename (roll forward). A failed write (a full disk) removes the temp files and
keeps the previous checkpoint and record untouched.

A full disk: torch.save reports the ENOSPC of the file it writes as ``RuntimeError: ... unexpected pos`` and
safetensors as ``SafetensorError: ... (os error 28)``; ``write_error`` finds the OSError behind either, so every
write of the run folder ends in one ``WriteFailed`` sentence naming the file and the reason.

Departures / choices:
1. SHA-256 over the file bytes, computed while writing (no second read). Loading reads the file twice (hash,
   then ``torch.load``); on the sizes one host trains that costs about a second per GB.
2. A record without a checksum (format 1, an early dfpo) is refused like a missing one: such a checkpoint cannot be
   told from a damaged or planted one.
"""

from __future__ import annotations

import hashlib
import json
import os
import pickle
import random
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from ...core.files import WriteFailed, describe_write_error, write_error, write_text_atomic
from .layout import RunDir

FORMAT = 3
"""Version of checkpoint.json and checkpoint.pt: 3 keeps every RNG state as plain data (2 added the checksum and
the config; 1: step and world size only)."""
_NUMPY_CORE = np._core if hasattr(np, "_core") else np.core  # renamed in NumPy 2
OLD_RNG_TYPES = (np.ndarray, np.dtype, type(np.dtype(np.uint32)), _NUMPY_CORE.multiarray._reconstruct)
"""What torch.load may build besides tensors and plain data: the NumPy RNG key of a format-2 checkpoint."""


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
        return read_record(run_dir)
    except ValueError:
        return None


def read_record(run_dir: Path) -> CheckpointMeta:
    """checkpoint.json of ``run_dir``; ValueError saying what is wrong with it (missing, empty, not JSON, no step)."""
    path = RunDir(run_dir).checkpoint_meta
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise ValueError(f"no {RunDir.CHECKPOINT_META} beside it") from None
    except (OSError, UnicodeDecodeError) as err:
        raise ValueError(f"{RunDir.CHECKPOINT_META} cannot be read ({err})") from None
    if not text.strip():
        raise ValueError(f"{RunDir.CHECKPOINT_META} is empty")
    try:
        raw = json.loads(text)
        return CheckpointMeta(
            step=int(raw["step"]),
            world_size=None if raw.get("world_size") is None else int(raw["world_size"]),
            sha256=raw.get("sha256"),
            size=raw.get("size"),
            config=raw.get("config"),
        )
    except (ValueError, KeyError, TypeError):
        raise ValueError(f"{RunDir.CHECKPOINT_META} is not valid JSON with a step (a torn or edited file)") from None


def checkpoint_step(run_dir: Path) -> int | None:
    """The step of the run folder's checkpoint from checkpoint.json (None if there is none)."""
    meta = read_meta(run_dir)
    return None if meta is None else meta.step


class _HashingWriter:
    """A binary file wrapper that hashes and counts every byte written through it, and keeps the OSError of a
    failed write (torch.save reports it as a RuntimeError without it)."""

    def __init__(self, fh):
        self.fh, self.hash, self.size = fh, hashlib.sha256(), 0
        self.error: OSError | None = None

    def write(self, data) -> int:
        self.hash.update(data)
        self.size += len(data)
        try:
            return self.fh.write(data)
        except OSError as err:
            self.error = err
            raise

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
    folder = RunDir(run_dir)
    path, tmp, meta_path = folder.checkpoint, folder.checkpoint_tmp, folder.checkpoint_meta
    if config is not None:
        state = {**state, "config": config}
    old_meta = meta_path.read_text() if meta_path.is_file() else None
    meta_written, writer = False, None
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
        cause = writer.error if writer is not None and writer.error is not None else write_error(err)
        if cause is not None:
            kept = checkpoint_step(run_dir)
            previous = f"the previous checkpoint (step {kept}) is kept" if kept is not None else "no earlier checkpoint exists"
            raise WriteFailed(
                f"writing checkpoint step {int(state['step'])} failed: {describe_write_error(path, cause)}; {previous}. "
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


def verified_record(run_dir: Path) -> CheckpointMeta:
    """checkpoint.json, if it can vouch for checkpoint.pt (readable, with a checksum); else a ValueError saying which
    and that nothing was loaded."""
    try:
        meta = read_record(run_dir)
    except ValueError as err:
        problem = str(err)
    else:
        if meta.sha256:
            return meta
        problem = f"{RunDir.CHECKPOINT_META} holds no checksum (written by an early dfpo)"
    raise ValueError(
        f"--resume {run_dir}: {problem}, so {RunDir(run_dir).checkpoint} cannot be verified and nothing was loaded (an unverified "
        f"checkpoint may be damaged or not this run's). Copy {RunDir.CHECKPOINT_META} back beside it from where {RunDir.CHECKPOINT} "
        "came from, or start the run again"
    )


def unsafe_objects(path: Path) -> list[str] | None:
    """What the pickle of checkpoint ``path`` would build besides tensors, plain data and ``OLD_RNG_TYPES``, read
    without running any of it ([] for a dfpo checkpoint); None when it cannot be read as a torch.save zip archive
    (a bare pickle, a truncated file: ``load_checkpoint`` says which)."""
    with torch.serialization.safe_globals(list(OLD_RNG_TYPES)):
        try:
            return torch.serialization.get_unsafe_globals_in_checkpoint(path)
        except Exception:  # noqa: BLE001 - torch raises several kinds for a file that is not its archive
            return None


def _unsafe_refused(run_dir: Path, path: Path, what: list[str]) -> ValueError:
    return ValueError(
        f"--resume {run_dir}: {path} holds objects that are not tensors or plain data ({', '.join(what[:5])}); it was not "
        "loaded, since loading it could run code, and dfpo writes none. Put back the checkpoint.pt this run wrote, or "
        "start the run again"
    )


def _present(run_dir: Path) -> Path:
    """checkpoint.pt of ``run_dir``; ValueError if it is missing or empty."""
    path = RunDir(run_dir).checkpoint
    if not path.is_file():
        raise ValueError(f"--resume {run_dir}: no {RunDir.CHECKPOINT} in it (the run stopped before its first checkpoint); start it again")
    if path.stat().st_size == 0:
        raise ValueError(f"--resume {run_dir}: {RunDir.CHECKPOINT} is empty (a write was cut off); start the run again")
    return path


def check_checkpoint(run_dir: Path) -> CheckpointMeta:
    """The cheap checks of a resume, before any work: checkpoint.pt is there and not empty, its record can vouch for
    it (``verified_record``), and its pickle asks for nothing but tensors and plain data. Returns the record;
    ValueError naming the file and what to do otherwise. ``load_checkpoint`` verifies the checksum."""
    run_dir = Path(run_dir)
    path = _present(run_dir)
    meta = verified_record(run_dir)
    what = unsafe_objects(path)
    if what:
        raise _unsafe_refused(run_dir, path, what)
    return meta


def _verified(run_dir: Path, meta: CheckpointMeta) -> None:
    """Check checkpoint.pt against the checksum of its record, finishing a rename a kill interrupted; ValueError
    if they differ."""
    path, tmp = RunDir(run_dir).checkpoint, RunDir(run_dir).checkpoint_tmp
    if file_sha256(path) == meta.sha256:
        tmp.unlink(missing_ok=True)  # a write cut off before its record: never part of the run
        return
    if tmp.is_file() and file_sha256(tmp) == meta.sha256:  # killed between the record and the rename: roll forward
        os.replace(tmp, path)
        return
    raise ValueError(
        f"--resume {run_dir}: {RunDir.CHECKPOINT} does not match the checksum in {RunDir.CHECKPOINT_META} (step {meta.step}, sha256 "
        f"{meta.sha256[:12]}..., {meta.size} bytes; the file has {path.stat().st_size} bytes): it was damaged after it was "
        "written (bit flips, a partial copy). Nothing was loaded; restore the run folder from a copy or start the run again"
    )


def load_checkpoint(run_dir: Path) -> dict:
    """checkpoint.pt, verified against checkpoint.json's checksum and read as tensors and plain data only, or a
    ValueError that says why it cannot be used (missing, empty, no record, damaged, truncated, not dfpo's)."""
    run_dir = Path(run_dir)
    path = _present(run_dir)
    _verified(run_dir, verified_record(run_dir))
    try:
        with torch.serialization.safe_globals(list(OLD_RNG_TYPES)):
            state = torch.load(path, map_location="cpu", weights_only=True)
    except pickle.UnpicklingError:  # weights_only refused something: never retried without it
        raise _unsafe_refused(run_dir, path, unsafe_objects(path) or ["a pickle that is not a torch.save archive"]) from None
    except Exception as err:  # truncated zip, bad pickle: torch raises several kinds
        raise ValueError(
            f"--resume {run_dir}: {RunDir.CHECKPOINT} is truncated or corrupt ({type(err).__name__}: {err}); start the run again"
        ) from None
    if not isinstance(state, dict) or "step" not in state:
        raise ValueError(f"--resume {run_dir}: {RunDir.CHECKPOINT} is not a dfpo checkpoint")
    return state


def seed_everything(seed: int) -> None:
    """Seed every generator ``rng_state`` saves (Python, NumPy, torch CPU and CUDA) from ``seed``."""
    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)


def rng_state() -> dict:
    """Every random generator the run draws from (Python, NumPy, torch CPU and CUDA), as tensors and plain data."""
    name, key, pos, has_gauss, gauss = np.random.get_state()
    state = {
        "python": random.getstate(),
        "numpy": (name, key.tolist(), pos, has_gauss, gauss),
        "torch": torch.get_rng_state(),
    }
    if torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def set_rng_state(state: dict) -> None:
    """Restore ``rng_state``'s generators (NumPy's key as a list of ints, or an ndarray in a format-2 checkpoint)."""
    random.setstate(state["python"])
    name, key, pos, has_gauss, gauss = state["numpy"]
    np.random.set_state((name, np.asarray(key, dtype=np.uint32), pos, has_gauss, gauss))
    torch.set_rng_state(state["torch"])
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])
