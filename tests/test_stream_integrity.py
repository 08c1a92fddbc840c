"""Streaming integrity, counted (issue #48 item 3): the sidecar never turns a failure into a success.

Peers' trackers show streams that look like success but are not: an upstream reset turned into
an empty 200 that ends with `finish_reason: stop`, an upstream 4xx/5xx laundered into a 200, usage
lost behind a gzipped upstream, a gateway that buffers before the first byte. Each class here is
injected by the fake upstream (tests/support/upstream.py) against a real sidecar on loopback, and
each test checks three things:

    the client sees the truth   the upstream's status and bytes, or a break where the upstream
                                broke (never a clean end of a cut answer), or the decoded answer
    the row names the class     its outcome, and for a failure no status explains, an error that
                                starts with the failure class
    the counter moves once      headroom_requests_total{outcome} by exactly one, and
                                headroom_upstream_failures_total{reason} by one for such a failure
                                (and nothing else moves)

The last test sends 20,000 clean streams of several shapes (chunked any way, vLLM's usage nulls,
event fields, gzip, a body ended by its connection's close, /v1/completions) and finds no
failure in any row or counter, and every client's bytes exact.
"""

from __future__ import annotations

import asyncio
import contextlib
import gzip
import json
import logging
import socket
import time
import zlib
from collections import Counter
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import httptools
import httpx
import pytest
from support.sidecar import CHAT, Rig, sidecar_rig, wait_until
from support.upstream import LoopServer
from support.waiting import patient

from collector.alerts.recording import ERROR_OUTCOMES
from collector.serving import serve_in_thread
from collector.sidecar.config import SidecarConfig
from collector.sidecar.ending import FAILURES
from collector.sidecar.exchange import DecodedBody, UpstreamBodyBroken
from collector.sidecar.headers import content_coding
from collector.sidecar.wiring import build_sidecar, sidecar_state

READ_TIMEOUT_S = 2.0
PATH = "/v1/chat/completions"


@pytest.fixture
def rig(tmp_path):
    with sidecar_rig(tmp_path, read_timeout_s=READ_TIMEOUT_S) as rig:
        yield rig


@contextlib.contextmanager
def _sidecar(tmp_path: Path, upstream: str) -> Iterator[tuple[Any, Any]]:
    """A sidecar in front of `upstream` (any URL): its server handle and app.

    Its two wall-clock deadlines are stretched for a busy machine: the upstream connect timeout
    (10 s) and the kept-alive client's idle timeout (uvicorn's 5 s). On loopback neither is ever
    near; but the test's clients, the sidecar and the upstream share one process, and where CPU
    hogs and other tests starve it for seconds the sidecar's loop wakes to timers already past:
    a connect the kernel finished is timed out (a 504 connect_timeout), and a kept-alive
    connection whose client had not yet been scheduled to send its next request is closed."""
    config = SidecarConfig(
        upstream=upstream,
        db_path=str(tmp_path / "log.duckdb"),
        instance="test",
        jobs=False,
        engine="none",
        connect_timeout_s=patient(SidecarConfig.connect_timeout_s),
    )
    app = build_sidecar(config)
    server = serve_in_thread(
        app, timeout_graceful_shutdown=5, timeout_keep_alive=patient(SidecarConfig.idle_timeout_s)
    )
    try:
        yield server, app
    finally:
        server.stop()


def _counts(rig: Rig) -> Counter[tuple[str, str]]:
    """('outcome', o) -> headroom_requests_total{outcome=o} and ('failure', r) ->
    headroom_upstream_failures_total{reason=r}, each summed over its other labels."""
    counts: Counter[tuple[str, str]] = Counter()
    for (name, labels), value in rig.metrics().items():
        named = dict(labels)
        if name == "headroom_requests_total":
            counts["outcome", named["outcome"]] += int(value)
        elif name == "headroom_upstream_failures_total":
            counts["failure", named["reason"]] += int(value)
    return counts


def _moved(before: Counter[tuple[str, str]], after: Counter[tuple[str, str]]) -> dict[tuple[str, str], int]:
    return {
        key: after[key] - before[key] for key in after.keys() | before.keys() if after[key] != before[key]
    }


def _row(rig: Rig) -> dict[str, Any]:
    """The one row, once the request has left the live set."""
    wait_until(lambda: not sidecar_state(rig.app).tracker.live, 5, what="the request leaving the live set")
    rows = rig.rows()
    assert len(rows) == 1, rows
    return rows[0]


