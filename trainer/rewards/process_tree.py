"""Finding and killing the processes a reward worker started, whatever session they made (Linux /proc).

A worker is a child subreaper (``worker``): what its reward forks stays its descendant, through setsid
and double forks, while it lives. ``kill_tree`` stops the worker, kills its descendants until none is left
(an orphan of a killed one is handed to the stopped worker, so it is found in the next round), then the worker.
A worker that died on its own has handed its orphans to init: ``marked_processes`` finds them by the
environment variable every worker's process inherits (``worker.MARKER_VARIABLE``), and the pool kills
those too. Only processes with that marker, or below a worker, are ever signalled.

Standard library only. Where /proc is missing (not Linux) the lists are empty and only the worker's process
group is killed.
"""

from __future__ import annotations

import os
import signal

MAX_ROUNDS = 100
"""Rounds of 'list the descendants, kill them' before giving up on a tree that keeps forking (each round kills
every process found, so a tree needs as many rounds as it forks faster than SIGKILL lands: one or two)."""


def _pids() -> list[int]:
    try:
        return [int(name) for name in os.listdir("/proc") if name.isdigit()]
    except OSError:
        return []


def _parent_and_state(pid: int) -> tuple[int, str] | None:
    """(parent pid, state letter) from /proc/PID/stat; None when the process is gone."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            stat = f.read()
    except OSError:
        return None
    fields = stat[stat.rfind(b")") + 2 :].split()  # after '(comm)', which may hold spaces and parentheses
    return int(fields[1]), fields[0].decode()


def live_descendants(root: int) -> list[int]:
    """Every living (not zombie) descendant of ``root``, parents before their children."""
    children: dict[int, list[int]] = {}
    for pid in _pids():
        found = _parent_and_state(pid)
        if found is not None and found[1] != "Z":
            children.setdefault(found[0], []).append(pid)
    out, todo = [], list(children.get(root, []))
    while todo:
        pid = todo.pop()
        out.append(pid)
        todo.extend(children.get(pid, []))
    return out


def _signal(pid: int, sig: int) -> None:
    try:
        os.kill(pid, sig)
    except (ProcessLookupError, PermissionError):  # gone already, or not ours to signal
        pass


def kill_tree(root: int) -> None:
    """SIGKILL ``root``'s descendants and its process group, then ``root`` (which its caller reaps).

    ``root`` is stopped first: it forks nothing more, and as a subreaper it keeps the orphans of the
    descendants killed here (unreaped), so every round finds the ones the last round left."""
    _signal(root, signal.SIGSTOP)
    for _ in range(MAX_ROUNDS):
        found = live_descendants(root)
        if not found:
            break
        for pid in found:
            _signal(pid, signal.SIGKILL)
    try:
        os.killpg(root, signal.SIGKILL)  # the worker leads its own session: its group, /proc or not
    except (ProcessLookupError, PermissionError):
        pass
    _signal(root, signal.SIGKILL)


def _environment_has(pid: int, entry: bytes, prefix: bool) -> bool:
    try:
        with open(f"/proc/{pid}/environ", "rb") as f:
            variables = f.read().split(b"\0")
    except OSError:  # gone, or another user's
        return False
    return any(v.startswith(entry) if prefix else v == entry for v in variables)


def marked_processes(variable: str, value: str, *, prefix: bool = False) -> list[int]:
    """Living processes (this one excluded) whose environment holds ``variable=value`` (``value`` a prefix of
    theirs if ``prefix``). The environment read is the one a process started with: a reward that changes
    ``os.environ`` keeps the mark; one that starts a program with an environment of its own drops it."""
    entry = f"{variable}={value}".encode()
    me = os.getpid()
    return [pid for pid in _pids() if pid != me and _environment_has(pid, entry, prefix)]


def kill_marked(variable: str, value: str, *, prefix: bool = False) -> None:
    """Kill every process marked ``variable=value`` (see ``marked_processes``) with its descendants."""
    marked = marked_processes(variable, value, prefix=prefix)
    for pid in marked:
        _signal(pid, signal.SIGSTOP)  # all stopped first: none forks or re-parents while the others die
    for pid in marked:
        for child in live_descendants(pid):
            _signal(child, signal.SIGKILL)
        _signal(pid, signal.SIGKILL)
