"""Fault injection, issue #36: upstreams that send what nobody asked for, against a real sidecar.

N1: a pooled upstream connection that receives bytes nobody asked for (an unsolicited response,
a second response after a streamed one, garbage after a response) is closed and never handed
out again, so a response reaches exactly the client whose request it answers. Each round sends
concurrent requests through a sidecar with a small upstream pool (so connections are reused at
once, by a request that was waiting for one); every client gets its own answer or a clean
error, within the read timeout, and the request log has one row per request.

N4: events that arrived intact before broken framing, in the same read, still reach the client.

N8: /v1/embeddings and a non-streamed /v1/responses answer are accounted, with the usage the
engine reports in each API's own names.

The upstream here writes every byte itself on raw sockets, one asyncio loop in a thread; each
answer carries its request's id (header `x-rid`), and every extra response carries it too,
marked `LEAK-`, so a client that receives another's bytes is seen.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from support.sidecar import wait_until
from support.upstream import LoopServer
from support.waiting import patient

from collector.serving import ServerHandle, serve_in_thread
from collector.sidecar.config import SidecarConfig
from collector.sidecar.wiring import build_sidecar, sidecar_state

READ_TIMEOUT_S = 2.0
PATH = "/v1/chat/completions"
ROUNDS = 8
CLIENTS = 6


def _chunked(data: bytes) -> bytes:
    return b"%x\r\n%b\r\n" % (len(data), data)


def _event(obj: dict[str, Any]) -> bytes:
    return b"data: " + json.dumps(obj, separators=(",", ":")).encode() + b"\n\n"


def _delta(text: str) -> bytes:
    return _event(
        {"id": "c", "object": "chat.completion.chunk", "choices": [{"index": 0, "delta": {"content": text}}]}
    )


def _json_response(rid: str) -> bytes:
    body = json.dumps(
        {
            "id": rid,
            "object": "chat.completion",
            "choices": [{"index": 0, "message": {"role": "assistant", "content": f"answer-{rid}"}}],
            "usage": {"prompt_tokens": 3, "completion_tokens": 2, "total_tokens": 5},
        }
    ).encode()
    head = b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: %d\r\n\r\n" % len(body)
    return head + body


def _stream_response(rid: str) -> bytes:
    head = b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ntransfer-encoding: chunked\r\n\r\n"
    events = _chunked(_delta(f"answer-{rid}")) + _chunked(_delta(" more")) + _chunked(b"data: [DONE]\n\n")
    return head + events + b"0\r\n\r\n"


class HostileUpstream(LoopServer):
    """Answers each completions request with its own id, then misbehaves as `mode` says:

    unsolicited   the answer; `inject()` later writes one whole extra response on every open
                  connection (each idles in the sidecar's pool then)
    second        a streamed answer and, in the same write, a second whole response
    garbage       the answer, then bytes that are no HTTP response, pipelined behind it
    broken-read   two whole events and broken chunk framing in one write (N4)
    json          (well-behaved) the request's `x_fake_json` as a JSON answer (N8)
    """

    def __init__(self, mode: str) -> None:
        self.mode = mode
        self.answered = 0
        self._last: dict[asyncio.StreamWriter, str] = {}  # each connection's last request id
        self._start("hostile-upstream")

    def inject(self) -> int:
        """Write one unrequested response on every open connection; returns how many. Once it
        returns the bytes are in the sidecar's socket buffers (loopback delivers at the write)."""

        async def _inject() -> int:
            sent = 0
            for writer, rid in list(self._last.items()):
                if not writer.is_closing():
                    writer.write(_json_response(f"LEAK-{rid}"))
                    await writer.drain()
                    sent += 1
            return sent

        return asyncio.run_coroutine_threadsafe(_inject(), self._loop).result(patient(10))

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.connections += 1
        self._writers.add(writer)
        try:
            for _ in range(1000):
                head = await reader.readuntil(b"\r\n\r\n")
                headers = {}
                for line in head.decode("latin-1").split("\r\n")[1:]:
                    name, _, value = line.partition(":")
                    headers[name.strip().lower()] = value.strip()
                body = await reader.readexactly(int(headers.get("content-length", "0")))
                rid = self._last[writer] = headers.get("x-rid", "none")
                if not await self._answer(rid, json.loads(body or b"{}"), writer):
                    break
        except (asyncio.IncompleteReadError, ConnectionError):
            pass
        finally:
            self._writers.discard(writer)
            self._last.pop(writer, None)
            writer.close()

    async def _answer(self, rid: str, payload: dict[str, Any], writer: asyncio.StreamWriter) -> bool:
        self.answered += 1
        if self.mode == "json":
            body = json.dumps(payload.get("x_fake_json")).encode()
            head = b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: %d\r\n\r\n"
            writer.write(head % len(body) + body)
            await writer.drain()
            return True
        stream = payload.get("stream") is True
        answer = _stream_response(rid) if stream else _json_response(rid)
        if self.mode == "unsolicited":
            writer.write(answer)
        elif self.mode == "second":
            writer.write(answer + _json_response(f"LEAK-{rid}"))
        elif self.mode == "garbage":
            writer.write(answer + b"LEAK-" + rid.encode() + b" \x00\xff not a response\r\n\r\n")
        elif self.mode == "broken-read":
            head = b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ntransfer-encoding: chunked\r\n\r\n"
            writer.write(head)
            await writer.drain()
            await asyncio.sleep(0.02)  # the head alone first: the break comes in the body's one read
            events = _chunked(_delta("abcd") + _delta("efgh"))
            writer.write(events + b"zz-not-a-chunk-size\r\nLEAK\r\n")
            await writer.drain()
            return False
        await writer.drain()
        return True


@contextlib.contextmanager
def _sidecar(tmp_path: Path, upstream: str, **config: Any) -> Iterator[tuple[ServerHandle, Any]]:
    settings: dict[str, Any] = {
        "db_path": str(tmp_path / "log.duckdb"),
        "instance": "test",
        "jobs": False,
        "engine": "none",
        "read_timeout_s": READ_TIMEOUT_S,
        "max_connections": 2,  # a small pool: each connection is reused at once
    }
    app = build_sidecar(SidecarConfig(upstream=upstream, **(settings | config)))
    server = serve_in_thread(app, timeout_graceful_shutdown=5)
    try:
        yield server, app
    finally:
        server.stop()


async def _one(
    client: httpx.AsyncClient, url: str, rid: str, stream: bool
) -> tuple[str, int | None, str, float]:
    """(rid, status or None for a transport error, the body, seconds)."""
    began = time.monotonic()
    body = {"model": "m", "stream": stream, "messages": [{"role": "user", "content": "hi"}]}
    try:
        answer = await client.post(url + PATH, json=body, headers={"x-rid": rid})
    except httpx.TransportError as exc:
        return rid, None, type(exc).__name__, time.monotonic() - began
    return rid, answer.status_code, answer.text, time.monotonic() - began


@pytest.mark.parametrize("mode", ["unsolicited", "second", "garbage"])
def test_a_connection_with_bytes_nobody_asked_for_never_carries_another_clients_answer(tmp_path, mode):
    upstream = HostileUpstream(mode)
    try:
        with _sidecar(tmp_path, upstream.url) as (server, app):

            async def rounds() -> list[tuple[str, int | None, str, float]]:
                results = []
                limits = httpx.Limits(max_keepalive_connections=0)  # each request its own client connection
                async with httpx.AsyncClient(timeout=patient(READ_TIMEOUT_S + 5), limits=limits) as client:
                    for round_ in range(ROUNDS):
                        results += await asyncio.gather(
                            *(
                                _one(client, server.url, f"r{round_}c{i}", stream=(i % 2 == 0))
                                for i in range(CLIENTS)
                            )
                        )
                return results

            results = asyncio.run(rounds())
            for rid, status, text, took in results:
                assert "LEAK" not in text, (rid, status, text)  # never bytes nobody asked for
                assert took < READ_TIMEOUT_S + 1.0, (rid, status, took)  # the read timeout bounds every wait
                if status == 200:
                    assert f"answer-{rid}" in text, (rid, text)  # its own answer, nobody else's
                    others = {r for r, *_ in results if r != rid and f'answer-{r}"' in text}
                    assert not others, (rid, others)
                else:
                    assert status in (None, 502, 504), (rid, status, text)  # a clean error
            answered = [rid for rid, status, *_ in results if status == 200]
            assert len(answered) >= len(results) * 0.9, results  # errors are the exception, not the rule
            wait_until(
                lambda: not sidecar_state(app).tracker.live, 5, what="every request leaving the live set"
            )
            assert sidecar_state(app).writer.flush(patient(30))
            rows = sidecar_state(app).batch_sink.query_dicts("SELECT outcome FROM requests", ())
            assert len(rows) == len(results)  # one row per request
    finally:
        upstream.stop()


def test_events_before_broken_framing_in_the_same_read_reach_the_client(tmp_path):
    """N4: the read that breaks the framing also holds two whole events; they are forwarded, then
    the client sees the break (the sidecar ends the body unfinished), as it would directly."""
    upstream = HostileUpstream("broken-read")
    try:
        with _sidecar(tmp_path, upstream.url) as (server, app):
            received = b""
            body = {"model": "m", "stream": True, "messages": [{"role": "user", "content": "hi"}]}
            with pytest.raises(httpx.RemoteProtocolError):
                with httpx.stream(
                    "POST", server.url + PATH, json=body, timeout=patient(READ_TIMEOUT_S + 5)
                ) as answer:
                    assert answer.status_code == 200
                    for part in answer.iter_raw():
                        received += part
            assert b"abcd" in received and b"efgh" in received, received
            assert b"LEAK" not in received
            wait_until(
                lambda: not sidecar_state(app).tracker.live, 5, what="the request leaving the live set"
            )
            assert sidecar_state(app).writer.flush(patient(30))
            (row,) = sidecar_state(app).batch_sink.query_dicts("SELECT * FROM requests", ())
            assert row["outcome"] == "upstream_error" and row["completion_tokens"] == 2
    finally:
        upstream.stop()


@pytest.mark.parametrize(
    ("path", "request_body", "answer", "expected"),
    [
        (
            "/v1/embeddings",
            {"model": "e5", "input": ["one two three four five six seven eight", "nine"]},
            {"object": "list", "data": [], "usage": {"prompt_tokens": 11, "total_tokens": 11}},
            {"prompt_tokens": 11, "completion_tokens": 0, "usage_source": "upstream", "stream": False},
        ),
        (
            "/v1/responses",
            {"model": "m", "instructions": "be brief", "input": [{"role": "user", "content": "hello there"}]},
            {
                "id": "resp_1",
                "object": "response",
                "output": [{"type": "message", "content": [{"type": "output_text", "text": "hi"}]}],
                "usage": {
                    "input_tokens": 9,
                    "output_tokens": 2,
                    "total_tokens": 11,
                    "input_tokens_details": {"cached_tokens": 4},
                },
            },
            {
                "prompt_tokens": 9,
                "completion_tokens": 2,
                "cached_prompt_tokens": 4,
                "usage_source": "upstream",
            },
        ),
    ],
)
def test_embeddings_and_responses_answers_are_accounted_with_their_usage(
    tmp_path, path, request_body, answer, expected
):
    """N8: each request is one row (endpoint, outcome ok, the engine's counts) and is counted in
    headroom_requests_total; before, both were passed through unseen."""
    upstream = HostileUpstream("json")
    try:
        with _sidecar(tmp_path, upstream.url) as (server, app):
            for _ in range(2):
                got = httpx.post(
                    server.url + path, json=request_body | {"x_fake_json": answer}, timeout=patient(10)
                )
                assert got.status_code == 200 and got.json() == answer  # forwarded untouched
            wait_until(
                lambda: not sidecar_state(app).tracker.live, 5, what="the requests leaving the live set"
            )
            assert sidecar_state(app).writer.flush(patient(30))
            rows = sidecar_state(app).batch_sink.query_dicts("SELECT * FROM requests", ())
            assert len(rows) == 2  # one row per request
            for row in rows:
                assert row["endpoint"] == path and row["outcome"] == "ok"
                for key, value in expected.items():
                    assert row[key] == value, (key, row[key], value)
            page = httpx.get(server.url + "/metrics", timeout=patient(5)).text
            counted = [
                line
                for line in page.splitlines()
                if line.startswith("headroom_requests_total{") and 'outcome="ok"' in line
            ]
            assert counted and sum(float(line.rsplit(" ", 1)[1]) for line in counted) == 2
    finally:
        upstream.stop()