def _stream(rig: Rig, headers: dict[str, str], body: dict[str, Any] = CHAT) -> tuple[int, bytes, bool]:
    """(status, the bytes the client received, whether the answer broke instead of ending)."""
    received = []
    with httpx.stream(
        "POST", rig.url + PATH, json=body, headers=headers, timeout=READ_TIMEOUT_S + 3
    ) as answer:
        try:
            for part in answer.iter_raw():
                received.append(part)
        except httpx.RemoteProtocolError:
            return answer.status_code, b"".join(received), True
    return answer.status_code, b"".join(received), False


def _direct(rig: Rig, headers: dict[str, str], body: dict[str, Any] = CHAT) -> httpx.Response:
    """The same request sent to the fake upstream itself: what the client would get without us."""
    return httpx.post(rig.fake.url + PATH, json=body, headers=headers, timeout=10)


def _assert_whole_events_without_an_end(received: bytes) -> None:
    """A broken stream as the client has it: the events before the break, each whole, and
    nothing that says the answer ended (no [DONE], no finish_reason)."""
    assert received.endswith(b"\n\n") and b"tok1" in received, received
    assert b"[DONE]" not in received and b'"finish_reason":"' not in received


# --- an upstream status before the first byte keeps its status ----------------------------------


@pytest.mark.parametrize(
    ("status", "outcome"),
    [(400, "bad_request"), (429, "rate_limited"), (500, "upstream_error"), (503, "overloaded")],
)
def test_an_upstream_status_before_the_first_byte_reaches_the_client_as_sent(rig, status, outcome):
    headers = {"x-fake": str(status)}
    before = _counts(rig)
    answer = httpx.post(rig.url + PATH, json=CHAT, headers=headers, timeout=10)
    direct = _direct(rig, headers)
    assert answer.status_code == status and answer.content == direct.content  # never a 200
    row = _row(rig)
    assert (row["outcome"], row["status_code"], row["error"]) == (outcome, status, None)
    assert _moved(before, _counts(rig)) == {("outcome", outcome): 1}  # no failure class: the status says it


# --- failures inside a 200 stream: a break, never a clean end --------------------------------------

# mode -> the failure class; every one of these breaks the client's answer after two tokens
_BREAKS = {
    "reset": "reset",  # a real RST after two tokens
    "truncated-chunk": "truncated",  # a chunk's size line announces more than the close leaves
    "cut-event": "truncated_event",  # half an event, then the body's clean end
    "broken-framing": "bad_framing",
}


@pytest.mark.parametrize("mode", sorted(_BREAKS))
def test_a_stream_cut_mid_answer_reaches_the_client_as_a_break_and_is_counted_once(rig, mode):
    before = _counts(rig)
    status, received, broke = _stream(rig, {"x-fake": mode})
    assert status == 200 and broke  # the client's HTTP library raises: it knows the answer is cut
    _assert_whole_events_without_an_end(received)
    reason = _BREAKS[mode]
    row = _row(rig)
    assert (row["outcome"], row["status_code"]) == ("upstream_error", 200)
    assert (
        row["error"].startswith(f"{reason}: ")
        and row["failure"] == reason
        and row["usage_source"] == "estimated"
    )
    assert row["completion_tokens"] == 2
    assert _moved(before, _counts(rig)) == {("outcome", "upstream_error"): 1, ("failure", reason): 1}


def test_a_reset_of_a_body_framed_by_its_connection_is_a_break_not_an_end(rig):
    """A body without a length or chunks ends when its connection closes; a reset is not that
    end. Before, the sidecar took the reset for the end and gave the client a clean answer."""
    before = _counts(rig)
    status, received, broke = _stream(rig, {"x-fake": "reset", "x-fake-framing": "close"})
    assert status == 200 and broke
    _assert_whole_events_without_an_end(received)
    row = _row(rig)
    assert (
        row["outcome"] == "upstream_error"
        and row["error"].startswith("reset: ")
        and row["failure"] == "reset"
    )
    assert _moved(before, _counts(rig)) == {("outcome", "upstream_error"): 1, ("failure", "reset"): 1}


