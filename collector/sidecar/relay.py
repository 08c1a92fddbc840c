"""Relaying one upstream answer to the client, and saying how it ended (an `Ending`).

The relays forward bytes as they arrive and tell the tracker what they see (tokens, usage); they
never finish a request and never send the response's last message: they return an `Ending`, and
the proxy finishes the request, then calls `ClientChannel.end(ending)`, which sends the last byte
(or our own JSON error when nothing was sent yet, or nothing at all, so the client sees the break
where the upstream broke).

Errors are ours: an Ending's `error` (the row's `error` column, the 502 body) is a short
description and an exception *type*, never an exception's text, which for a parser may quote the
upstream's bytes.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

import orjson
from uvicorn.protocols.http.httptools_impl import RequestResponseCycle as _UvicornCycle

from collector.record import outcome_for_status
from collector.sidecar.requests import EMBEDDINGS_PATH
from collector.sidecar.tracker import LiveRequest, Tracker
from collector.sidecar.upstream import BufferedBody, Exchange, UpstreamBodyBroken, UpstreamError
from collector.sse import (
    DONE,
    ERROR,
    MALFORMED,
    EventSplitter,
    EventTooLarge,
    inspect_event,
    openai_usage,
    plain_read,
    plain_read_stripped,
)

__all__ = [
    "Ending",
    "ClientChannel",
    "BodyTooLarge",
    "read_body",
    "client_closing",
    "wait_disconnect",
    "TaskWatch",
    "CycleWatch",
    "request_headers",
    "response_headers",
    "describe_failure",
    "relay_body",
    "relay_stream",
    "relay_exchange_stream",
    "upstream_headers",
    "upstream_target",
    "media_type",
    "chunked_cycle",
    "send_error",
]

Scope = dict[str, Any]

# Not forwarded: hop-by-hop headers (RFC 9110 §7.6.1), the length we may change, and `Expect`:
# uvicorn already answered the client's 100-continue, and an upstream that ignores it would
# make the request wait for a 100 that never comes.
_HOP_BY_HOP = frozenset(
    {
        b"connection",
        b"keep-alive",
        b"proxy-authenticate",
        b"proxy-authorization",
        b"te",
        b"trailers",
        b"transfer-encoding",
        b"upgrade",
        b"host",
        b"content-length",
        b"expect",
    }
)
_USAGE_NULL = b',"usage":null'
_NULL_END = b',"usage":null}\n\n'  # how such a chunk ends


def read_plain(body: bytes, strip_usage: bool) -> tuple[int, bytes] | None:
    """A read of plain chunks: (its tokens, the bytes to forward); None for any other read.

    vLLM and SGLang write `"usage":null` into every chunk once usage was asked for. When the
    client did not ask (`strip_usage`: the sidecar asked for it), the field goes, once per read
    (inside a JSON string its quotes would be escaped, so it is never text). A read whose chunks
    all end with it is read and stripped in one split (`plain_read_stripped`); any other read of
    plain chunks is parsed by `plain_read`, which says whether a chunk's `usage` is null, so
    OpenAI- and llama.cpp-style reads, which never hold it, are not searched for it.
    """
    if strip_usage and body.endswith(_NULL_END):
        stripped = plain_read_stripped(body)
        if stripped is not None:
            return stripped
    read = plain_read(body)
    if read is None:
        return None
    tokens, usage_null = read
    if usage_null and strip_usage:
        body = body.replace(_USAGE_NULL, b"")
    return tokens, body


@dataclass(frozen=True, slots=True)
class Ending:
    """How an exchange ended: its outcome, our short reason, and what the client still needs.

    `answer` is the status of our own JSON error, sent only when the response has not started;
    `limit` names the flag a refused request went past; `complete` says the upstream ended its
    answer properly, so ours ends properly too, with `last` as its final bytes.
    """

    outcome: str
    error: str | None = None
    answer: int | None = None
    limit: str | None = None
    complete: bool = False
    last: bytes = b""


class ClientChannel:
    """The client's side of one request: the ASGI sends, and whether the response has started."""

    __slots__ = ("send", "started", "gone", "answered")

    def __init__(self, send: Any) -> None:
        self.send = send  # the server's ASGI send (a relay sends its bodies with it directly)
        self.started = False
        self.gone = False
        self.answered: Ending | None = None  # how it ended, once the client had a whole SSE answer

    async def start(self, status: int, headers: list[tuple[bytes, bytes]]) -> None:
        """Send the status and headers. Marked started *before* the await: a cancel inside it
        must never lead to a second start (uvicorn's "Expected ASGI message" RuntimeError)."""
        self.started = True
        await self.send({"type": "http.response.start", "status": status, "headers": headers})

    async def body(self, data: bytes) -> None:
        """Forward bytes; more follow."""
        await self.send({"type": "http.response.body", "body": data, "more_body": True})

    async def end_body(self) -> None:
        """End a response whose bytes were all forwarded."""
        await self.send({"type": "http.response.body", "body": b"", "more_body": False})

    async def end(self, ending: Ending) -> None:
        """The last message: our JSON error, the final bytes, or nothing (the break shows)."""
        if self.gone:
            return
        if not self.started:
            if ending.answer is not None:
                self.started = True
                await send_error(self.send, ending.answer, ending.outcome, ending.error or "", ending.limit)
            return
        if ending.complete:
            await self.send({"type": "http.response.body", "body": ending.last, "more_body": False})


