"""Shared test helpers: real-tool lookup that fails in CI instead of skipping, free ports."""

from __future__ import annotations

import os
import shutil
import socket
from pathlib import Path

import pytest

FIXTURES = Path(__file__).parent / "fixtures"
IN_CI = os.environ.get("CI", "").lower() in ("1", "true", "yes")


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