def test_a_body_framed_by_its_connection_that_closes_cleanly_is_whole(rig):
    headers = {"x-fake-framing": "close"}
    before = _counts(rig)
    status, received, broke = _stream(rig, headers)
    assert status == 200 and not broke
    assert received == _direct(rig, {}).content  # what the engine would have sent, [DONE] and all
    row = _row(rig)
    assert (row["outcome"], row["usage_source"], row["completion_tokens"]) == ("ok", "upstream", 5)
    assert _moved(before, _counts(rig)) == {("outcome", "ok"): 1}


# mode -> (failure class, outcome): the engine said something went wrong, inside its 200 stream;
# the client gets the stream as sent (the error is in it), and the row and counter say so
_SAID = {
    "malformed": ("malformed_event", "upstream_error"),
    "error-event": ("error_event", "upstream_error"),
    "error-field": ("error_event", "upstream_error"),
}


@pytest.mark.parametrize("mode", sorted(_SAID))
def test_an_error_inside_a_200_stream_is_forwarded_and_counted_once(rig, mode):
    before = _counts(rig)
    status, received, broke = _stream(rig, {"x-fake": mode})
    direct = _direct(rig, {"x-fake": mode})
    assert status == 200 and not broke and received == direct.content
    reason, outcome = _SAID[mode]
    row = _row(rig)
    assert row["outcome"] == outcome and row["error"].startswith(f"{reason}: ") and row["failure"] == reason
    assert _moved(before, _counts(rig)) == {("outcome", outcome): 1, ("failure", reason): 1}


def test_silence_mid_stream_is_a_timeout_and_a_break(rig):
    before = _counts(rig)
    status, received, broke = _stream(rig, {"x-fake": "stall"})
    assert status == 200 and broke and b"[DONE]" not in received
    row = _row(rig)
    assert (row["outcome"], row["status_code"]) == ("timeout", 200) and row["error"].startswith(
        "read_timeout: "
    )
    assert _moved(before, _counts(rig)) == {("outcome", "timeout"): 1, ("failure", "read_timeout"): 1}


@pytest.mark.parametrize(
    ("mode", "reason", "outcome", "status"),
    [
        ("garbage-head", "bad_headers", "upstream_error", 502),
        ("hang", "read_timeout", "timeout", 504),
    ],
)
def test_a_failure_before_the_upstreams_status_is_our_own_error_answer(rig, mode, reason, outcome, status):
    before = _counts(rig)
    answer = httpx.post(rig.url + PATH, json=CHAT, headers={"x-fake": mode}, timeout=READ_TIMEOUT_S + 3)
    assert answer.status_code == status and answer.json()["error"]["type"] == outcome
    row = _row(rig)
    assert (row["outcome"], row["status_code"]) == (outcome, status) and row["error"].startswith(
        f"{reason}: "
    )
    assert _moved(before, _counts(rig)) == {("outcome", outcome): 1, ("failure", reason): 1}


def test_an_upstream_that_cannot_be_reached_is_a_counted_502(tmp_path):
    with socket.socket() as closed:
        closed.bind(("127.0.0.1", 0))  # bound, never listening: a connection is refused
        with _sidecar(tmp_path, f"http://127.0.0.1:{closed.getsockname()[1]}") as (server, app):
            rig = Rig(None, server, app)  # type: ignore[arg-type]  (no fake upstream: nothing listens)
            before = _counts(rig)
            answer = httpx.post(rig.url + PATH, json=CHAT, timeout=10)
            assert answer.status_code == 502 and answer.json()["error"]["type"] == "upstream_error"
            row = _row(rig)
            assert (
                row["outcome"] == "upstream_error"
                and row["error"].startswith("connect_failed: ")
                and row["failure"] == "connect_failed"
            )
            moved = _moved(before, _counts(rig))
    assert moved == {("outcome", "upstream_error"): 1, ("failure", "connect_failed"): 1}


def test_every_failure_class_is_an_availability_error():
    """Each class ends a request as an outcome the availability SLO counts as failed."""
    assert set(FAILURES.values()) <= set(ERROR_OUTCOMES)


# --- usage survives a compressed upstream ------------------------------------------------------


