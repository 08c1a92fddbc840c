"""One request to the upstream as its callers see it: an `Exchange`, its failures, its body's sinks.

`H1Pool.send` (collector.sidecar.upstream) returns an Exchange once the response's head arrived;
its body then goes to a `BodySink` from the connection's callbacks (the SSE relay's), or waits in a
`BufferedBody` for a task to read it (every other answer). Each failure is an `UpstreamError`
whose message is ours, never the peer's bytes, and whose `reason` names its failure class (the
row's error starts with it; it is the `reason` of headroom_upstream_failures_total).

An answer the upstream compressed although the sidecar asked for `Accept-Encoding: identity`
(gzip, x-gzip or deflate: `DECODED_CODINGS`) is read through a `DecodedBody`, so that its events
and usage can be read; the client then receives it decoded (collector.sidecar.headers drops its
Content-Encoding and Content-Length).
"""

from __future__ import annotations

import asyncio
import zlib
from typing import Protocol

__all__ = [
    "DECODED_CODINGS",
    "BodySink",
    "BufferedBody",
    "Carrier",
    "DecodedBody",
    "Exchange",
    "UpstreamBodyBroken",
    "UpstreamConnectError",
    "UpstreamConnectTimeout",
    "UpstreamDisconnected",
    "UpstreamError",
    "UpstreamReadTimeout",
    "UpstreamUnparsable",
]


class UpstreamError(Exception):
    """A failure of the exchange with the upstream; the message is ours, never the peer's bytes.

    `reason` is its failure class: each subclass has one, and `UpstreamBodyBroken` says which
    way the body broke (`reset`, `truncated`, `bad_framing`, `bad_encoding`).
    """

    reason = "upstream_failed"

    def __init__(self, message: str, reason: str | None = None) -> None:
        super().__init__(message)
        if reason is not None:
            self.reason = reason


class UpstreamConnectError(UpstreamError):
    """No connection could be made."""

    reason = "connect_failed"


class UpstreamConnectTimeout(UpstreamError, TimeoutError):
    """No connection within the connect timeout."""

    reason = "connect_timeout"


class UpstreamDisconnected(UpstreamError):
    """The connection closed (or failed) before the response's head arrived."""

    reason = "closed_before_headers"


class UpstreamBodyBroken(UpstreamError):
    """The connection closed or was reset, the chunked framing broke, or a compressed body was
    corrupt or cut, inside the response's body (`reason` says which)."""

    reason = "truncated"


class UpstreamUnparsable(UpstreamError):
    """The response's status line or headers are not HTTP."""

    reason = "bad_headers"


class UpstreamReadTimeout(UpstreamError, TimeoutError):
    """Nothing arrived for the read timeout."""

    reason = "read_timeout"


class BodySink(Protocol):
    """Where an exchange's body goes, from the connection's callbacks."""

    def body(self, data: bytes) -> None: ...

    def broken(self, exc: UpstreamError) -> None: ...


class Carrier(Protocol):
    """The connection that carries an exchange (collector.sidecar.connection's PooledConnection)."""

    exchange: Exchange | None

    def pause(self) -> None: ...

    def resume(self, exchange: Exchange) -> None: ...

    def close(self) -> None: ...


class Exchange:
    """One request on one connection: its head, then its body into a sink (see the module doc)."""

    __slots__ = (
        "status",
        "headers",
        "retries",
        "retry_reason",
        "head",
        "ended",
        "connection",
        "_sink",
        "_held",
        "_failure",
    )

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self.status = 0
        self.headers: list[tuple[bytes, bytes]] = []
        self.retries = 0
        self.retry_reason: str | None = None
        self.head: asyncio.Future[None] = loop.create_future()
        self.ended: asyncio.Future[bool] = loop.create_future()
        self.connection: Carrier | None = None
        self._sink: BodySink | None = None
        self._held: list[bytes] | None = []  # body that came before start_body; None after it
        self._failure: UpstreamError | None = None

    def start_body(self, sink: BodySink) -> None:
        """Hand the body to `sink` from now on; what arrived with the head goes first."""
        self._sink = sink
        held, self._held = self._held, None
        if held:
            sink.body(b"".join(held))
        if self._failure is not None:
            sink.broken(self._failure)

    def pause(self) -> None:
        """Stop reading the upstream (the client is slow); `resume` reads on. The read timeout
        stops meanwhile (nothing is read, so nothing can arrive) and restarts at the resume."""
        if self.connection is not None:
            self.connection.pause()

    def resume(self) -> None:
        """Read the upstream again after `pause`."""
        if self.connection is not None:
            self.connection.resume(self)

    def abandon(self) -> None:
        """Nobody wants the rest (the client left, or the request was cancelled): the connection
        closes and is never pooled again."""
        connection, self.connection = self.connection, None
        if connection is not None:
            connection.exchange = None
            connection.close()
        self._sink = None
        if not self.head.done():
            self.head.cancel()
        if not self.ended.done():
            self.ended.set_result(False)

    # --- what the connection calls ----------------------------------------------------------
    def _body(self, data: bytes) -> None:
        if self._held is not None:
            self._held.append(data)
        elif self._sink is not None:
            self._sink.body(data)

    def _end(self) -> None:
        self.connection = self._sink = None  # the sink refers back to this: no cycle left to collect
        if not self.ended.done():
            self.ended.set_result(True)

    def _fail(self, exc: UpstreamError) -> None:
        self.connection = None
        if not self.head.done():
            self.head.set_exception(exc)
        if self.ended.done():
            return
        if self._held is None and self._sink is not None:
            self._sink.broken(exc)
            self._sink = None
        else:
            self._failure = exc  # told to the sink when it comes
        self.ended.set_result(False)


