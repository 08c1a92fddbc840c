"""Relaying one upstream answer to the client; what was read of it goes to the tracker.

The relays forward bytes as they arrive and tell the tracker what they see (tokens, usage); they
never finish a request and never send the response's last message: they return an `Ending`
(collector.sidecar.ending) and the proxy finishes the request, then sends the last byte.

An SSE answer is read one upstream read at a time by `_Stream.read`, the one per-read step of
both ways it is relayed: by `headroom run` (uvicorn's server) in the upstream connection's
callback, written straight to the client's transport (`_StreamSink`, a ChunkWriter); on any
other ASGI server by a coroutine that takes the reads from a BufferedBody and sends ASGI
messages (`relay_stream`).
"""

from __future__ import annotations

import asyncio
import time
from typing import Any

import orjson

from collector.record import outcome_for_status
from collector.sidecar.client import ClientChannel
from collector.sidecar.ending import Ending, failed
from collector.sidecar.exchange import BufferedBody, DecodedBody, Exchange, UpstreamBodyBroken, UpstreamError
from collector.sidecar.live import LiveRequest
from collector.sidecar.requests import EMBEDDINGS_PATH
from collector.sidecar.tracker import Tracker
from collector.sidecar.uvicorn_cycle import ChunkWriter
from collector.sse import (
    DONE,
    ERROR,
    MALFORMED,
    EventSplitter,
    EventTooLarge,
    inspect_event,
    openai_usage,
    plain_read,
)

__all__ = ["relay_body", "relay_exchange_stream", "relay_stream"]

_USAGE_NULL = b',"usage":null'
_DONE_LINE = b"data: [DONE]"  # the stream's last event: whole even where its blank line is missing


async def relay_body(
    tracker: Tracker,
    request: LiveRequest,
    response: Any,
    client: ClientChannel,
    keep_limit: int,
) -> Ending:
    """Stream a non-SSE answer through; read the usage of a 200 from what was kept.

    `response` is a BufferedBody, or a DecodedBody where the upstream compressed the answer.

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
        if isinstance(payload, dict) and ("timings" in payload or "metrics" in payload):
            tracker.reported_timings(request, payload.get("timings"), payload.get("metrics"))
        tracker.spent(request, time.monotonic() - began)
    return Ending(outcome_for_status(response.status), complete=True, last=held)


def _payload(body: bytes) -> Any:
    """A non-streamed answer's JSON, or None when it is not JSON."""
    try:
        return orjson.loads(body)
    except orjson.JSONDecodeError:
        return None


async def relay_exchange_stream(
    tracker: Tracker,
    request: LiveRequest,
    strip_usage: bool,
    exchange: Exchange,
    client: ClientChannel,
    max_event_bytes: int,
    decode: bool = False,
) -> Ending:
    """Relay an SSE answer of the upstream client (collector.sidecar.upstream) to the client.

    On uvicorn's server (`headroom run`'s) each socket read of the upstream is read, counted and
    written to the client's transport in the connection's callback (`_StreamSink`): no task step
    or coroutine per read. Elsewhere the reads wait in a BufferedBody for `relay_stream`, and so
    do the reads of a compressed stream (`decode`), decoded on the way (DecodedBody).
    """
    writer = None if decode else ChunkWriter.on(client.send)
    if writer is None:
        body = BufferedBody(exchange)
        return await relay_stream(
            tracker, request, strip_usage, DecodedBody(body) if decode else body, client, max_event_bytes
        )
    stream = _Stream(tracker, request, strip_usage, exchange.status, client, max_event_bytes)
    sink = _StreamSink(stream, exchange, writer)
    exchange.start_body(sink)
    whole = await exchange.ended
    if sink.failure is not None:
        raise sink.failure
    if not whole:  # ended short without saying how: never reported as a whole answer
        raise UpstreamBodyBroken("the upstream's response ended early", "truncated")
    return stream.finished()


async def relay_stream(
    tracker: Tracker,
    request: LiveRequest,
    strip_usage: bool,
    response: Any,
    client: ClientChannel,
    max_event_bytes: int,
) -> Ending:
    """Forward SSE events as they complete, read by `_Stream.read`, with the server's ASGI send.

    `response` has the upstream's `status` and `readany()` (b"" at the end). An event over
    `max_event_bytes` that has not ended raises EventTooLarge (the stream ends as upstream_error);
    the splitter keeps memory at that bound per stream.
    """
    stream = _Stream(tracker, request, strip_usage, response.status, client, max_event_bytes)
    step, send, readany = stream.read, client.send, response.readany
    while data := await readany():
        body = step(data)
        if body:  # ClientChannel.body's message, sent from here: one call less per read
            await send({"type": "http.response.body", "body": body, "more_body": True})
            stream.forwarded()
    return stream.finished()