@pytest.mark.parametrize("encoding", ["gzip", "deflate"])
def test_a_compressed_stream_is_decoded_for_the_client_and_its_usage_read(rig, encoding):
    """The sidecar asks for identity; an upstream that compresses anyway is decoded, so its
    usage is read (and the usage chunk we asked for still removed): the client receives exactly
    the uncompressed answer, without a Content-Encoding that no longer holds."""
    before = _counts(rig)
    with httpx.stream("POST", rig.url + PATH, json=CHAT, headers={"x-fake-encoding": encoding}) as answer:
        received = answer.read()  # httpx decodes by Content-Encoding: none is left to decode
        assert "content-encoding" not in answer.headers
    assert received == _direct(rig, {}).content
    row = _row(rig)
    assert (row["outcome"], row["usage_source"], row["completion_tokens"], row["prompt_tokens"]) == (
        "ok",
        "upstream",
        5,
        8,
    )
    assert _moved(before, _counts(rig)) == {("outcome", "ok"): 1}


def test_a_compressed_answer_that_is_not_streamed_is_decoded_and_its_usage_read(rig):
    body = {**CHAT, "stream": False}
    before = _counts(rig)
    answer = httpx.post(rig.url + PATH, json=body, headers={"x-fake-encoding": "gzip"}, timeout=10)
    assert "content-encoding" not in answer.headers
    assert answer.content == _direct(rig, {}, body).content
    row = _row(rig)
    assert (row["outcome"], row["usage_source"], row["completion_tokens"]) == ("ok", "upstream", 5)
    assert _moved(before, _counts(rig)) == {("outcome", "ok"): 1}


@pytest.mark.parametrize(
    ("encoding", "reason"), [("gzip-unfinished", "truncated"), ("gzip-bogus", "bad_encoding")]
)
def test_a_compressed_stream_that_does_not_decode_to_its_end_is_a_break(rig, encoding, reason):
    """Labelled gzip and not gzip: nothing decodes, the client gets a break. A gzip stream that
    never ends: what decoded was forwarded as it came (here every event: each was flushed),
    then the break, since the body is cut short of what its Content-Encoding promises."""
    before = _counts(rig)
    status, received, broke = _stream(rig, {"x-fake-encoding": encoding})
    assert status == 200 and broke
    assert received == (_direct(rig, {}).content if encoding == "gzip-unfinished" else b"")
    row = _row(rig)
    assert (
        row["outcome"] == "upstream_error"
        and row["error"].startswith(f"{reason}: ")
        and row["failure"] == reason
    )
    assert _moved(before, _counts(rig)) == {("outcome", "upstream_error"): 1, ("failure", reason): 1}


def test_a_coding_the_sidecar_does_not_decode_is_forwarded_unread_and_said(rig, caplog):
    """Brotli (or any coding but gzip and deflate) is passed on as it came, with its header; its
    events cannot be read, so its tokens are estimated, and a WARNING says so (once a minute)."""
    caplog.set_level(logging.WARNING, logger="collector")
    before = _counts(rig)
    headers = {"x-fake-encoding": "br-bogus"}
    with httpx.stream("POST", rig.url + PATH, json=CHAT, headers=headers, timeout=10) as answer:
        received = b"".join(answer.iter_raw())
        assert answer.headers["content-encoding"] == "br"
    # as the upstream sent it (the fake's br is plain), with the usage chunk the sidecar asked for:
    # it cannot be taken out of bytes the sidecar does not read
    asked = {**CHAT, "stream_options": {"include_usage": True}}
    assert received == _direct(rig, headers, asked).content
    row = _row(rig)
    assert (row["outcome"], row["usage_source"], row["completion_tokens"]) == ("ok", "estimated", 0)
    assert "does not decode" in caplog.text
    assert _moved(before, _counts(rig)) == {("outcome", "ok"): 1}


class _Reads:
    """A BufferedBody stand-in: `readany` hands out `parts`, then b""."""

    def __init__(self, parts: list[bytes]) -> None:
        self.status, self.parts = 200, list(parts)

    async def readany(self) -> bytes:
        return self.parts.pop(0) if self.parts else b""


def _decoded(parts: list[bytes]) -> list[bytes]:
    """What a DecodedBody returns, read by read, over `parts`."""

    async def read() -> list[bytes]:
        body, out = DecodedBody(_Reads(parts)), []  # type: ignore[arg-type]
        while data := await body.readany():
            out.append(data)
        return out

    return asyncio.run(read())