class BufferedBody:
    """A BodySink read by a task (`readany`: b"" at the end).

    For the answers that are not the hot path (non-streamed ones, errors) and for servers whose
    transport the relay cannot write to from a callback: the reads wait here until the task takes
    them, and past `high_water` bytes waiting the upstream is paused until it has.
    """

    __slots__ = (
        "status",
        "content_length",
        "_exchange",
        "_pending",
        "_size",
        "_wakeup",
        "_failure",
        "_high",
    )

    def __init__(self, exchange: Exchange, high_water: int = 2**20) -> None:
        self.status = exchange.status
        self.content_length = _content_length(exchange.headers)
        self._exchange = exchange
        self._pending: list[bytes] = []
        self._size = 0
        self._wakeup: asyncio.Future[None] | None = None
        self._failure: UpstreamError | None = None
        self._high = high_water
        exchange.ended.add_done_callback(self._wake)
        exchange.start_body(self)

    def body(self, data: bytes) -> None:
        self._pending.append(data)
        self._size += len(data)
        if self._size > self._high:
            self._exchange.pause()
        self._wake()

    def broken(self, exc: UpstreamError) -> None:
        self._failure = exc
        self._wake()

    def _wake(self, _: object = None) -> None:
        if self._wakeup is not None and not self._wakeup.done():
            self._wakeup.set_result(None)

    async def readany(self) -> bytes:
        """What arrived since the last call; b"" once the body ended; raises how it broke."""
        while not self._pending:
            if self._failure is not None:
                raise self._failure
            if self._exchange.ended.done():
                return b""
            self._wakeup = asyncio.get_running_loop().create_future()
            await self._wakeup
        data = b"".join(self._pending)
        self._pending.clear()
        if self._size > self._high:
            self._exchange.resume()
        self._size = 0
        return data


DECODED_CODINGS = frozenset({"gzip", "x-gzip", "deflate"})  # what DecodedBody reads
_ANY_ZLIB = 32 + zlib.MAX_WBITS  # a gzip or a zlib header, told apart by the decoder
_DECODED_PIECE = 2**16  # decoded bytes per read at most: a small compressed read can hold a lot


class DecodedBody:
    """A compressed answer (one of DECODED_CODINGS) read decoded: `readany` like BufferedBody's.

    Each read returns at most 64 KiB of decoded bytes, so that a small compressed read that
    decodes to megabytes is forwarded piece by piece under the client's flow control (and the
    upstream stays paused meanwhile, as BufferedBody pauses it). Concatenated gzip members are
    read as one body. A body that is not what its coding says raises UpstreamBodyBroken
    `bad_encoding`; one that ends before its compressed stream does, `truncated`. An empty body
    (a 204, say) is no failure. Not the hot path: uncompressed answers, nearly all of them,
    never come here.
    """

    __slots__ = ("status", "content_length", "_body", "_decoder", "_tail", "_seen", "_ended")

    def __init__(self, body: BufferedBody) -> None:
        self.status = body.status
        self.content_length: int | None = None  # the decoded length is not known before the end
        self._body = body
        self._decoder = zlib.decompressobj(_ANY_ZLIB)
        self._tail = b""  # compressed bytes not decoded yet
        self._seen = self._ended = False

    async def readany(self) -> bytes:
        """Decoded bytes since the last call; b"" once the body ended; raises how it broke."""
        while True:
            if self._tail:
                data, self._tail = self._tail, b""
            elif self._ended:
                return b""
            else:
                data = await self._body.readany()
                if not data:
                    self._ended = True
                    if self._seen and not self._decoder.eof:
                        raise UpstreamBodyBroken("the upstream's compressed body ended early", "truncated")
                    return b""
                self._seen = True
            decoder = self._decoder
            try:
                if decoder.eof:  # a member ended and more follows: gzip allows several
                    decoder = self._decoder = zlib.decompressobj(_ANY_ZLIB)
                decoded = decoder.decompress(data, _DECODED_PIECE)
            except zlib.error:
                raise UpstreamBodyBroken(
                    "the upstream's compressed body is not what its Content-Encoding says", "bad_encoding"
                ) from None
            self._tail = decoder.unconsumed_tail or decoder.unused_data
            if decoded:
                return decoded


def _content_length(headers: list[tuple[bytes, bytes]]) -> int | None:
    for name, value in headers:
        if name.lower() == b"content-length" and value.strip().isdigit():
            return int(value)
    return None
