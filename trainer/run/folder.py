"""The run folder: checked, locked and claimed before any expensive work; never cleared unless it is this trainer's.

Layout of RUN_DIR::

    .dfpo-run.json    the mark of dfpo train: written when it claims a new or empty folder; from the first
                      checkpoint on it holds the run's identity
    .lock             flock held by the process training in the folder (its PID inside)
    config.toml       the resolved config (``--resume`` reads it back and checks it against the checkpoint)
    checkpoint.pt     the last good checkpoint, with checkpoint.json (step, config, SHA-256; ``checkpoint``)
    metrics.jsonl     one object per training step, flushed
    eval.jsonl        one object per evaluation
    samples.jsonl     sample completions
    summary.json      run-level metrics (Jitter2, Steps(reward >= kappa), final eval)
    tax_reference.pt  pi_init at the eval prompts' positions, scored at the step-0 eval (eval/tax_kl; ``stages.tax``):
                      a resume measures against it, a start from step 0 scores it again
    tb/               TensorBoard events
    init_model/       the tiny preset after its warm-start (model + tokenizer), and .dfpo-files.json: the name and
                      size of every file written there, written last

A fresh start clears a folder only when all of these hold: it carries the mark, the mark says no checkpoint was
ever written in it, it holds no summary.json, and everything in it is a file dfpo train writes before its first
checkpoint (a run killed during start-up, or a run with train.save_every = 0 killed before its end: its logs,
tb/'s event files and tax_reference.pt too): in init_model/ only the files its .dfpo-files.json names (or, when a kill cut the save short
before that record, only files save_pretrained writes), never a subfolder or a link. Anything else that is not
empty is refused, naming what is in the way, and nothing is deleted: a project folder that happens to hold a
``config.toml``, a finished run whose checkpoint was pruned, a folder of an older dfpo without the mark, a run
someone started inside a leftover's init_model/.

A run's identity (``run_identity``): its objective label, its seed, and the SHA-256 of its config without the keys
a resume may change (``RESUME_IGNORED``). It is written into the mark with the run's first checkpoint; a resume
refuses a folder whose mark names another run than its checkpoint.json (files of two runs copied together), and
``dfpo compare`` refuses a folder that does not hold the run of its label and seed.
"""

from __future__ import annotations

import hashlib
import json
import os
import time
from collections.abc import Callable
from pathlib import Path

from ...core.files import WriteFailed, check_writable_folder, describe_write_error, write_error, write_run_file, write_text_atomic
from ...core.loss.objectives import format_objective_label
from .checkpoint import check_checkpoint, checkpoint_step, read_meta
from .code import code_record, recorded_sources, source_sha256
from .layout import RunDir
from .resume import RESUME_IGNORED, flat_items

INIT_MODEL_RECORD = ".dfpo-files.json"
"""In init_model/: the name and size of each file dfpo train wrote there, written after them."""
SAVE_PRETRAINED_FILES = frozenset(
    {
        "config.json",
        "generation_config.json",
        "model.safetensors",
        "tokenizer.json",
        "tokenizer_config.json",
        "special_tokens_map.json",
        "added_tokens.json",
        "chat_template.jinja",
    }
)
"""What save_pretrained writes for the tiny preset (some names only in some transformers versions): all that an
init_model/ whose save was cut off before its record may hold."""


ATOMIC_FILES = RunDir.STARTUP_FILES | {RunDir.TAX_REFERENCE}
"""The files written before a first checkpoint through a temporary ``.NAME.*.tmp`` beside them (``write_text_atomic``,
``tax.save_reference``), which a kill may leave behind."""


def _is_own_temp_file(name: str) -> bool:
    """A temp file of ``write_text_atomic`` or ``tax.save_reference`` for one of ``ATOMIC_FILES``
    (``.config.toml.x1y2.tmp``, ``.tax_reference.pt.x1y2.tmp``)."""
    return name.startswith(".") and name.endswith(".tmp") and any(name.startswith(f".{f}.") for f in ATOMIC_FILES)


def read_mark(run_dir: Path) -> dict | None:
    """The mark dfpo train left in ``run_dir`` (None: no mark, or not one of ours)."""
    try:
        mark = json.loads(RunDir(run_dir).mark.read_text())
    except (OSError, ValueError):
        return None
    return mark if isinstance(mark, dict) and mark.get("written_by") == "dfpo train" else None


