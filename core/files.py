"""Output paths checked before any work, and files written so that nothing is lost half-way."""

from __future__ import annotations

import contextlib
import errno
import os
import re
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import BinaryIO

DISK_FULL_ERRNOS = (errno.ENOSPC, errno.EDQUOT, errno.EFBIG)
WRITE_ERRNOS = (*DISK_FULL_ERRNOS, errno.EROFS, errno.EACCES, errno.EPERM)
"""The errors of a write that the user mends (space, a read-only disk, permissions): the command line names the
file in one sentence instead of a traceback."""


class WriteFailed(RuntimeError):
    """A file of the run folder could not be written (a full disk, a quota, permissions); what was written
    before is kept. The message says what failed and what to do; the command line prints it without a traceback."""


def describe_write_error(path: Path, err: OSError) -> str:
    """``path: <the reason in words>`` for an OSError of a write."""
    if err.errno in DISK_FULL_ERRNOS:
        return f"{path}: no space left on the device (or the quota is used up): {err.strerror or err}"
    return f"{path}: {err.strerror or err}"


def write_error(err: BaseException) -> OSError | None:
    """The OSError behind a failed write: ``err`` itself, or the one a library reported only in its message
    (safetensors: ``SafetensorError: ... I/O error: No space left on device (os error 28)``); None for any other
    error (a bug, which keeps its traceback)."""
    if isinstance(err, OSError):
        return err
    found = re.search(r"\(os error (\d+)\)", str(err))
    if found is None:
        return None
    code = int(found.group(1))
    return OSError(code, os.strerror(code))


def write_run_file(path: Path, text: str) -> None:
    """``write_text_atomic`` for a file of the run folder: on failure the old file stays, the temp file is gone, and
    ``WriteFailed`` names the file and the reason."""
    try:
        write_text_atomic(path, text)
    except OSError as err:
        raise WriteFailed(f"writing {describe_write_error(path, err)}; the previous version of the file is kept") from None


def check_output_file(flag: str, path: str | os.PathLike) -> None:
    """ValueError naming ``flag`` and the path unless a file can be written there."""
    path = Path(path)
    parent = path.resolve().parent
    if path.is_dir():
        raise ValueError(f"{flag} {str(path)!r} is a directory, expected a file path")
    if not parent.is_dir():
        raise ValueError(f"{flag} {str(path)!r}: directory {str(parent)!r} does not exist")
    if not os.access(parent, os.W_OK) or (path.exists() and not os.access(path, os.W_OK)):
        raise ValueError(f"{flag} {str(path)!r} cannot be written (permission denied)")


def check_writable_folder(flag: str, path: str | os.PathLike) -> None:
    """ValueError naming ``flag`` unless ``path`` is a writable folder or can be created. Touches nothing."""
    path = Path(path)
    if path.exists() and not path.is_dir():
        raise ValueError(f"{flag} {str(path)!r} is a file, expected a folder")
    existing = next(p for p in (path, *path.parents) if p.exists())
    if not existing.is_dir() or not os.access(existing, os.W_OK):
        what = "written" if existing == path else "created"
        raise ValueError(f"{flag} {str(path)!r} cannot be {what}: {str(existing)!r} is not a writable folder")


def check_output_dir(flag: str, path: str | os.PathLike, *, force: bool, marker: str) -> None:
    """ValueError unless ``path`` can hold a new run: creatable, writable, and not an earlier run
    (a folder holding ``marker``) unless ``force``. Touches nothing."""
    check_writable_folder(flag, path)
    if (Path(path) / marker).exists() and not force:
        raise ValueError(f"{flag} {str(path)!r} already holds a run ({marker}); pass --force to overwrite it or choose another folder")


@contextlib.contextmanager
def naming_write_errors(path: str | os.PathLike) -> Iterator[None]:
    """Give an OSError raised inside the block the file name it lacks (a buffered file's flush, ``os.fsync``), so
    the command line can name the file in one sentence."""
    try:
        yield
    except OSError as err:
        if err.filename is None and err.errno is not None:  # an error of the system (one made up in Python keeps its words)
            err.filename = str(path)
        raise


def write_atomic(path: str | os.PathLike, write: Callable[[BinaryIO], None]) -> None:
    """Call ``write`` on a temporary binary file beside ``path`` and rename it over ``path``: a reader (or a crash
    half-way) sees the old file or the new one, never a torn one. A ``path`` that is a symbolic link is replaced by
    the new file (its target is left as it was)."""
    path = Path(path)
    with naming_write_errors(path):
        fd, tmp = tempfile.mkstemp(dir=path.parent.resolve(), prefix=f".{path.name}.", suffix=".tmp")
        try:
            os.fchmod(fd, _file_mode(path))  # mkstemp makes 0600; keep the old file's mode, or the umask's default
            with os.fdopen(fd, "wb") as fh:
                write(fh)
                fh.flush()
                os.fsync(fh.fileno())
            os.replace(tmp, path)
        except BaseException:
            Path(tmp).unlink(missing_ok=True)
            raise


def write_text_atomic(path: str | os.PathLike, text: str) -> None:
    """Write ``text`` (UTF-8) to ``path`` atomically (``write_atomic``)."""
    write_atomic(path, lambda fh: fh.write(text.encode("utf-8")))


def _file_mode(path: Path) -> int:
    """The permission bits a rewrite of ``path`` keeps: the existing file's, else what ``open`` would give (0666 - umask)."""
    try:
        return path.stat().st_mode & 0o7777
    except OSError:
        umask = os.umask(0)
        os.umask(umask)
        return 0o666 & ~umask


def check_input_file(flag: str, path: str | os.PathLike) -> None:
    """ValueError naming ``flag`` and the path unless it is a regular file that can be read (a folder, a FIFO or a
    device given as a file is named as such: reading a FIFO would wait forever)."""
    path = Path(path)
    if not path.exists():
        raise ValueError(f"{flag} {str(path)!r}: no such file")
    if path.is_dir():
        raise ValueError(f"{flag} {str(path)!r} is a directory, expected a file")
    if not path.is_file():
        raise ValueError(f"{flag} {str(path)!r} is not a regular file (a FIFO, socket or device); give the path of a file")
    if not os.access(path, os.R_OK):
        raise ValueError(f"{flag} {str(path)!r} cannot be read (permission denied)")


def read_utf8(path: str | os.PathLike) -> str:
    """A text file's content; ValueError ``FILE:LINE: not UTF-8`` at the first line that does not decode."""
    data = Path(path).read_bytes()
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as err:
        line = data[: err.start].count(b"\n") + 1
        raise ValueError(f"{path}:{line}: not UTF-8 ({err.reason} at byte {err.start})") from None