class _StreamSink:
    """The callback relay: each upstream read, in the upstream connection's callback, read by
    `_Stream.read` and written to the client's transport. A client that does not keep up pauses
    the upstream's reading until its transport drained."""

    __slots__ = ("stream", "exchange", "writer", "failure", "draining")

    def __init__(self, stream: _Stream, exchange: Exchange, writer: ChunkWriter) -> None:
        self.stream, self.exchange, self.writer = stream, exchange, writer
        self.failure: BaseException | None = None
        self.draining: asyncio.Future[None] | None = None  # the task that resumes the upstream

    def body(self, data: bytes) -> None:
        try:
            body = self.stream.read(data)
        except EventTooLarge as exc:
            self.failure = exc
            self.exchange.abandon()
            return
        if body:
            if self.writer.write(body) and self.draining is None:
                self.exchange.pause()
                self.draining = asyncio.ensure_future(self._drained())
            self.stream.forwarded()

    def broken(self, exc: UpstreamError) -> None:
        self.failure = exc

    async def _drained(self) -> None:
        try:
            await self.writer.drain()
        finally:
            self.draining = None
            self.exchange.resume()


class _Stream:
    """One SSE answer's reading: each upstream read split, read, counted and stripped (`read`),
    and how the stream ended (`finished`)."""

    __slots__ = (
        "_tracker",
        "_request",
        "_strip_usage",
        "_tracing",
        "_client",
        "_status",
        "splitter",
        "malformed",
        "errored",
        "done",
    )

    def __init__(
        self,
        tracker: Tracker,
        request: LiveRequest,
        strip_usage: bool,
        status: int,
        client: ClientChannel,
        max_event_bytes: int,
    ) -> None:
        self._tracker, self._request, self._strip_usage = tracker, request, strip_usage
        self._tracing = request.telemetry is not None  # the span reads each chunk's id, model and finish
        self._client, self._status = client, status
        self.splitter = EventSplitter(max_event_bytes)
        self.malformed = False
        self.errored = False
        self.done = False  # a `[DONE]` was read: the SSE answer is complete once it is sent

    def read(self, data: bytes) -> bytes:
        """One upstream read: the bytes to forward (b"" while an event is incomplete), less what
        the sidecar asked for; its tokens and the time spent reading it go to the tracker in one
        call (the same instant for TTFT). Raises EventTooLarge.

        A read of plain chunks (nearly all of them) is read in one parse (`plain_read`); any
        other read event by event (`events`)."""
        began = time.monotonic()
        body = self.splitter.take(data)
        tokens = 0
        if body:
            read = None if self._tracing else plain_read(body, self._strip_usage)
            if read is None:
                tokens, body = self.events(body)
            else:
                tokens, body = read
        self._tracker.relayed(self._request, tokens, began, time.monotonic())
        return body

    def forwarded(self) -> None:
        """What `read` returned was sent: once that held `[DONE]`, the client has the whole
        answer, and one that leaves before the upstream's body ends (many SSE clients hang up at
        `[DONE]`) cancelled nothing."""
        if self.done and self._client.answered is None:
            self._client.answered = self.ending(b"")

    def finished(self) -> Ending:
        """How the stream ended, once the upstream's body did."""
        return self.ending(self.splitter.remainder())

    def ending(self, rest: bytes) -> Ending:
        """How the stream ended, from what was read (`rest`: the bytes after its last event).

        A stream cut inside an event (`truncated_event`) ends the client's answer as a break, as
        a cut connection does, never as a clean end that a client would read as a whole answer
        without its last event; the events before the cut were forwarded. Only `[DONE]` without
        its blank line is whole (nothing of the answer is missing). An error the stream itself
        carried (`error_event`, `malformed_event`) reached the client as sent, so its answer ends
        as the upstream's did.
        """
        if self.malformed:
            return failed("malformed_event", "malformed event in stream", complete=True, last=rest)
        if self.errored:
            return failed("error_event", "error event in stream", complete=True, last=rest)
        cut = rest.strip()
        if cut and cut != _DONE_LINE:
            return failed("truncated_event", "the stream ended inside an event")
        return Ending(outcome_for_status(self._status), complete=True, last=rest)

    def events(self, complete: bytes) -> tuple[int, bytes]:
        """Read `complete`, which is not all plain chunks: (its tokens, the bytes to forward, less
        the usage chunk we asked for and the `"usage":null` fields, as `plain_read` strips them).

        The read that ends a stream is plain chunks, then the usage chunk and `[DONE]`: its plain
        part is read (and stripped) by `plain_read`, and only its last two events one by one. Any
        other read is read event by event.
        """
        if self.splitter.separator == b"\n\n" and not self._tracing:  # tracing reads each chunk
            cut = _last_events_start(complete, 2)
            if cut > 0:
                plain = complete[:cut]
                read = plain_read(plain, self._strip_usage)
                if read is not None:
                    tokens, head = read
                    more, tail = self.each_event(complete[cut:])
                    if head is plain and len(tail) == len(complete) - cut:  # nothing left either part
                        return tokens + more, complete
                    return tokens + more, head + tail
        return self.each_event(complete)

    def each_event(self, complete: bytes) -> tuple[int, bytes]:
        """Read each event of `complete`: (its tokens, the bytes to forward, less what we asked for)."""
        request, telemetry, splitter = self._request, self._request.telemetry, self.splitter
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
                chunk = info.chunk  # (None for a common chunk: no usage, no timings, not tracing)
                if chunk is not None and ("timings" in chunk or "metrics" in chunk):  # the engine's own
                    self._tracker.reported_timings(request, chunk.get("timings"), chunk.get("metrics"))
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