async def send_error(send: Any, status: int, kind: str, message: str, limit: str | None = None) -> None:
    """An OpenAI-style JSON error: {"error": {"message", "type", "code"[, "limit"]}}."""
    error: dict[str, Any] = {"message": message, "type": kind, "code": status}
    if limit is not None:
        error["limit"] = limit
    await send(
        {"type": "http.response.start", "status": status, "headers": [(b"content-type", b"application/json")]}
    )
    await send({"type": "http.response.body", "body": orjson.dumps({"error": error}), "more_body": False})


class BodyTooLarge(Exception):
    """The request body passed the limit; the message names the limit and the flag."""


async def read_body(receive: Any, scope: Scope, limit: int) -> bytes | None:
    """The whole request body, None when the client left first; BodyTooLarge past `limit` bytes.

    A declared Content-Length over the limit is refused before a byte of the body is read (so a
    client that sent `Expect: 100-continue` never uploads it).
    """
    declared = _content_length(scope)
    if declared is not None and declared > limit:
        raise BodyTooLarge(_too_large(declared, limit))
    chunks, size = [], 0
    while True:
        message = await receive()
        if message["type"] == "http.disconnect":
            return None
        chunk = message.get("body", b"")
        size += len(chunk)
        if size > limit:
            raise BodyTooLarge(_too_large(size, limit))
        chunks.append(chunk)
        if not message.get("more_body"):
            return b"".join(chunks)


def _too_large(size: int, limit: int) -> str:
    return (
        f"request body of {size} bytes or more is over the limit of {limit} bytes (--max-request-body-bytes)"
    )


def _content_length(scope: Scope) -> int | None:
    for key, value in scope["headers"]:
        if key == b"content-length" and value.isdigit():
            return int(value)
    return None


def client_closing(receive: Any) -> bool | None:
    """Whether the client's connection is closing, or None where the server does not show it.

    uvicorn's `receive` is a method of its request cycle, which holds the transport; asyncio
    marks a transport closing as soon as it reads the peer's FIN, in the same loop step, while
    the `http.disconnect` message takes a few steps more to reach a waiting `receive`.
    """
    transport = getattr(getattr(receive, "__self__", None), "transport", None)
    is_closing = getattr(transport, "is_closing", None)
    return bool(is_closing()) if callable(is_closing) else None


async def wait_disconnect(receive: Any) -> None:
    """Return when the client disconnects."""
    while (await receive())["type"] != "http.disconnect":
        pass


class TaskWatch:
    """A disconnect watch for any ASGI server: a task that waits on `receive` for http.disconnect
    and calls `gone()` when it comes (or when `receive` raises)."""

    __slots__ = ("_receive", "_gone", "_watcher")

    def __init__(self, receive: Any, gone: Callable[[], None]) -> None:
        self._receive, self._gone = receive, gone
        self._watcher = asyncio.ensure_future(wait_disconnect(receive))
        self._watcher.add_done_callback(self._done)

    def _done(self, done: asyncio.Future[None]) -> None:
        if not done.cancelled():  # scheduled before it came off: too late
            done.exception()  # retrieved: a receive that raised counts as the client gone
            self._gone()

    def seen(self) -> bool | None:
        """Whether the client is gone by now; None when neither the watcher nor the transport
        says so yet and the server does not show its transport (then ask again a step later)."""
        closing = client_closing(self._receive)
        if self._watcher.done():  # its callback may not have run yet
            self._watcher.exception()
            return True
        return closing

    def stop(self) -> None:
        """End the watch: `gone` is not called after this."""
        self._watcher.remove_done_callback(self._done)
        self._watcher.cancel()