def write_mark(run_dir: Path, *, checkpointed: bool, identity: dict | None = None) -> None:
    """Claim ``run_dir`` for dfpo train (``checkpointed``: a checkpoint has been written in it at least once;
    ``identity``: the run's, ``run_identity``, else the one the mark holds already)."""
    previous = read_mark(run_dir) or {}
    mark = {
        "written_by": "dfpo train",
        "created": previous.get("created", time.strftime("%Y-%m-%dT%H:%M:%S%z")),
        "checkpointed": checkpointed,
    }
    identity = identity or previous.get("identity")
    if identity:
        mark["identity"] = identity
    record, earlier = code_record(), previous.get("code")
    codes = [c for c in earlier if isinstance(c, dict)] if isinstance(earlier, list) else []
    mark["code"] = codes if record in codes else [*codes, record]  # every code that trained part of the run
    write_run_file(RunDir(run_dir).mark, json.dumps(mark, sort_keys=True) + "\n")


def foreign_code(out: Path) -> tuple[list[Path], int]:
    """The run folders under ``out`` (any depth) not trained by this code alone (another fingerprint, or none
    recorded), and how many run folders there are."""
    current, foreign, total = source_sha256(), [], 0
    for mark_path in sorted(Path(out).rglob(RunDir.MARK)):
        mark = read_mark(mark_path.parent)
        if mark is None:
            continue
        total += 1
        if recorded_sources(mark) != [current]:
            foreign.append(mark_path.parent)
    return foreign, total


def _resume_may_change(key: str) -> bool:
    return any(key == k or key.startswith(k + ".") for k in RESUME_IGNORED)


def objective_label(name: str, overrides: dict) -> str:
    """``dfpo_min:length_aware=true:stopgrad=score``: the preset and its overrides as ``dfpo compare`` labels it."""
    return format_objective_label(name, overrides)


def run_identity(config: dict, keys: set[str] | None = None) -> dict:
    """The identity of the run a config (``config_to_dict``, or one read back from JSON) defines: its objective
    label, its seed, and the SHA-256 of every key but those a resume may change (``RESUME_IGNORED``). ``keys``: only
    these dotted keys enter the hash (the identity a run of an older dfpo, whose config had only those, recorded)."""
    objective = config.get("objective") or {}
    defining = {k: v for k, v in flat_items(config).items() if not _resume_may_change(k) and (keys is None or k in keys)}
    return {
        "objective": objective_label(str(objective.get("name")), objective.get("overrides") or {}),
        "seed": config.get("seed"),
        "config_sha256": hashlib.sha256(json.dumps(defining, sort_keys=True).encode()).hexdigest(),
    }


def describe_identity(identity: dict, where: str = "") -> str:
    """``dfpo_min seed 0 (config 1a2b3c4d5e6f[, where])``."""
    return f"{identity.get('objective')} seed {identity.get('seed')} (config {str(identity.get('config_sha256'))[:12]}{', ' + where if where else ''})"


def folder_identity(run_dir: Path) -> dict | None:
    """The identity of the run in ``run_dir``: the one its mark records, else that of the config its checkpoint.json
    keeps (a folder of an older dfpo); None when neither says."""
    mark = read_mark(run_dir) or {}
    if mark.get("identity"):
        return mark["identity"]
    meta = read_meta(run_dir)
    return run_identity(meta.config) if meta is not None and meta.config else None


def check_run_dir_path(run_dir: Path) -> None:
    """ValueError naming the link when ``run_dir``, or a folder above it, is a symbolic link that leads nowhere
    (its target is missing, or it loops): the folder could not be created through it."""
    for p in (run_dir, *run_dir.parents):
        if p.is_symlink() and not p.exists():
            where = "is a symbolic link" if p == run_dir else f"lies under {str(p)!r}, a symbolic link"
            raise ValueError(
                f"run_dir {str(run_dir)!r} {where} to {os.readlink(p)!r}, which does not exist or loops back to itself; "
                "point the link at a folder, or choose another folder (--set run_dir=...)"
            )


