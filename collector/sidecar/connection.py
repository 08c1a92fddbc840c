"""One pooled upstream connection: the asyncio protocol under `H1Pool` (collector.sidecar.upstream).

`PooledConnection` is where an upstream's bytes arrive: httptools' parser fed from the socket's
own callback, each read's body joined and handed to the exchange's sink in that callback (no
coroutine per read), the read timeout, and the checks that close a connection rather than pool it
again (upstream.py's module doc lists them). It lives apart from the pool so that each file stays
one thing: the pool decides which connection carries a request and when a request waits; this
module decides what a connection does with what it reads. It knows its pool only through
`ConnectionPool`, the few members it calls, so it imports nothing of upstream.py.
"""

from __future__ import annotations

import asyncio
import socket
from typing import Protocol

import httptools

from collector.sidecar.exchange import (
    Exchange,
    UpstreamBodyBroken,
    UpstreamDisconnected,
    UpstreamError,
    UpstreamReadTimeout,
    UpstreamUnparsable,
)

__all__ = ["ConnectionPool", "PooledConnection"]


class ConnectionPool(Protocol):
    """What a connection asks of its pool (collector.sidecar.upstream's H1Pool)."""

    read_timeout_s: float

    @property
    def loop(self) -> asyncio.AbstractEventLoop: ...

    def _release(self, connection: PooledConnection) -> None:
        """The connection ended a response and may carry another: back to the idle list."""

    def _forget(self, connection: PooledConnection) -> None:
        """The connection closed: it leaves the pool."""