class CycleWatch(asyncio.Event):
    """A disconnect watch without a task, on uvicorn's httptools server (`headroom run`'s).

    uvicorn's request cycle wakes a waiting `receive` through its `message_event`, which its
    protocol sets, among other times, when the connection is lost, with `cycle.disconnected`
    set first (uvicorn 0.29-0.55, `HttpToolsProtocol.connection_lost`). For the exchange this
    event stands in for it, and its `set` calls `gone()` when the cycle is disconnected: the
    news arrives in the same loop step as uvicorn's own, and no task, coroutine or
    cancellation is spent on each request (BENCHMARKS.md §2, stop 31). `stop` puts the
    cycle's own event back, set if this one was.
    """

    def __init__(self, cycle: Any, gone: Callable[[], None]) -> None:
        super().__init__()
        self._cycle, self._gone, self._own = cycle, gone, cycle.message_event
        cycle.message_event = self
        cycle.flow.resume_reading()  # as uvicorn's `receive` does before it waits: a FIN is read

    @classmethod
    def on(cls, receive: Any, gone: Callable[[], None]) -> CycleWatch | None:
        """The watch on the uvicorn cycle behind `receive`; None for any other server, or a
        cycle that has already ended."""
        cycle = getattr(receive, "__self__", None)
        if type(cycle) is not _UvicornCycle or cycle.disconnected or cycle.response_complete:
            return None
        return cls(cycle, gone)

    def set(self) -> None:
        super().set()
        if self._cycle.disconnected:
            self._gone()

    def seen(self) -> bool:
        """Whether the client is gone by now: disconnected, or its FIN read (`client_closing`)."""
        return bool(self._cycle.disconnected or self._cycle.transport.is_closing())

    def stop(self) -> None:
        """End the watch: the cycle's own event is back, set if anything set this one."""
        if self._cycle.message_event is self:
            self._cycle.message_event = self._own
            if self.is_set():
                self._own.set()
        self._gone = _nothing


def request_headers(scope: Scope) -> list[tuple[bytes, bytes]]:
    """The client's headers for the upstream (the pass-through's), less hop-by-hop ones."""
    return [(k, v) for k, v in scope["headers"] if k not in _HOP_BY_HOP]


def response_headers(raw: Iterable[tuple[bytes, bytes]], *, keep_length: bool) -> list[tuple[bytes, bytes]]:
    """The upstream's headers for the client, less hop-by-hop ones (Content-Length if kept)."""
    return [
        (k, v)
        for k, v in raw
        if (k.lower() not in _HOP_BY_HOP) or (keep_length and k.lower() == b"content-length")
    ]


def _nothing() -> None:
    return None


def describe_failure(exc: BaseException, read_timeout_s: float) -> Ending:
    """The Ending of an exchange that raised `exc`: outcome, our words and the exception's type.

    Example: UpstreamBodyBroken("the upstream closed the connection inside the body") ->
    Ending('upstream_error', "the upstream closed the connection inside the body
    (UpstreamBodyBroken)", answer=502). The upstream client (collector.sidecar.upstream) raises
    UpstreamErrors whose messages are ours; anything else is named by its type only.
    """
    if isinstance(exc, UpstreamError):
        name = type(exc).__name__
        if isinstance(exc, TimeoutError):
            if "in time" in str(exc):
                return Ending("timeout", f"{exc} ({name})", answer=504)
            return Ending("timeout", f"{exc} (--read-timeout; {name})", answer=504)
        return Ending("upstream_error", f"{exc} ({name})", answer=502)
    return _describe_other(exc, read_timeout_s)


def _describe_other(exc: BaseException, read_timeout_s: float) -> Ending:
    name = type(exc).__name__
    if isinstance(exc, asyncio.TimeoutError):
        return Ending(
            "timeout",
            f"the upstream sent nothing for {read_timeout_s:g} s (--read-timeout; {name})",
            answer=504,
        )
    if isinstance(exc, EventTooLarge):
        return Ending("upstream_error", str(exc), answer=502, limit="--max-sse-event-bytes")
    return Ending("upstream_error", f"proxy error: {name}", answer=502)


