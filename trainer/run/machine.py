"""The machine a run trained on, in one line, so that every time a run records has its machine beside it.

``dfpo train`` writes it into summary.json (``machine``); ``dfpo compare`` sums its cells' times per machine; README's
measured run stores it with the run. A speed figure without its machine cannot be read: the same step takes 15 s on
idle cores and 200 s under load, and a GPU changes everything.
"""

from __future__ import annotations

import os
import re
import sys
from pathlib import Path

NOT_RECORDED = "not recorded (trained before dfpo recorded the machine)"
"""How a run whose summary.json has no ``machine`` is counted."""


def _first(pattern: str, path: str) -> str | None:
    """The first group of ``pattern`` in the text file ``path`` (multiline), or None where the file or the line is absent."""
    try:
        text = Path(path).read_text(encoding="utf-8", errors="replace")
    except OSError:
        return None
    found = re.search(pattern, text, re.M)
    return found[1].strip() if found else None


def usable_cores() -> int:
    """The cores this process may run on (its affinity where the platform has one, else the logical CPU count)."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:
        return os.cpu_count() or 1


def cuda_device_name() -> str | None:
    """The name of the current CUDA device where this process has already initialised CUDA, else None (nothing is
    initialised here: a CPU run stays a CPU run)."""
    torch = sys.modules.get("torch")
    if torch is None or not torch.cuda.is_initialized():
        return None
    return torch.cuda.get_device_name(torch.cuda.current_device())


def machine_line() -> str:
    """'2-core AMD EPYC 7B13, 23.5 GiB' for the machine this process runs on: the cores it may use and
    /proc/cpuinfo's model name, /proc/meminfo's MemTotal, then the CUDA device it uses, if any."""
    model = _first(r"^model name\s*:\s*(.+)$", "/proc/cpuinfo") or "CPU"
    total_kb = _first(r"^MemTotal:\s*(\d+) kB", "/proc/meminfo")
    parts = [f"{usable_cores()}-core {model}"]
    parts += [f"{int(total_kb) / 2**20:.1f} GiB"] if total_kb else []
    gpu = cuda_device_name()
    parts += [f"GPU {gpu}"] if gpu else []
    return ", ".join(parts)


_READABLE = re.compile(r"[A-Za-z0-9 ,.;:()+/%-]{1,200}")
"""What a recorded machine line may hold to be shown: letters, digits and plain punctuation, nothing markdown or HTML
reads (it comes from a run folder, which is data)."""


def recorded_machine(value: object) -> str:
    """The machine line a run's summary.json recorded (``machine``), checked before it is shown; ``NOT_RECORDED`` for
    a run older than that record, and a sentence saying so for one that is not a plain line."""
    if value is None:
        return NOT_RECORDED
    if isinstance(value, str) and _READABLE.fullmatch(value):
        return value
    return "unreadable (the summary's machine is not a plain line of text)"
