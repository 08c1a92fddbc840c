"""benchmarks/callback_proxy.py, the measured ceiling of a relay in protocol callbacks
(BENCHMARKS.md §2, stop 34): it must relay exactly what the upstream sends (less the usage chunk
it asked for) and account for each answer as the sidecar does, or its figures measure nothing."""

from __future__ import annotations

import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import duckdb
import httpx
import pytest
from support.processes import free_port

ROOT = Path(__file__).resolve().parents[1]
BODY = b'{"model":"bench","stream":true,"messages":[{"role":"user","content":"hi"}]}'
pytestmark = pytest.mark.subprocess


@contextmanager
def _serving(*args: str, graceful: bool = True) -> Iterator[str]:
    """`python benchmarks/SCRIPT PORT ARGS` until it answers /healthz; then SIGINT, and a clean
    exit (the log's rows written) where `graceful`, else SIGTERM."""
    port = free_port()
    process = subprocess.Popen([sys.executable, *args[:1], str(port), *args[1:]], cwd=ROOT)
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 30
    try:
        while True:  # a process's readiness has no event to await
            try:
                if httpx.get(url + "/healthz", timeout=1).status_code == 200:
                    break
            except httpx.TransportError:
                pass
            assert process.poll() is None and time.monotonic() < deadline, f"{args[0]} did not start"
            time.sleep(0.05)
        yield url
    finally:
        process.send_signal(signal.SIGINT if graceful else signal.SIGTERM)
        code = process.wait(30)
        assert code == 0 or not graceful


def _answer(url: str, chunks: int) -> bytes:
    response = httpx.post(url + "/v1/chat/completions", content=BODY, headers={"x-chunks": str(chunks)})
    assert response.status_code == 200
    assert response.headers["content-type"] == "text/event-stream"
    return response.content


@pytest.mark.parametrize("server", ["raw", "uvicorn"])
def test_the_callback_relay_forwards_the_answer_and_logs_one_row_per_request(tmp_path, server):
    db = tmp_path / "log.duckdb"
    with _serving("benchmarks/sse_upstream.py", graceful=False) as upstream:
        direct = [_answer(upstream, chunks) for chunks in (1, 5, 64)]
        assert b'"usage"' not in b"".join(direct)  # the client did not ask for usage
        proxy = ["benchmarks/callback_proxy.py", upstream + "/", "--accounted", "--db", str(db)]
        with _serving(*proxy, "--server", server) as url:
            relayed = [_answer(url, chunks) for chunks in (1, 5, 64)]
    assert relayed == direct  # the usage chunk the relay asked for is stripped, nothing else changes
    with duckdb.connect(str(db), read_only=True) as con:
        rows = con.execute(
            "SELECT outcome, completion_tokens, usage_source FROM requests ORDER BY completion_tokens"
        ).fetchall()
    assert rows == [("ok", 1, "upstream"), ("ok", 5, "upstream"), ("ok", 64, "upstream")]


def test_bytes_only_the_relay_forwards_the_upstream_answer_unchanged():
    with _serving("benchmarks/sse_upstream.py", graceful=False) as upstream:
        direct = _answer(upstream, 7)
        with _serving("benchmarks/callback_proxy.py", upstream + "/") as url:
            assert _answer(url, 7) == direct
