"""``dfpo app``: start the Streamlit explorer (imports stay light here)."""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
from pathlib import Path

RUNS_ENV = "DFPO_APP_RUNS"


def streamlit_command(port: int, address: str, headless: bool) -> list[str]:
    """The ``streamlit run`` command line for the explorer's entry script."""
    main = Path(__file__).resolve().parent / "main.py"
    return [
        sys.executable, "-m", "streamlit", "run", str(main),
        "--server.address", address, "--server.port", str(port),
        "--server.headless", "true" if headless else "false",
        "--browser.gatherUsageStats", "false", "--client.toolbarMode", "viewer",
    ]  # fmt: skip


def _cmd_app(args: argparse.Namespace) -> int:
    if not 0 < args.port < 65536:
        raise ValueError(f"--port must be in 1..65535, got --port {args.port}")
    runs = [Path(r) for r in (args.runs or ["runs"])]
    missing = [str(r) for r in runs if args.runs and not r.is_dir()]
    if missing:
        raise ValueError(f"--runs {missing[0]!r} is not a folder")
    try:
        import streamlit  # noqa: F401
    except ModuleNotFoundError:
        raise ValueError("the app needs Streamlit: pip install -c constraints.txt -e '.[app]'") from None
    env = dict(os.environ, **{RUNS_ENV: os.pathsep.join(str(r.resolve()) for r in runs)})
    print(f"dfpo app: http://{args.address}:{args.port}  (run folders from {', '.join(map(str, runs))})", flush=True)
    return subprocess.call(streamlit_command(args.port, args.address, args.headless), env=env)


def register(subparsers) -> None:
    p = subparsers.add_parser("app", help="Streamlit explorer: cancellation by hand, atlas, toy lab, claims ledger, training runs")
    p.add_argument("--port", type=int, default=8501, help="port (default 8501)")
    p.add_argument("--address", default="127.0.0.1", help="address to bind (default 127.0.0.1: this machine only)")
    p.add_argument("--headless", action="store_true", help="do not open a browser")
    p.add_argument("--runs", action="append", metavar="DIR", help="folder holding trainer run folders (repeatable; default ./runs)")
    p.set_defaults(func=_cmd_app)
