"""The sidecar's one upstream client: HTTP/1.1 in protocol callbacks, body relayed per socket read.

Every route that reaches the engine goes through an `H1Pool`: the accounted completions, the
pass-through and the readiness check (which keeps a pool of one connection of its own, so a full
pool never makes /readyz say "not ready"). It is asyncio protocols with httptools' parser rather
than an HTTP client library because the body is handed over in the socket's own callback, without
a coroutine resumed per read. This module is the pool; each of its connections, the protocol
whose callbacks parse and relay, is a `PooledConnection` (collector.sidecar.connection).

One `Exchange` (collector.sidecar.exchange) is one request on one connection of the pool:

    exchange = await pool.send(b"POST", target, headers, body)  # returns once the head arrived
    exchange.status, exchange.headers, exchange.retries
    exchange.start_body(sink)   # from now on each socket read's body goes to sink.body(data)
    ok = await exchange.ended   # True: the body ended as HTTP frames it; False: sink.broken(exc) ran

A sink's `body` runs inside the connection's `data_received`: it must not block or await. The
pieces of one socket read (httptools gives one per HTTP chunk, and engines write a chunk per SSE
event) are joined and handed over once, so the client gets them in one write too, not a write
per chunk (BENCHMARKS.md §2 has the figures).

A request whose *reused* pooled connection fails before any response byte is sent once more
on a new connection (llama.cpp closes keep-alive connections
without saying so); nothing else is retried. A connect timeout, a read timeout (no byte for
`read_timeout_s`: one timer per exchange, moved on only when it fires; stopped while the
exchange is paused for a slow client, since nothing is read then, and re-armed from the resume),
and at most `max_connections` connections (0: no bound), a request waiting in order for a free one
for at most `wait_timeout_s` (None: no deadline): past it the request fails with
`UpstreamPoolTimeout` (the proxy answers 503, outcome `overloaded`) and `on_wait_timeout` is
called (the sidecar counts it in headroom_upstream_wait_timeouts_total). A waiting request costs
one timer, and only while it waits.

A connection carries one exchange at a time, and a byte nobody asked for ends it (issue #36 N1:
an upstream that wrote one extra response made the pool hold a connection twice, and one
client received another's completion). A connection is closed, never pooled again, when

- bytes arrive while it carries no exchange (it is idle in the pool);
- bytes follow the end of a response in the same read (a second response, or garbage);
- its kernel buffer already holds bytes when it is taken from the pool (a non-blocking
  `MSG_PEEK` of one byte, one system call per reuse, catches what arrived since the loop last
  polled it);
- the response's framing breaks, or the response ends while the client's reading is paused.

What a read parsed before its framing broke still reaches the sink, then the failure (N4). A body
the connection's end cuts short of its framing (a length, or chunked's last chunk) fails as
`truncated`, one cut by a reset as `reset`, even a body that has no framing and would have ended
with its connection (only a clean close ends it).
"""

from __future__ import annotations

import asyncio
import base64
import collections
import ssl
from collections.abc import Callable
from urllib.parse import unquote, urlsplit

from collector.sidecar.connection import PooledConnection
from collector.sidecar.exchange import (
    Exchange,
    UpstreamConnectError,
    UpstreamConnectTimeout,
    UpstreamDisconnected,
    UpstreamError,
)

__all__ = ["H1Pool", "UpstreamPoolTimeout"]


_BODY_METHODS = frozenset({b"POST", b"PUT", b"PATCH"})  # they declare a length, even of 0


class UpstreamPoolTimeout(UpstreamError):
    """No pooled connection came free within the pool's wait deadline (--upstream-wait-timeout)."""