def _init_model_record(folder: Path) -> dict[str, int] | None:
    """{file name: size} that init_model/.dfpo-files.json records (None: no readable record)."""
    try:
        files = json.loads((folder / INIT_MODEL_RECORD).read_text())["files"]
    except (OSError, ValueError, KeyError, TypeError):
        return None
    return {str(name): int(size) for name, size in files.items()} if isinstance(files, dict) else None


def write_init_model(folder: Path, save: Callable[[Path], None]) -> None:
    """``save(folder)`` into the new folder RUN_DIR/init_model, then its record of what was written. A folder
    already there is refused (something else wrote it while this run started); a write that fails (a full disk,
    including safetensors' SafetensorError) is one ``WriteFailed`` sentence."""
    try:
        folder.mkdir()
        save(folder)
        files = {p.name: p.stat().st_size for p in sorted(folder.iterdir())}
        write_text_atomic(folder / INIT_MODEL_RECORD, json.dumps({"written_by": "dfpo train", "files": files}, sort_keys=True))
    except FileExistsError:
        raise ValueError(
            f"run_dir {str(folder.parent)!r}: {folder} appeared while this run was starting, written by something else; "
            "nothing was deleted. Choose another folder (--set run_dir=...)"
        ) from None
    except Exception as err:
        cause = write_error(err)
        if cause is None:
            raise
        raise WriteFailed(
            f"writing the tiny preset's warm-started model failed: {describe_write_error(folder, cause)}; nothing written "
            "before is lost. Free space, then run the same command again (it clears what this start wrote)"
        ) from None


UNCHECKPOINTED_FILES = RunDir.STARTUP_FILES | set(RunDir.LOGS) | {RunDir.TAX_REFERENCE}
"""What a run that never wrote a checkpoint may leave (besides init_model/ and tb/, and the temporary files of
``_is_own_temp_file``): its start-up files, and of a run with train.save_every = 0 that died before its end, its logs
and the learning tax's pi_init (``RunDir.TAX_REFERENCE``, written by ``stages.tax`` at the step-0 eval). Clearing that one is right:
the run starts again from the initial weights and its step-0 eval scores pi_init again."""
TENSORBOARD_PREFIX = "events.out.tfevents."
"""The name of every file TensorBoard's SummaryWriter writes into tb/."""


def _tensorboard_leftovers(folder: Path) -> tuple[list[Path], list[str]]:
    """(the event files of tb/, the names of everything else in it: a subfolder, a link, any other file)."""
    files, foreign = [], []
    for p in sorted(folder.iterdir()):
        if p.name.startswith(TENSORBOARD_PREFIX) and p.is_file() and not p.is_symlink():
            files.append(p)
        else:
            foreign.append(f"{RunDir.TENSORBOARD}/{p.name}")
    return files, foreign


def _init_model_leftovers(folder: Path) -> tuple[list[Path], list[str]]:
    """(the files of a start-up leftover's init_model/ dfpo train wrote, the names of everything else in it)."""
    record = _init_model_record(folder)
    ours = SAVE_PRETRAINED_FILES if record is None else {*record, INIT_MODEL_RECORD}
    files, foreign = [], []
    for p in sorted(folder.iterdir()):
        if p.name in ours and p.is_file() and not p.is_symlink():
            files.append(p)
        else:
            foreign.append(f"{RunDir.INIT_MODEL}/{p.name}")
    return files, foreign


def init_model_problem(run_dir: Path) -> str | None:
    """What is wrong with the tiny preset's init_model/ for a resume (None: nothing): missing, or a file its record
    names missing or of another size (an older dfpo wrote no record: config.json and model.safetensors must be there)."""
    folder = RunDir(run_dir).init_model
    if not folder.is_dir():
        return "is missing"
    expected = _init_model_record(folder) or {"config.json": None, "model.safetensors": None}
    for name, size in expected.items():
        path = folder / name
        if not path.is_file():
            return f"lacks {name}"
        if size is not None and path.stat().st_size != size:
            return f"holds a {name} of {path.stat().st_size} bytes where {size} were written"
    return None


