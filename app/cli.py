"""``dfpo app``: start the Streamlit explorer (imports stay light here).

The server runs headless with no first-run prompt and no usage statistics, bound to 127.0.0.1 by
default; the URL is printed once the server answers its health check, and the server's own log shows only
its warnings and errors (its info lines, such as Uvicorn's start, would say the address again in another
form). SIGTERM and SIGINT are passed on to the server, which stops; ``dfpo app`` then exits with 128 + the
signal's number (143, 130).
"""

from __future__ import annotations

import argparse
import os
import signal
import socket
import subprocess
import sys
import textwrap
import time
import urllib.request
from pathlib import Path

from .pages import PAGES, page_list, short_list

RUNS_ENV = "DFPO_APP_RUNS"
START_TIMEOUT_S = 120.0
STREAMLIT_ENV = {
    "STREAMLIT_SERVER_HEADLESS": "true",  # never open a browser, never prompt (the prompt blocks without a terminal)
    "STREAMLIT_SERVER_SHOW_EMAIL_PROMPT": "false",
    "STREAMLIT_BROWSER_GATHER_USAGE_STATS": "false",  # no usage statistics sent anywhere
}
"""Streamlit's own settings, as environment variables too, so a ~/.streamlit/config.toml cannot turn them back on."""


def streamlit_command(port: int, address: str) -> list[str]:
    """The ``streamlit run`` command line for the explorer's entry script."""
    main = Path(__file__).resolve().parent / "main.py"
    return [
        sys.executable, "-m", "streamlit", "run", str(main),
        "--server.address", address, "--server.port", str(port),
        "--server.headless", "true", "--server.showEmailPrompt", "false",
        "--browser.gatherUsageStats", "false", "--client.toolbarMode", "viewer",
        "--logger.hideWelcomeMessage", "true",  # dfpo app prints the URL itself, once the server answers
        "--logger.level", "warning",  # not the server's own info lines ("Uvicorn server started on ..."); its warnings still show
    ]  # fmt: skip


def port_in_use(address: str, port: int) -> bool:
    """True when something on this machine already listens on ``address:port``."""
    with socket.socket(socket.AF_INET6 if ":" in address else socket.AF_INET) as s:
        s.settimeout(1.0)
        return s.connect_ex((address if address not in ("0.0.0.0", "::") else "127.0.0.1", port)) == 0


def wait_healthy(url: str, proc: subprocess.Popen, timeout: float = START_TIMEOUT_S) -> bool:
    """Poll ``url``/_stcore/health until it answers 'ok' (True), the server exits or ``timeout`` passes (False)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline and proc.poll() is None:
        try:
            with urllib.request.urlopen(f"{url}/_stcore/health", timeout=2) as resp:
                if resp.read().strip() == b"ok":
                    return True
        except OSError:
            pass
        time.sleep(0.2)
    return False


def _cmd_app(args: argparse.Namespace) -> int:
    if not 0 < args.port < 65536:
        raise ValueError(f"--port must be in 1..65535, got --port {args.port}")
    runs = [Path(r).expanduser().resolve() for r in (args.runs or ["runs"])]
    missing = [r for r, given in zip(runs, args.runs or []) if not r.is_dir()]
    if missing:
        raise ValueError(f"--runs {str(missing[0])!r} is not a folder")
    try:
        import streamlit  # noqa: F401
    except ModuleNotFoundError:
        raise ValueError("the app needs Streamlit: pip install -c constraints.txt -e '.[app]'") from None
    if port_in_use(args.address, args.port):
        raise ValueError(f"port {args.port} on {args.address} is already in use; choose another with --port")
    env = dict(os.environ, **STREAMLIT_ENV, **{RUNS_ENV: os.pathsep.join(map(str, runs))})
    host = f"[{args.address}]" if ":" in args.address else args.address
    url = f"http://{'127.0.0.1' if args.address in ('0.0.0.0', '::') else host}:{args.port}"
    received: list[int] = []

    proc = subprocess.Popen(streamlit_command(args.port, args.address), env=env, stdin=subprocess.DEVNULL)

    def forward(signum, frame) -> None:  # noqa: ARG001
        received.append(signum)
        if proc.poll() is None:
            proc.send_signal(signum)

    previous = {sig: signal.signal(sig, forward) for sig in (signal.SIGTERM, signal.SIGINT)}
    try:
        if wait_healthy(url, proc):
            print(f"dfpo app: {url}  (run folders from {', '.join(map(str, runs))}; Ctrl-C stops it)", flush=True)
            if args.browser:
                import webbrowser

                webbrowser.open(url)
        elif proc.poll() is None and not received:
            print(f"dfpo app: the server did not answer on {url} within {START_TIMEOUT_S:.0f} s; stopping it", file=sys.stderr)
            proc.terminate()
        rc = proc.wait()
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
        if proc.poll() is None:  # an exception on the way: leave no server behind
            proc.terminate()
            proc.wait()
    return 128 + received[0] if received else rc


def description() -> str:
    """``dfpo app --help``'s text above the options: what the explorer shows, page by page, and how to open it."""
    opening = f"The explorer: a Streamlit app of {len(PAGES)} pages, every number computed by dfpo's own code."
    how = (
        "`dfpo app` starts the server and prints its address once it answers (http://127.0.0.1:8501 by default, this "
        "machine only): open that address in a browser, or pass --browser to have it opened. Ctrl-C stops the server. "
        "More in docs/app.md."
    )
    return f"{textwrap.fill(opening, 88)}\n\n{page_list()}\n\n{textwrap.fill(how, 88)}"


def register(subparsers) -> None:
    p = subparsers.add_parser(
        "app",
        help=f"Streamlit explorer in the browser, {len(PAGES)} pages: {short_list()}",
        description=description(),
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("--port", type=int, default=8501, help="port (default 8501)")
    p.add_argument("--address", default="127.0.0.1", help="address to bind (default 127.0.0.1: this machine only)")
    p.add_argument("--browser", action="store_true", help="open the explorer in this machine's web browser once it is up")
    p.add_argument("--headless", action="store_true", help="accepted for older command lines: the server is always headless")
    p.add_argument("--runs", action="append", metavar="DIR", help="folder holding run folders, trainer or toy (repeatable; default ./runs)")
    p.set_defaults(func=_cmd_app)