async def relay_body(
    tracker: Tracker,
    request: LiveRequest,
    response: Any,
    client: ClientChannel,
    keep_limit: int,
) -> Ending:
    """Stream a non-SSE answer through; read the usage of a 200 from what was kept.

    Bytes go to the client as they arrive, except the chunk that completes a declared
    Content-Length: it is held back as the Ending's `last`, so the request is finished before
    the client has all of it (a Content-Length client is done at its last byte; a chunked one
    only at the end we send after finishing). Up to `keep_limit` bytes of a 200 are kept to read
    its `usage`; past it the answer still streams through, its tokens estimated.
    """
    keep: list[bytes] | None = [] if response.status == 200 else None
    declared = response.content_length
    kept = received = 0
    held = b""
    readany = response.readany  # b"" at the end
    while data := await readany():
        received += len(data)
        if declared is not None and received >= declared:
            held += data  # the last piece of a known length: after the finish
        else:
            await client.body(data)
        if keep is not None:
            kept += len(data)
            if kept <= keep_limit:
                keep.append(data)
            else:
                keep = None  # too big to read: forwarded unread, tokens estimated
    if keep:
        began = time.monotonic()
        payload = _payload(b"".join(keep))
        usage = payload.get("usage") if isinstance(payload, dict) else None
        if isinstance(usage, dict):  # in the chat API's names (the Responses API's renamed)
            embeddings = request.endpoint == EMBEDDINGS_PATH
            tracker.reported_usage(request, openai_usage(usage, embeddings=embeddings))
        if request.telemetry is not None:
            request.telemetry.note_answer(payload)
        tracker.spent(request, time.monotonic() - began)
    return Ending(outcome_for_status(response.status), complete=True, last=held)


def _payload(body: bytes) -> Any:
    """A non-streamed answer's JSON, or None when it is not JSON."""
    try:
        return orjson.loads(body)
    except orjson.JSONDecodeError:
        return None


async def relay_stream(
    tracker: Tracker,
    request: LiveRequest,
    strip_usage: bool,
    response: Any,
    client: ClientChannel,
    max_event_bytes: int,
) -> Ending:
    """Forward SSE events as they complete, reading each; strip the usage chunk we asked for.

    A read of plain chunks (nearly all of them) is read in one parse and forwarded as received,
    less what the sidecar asked for (`read_plain`); any other read is split and its events read one by one (`_Reading.events`).
    An event over `max_event_bytes` that has not ended raises EventTooLarge (the stream ends as
    upstream_error); the splitter keeps memory at that bound per stream.
    """
    splitter = EventSplitter(max_event_bytes)
    reading = _Reading(tracker, request, strip_usage)
    clock, relayed, send = time.monotonic, tracker.relayed, client.send
    cycle = chunked_cycle(send)  # uvicorn's: the bodies go straight to its transport
    if cycle is not None:
        flow, write = cycle.flow, cycle.transport.write
    tracing = request.telemetry is not None  # the span reads each chunk's id, model and finish
    readany = response.readany  # b"" at the end
    while data := await readany():
        began = clock()
        body = splitter.take(data)
        tokens = 0
        if body:
            read = None if tracing else read_plain(body, strip_usage)
            if read is None:
                tokens, body = reading.events(splitter, body)
            else:
                tokens, body = read
        # one tracker call per read (tokens and the time spent): the same instant for TTFT
        relayed(request, tokens, clock() - began)
        if body:
            if cycle is None:  # ClientChannel.body's message, sent from here: one call less per read
                await send({"type": "http.response.body", "body": body, "more_body": True})
            else:  # what uvicorn's send does with this message, without the message
                if flow.write_paused and not cycle.disconnected:
                    await flow.drain()
                if not cycle.disconnected:
                    write(b"%x\r\n%b\r\n" % (len(body), body))
            if reading.done and client.answered is None:
                # the client has the whole answer: one that leaves before the upstream's body
                # ends (many SSE clients hang up at [DONE]) did not cancel anything
                client.answered = reading.ending(response.status, b"")
    return reading.ending(response.status, splitter.remainder())


def chunked_cycle(send: Any) -> Any:
    """uvicorn's request cycle behind `send`, when a relay may write body chunks to its transport.

    That is when `send` is the cycle's own (uvicorn's httptools server, which `headroom run`
    serves on) and the response has started with chunked encoding and is not complete. Each
    chunk is then written as uvicorn's `send` would write it (flow control, a disconnected
    client, the chunk framing: uvicorn 0.29-0.55's `RequestResponseCycle.send`), without
    building and dispatching an ASGI message per read (BENCHMARKS.md §2, stop 28: with the
    token Structs untracked by the GC, 1.5 % less CPU per chunk at flood, within the noise of
    a run). None otherwise: the relay sends ASGI messages.
    """
    cycle = getattr(send, "__self__", None)
    if (
        type(cycle) is _UvicornCycle
        and cycle.response_started
        and not cycle.response_complete
        and cycle.chunked_encoding is True
        and cycle.scope["method"] != "HEAD"
    ):
        return cycle
    return None