def startup_leftovers(run_dir: Path) -> list[Path]:
    """What a fresh start in ``run_dir`` clears, checked without touching anything: the files (and then the emptied
    init_model/) of a run of ours killed during its start-up, [] for an empty folder; ValueError naming the folder
    and the reason for everything else."""
    run_dir = Path(run_dir)
    contents = sorted(p for p in run_dir.iterdir() if p.name != RunDir.LOCK) if run_dir.is_dir() else []
    if not contents:
        return []
    if (run_dir / RunDir.CHECKPOINT).is_file():
        raise ValueError(
            f"run_dir {str(run_dir)!r} holds a run (checkpoint at step {checkpoint_step(run_dir)}); continue it with "
            f"--resume {run_dir} or choose another folder (--set run_dir=...)"
        )
    names = ", ".join(p.name for p in contents[:5]) + (" ..." if len(contents) > 5 else "")
    mark = read_mark(run_dir)
    if mark is None:
        raise ValueError(
            f"run_dir {str(run_dir)!r} is not empty ({names}) and was not started by dfpo train (no {RunDir.MARK}); nothing was "
            "deleted. Choose another folder (--set run_dir=...) or empty it yourself"
        )
    if mark.get("checkpointed"):
        raise ValueError(
            f"run_dir {str(run_dir)!r} holds a dfpo run whose {RunDir.CHECKPOINT} is gone ({names}); its files are kept and nothing "
            f"was deleted. Put {RunDir.CHECKPOINT} back to --resume it, or choose another folder (--set run_dir=...)"
        )
    if (run_dir / RunDir.SUMMARY).is_file():
        raise ValueError(
            f"run_dir {str(run_dir)!r} holds a finished dfpo run that kept no checkpoint (train.save_final = false); nothing "
            "was deleted. Choose another folder (--set run_dir=...)"
        )
    clear, foreign = [], []
    for p in contents:
        if p.name == RunDir.INIT_MODEL and p.is_dir() and not p.is_symlink():
            files, others = _init_model_leftovers(p)
            clear += [*files, p]
            foreign += others
        elif p.name == RunDir.TENSORBOARD and p.is_dir() and not p.is_symlink():  # a run without checkpoints (save_every = 0)
            files, others = _tensorboard_leftovers(p)
            clear += [*files, p]
            foreign += others
        elif (p.name in UNCHECKPOINTED_FILES or _is_own_temp_file(p.name)) and p.is_file() and not p.is_symlink():
            clear.append(p)
        else:
            foreign.append(p.name)
    if foreign:
        raise ValueError(
            f"run_dir {str(run_dir)!r} holds a run that stopped before its first checkpoint, and files dfpo train did not "
            f"write ({', '.join(foreign[:5])}); nothing was deleted. Choose another folder (--set run_dir=...) or move them"
        )
    return [p for p in clear if p.name != RunDir.MARK]


def check_resumable(run_dir: Path, *, steps: int) -> dict | None:
    """What a resume needs, checked before any work: a checkpoint its record vouches for (``check_checkpoint``), a
    step within ``steps``, a mark and a record of the same run, and the tiny preset's init_model/. Returns the run's
    identity; ValueError naming the folder, the file and what to do otherwise."""
    run_dir = Path(run_dir)
    meta = check_checkpoint(run_dir)
    if steps < meta.step:
        raise ValueError(
            f"--resume {run_dir}: train.steps={steps} is below the checkpoint's step {meta.step}; give train.steps >= {meta.step}"
        )
    found = run_identity(meta.config) if meta.config else None
    started = (read_mark(run_dir) or {}).get("identity")
    if started and found and started != found:
        raise ValueError(
            f"--resume {run_dir}: the folder holds the run {describe_identity(started, RunDir.MARK)}, but its {RunDir.CHECKPOINT_META} "
            f"is of the run {describe_identity(found, RunDir.CHECKPOINT_META)}: files of two runs are mixed, so nothing was loaded or "
            f"written. Put back this folder's own {RunDir.CHECKPOINT}, {RunDir.CHECKPOINT_META} and {RunDir.CONFIG}, or resume the other run "
            "in its own folder"
        )
    problem = init_model_problem(run_dir) if (meta.config or {}).get("model", {}).get("name") == "tiny" else None
    if problem:
        raise ValueError(
            f"--resume {run_dir}: {run_dir / RunDir.INIT_MODEL} {problem}: it holds the tiny preset's warm-started model, which "
            "this run started from and which a resume does not build again. Restore it from a copy of the run folder, "
            "or start the run again in a new folder"
        )
    return started or found


