"""One request to the upstream as its callers see it: an `Exchange`, its failures, its body's sinks.

`H1Pool.send` (collector.sidecar.upstream) returns an Exchange once the response's head arrived;
its body then goes to a `BodySink` from the connection's callbacks (the SSE relay's), or waits in a
`BufferedBody` for a task to read it (every other answer). Each failure is an `UpstreamError`
whose message is ours, never the peer's bytes.
"""

from __future__ import annotations

import asyncio
from typing import Protocol

__all__ = [
    "BodySink",
    "BufferedBody",
    "Carrier",
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
    """A failure of the exchange with the upstream; the message is ours, never the peer's bytes."""


class UpstreamConnectError(UpstreamError):
    """No connection could be made."""


class UpstreamConnectTimeout(UpstreamError, TimeoutError):
    """No connection within the connect timeout."""


class UpstreamDisconnected(UpstreamError):
    """The connection closed (or failed) before the response's head arrived."""


class UpstreamBodyBroken(UpstreamError):
    """The connection closed, or the chunked framing broke, inside the response's body."""


class UpstreamUnparsable(UpstreamError):
    """The response's status line or headers are not HTTP."""


class UpstreamReadTimeout(UpstreamError, TimeoutError):
    """Nothing arrived for the read timeout."""


class BodySink(Protocol):
    """Where an exchange's body goes, from the connection's callbacks."""

    def body(self, data: bytes) -> None: ...

    def broken(self, exc: UpstreamError) -> None: ...


class Carrier(Protocol):
    """The connection that carries an exchange (collector.sidecar.upstream's)."""

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


def _content_length(headers: list[tuple[bytes, bytes]]) -> int | None:
    for name, value in headers:
        if name.lower() == b"content-length" and value.strip().isdigit():
            return int(value)
    return None
