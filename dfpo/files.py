"""Output paths checked before any work, and files written so that nothing is lost half-way."""

from __future__ import annotations

import os
import tempfile
from pathlib import Path


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


def write_text_atomic(path: str | os.PathLike, text: str) -> None:
    """Write ``text`` to a temporary file beside ``path`` and rename it over ``path``: a reader
    (or a crash half-way) sees the old file or the new one, never a torn one."""
    path = Path(path)
    fd, tmp = tempfile.mkstemp(dir=path.resolve().parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        os.fchmod(fd, _file_mode(path))  # mkstemp makes 0600; keep the old file's mode, or the umask's default
        with os.fdopen(fd, "w", encoding="utf-8") as fh:
            fh.write(text)
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


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