def test_decoding_is_piecewise_whatever_the_compressed_reads():
    """10 MiB of one byte is 10 KiB of gzip: it comes out 64 KiB at a time (the client's flow
    control holds the rest), however the compressed bytes were cut; two gzip members are one
    body; an empty body is no failure."""
    plain = b"x" * (10 * 2**20)
    packed = gzip.compress(plain)
    out = _decoded([packed[:5], packed[5:]])
    assert b"".join(out) == plain and max(map(len, out)) <= 2**16
    assert b"".join(_decoded([gzip.compress(b"one ") + gzip.compress(b"two")])) == b"one two"
    assert b"".join(_decoded([zlib.compress(b"zlib-framed deflate")])) == b"zlib-framed deflate"
    assert _decoded([]) == []


@pytest.mark.parametrize(
    ("parts", "reason"),
    [
        ([gzip.compress(b"whole")[:-6]], "truncated"),
        ([b"not gzip at all"], "bad_encoding"),
        ([gzip.compress(b"whole") + b"trailing garbage"], "bad_encoding"),
    ],
)
def test_a_body_that_is_not_its_coding_fails_as_its_class(parts, reason):
    with pytest.raises(UpstreamBodyBroken) as raised:
        _decoded(parts)
    assert raised.value.reason == reason


def test_content_coding_reads_every_content_encoding_header():
    assert content_coding([(b"Content-Encoding", b" GZIP ")]) == "gzip"
    assert content_coding([(b"content-encoding", b"identity"), (b"content-type", b"x")]) is None
    assert content_coding([]) is None
    assert content_coding([(b"content-encoding", b"gzip"), (b"content-encoding", b"br")]) == "gzip, br"


# --- no buffering: the first token goes on at once; an upstream's own buffering is timed as such ---


@pytest.mark.parametrize("encoding", ["identity", "gzip"])
def test_the_first_event_reaches_the_client_before_the_upstream_sends_the_second(rig, encoding):
    """The upstream sends the role chunk and one token, then waits until the test opens its gate,
    which the test does only once the client holds that token: a sidecar that held bytes back
    (to fill a buffer, to read ahead) would leave the client waiting into its read timeout."""
    test_id = f"first-{encoding}"
    gate = rig.fake.gate(test_id)
    headers = {"x-fake": "gate-second", "x-test-id": test_id, "x-fake-encoding": encoding}
    received = b""
    with httpx.stream(
        "POST", rig.url + PATH, json=CHAT, headers=headers, timeout=READ_TIMEOUT_S + 3
    ) as answer:
        parts = answer.iter_raw()
        while b"tok0" not in received:
            received += next(parts)  # the upstream holds tok1 back until the gate opens
        assert b"tok1" not in received
        gate.set()
        received += b"".join(parts)
    assert received == _direct(rig, {}).content
    assert _row(rig)["outcome"] == "ok"


def test_an_upstream_that_buffers_is_timed_when_its_tokens_arrive(rig):
    """A gateway that holds ~16 KB of events back sends them at once: the client gets them all,
    the row is ok with every token, and its TTFT is when the first token reached the sidecar
    (after the upstream let go), not when the upstream's headers did."""
    gate = rig.fake.gate("held-1")
    tokens = 64
    headers = {
        "x-fake": "buffered",
        "x-test-id": "held-1",
        "x-fake-tokens": str(tokens),
        "x-fake-text": "w" * 200,
    }
    before = _counts(rig)
    with httpx.stream(
        "POST", rig.url + PATH, json=CHAT, headers=headers, timeout=READ_TIMEOUT_S + 3
    ) as answer:
        assert answer.status_code == 200  # its headers came at once; its events are held back
        opened = time.time()
        gate.set()
        received = answer.read()
    assert received == _direct(rig, {"x-fake-tokens": str(tokens), "x-fake-text": "w" * 200}).content
    assert len(received) > 16_000
    row = _row(rig)
    assert (row["outcome"], row["completion_tokens"], row["usage_source"]) == ("ok", tokens, "upstream")
    # the wall times of the row are admission's plus monotonic intervals: 1 ms covers the clocks
    assert row["first_token_at"] >= datetime.fromtimestamp(opened - 0.001, UTC)
    assert row["first_byte_at"] <= datetime.fromtimestamp(opened + 0.001, UTC)
    assert _moved(before, _counts(rig)) == {("outcome", "ok"): 1}


# --- no false positives over 20,000 clean streams -----------------------------------------------------

CLEAN_STREAMS = 20_000
CLIENTS = 16
_TOKENS = 8
_ID = b'"id":"c","object":"chat.completion.chunk","created":1,"model":"m"'


