"""``dfpo train --nproc N``: start N training processes on this machine and answer for them as one command.

The launcher starts N copies of ``python -m dfpo train`` (without --nproc) with the environment torchrun would
give them (RANK, LOCAL_RANK, WORLD_SIZE, LOCAL_WORLD_SIZE, MASTER_ADDR, MASTER_PORT), waits for them, and exits
with the run's status:

1. SIGINT or SIGTERM to the launcher (or to its process group: Ctrl-C in a terminal) is passed to every rank once;
   the ranks finish their step, write a checkpoint and stop, and the launcher exits 130 / 143 with the ranks'
   message (printed by rank 0), no traceback. A second signal is passed on too (the ranks stop at once); ranks
   still running ``grace_s`` after it are killed.
2. The ranks run in a process group of their own, so a signal is delivered to each exactly once, and each asks
   the kernel for SIGHUP when the launcher dies (``PR_SET_PDEATHSIG``, ``PARENT_DEATH``; checked against a launcher that died
   before the request): killing the launcher, even with SIGKILL, stops every rank after its step.
3. A rank that fails makes the launcher stop the others (SIGTERM, then SIGKILL after ``grace_s``); the exit status
   is rank 0's (2 for an error in the input, which rank 0 printed once), else the first failing rank's.

Why not torchrun (``torch.distributed.run``): it starts every worker in a new session, so a signal to the
launcher's process group misses them and a killed torchrun leaves them training, and it answers SIGTERM with a
traceback and exit status 1. A single machine needs none of its rendezvous or restart machinery. Under an external
``torchrun ... -m dfpo train`` the trainer runs as before (torchrun's own behaviour then applies).
"""

from __future__ import annotations

import ctypes
import os
import signal
import socket
import subprocess
import sys
import time

from .run.signals import LAUNCHER_PID_ENV, PARENT_DEATH

PR_SET_PDEATHSIG = 1


def free_port() -> int:
    """A TCP port on 127.0.0.1 that nothing listens on now (rank 0 binds it for the process group's store)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def rank_environment(rank: int, world: int, port: int) -> dict[str, str]:
    """What a rank reads from its environment (torchrun's names), plus the launcher's PID."""
    return {
        "RANK": str(rank),
        "LOCAL_RANK": str(rank),
        "WORLD_SIZE": str(world),
        "LOCAL_WORLD_SIZE": str(world),
        "GROUP_RANK": "0",
        "MASTER_ADDR": "127.0.0.1",
        "MASTER_PORT": str(port),
        LAUNCHER_PID_ENV: str(os.getpid()),
    }


def stop_with_launcher() -> None:
    """In a rank started by the launcher: ask for PARENT_DEATH (SIGHUP) when the launcher dies, and stop now if it already has
    (Linux; elsewhere a no-op)."""
    launcher = os.environ.get(LAUNCHER_PID_ENV)
    if not launcher or not sys.platform.startswith("linux"):
        return
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(PR_SET_PDEATHSIG, PARENT_DEATH, 0, 0, 0)
    except (OSError, AttributeError):
        return
    if os.getppid() != int(launcher):  # the launcher died before the request: it will never be delivered
        os.kill(os.getpid(), PARENT_DEATH)


class Launcher:
    """N ranks of one command; ``run`` waits for them and returns the run's exit status."""

    def __init__(self, command: list[str], nproc: int, *, grace_s: float = 60.0, poll_s: float = 0.1):
        if nproc < 2:
            raise ValueError(f"--nproc must be >= 2 to launch processes, got {nproc}")
        self.command, self.nproc, self.grace_s, self.poll_s = command, nproc, grace_s, poll_s
        self.procs: list[subprocess.Popen] = []
        self.signals: list[int] = []
        self.kill_at: float | None = None

    def _forward(self, signum: int, frame) -> None:
        """Pass a signal to every live rank's process group; after the second, the ranks get ``grace_s`` to stop."""
        self.signals.append(signum)
        for p in self.procs:
            if p.poll() is None:
                try:
                    os.killpg(p.pid, signum)
                except ProcessLookupError:
                    pass
        if len(self.signals) >= 2 and self.kill_at is None:
            self.kill_at = time.monotonic() + self.grace_s

    def _terminate_others(self) -> None:
        """A rank failed: SIGTERM the rest once, SIGKILL them ``grace_s`` later."""
        if self.kill_at is not None:
            return
        for p in self.procs:
            if p.poll() is None:
                try:
                    os.killpg(p.pid, signal.SIGTERM)
                except ProcessLookupError:
                    pass
        self.kill_at = time.monotonic() + self.grace_s

    def _kill_all(self) -> None:
        for p in self.procs:
            if p.poll() is None:
                try:
                    os.killpg(p.pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass

    def run(self) -> int:
        old = {sig: signal.signal(sig, self._forward) for sig in (signal.SIGINT, signal.SIGTERM)}
        try:
            port = free_port()
            for rank in range(self.nproc):
                env = dict(os.environ, **rank_environment(rank, self.nproc, port))
                self.procs.append(subprocess.Popen(self.command, env=env, process_group=0))
            while any(p.poll() is None for p in self.procs):
                if any(p.returncode not in (None, 0) for p in self.procs) and not self.signals:
                    self._terminate_others()
                if self.kill_at is not None and time.monotonic() > self.kill_at:
                    self._kill_all()
                time.sleep(self.poll_s)
        finally:
            self._kill_all()  # nothing outlives the launcher, however it ends
            for p in self.procs:
                p.wait()
            for sig, handler in old.items():
                signal.signal(sig, handler)
        return self.exit_status()

    def exit_status(self) -> int:
        """0 when every rank finished; else 128 + the signal that stopped the run, else rank 0's status when it
        failed, else the first failure's."""
        codes = [p.returncode for p in self.procs]
        if all(c == 0 for c in codes):
            return 0
        if self.signals:
            return 128 + self.signals[0]
        if codes[0] != 0:
            return codes[0] if codes[0] > 0 else 128 - codes[0]
        failed = [c for c in codes if c != 0]
        if not failed:
            return 0
        return failed[0] if failed[0] > 0 else 128 - failed[0]
