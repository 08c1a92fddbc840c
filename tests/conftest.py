"""Shared test helpers: real-tool lookup that fails in CI instead of skipping, free ports."""

from __future__ import annotations

import contextlib
import os
import shutil
import socket
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest

FIXTURES = Path(__file__).parent / "fixtures"
IN_CI = os.environ.get("CI", "").lower() in ("1", "true", "yes")
HEADROOM = Path(sys.executable).parent / "headroom"  # the installed console script


def require_tool(name: str) -> str:
    """Path of a real binary (promtool, prometheus, amtool, prometheus-alertmanager).

    Missing in CI (CI=true) is a failure: the suite must prove the real thing. Elsewhere it skips
    with the command that installs it.
    """
    path = shutil.which(name)
    if path:
        return path
    message = f"{name} not found; install with: make tools (apt-get install prometheus prometheus-alertmanager)"
    if IN_CI:
        pytest.fail(message)
    pytest.skip(message)


def free_port() -> int:
    """A TCP port on 127.0.0.1 that was free a moment ago."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@pytest.fixture
def fixtures_dir() -> Path:
    return FIXTURES


@contextlib.contextmanager
def headroom_process(*args: str, health: str, port: int | None = None):
    """Run `headroom ARGS --listen 127.0.0.1:PORT` and yield its URL once `health` answers 200.

    Stopped with SIGTERM at exit (graceful: a sidecar flushes its log). A process that dies or
    does not answer within 30 s fails with the tail of its stderr.
    """
    port = port or free_port()
    process = subprocess.Popen([str(HEADROOM), *args, "--listen", f"127.0.0.1:{port}"],
                               stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 30
        while True:
            try:
                if httpx.get(url + health, timeout=1).status_code == 200:
                    break
            except httpx.TransportError:
                pass
            if process.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"headroom {args[0]} did not start: "
                                   f"{process.stderr.read().decode()[-800:]}")
            time.sleep(0.05)
        yield url
    finally:
        process.terminate()
        process.wait(30)


def sim_process(**flags):
    """Run `headroom sim` with --flag value pairs on a free port; yields its base URL."""
    args = ["sim"]
    for name, value in flags.items():
        args += [f"--{name.replace('_', '-')}", str(value)]
    return headroom_process(*args, health="/health")