def _chat_event(choice: bytes, usage_null: bool) -> bytes:
    return (
        b"data: {"
        + _ID
        + b',"choices":['
        + choice
        + b"]"
        + (b',"usage":null' if usage_null else b"")
        + b"}\n\n"
    )


def _clean_events(shape: str, usage: bool) -> list[bytes]:
    """One clean answer's events: role, tokens, finish, the usage chunk when asked, [DONE]."""
    null = shape == "vllm" and usage
    if shape == "completions":
        choice = b'{"index":0,"text":"%s","finish_reason":%s}'
        events = [
            b'data: {"id":"c","object":"text_completion","choices":['
            + choice % (b" tok", b"null")
            + b"]}\n\n"
        ]
        events *= _TOKENS
        events.append(
            b'data: {"id":"c","object":"text_completion","choices":['
            + choice % (b"", b'"length"')
            + b"]}\n\n"
        )
    else:
        events = [
            _chat_event(b'{"index":0,"delta":{"role":"assistant","content":""},"finish_reason":null}', null)
        ]
        token = _chat_event(b'{"index":0,"delta":{"content":" tok"},"finish_reason":null}', null)
        if shape == "fields":  # an id and an event name before the data, keep-alive comments between
            token = b"id: 7\nevent: message\n" + token
            events.append(b": keep-alive\n\n")
        events += [token] * _TOKENS
        events.append(_chat_event(b'{"index":0,"delta":{},"finish_reason":"stop"}', null))
    if usage:
        counts = b'"usage":{"prompt_tokens":5,"completion_tokens":%d,"total_tokens":%d}' % (
            _TOKENS,
            _TOKENS + 5,
        )
        events.append(b"data: {" + _ID + b',"choices":[],' + counts + b"}\n\n")
    return [*events, b"data: [DONE]\n\n"]


def _chunked(data: bytes) -> bytes:
    return b"%x\r\n%b\r\n" % (len(data), data)


_SHAPES = (
    "openai",
    "vllm",
    "one-chunk",
    "cut-anywhere",
    "fields",
    "gzip",
    "client-usage",
    "close",
    "completions",
)
_HEAD = b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\n"


def _answer(shape: str, usage: bool, index: int) -> list[bytes]:
    """The upstream's writes for one clean answer of `shape`."""
    events = _clean_events(shape, usage)
    if shape == "gzip":
        compressor = zlib.compressobj(wbits=31)
        pieces = [compressor.compress(e) + compressor.flush(zlib.Z_SYNC_FLUSH) for e in events]
        pieces.append(compressor.flush())
        return (
            [_HEAD + b"content-encoding: gzip\r\ntransfer-encoding: chunked\r\n\r\n"]
            + [_chunked(p) for p in pieces if p]
            + [b"0\r\n\r\n"]
        )
    if shape == "close":  # no framing: the body ends with the connection
        return [_HEAD + b"connection: close\r\n\r\n", *events]
    head = _HEAD + b"transfer-encoding: chunked\r\n\r\n"
    if shape == "one-chunk":
        return [head + _chunked(b"".join(events)) + b"0\r\n\r\n"]
    if shape == "cut-anywhere":  # HTTP chunks and writes cut through events at varying places
        body = b"".join(events)
        cuts = sorted({(index * 7919 + k * 104_729) % len(body) for k in range(1, 6)} - {0})
        pieces = [body[a:b] for a, b in zip([0, *cuts], [*cuts, len(body)], strict=True)]
        return [head, *(_chunked(p) for p in pieces), b"0\r\n\r\n"]
    return [head, *(_chunked(e) for e in events), b"0\r\n\r\n"]


def _expected(shape: str) -> bytes:
    """What the client must receive: the answer without the usage the sidecar asked for (with it
    where the client asked), uncompressed."""
    return b"".join(_clean_events(shape, usage=shape == "client-usage"))


class _CleanUpstream(LoopServer):
    """Answers each request with a clean stream of the shape its `x-shape` names, written as
    `_answer` says (each write its own, with TCP_NODELAY)."""

    def __init__(self) -> None:
        self.served = 0
        self._start("clean-upstream")

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self._writers.add(writer)
        writer.get_extra_info("socket").setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        try:
            while True:
                head = await reader.readuntil(b"\r\n\r\n")
                headers = dict(
                    line.split(b": ", 1) for line in head.lower().split(b"\r\n")[1:] if b": " in line
                )
                body = await reader.readexactly(int(headers[b"content-length"]))
                shape = headers[b"x-shape"].decode()
                self.served += 1
                for piece in _answer(shape, b'"include_usage":true' in body, self.served):
                    writer.write(piece)
                await writer.drain()
                if shape == "close":
                    break
        except (asyncio.IncompleteReadError, ConnectionError):
            pass
        finally:
            self._writers.discard(writer)
            writer.close()