class RunFolderLock:
    """Exclusive use of a run folder: ``flock`` on RUN_DIR/.lock, the holder's PID written in it.

    The operating system releases the lock when its process dies, however it dies, so a lock
    left by a killed run is simply taken over; a live holder makes ``acquire`` fail at once.
    """

    def __init__(self, run_dir: Path):
        self.path = RunDir(run_dir).lock
        self._fh = None
        self.created_folder = False  # set by prepare_run_folder when it made the folder
        self.created_file = False

    def acquire(self, *, claim: bool = True) -> None:
        """Take the lock (ValueError naming the holder if a live process has it); ``claim``: write this PID in it."""
        import fcntl

        self.created_file = not self.path.exists()
        try:
            fh = open(self.path, "a+")
        except OSError as err:
            raise WriteFailed(f"creating {describe_write_error(self.path, err)}; nothing was written") from None
        try:
            fcntl.flock(fh.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            fh.seek(0)
            holder = fh.read().strip() or "unknown"
            fh.close()
            raise ValueError(
                f"run_dir {str(self.path.parent)!r} is in use by process {holder} (another dfpo train); wait for it or stop it"
            ) from None
        self._fh = fh
        if claim:  # unbuffered: a write that fails leaves nothing for close() to fail on again
            try:
                os.ftruncate(fh.fileno(), 0)
                os.write(fh.fileno(), str(os.getpid()).encode())
            except OSError as err:
                raise WriteFailed(f"writing {describe_write_error(self.path, err)}; nothing else was written") from None

    def release(self) -> None:
        if self._fh is not None:
            self._fh.close()  # closing the file drops the flock
            self._fh = None

    def abandon(self) -> None:
        """Release, and take back what this run added to a folder it is giving up: the whole folder if it made it and
        wrote nothing but its lock and mark, else the lock file if it made that (a refused folder is left as found)."""
        self.release()
        folder = self.path.parent
        if self.created_folder and folder.is_dir() and {p.name for p in folder.iterdir()} <= {RunDir.LOCK, RunDir.MARK}:
            for name in (RunDir.LOCK, RunDir.MARK):
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
    check_run_dir_path(run_dir)
    check_writable_folder("run_dir", run_dir)
    if not run_dir.is_dir():
        return
    if (run_dir / RunDir.LOCK).exists():
        probe = RunFolderLock(run_dir)
        probe.acquire(claim=False)  # ValueError naming the holder when another process trains here
        probe.release()
    if resume:
        check_resumable(run_dir, steps=steps)
    else:
        startup_leftovers(run_dir)


def prepare_run_folder(run_dir: Path, *, resume: bool, steps: int) -> RunFolderLock:
    """Check, lock and claim a run folder before any expensive work; return the held lock.

    Refused at once, naming the folder: a broken link, a file in the way, a folder that cannot be written, a folder
    another process is using, anything ``startup_leftovers`` or (resuming) ``check_resumable`` refuses. A new or empty
    folder gets the mark; a fresh start over a run of this trainer that was killed during its start-up clears the
    files that run wrote, one by one (a folder only once it is empty).
    """
    run_dir = Path(run_dir)
    check_run_dir_path(run_dir)
    check_writable_folder("run_dir", run_dir)
    created = not run_dir.exists()
    try:
        run_dir.mkdir(parents=True, exist_ok=True)
    except OSError as err:
        raise WriteFailed(f"creating {describe_write_error(run_dir, err)}; nothing was written") from None
    lock = RunFolderLock(run_dir)
    lock.created_folder = created
    try:
        lock.acquire()
        if resume:
            identity = check_resumable(run_dir, steps=steps)
        else:
            identity = None
            for p in startup_leftovers(run_dir):  # a run of ours killed during start-up: start it again
                if p.is_dir():
                    p.rmdir()  # init_model/, emptied of its files just before
                else:
                    p.unlink()
        write_mark(run_dir, checkpointed=resume, identity=identity)  # a resumed folder is never a start-up leftover
        return lock
    except BaseException:
        lock.abandon()
        raise
