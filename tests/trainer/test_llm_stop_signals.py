"""A second SIGTERM stops ``dfpo train`` at once even while the main thread is inside one long call into C (the
backward pass of a 0.6B model on a busy CPU took minutes, and Python runs a handler only between bytecodes)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time

CHILD = textwrap.dedent(
    """
    import os, sys, time
    os.environ["OMP_NUM_THREADS"] = "1"
    import torch
    torch.set_num_threads(1)
    from dfpo.trainer.run.signals import StoppedAtOnce, StopSignals

    # a matmul size whose single call lasts >= 30 s here: t(n) ~ n^3, measured at n = 512
    a = torch.randn(512, 512)
    start = time.perf_counter(); a @ a; per = time.perf_counter() - start
    n = int(512 * max(1.0, (30.0 / max(per, 1e-4)) ** (1 / 3)))
    x = torch.randn(n, n)
    with StopSignals(immediate=False) as stop:
        stop.last_words = lambda signum: print(f"stopped at once by signal {signum}", file=sys.stderr, flush=True)
        print("ready", flush=True)
        try:
            x @ x  # one call into C: no bytecode runs in this thread until it returns
            time.sleep(60)
        except StoppedAtOnce as stopped:
            print("the main thread took it", file=sys.stderr, flush=True)
            raise SystemExit(stopped.exit_code)
    """
)


def test_a_second_sigterm_during_a_long_computation_ends_the_run_at_once():
    proc = subprocess.Popen([sys.executable, "-c", CHILD], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        assert proc.stdout.readline().strip() == "ready"
        time.sleep(0.5)
        os.kill(proc.pid, signal.SIGTERM)  # finish the step: recorded when the main thread gets to it
        time.sleep(0.5)
        sent = time.monotonic()
        os.kill(proc.pid, signal.SIGTERM)  # now: the watcher ends the process after its grace period
        proc.wait(timeout=20)
        waited = time.monotonic() - sent
    finally:
        if proc.poll() is None:
            proc.kill()
    err = proc.stderr.read()
    assert proc.returncode == 128 + signal.SIGTERM, (proc.returncode, err)
    assert err.strip() == f"stopped at once by signal {int(signal.SIGTERM)}", err
    assert waited < 10, waited  # the grace period (3 s) and exit, not the >= 30 s the computation takes
