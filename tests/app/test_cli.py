"""``dfpo app`` as a process: no prompt without a terminal, the URL once the server answers, a clean
stop on SIGTERM and SIGINT, nothing sent off the machine."""

from __future__ import annotations

import os
import select
import signal
import socket
import subprocess
import sys
import time
import urllib.request

import pytest

pytest.importorskip("streamlit")

from dfpo.app.cli import STREAMLIT_ENV, streamlit_command  # noqa: E402


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _port_open(port: int) -> bool:
    with socket.socket() as s:
        return s.connect_ex(("127.0.0.1", port)) == 0


def _read_until(proc: subprocess.Popen, needle: str, timeout: float) -> str:
    """stdout of ``proc`` up to the first line holding ``needle``; fails on timeout or exit."""
    out, deadline = "", time.monotonic() + timeout
    while time.monotonic() < deadline:
        ready, _, _ = select.select([proc.stdout], [], [], 0.5)
        if ready:
            line = proc.stdout.readline()
            if not line and proc.poll() is not None:
                break
            out += line
            if needle in line:
                return out
        elif proc.poll() is not None:
            break
    pytest.fail(f"no {needle!r} in the output of dfpo app (exit {proc.poll()}):\n{out}")


@pytest.mark.parametrize("signum, code", [(signal.SIGTERM, 143), pytest.param(signal.SIGINT, 130, marks=pytest.mark.slow)])
def test_dfpo_app_without_a_terminal_prints_the_url_once_up_and_stops_on_a_signal(tmp_path, signum, code):
    """As the README runs it (no --headless), with stdin not a terminal and a home with no Streamlit
    credentials: before the fix Streamlit's first-run e-mail prompt read EOF and the command exited 255."""
    port = _free_port()
    env = dict(os.environ, HOME=str(tmp_path), PYTHONUNBUFFERED="1")
    env.pop("STREAMLIT_SERVER_HEADLESS", None)
    proc = subprocess.Popen(
        [sys.executable, "-m", "dfpo", "app", "--port", str(port), "--runs", str(tmp_path)],
        stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env, cwd=tmp_path,
        start_new_session=True,
    )  # fmt: skip
    try:
        out = _read_until(proc, "dfpo app: http://", timeout=120)
        url = f"http://127.0.0.1:{port}"
        assert f"dfpo app: {url}" in out
        assert urllib.request.urlopen(f"{url}/_stcore/health", timeout=5).read() == b"ok"  # up when the URL is printed
        assert "Email" not in out and "usage statistics" not in out
        assert out.splitlines() == [out.splitlines()[-1]], out  # the URL alone: no raw server log line ("Uvicorn server started")
        proc.send_signal(signum)  # to dfpo app only: it passes the signal on to the server
        assert proc.wait(timeout=30) == code
        assert not _port_open(port)
        assert not (tmp_path / ".streamlit" / "credentials.toml").exists()
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()


def test_dfpo_app_refuses_bad_options_before_starting(tmp_path, capsys):
    from dfpo.cli import main

    assert main(["app", "--port", "0"]) == 2
    assert "--port must be in 1..65535, got --port 0" in capsys.readouterr().err
    assert main(["app", "--runs", str(tmp_path / "missing")]) == 2
    assert "is not a folder" in capsys.readouterr().err


def test_dfpo_app_refuses_a_port_in_use(tmp_path, capsys):
    from dfpo.cli import main

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        port = s.getsockname()[1]
        assert main(["app", "--port", str(port), "--runs", str(tmp_path)]) == 2
    assert f"port {port} on 127.0.0.1 is already in use" in capsys.readouterr().err


def test_dfpo_app_binds_to_loopback_headless_without_prompt_or_statistics():
    from dfpo.cli import build_parser

    args = build_parser().parse_args(["app"])
    assert args.address == "127.0.0.1" and args.port == 8501 and not args.browser
    cmd = streamlit_command(args.port, args.address)
    option = lambda name: cmd[cmd.index(name) + 1]  # noqa: E731
    assert option("--server.address") == "127.0.0.1" and option("--server.headless") == "true"
    assert option("--server.showEmailPrompt") == "false" and option("--browser.gatherUsageStats") == "false"
    assert STREAMLIT_ENV["STREAMLIT_BROWSER_GATHER_USAGE_STATS"] == "false"
    assert option("--logger.level") == "warning"  # the server's info lines (Uvicorn's start) stay off the console
    assert build_parser().parse_args(["app", "--headless"]).headless  # the README's older command line still parses