class H1Pool:
    """Keep-alive HTTP/1.1 connections to one upstream (a base URL); open() inside the loop."""

    def __init__(
        self,
        base_url: str,
        *,
        max_connections: int = 1024,
        connect_timeout_s: float = 10.0,
        read_timeout_s: float = 600.0,
        wait_timeout_s: float | None = None,
        on_wait_timeout: Callable[[], object] | None = None,
    ) -> None:
        parts = urlsplit(base_url)
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise ValueError(f"not an http(s) URL: {base_url!r}")
        self.host = parts.hostname
        self.port = parts.port or (443 if parts.scheme == "https" else 80)
        self.ssl: ssl.SSLContext | None = ssl.create_default_context() if parts.scheme == "https" else None
        netloc = parts.netloc.rpartition("@")[2]
        self.prefix = parts.path.rstrip("/").encode("latin-1")  # the base URL's own path
        self._fixed = [(b"host", netloc.encode("ascii") if netloc.isascii() else netloc.encode("idna"))]
        if parts.username is not None:  # credentials in the URL: Basic authorization
            pair = f"{unquote(parts.username)}:{unquote(parts.password or '')}".encode()
            self._fixed.append((b"authorization", b"Basic " + base64.b64encode(pair)))
        self.max_connections = max_connections
        self.connect_timeout_s = connect_timeout_s
        self.read_timeout_s = read_timeout_s
        self.wait_timeout_s = wait_timeout_s
        self._on_wait_timeout = on_wait_timeout
        self._idle: collections.deque[PooledConnection] = collections.deque()
        self._open = 0
        self._waiters: collections.deque[asyncio.Future[None]] = collections.deque()
        self._all: set[PooledConnection] = set()

    @property
    def loop(self) -> asyncio.AbstractEventLoop:
        return asyncio.get_running_loop()

    def close(self) -> None:
        """Close every connection (at shutdown)."""
        for connection in list(self._all):
            connection.close()
        self._idle.clear()

    async def send(
        self, method: bytes, target: bytes, headers: list[tuple[bytes, bytes]], body: bytes
    ) -> Exchange:
        """Send; return the exchange once its head arrived. Raises an UpstreamError (the head
        never came), once retried on a new connection where a reused one failed first."""
        head = self._head(method, target, headers, len(body))
        connection = await self._acquire()
        exchange = await self._try(connection, head + body)
        if exchange.head.done() and exchange.head.exception() is None:
            return exchange
        failure = exchange.head.exception()
        assert isinstance(failure, UpstreamError)
        if not (connection.used and not connection.got_bytes and isinstance(failure, UpstreamDisconnected)):
            raise failure
        again = await self._try(await self._open_connection(), head + body)
        again.retries, again.retry_reason = 1, "stale_connection"
        if again.head.exception() is not None:
            raise again.head.exception()  # type: ignore[misc]
        return again

    async def _try(self, connection: PooledConnection, data: bytes) -> Exchange:
        exchange = Exchange(self.loop)
        connection.send(exchange, data)
        try:
            await exchange.head
        except UpstreamError:
            pass  # the caller reads it off the head
        except asyncio.CancelledError:
            exchange.abandon()
            raise
        return exchange

    def _head(self, method: bytes, target: bytes, headers: list[tuple[bytes, bytes]], length: int) -> bytes:
        """The request's head; a bodiless GET, DELETE or OPTIONS declares no length (RFC 9110 §8.6)."""
        lines = [method, b" ", self.prefix + target, b" HTTP/1.1\r\n"]
        fixed_names = {name for name, _ in self._fixed}
        for name, value in self._fixed:
            lines += (name, b": ", value, b"\r\n")
        for name, value in headers:
            if name.lower() not in fixed_names:
                lines += (name, b": ", value, b"\r\n")
        lines.append(b"content-length: %d\r\n\r\n" % length if length or method in _BODY_METHODS else b"\r\n")
        return b"".join(lines)

    # --- the pool -------------------------------------------------------------------------------
    async def _acquire(self) -> PooledConnection:
        deadline: float | None = None  # set at the first wait: the whole wait has one deadline
        while True:
            while self._idle:
                connection = self._idle.pop()  # the most recently used: the warmest
                connection.pooled = False
                if connection.closed or connection.exchange is not None:
                    continue
                if connection.unread_bytes():  # a response nobody asked for waits in it
                    connection.surprise = True
                    connection.close()
                    continue
                return connection
            if self.max_connections <= 0 or self._open < self.max_connections:
                return await self._open_connection()
            loop = self.loop
            waiter = loop.create_future()
            self._waiters.append(waiter)
            timer = None
            if self.wait_timeout_s is not None:
                deadline = loop.time() + self.wait_timeout_s if deadline is None else deadline
                timer = loop.call_at(deadline, self._expire, waiter)
            try:
                await waiter
            except UpstreamPoolTimeout:
                if self._on_wait_timeout is not None:
                    self._on_wait_timeout()
                raise
            except asyncio.CancelledError:
                if waiter in self._waiters:
                    self._waiters.remove(waiter)
                elif waiter.done() and not waiter.cancelled() and waiter.exception() is None:
                    self._wake()  # pass the turn on
                raise
            finally:
                if timer is not None:
                    timer.cancel()

    def _expire(self, waiter: asyncio.Future[None]) -> None:
        """A waiter's deadline passed with no connection free: it fails (and leaves the queue
        when `_wake` next reaches it: a finished waiter is passed over)."""
        if not waiter.done():
            waiter.set_exception(
                UpstreamPoolTimeout(
                    f"no upstream connection came free within {self.wait_timeout_s:g} s: all "
                    f"{self.max_connections} in use (--upstream-wait-timeout, --max-upstream-connections)"
                )
            )

    async def _open_connection(self) -> PooledConnection:
        """A new connection (the single retry's may pass the bound by one)."""
        self._open += 1
        try:
            _, connection = await asyncio.wait_for(
                self.loop.create_connection(
                    lambda: PooledConnection(self),
                    self.host,
                    self.port,
                    ssl=self.ssl,
                    server_hostname=self.host if self.ssl else None,
                ),
                self.connect_timeout_s,
            )
        except TimeoutError:
            self._open -= 1
            self._wake()
            raise UpstreamConnectTimeout("could not connect to the upstream in time") from None
        except OSError as exc:
            self._open -= 1
            self._wake()
            raise UpstreamConnectError(f"cannot connect to the upstream ({type(exc).__name__})") from None
        except BaseException:
            self._open -= 1
            self._wake()
            raise
        self._all.add(connection)
        return connection

    def _release(self, connection: PooledConnection) -> None:
        if not connection.pooled:  # never twice: two requests would share it
            connection.pooled = True
            self._idle.append(connection)
        self._wake()

    def _forget(self, connection: PooledConnection) -> None:
        if connection in self._all:
            self._all.discard(connection)
            self._open -= 1
        if connection.pooled:
            connection.pooled = False
            try:
                self._idle.remove(connection)
            except ValueError:
                pass
        self._wake()

    def _wake(self) -> None:
        while self._waiters:
            waiter = self._waiters.popleft()
            if not waiter.done():
                waiter.set_result(None)
                return
