"""The logs of a run folder (JSONL flushed per line, TensorBoard, wandb) and the progress lines' rate.

The folder's layout and its checks are in ``folder``; checkpoints in ``checkpoint``; how a run stops on a signal
in ``signals``. On several processes
rank 0 alone writes the folder.
"""

from __future__ import annotations

import json
import math
import os
import time
from collections.abc import Callable
from pathlib import Path

from ...core.files import WriteFailed, describe_write_error, write_text_atomic
from .layout import RunDir


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
        try:
            self._fh = open(path, "a", encoding="utf-8")
        except OSError as err:
            raise WriteFailed(f"cannot open {describe_write_error(path, err)}") from None

    def write(self, record: dict) -> None:
        try:
            self._fh.write(json.dumps(record, sort_keys=True) + "\n")
            self._fh.flush()
        except OSError as err:  # a full disk: a torn last line at worst, which every reader skips
            raise WriteFailed(
                f"writing {describe_write_error(self.path, err)}; the last checkpoint is kept. Free space, then continue with: "
                f"dfpo train --resume {self.path.parent}"
            ) from None

    def close(self) -> None:
        self._fh.close()

    @staticmethod
    def truncate(path: Path, keep) -> None:
        """Rewrite ``path`` atomically with only the records for which ``keep(record)`` holds."""
        if not path.exists():
            return
        kept = [json.dumps(rec, sort_keys=True) for rec in JsonlLog.read(path) if keep(rec)]
        write_text_atomic(path, "".join(line + "\n" for line in kept))

    @staticmethod
    def read(path: Path) -> list[dict]:
        """The records of a JSONL file; lines that are not a JSON object (cut by a kill) are skipped. Lines end at
        "\\n" only: U+2028 or NEL inside a string is text, not a line break."""
        if not path.exists():
            return []
        out = []
        for line in path.read_text(encoding="utf-8", errors="replace").split("\n"):
            try:
                rec = json.loads(line)
            except json.JSONDecodeError:
                continue
            if isinstance(rec, dict):
                out.append(rec)
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

                self.tb = SummaryWriter(str(RunDir(run_dir).tensorboard), purge_step=purge_step)
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


def missing_steps(rows: list[dict], last: int) -> list[int]:
    """Steps 1..last that have no line in a metrics log (lost to a crash)."""
    have = {r.get("step") for r in rows}
    return [s for s in range(1, last + 1) if s not in have]


IMPORTED_AT = time.monotonic()
"""When this module was imported (``dfpo.cli`` imports it first thing, so: the start of a ``dfpo`` process), the
clock ``process_age_s`` falls back on where the OS does not say when the process started."""
PROGRESS_EVERY_S = 30.0
"""Without a progress bar (``--quiet``, or ``log.progress = false``): at most one progress line this often, during
the training steps and the tiny preset's warm-up."""


class Every:
    """``due()`` is True at most once per ``seconds`` of ``clock`` (monotonic), counted from construction: the rate
    of the progress lines printed without a bar."""

    def __init__(self, seconds: float, clock: Callable[[], float] = time.monotonic):
        self.seconds, self.clock = seconds, clock
        self.last = clock()

    def due(self) -> bool:
        now = self.clock()
        if now - self.last < self.seconds:
            return False
        self.last = now
        return True


def process_age_s() -> float:
    """Seconds since this process started, as the operating system records it (Linux: the start time in
    /proc/self/stat against /proc/uptime, both in 10 ms ticks since boot), so the interpreter's start and every
    import count, as in ``/usr/bin/time``'s elapsed time. Without /proc: since ``dfpo.cli`` was imported."""
    try:
        with open("/proc/self/stat", encoding="ascii") as fh:
            start_ticks = int(fh.read().rsplit(")", 1)[1].split()[19])  # field 22, starttime; the name may hold spaces
        with open("/proc/uptime", encoding="ascii") as fh:
            uptime = float(fh.read().split()[0])
        return max(0.0, uptime - start_ticks / os.sysconf("SC_CLK_TCK"))
    except (OSError, ValueError, IndexError):
        return time.monotonic() - IMPORTED_AT