class _Answer:
    """httptools' callbacks for one response."""

    def __init__(self) -> None:
        self.body: list[bytes] = []
        self.complete = False

    def on_body(self, body: bytes) -> None:
        self.body.append(body)

    def on_message_complete(self) -> None:
        self.complete = True


async def _client(port: int, first: int, count: int, wrong: list[tuple[int, str, bytes]]) -> None:
    """Send `count` streamed requests one after another on one keep-alive connection; every
    answer must be 200 and exactly the expected bytes (else it goes to `wrong`)."""
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    try:
        for index in range(first, first + count):
            shape = _SHAPES[index % len(_SHAPES)]
            path = "/v1/completions" if shape == "completions" else PATH
            payload: dict[str, Any] = {
                "model": "m",
                "stream": True,
                "prompt" if shape == "completions" else "messages": (
                    "hello" if shape == "completions" else [{"role": "user", "content": "hello"}]
                ),
            }
            if shape == "client-usage":
                payload["stream_options"] = {"include_usage": True}
            body = json.dumps(payload, separators=(",", ":")).encode()
            writer.write(
                b"POST %s HTTP/1.1\r\nhost: x\r\ncontent-type: application/json\r\nx-shape: %s\r\n"
                b"content-length: %d\r\n\r\n%b" % (path.encode(), shape.encode(), len(body), body)
            )
            answer = _Answer()
            parser = httptools.HttpResponseParser(answer)
            while not answer.complete:
                data = await reader.read(65536)
                if not data:
                    raise ConnectionError(f"the sidecar closed the connection at request {index}")
                parser.feed_data(data)
            received = b"".join(answer.body)
            if parser.get_status_code() != 200 or received != _expected(shape):
                wrong.append((index, shape, received))
    finally:
        writer.close()


@contextlib.contextmanager
def _clean_rig(tmp_path: Path) -> Iterator[tuple[Any, Any, _CleanUpstream]]:
    upstream = _CleanUpstream()
    try:
        with _sidecar(tmp_path, upstream.url) as (server, app):
            yield server, app, upstream
    finally:
        upstream.stop()


@pytest.mark.slow
def test_no_false_failure_over_20000_clean_streams(tmp_path):
    """20,000 clean streams of nine shapes through the real sidecar, 16 clients at a time: every
    client gets exactly the answer it would have had without the sidecar, every row is ok with
    the upstream's usage, and no failure is counted anywhere."""
    began = time.monotonic()
    with _clean_rig(tmp_path) as (server, app, upstream):
        wrong: list[tuple[int, str, bytes]] = []
        each = CLEAN_STREAMS // CLIENTS

        async def clients() -> None:
            await asyncio.gather(*(_client(server.port, k * each, each, wrong) for k in range(CLIENTS)))

        asyncio.run(clients())
        assert not wrong, f"{len(wrong)} answers differ, the first: {wrong[0][:2]} {wrong[0][2][-200:]!r}"
        assert upstream.served == CLEAN_STREAMS
        assert sidecar_state(app).writer.flush()
        rows = sidecar_state(app).batch_sink.query_dicts(
            "SELECT outcome, error, failure, usage_source, completion_tokens, count(*) AS n "
            "FROM requests GROUP BY ALL"
        )
        metrics = httpx.get(server.url + "/metrics").text
    assert rows == [
        {
            "outcome": "ok",
            "error": None,
            "failure": None,
            "usage_source": "upstream",
            "completion_tokens": _TOKENS,
            "n": CLEAN_STREAMS,
        }
    ]
    failures = [line for line in metrics.splitlines() if line.startswith("headroom_upstream_failures_total")]
    outcomes = [line for line in metrics.splitlines() if line.startswith("headroom_requests_total")]
    assert failures == [] and all('outcome="ok"' in line for line in outcomes), outcomes
    assert sum(float(line.rsplit(" ", 1)[1]) for line in outcomes) == CLEAN_STREAMS
    print(f"{CLEAN_STREAMS} clean streams in {time.monotonic() - began:.1f} s")
