"""A real llama.cpp llama-server for tests: built once by scripts/build-llama-server.sh (cached
under ~/.cache/llm-headroom), started by scripts/llama-server.sh on a free loopback port.

`make test` builds it before the suite runs. Without the cached binary a test needing it fails
under CI=true and skips elsewhere, with the command that builds it.
"""

from __future__ import annotations

import contextlib
import subprocess
import tempfile
import time
from pathlib import Path

import httpx
import pytest
from conftest import IN_CI, free_port

from support.processes import stop_process
from support.waiting import patient

SCRIPTS = Path(__file__).resolve().parent.parent.parent / "scripts"


def require_llama_server() -> None:
    """Fail (CI) or skip (elsewhere) unless the cached llama-server and model exist."""
    found = subprocess.run(
        ["bash", str(SCRIPTS / "build-llama-server.sh"), "--check"], capture_output=True, text=True
    )
    if found.returncode == 0:
        return
    message = "llama-server not built; run: bash scripts/build-llama-server.sh (or make test)"
    if IN_CI:
        pytest.fail(message)
    pytest.skip(message)


@contextlib.contextmanager
def llama_server(parallel: int, *, threads: int = 1, startup_timeout_s: float = 60.0):
    """Run llama-server with `parallel` slots; yields its base URL once /health says ok."""
    require_llama_server()
    port = free_port()
    # its stderr goes to a file, not a pipe nobody drains (a full pipe would block it); on a
    # failed start the message says how it exited (-11: a crash) and the log's tail
    log = tempfile.TemporaryFile()
    process = subprocess.Popen(
        [
            "bash",
            str(SCRIPTS / "llama-server.sh"),
            "--parallel",
            str(parallel),
            "--threads",
            str(threads),
            "--port",
            str(port),
        ],
        stdout=subprocess.DEVNULL,
        stderr=log,
    )
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + patient(startup_timeout_s)
        while True:  # 503 while the model loads, 200 once it serves
            try:
                if httpx.get(url + "/health", timeout=patient(1)).status_code == 200:
                    break
            except httpx.TransportError:
                pass
            if process.poll() is not None or time.monotonic() > deadline:
                log.seek(0)
                tail = log.read().decode(errors="replace")[-800:]
                raise RuntimeError(f"llama-server did not start (exit {process.poll()}): {tail}")
            time.sleep(0.1)
        yield url
    finally:
        stop_process(process, 20)
        log.close()