async def relay_exchange_stream(
    tracker: Tracker,
    request: LiveRequest,
    strip_usage: bool,
    exchange: Exchange,
    client: ClientChannel,
    max_event_bytes: int,
) -> Ending:
    """relay_stream for an answer of the accounted routes' own client (collector.sidecar.upstream).

    On uvicorn's server (`headroom run`'s) each socket read of the upstream is read, counted and
    written to the client's transport in the connection's callback (`_StreamSink`): no task step
    or coroutine per read (BENCHMARKS.md §2, stop 34). Elsewhere the reads wait in a
    BufferedBody and relay_stream forwards them with ASGI messages.
    """
    cycle = chunked_cycle(client.send)
    if cycle is None:
        return await relay_stream(
            tracker, request, strip_usage, BufferedBody(exchange), client, max_event_bytes
        )
    sink = _StreamSink(tracker, request, strip_usage, exchange, cycle, client, max_event_bytes)
    exchange.start_body(sink)
    whole = await exchange.ended
    if sink.failure is not None:
        raise sink.failure
    if not whole:  # ended short without saying how: never reported as a whole answer
        raise UpstreamBodyBroken("the upstream's response ended early")
    return sink.reading.ending(exchange.status, sink.splitter.remainder())


class _StreamSink:
    """An SSE answer's reads, each read, counted and written to uvicorn's transport as it comes.

    What relay_stream's loop does per read, in the upstream connection's callback. A client
    that does not keep up pauses the upstream's reading until uvicorn's flow control says its
    transport drained.
    """

    __slots__ = (
        "tracker",
        "request",
        "strip_usage",
        "exchange",
        "cycle",
        "flow",
        "write",
        "client",
        "splitter",
        "reading",
        "tracing",
        "status",
        "failure",
        "draining",
    )

    def __init__(
        self,
        tracker: Tracker,
        request: LiveRequest,
        strip_usage: bool,
        exchange: Exchange,
        cycle: Any,
        client: ClientChannel,
        max_event_bytes: int,
    ) -> None:
        self.tracker, self.request, self.strip_usage = tracker, request, strip_usage
        self.exchange, self.cycle, self.client = exchange, cycle, client
        self.flow, self.write = cycle.flow, cycle.transport.write
        self.splitter = EventSplitter(max_event_bytes)
        self.reading = _Reading(tracker, request, strip_usage)
        self.tracing = request.telemetry is not None  # the span reads each chunk's id, model and finish
        self.status = exchange.status
        self.failure: BaseException | None = None
        self.draining: asyncio.Future[None] | None = None  # the task that resumes the upstream

    def body(self, data: bytes) -> None:
        began = time.monotonic()
        try:
            body = self.splitter.take(data)
        except EventTooLarge as exc:
            self.failure = exc
            self.exchange.abandon()
            return
        tokens = 0
        if body:
            read = None if self.tracing else read_plain(body, self.strip_usage)
            if read is None:
                tokens, body = self.reading.events(self.splitter, body)
            else:
                tokens, body = read
        self.tracker.relayed(self.request, tokens, time.monotonic() - began)
        if body:
            if not self.cycle.disconnected:
                self.write(b"%x\r\n%b\r\n" % (len(body), body))
                if self.flow.write_paused and self.draining is None:
                    self.exchange.pause()
                    self.draining = asyncio.ensure_future(self._drained())
            if self.reading.done and self.client.answered is None:
                self.client.answered = self.reading.ending(self.status, b"")

    def broken(self, exc: UpstreamError) -> None:
        self.failure = exc

    async def _drained(self) -> None:
        try:
            await self.flow.drain()
        finally:
            self.draining = None
            self.exchange.resume()


def upstream_target(scope: Scope) -> bytes:
    """The request target for the upstream: the (normalised) raw path and the query string."""
    raw: bytes = scope.get("raw_path") or scope["path"].encode("latin-1")
    query: bytes = scope.get("query_string") or b""
    return raw + b"?" + query if query else raw