class PooledConnection(asyncio.Protocol):
    """One keep-alive connection of the pool, carrying one exchange at a time (upstream.py's
    module doc says when it closes rather than going back to the pool)."""

    def __init__(self, pool: ConnectionPool) -> None:
        self.pool = pool
        self.loop = pool.loop
        self.transport: asyncio.Transport | None = None
        self.parser = httptools.HttpResponseParser(self)
        self.exchange: Exchange | None = None
        self.parts: list[bytes] = []
        self.used = False  # it has carried an exchange before the current one
        self.got_bytes = False  # the current exchange's response has begun
        self.headed = False  # ... and its head is complete
        self.framed = True  # its body's end is in its framing (a length, or chunked)
        self.paused = False
        self.last_read = 0.0
        self.timer: asyncio.TimerHandle | None = None
        self.closed = False
        self.pooled = False  # waiting in the pool's idle list
        self.completed = False  # the exchange's response ended in the read being parsed
        self.keep = False  # ... and the connection may carry another
        self.surprise = False  # bytes followed that end in the same read: closed, never pooled

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]

    def send(self, exchange: Exchange, data: bytes) -> None:
        exchange.connection, self.exchange = self, exchange
        self.got_bytes = self.headed = self.paused = False
        self.framed = True
        self._arm(self.loop.time())
        assert self.transport is not None
        self.transport.write(data)

    def pause(self) -> None:
        """Stop reading (the exchange's client is slow) and the read timeout with it."""
        if not self.paused:
            self.paused = True
            self._stop_timer()
            if self.transport is not None:
                self.transport.pause_reading()

    def resume(self, exchange: Exchange) -> None:
        """Read again; the read timeout restarts from now while `exchange` is still carried."""
        if self.paused:
            self.paused = False
            if self.exchange is exchange:
                self._arm(self.loop.time())
            if self.transport is not None and not self.transport.is_closing():
                self.transport.resume_reading()

    def unread_bytes(self) -> bool:
        """Whether the kernel holds bytes for this idle connection that the loop has not read:
        a response nobody asked for (one non-blocking MSG_PEEK; the socket object only wraps the
        descriptor and is detached, never closed)."""
        transport = self.transport
        if transport is None or transport.is_closing():
            return True
        raw = transport.get_extra_info("socket")
        if raw is None:  # not a socket (a test's transport): nothing to peek at
            return False
        peek = socket.socket(raw.family, raw.type, 0, raw.fileno())
        try:
            return bool(peek.recv(1, socket.MSG_PEEK | socket.MSG_DONTWAIT))
        except BlockingIOError:
            return False  # nothing waiting: the common case
        except OSError:
            return True  # reset or otherwise broken: not reusable
        finally:
            peek.detach()

    # --- httptools' callbacks and the socket's ------------------------------------------------
    def data_received(self, data: bytes) -> None:
        if self.exchange is None:  # idle: nobody asked for these bytes
            self.surprise = True
            self.close()
            return
        self.got_bytes = True
        self.last_read = self.loop.time()
        try:
            self.parser.feed_data(data)
        except httptools.HttpParserError:
            if self.completed:  # garbage after a whole response: that response stands
                self.surprise = True
            else:
                if self.headed:
                    self._flush()  # what the read held before the break goes first (N4)
                self._fail(
                    UpstreamBodyBroken("the upstream's chunked framing is broken", "bad_framing")
                    if self.headed
                    else UpstreamUnparsable("the upstream's response could not be parsed")
                )
                return
        if self.parts:
            self._flush()
        if self.completed:
            self._after_response()

    def _flush(self) -> None:
        parts = self.parts
        exchange = self.exchange
        if exchange is not None and parts:
            exchange._body(parts[0] if len(parts) == 1 else b"".join(parts))
        parts.clear()

    def on_message_begin(self) -> None:
        if self.completed or self.exchange is None:  # a second response to one request
            self.surprise = True
        elif self.exchange is not None:
            self.exchange.headers = []

    def on_header(self, name: bytes, value: bytes) -> None:
        if self.exchange is not None and not self.completed:
            self.exchange.headers.append((name, value))

    def on_headers_complete(self) -> None:
        exchange = self.exchange
        status = self.parser.get_status_code()
        if exchange is None or self.completed or status < 200:  # a 1xx: the real head follows
            return
        self.headed = True
        exchange.status = status
        lengths = [name.lower() for name, _ in exchange.headers]
        self.framed = b"content-length" in lengths or b"transfer-encoding" in lengths or status in (204, 304)
        if not exchange.head.done():
            exchange.head.set_result(None)

    def on_body(self, body: bytes) -> None:
        if not self.completed:
            self.parts.append(body)

    def on_message_complete(self) -> None:
        if not self.headed or self.completed:
            return  # the end of a 1xx, or of a response nobody asked for
        self._flush()
        exchange, self.exchange = self.exchange, None
        self._stop_timer()
        self.completed = True
        self.keep = self.parser.should_keep_alive() and not self.paused
        if exchange is not None:
            exchange._end()

    def _after_response(self) -> None:
        """The read that ended a response is parsed: pool the connection, unless that read held
        more (another response, garbage) or the connection may not carry another request."""
        self.completed = False
        self.used = True
        if self.keep and not self.surprise:
            self.pool._release(self)
        else:
            self.close()

    def connection_lost(self, exc: Exception | None) -> None:
        self.closed = True
        self._stop_timer()
        self.pool._forget(self)
        exchange = self.exchange
        if exchange is None:
            return
        if self.headed and not self.framed and exc is None:  # a body that ends with its connection
            self._flush()
            self.exchange = None
            exchange._end()
            return
        # a reset is a failure even where the connection's end would have ended the body
        self._fail(
            UpstreamDisconnected("the upstream closed the connection")
            if not self.headed
            else UpstreamBodyBroken("the upstream closed the connection inside the body", "truncated")
            if exc is None
            else UpstreamBodyBroken("the upstream reset the connection inside the body", "reset")
        )

    # --- ours -------------------------------------------------------------------------------
    def _arm(self, now: float) -> None:
        """The read timeout from `now`: one timer, moved on only when it fires."""
        self.last_read = now
        if self.timer is None:
            self.timer = self.loop.call_at(now + self.pool.read_timeout_s, self._timed_out)

    def _timed_out(self) -> None:
        self.timer = None
        if self.exchange is None or self.paused:  # paused: re-armed by the resume
            return
        due = self.last_read + self.pool.read_timeout_s
        if self.loop.time() < due:  # a read since: wait out the rest of it
            self.timer = self.loop.call_at(max(due, self.loop.time() + 0.001), self._timed_out)
            return
        self._fail(UpstreamReadTimeout(f"the upstream sent nothing for {self.pool.read_timeout_s:g} s"))

    def _stop_timer(self) -> None:
        if self.timer is not None:
            self.timer.cancel()
            self.timer = None

    def _fail(self, exc: UpstreamError) -> None:
        exchange, self.exchange = self.exchange, None
        self.parts.clear()
        self.close()
        if exchange is not None:
            exchange._fail(exc)

    def close(self) -> None:
        self._stop_timer()
        if self.transport is not None and not self.transport.is_closing():
            self.transport.close()