def upstream_headers(scope: Scope, traceparent: str | None) -> list[tuple[bytes, bytes]]:
    """The client's headers for the upstream, less hop-by-hop ones and compression (the proxy
    reads the stream, so it must arrive as sent), with the sidecar's `traceparent` if tracing."""
    headers = [
        (k, v)
        for k, v in scope["headers"]
        if k not in _HOP_BY_HOP and k != b"accept-encoding" and (traceparent is None or k != b"traceparent")
    ]
    headers.append((b"accept-encoding", b"identity"))
    if traceparent is not None:
        headers.append((b"traceparent", traceparent.encode("latin-1")))
    return headers


def media_type(headers: list[tuple[bytes, bytes]]) -> str:
    """The Content-Type's media type, lower case ('' when there is none)."""
    for name, value in headers:
        if name.lower() == b"content-type":
            return value.split(b";", 1)[0].strip().lower().decode("latin-1")
    return ""


class _Reading:
    """One stream's reading of the reads that are not all plain chunks: event by event."""

    __slots__ = ("_tracker", "_request", "_strip_usage", "malformed", "errored", "done")

    def __init__(self, tracker: Tracker, request: LiveRequest, strip_usage: bool) -> None:
        self._tracker = tracker
        self._request = request
        self._strip_usage = strip_usage
        self.malformed = False
        self.errored = False
        self.done = False  # a `[DONE]` was read: the SSE answer is complete once it is sent

    def ending(self, status: int, rest: bytes) -> Ending:
        """How the stream ended, from what was read (`rest`: the bytes after its last event)."""
        error = (
            "malformed event in stream"
            if self.malformed
            else "error event in stream"
            if self.errored
            else "stream ended inside an event"
            if rest.strip()
            else None
        )
        return Ending(
            "upstream_error" if error else outcome_for_status(status), error, complete=True, last=rest
        )

    def events(self, splitter: EventSplitter, complete: bytes) -> tuple[int, bytes]:
        """Read `complete`: (its tokens, the bytes to forward, less what we asked for: the usage
        chunk, and the `"usage":null` fields, as `read_plain` strips them).

        The read that ends a stream is plain chunks, then the usage chunk and `[DONE]` (a fifth
        of all events under a flood, BENCHMARKS.md §2): its plain part is read (and stripped)
        by `read_plain`, and only its last two events one by one. Any other read is read event
        by event.
        """
        if splitter.separator == b"\n\n" and self._request.telemetry is None:  # tracing reads each chunk
            cut = _last_events_start(complete, 2)
            if cut > 0:
                plain = complete[:cut]
                read = read_plain(plain, self._strip_usage)
                if read is not None:
                    tokens, head = read
                    more, tail = self.each_event(splitter, complete[cut:])
                    if head is plain and len(tail) == len(complete) - cut:  # nothing left either part
                        return tokens + more, complete
                    return tokens + more, head + tail
        return self.each_event(splitter, complete)

    def each_event(self, splitter: EventSplitter, complete: bytes) -> tuple[int, bytes]:
        """Read each event of `complete`: (its tokens, the bytes to forward, less what we asked for)."""
        request, telemetry = self._request, self._request.telemetry
        events = splitter.events(complete)
        kept: list[bytes] | None = None  # None: forward `complete` exactly as received
        tokens = 0
        for index, event in enumerate(events):
            info = inspect_event(event, keep_chunk=telemetry is not None)
            if info is None:
                pass
            elif info is DONE:
                self.done = True
            elif info is MALFORMED:
                self.malformed = True
            elif info is ERROR:  # the engine failed mid-stream and said so
                self.errored = True
            else:
                tokens += info.tokens_estimate
                if telemetry is not None:  # the response's id, model, finish
                    telemetry.note_answer(info.chunk)
                if info.usage is not None:
                    self._tracker.reported_usage(request, info.usage)  # cumulative: replace, never sum
                    if self._strip_usage and info.usage_only:  # the usage chunk we asked for
                        kept = events[:index] if kept is None else kept
                        continue
            if kept is not None:
                kept.append(event)
        if kept is not None:
            complete = splitter.join(kept)
        if self._strip_usage:  # (replace returns the read itself when it has none)
            complete = complete.replace(_USAGE_NULL, b"")
        return tokens, complete


def _last_events_start(complete: bytes, events: int) -> int:
    """Where the last `events` "\\n\\n"-ended events of `complete` start (0 when it has no more)."""
    end = len(complete) - 2
    for _ in range(events):
        end = complete.rfind(b"\n\n", 0, end)
        if end < 0:
            return 0
    return end + 2
