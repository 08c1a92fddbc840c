"""The sidecar's one upstream client: HTTP/1.1 in protocol callbacks, body relayed per socket read.

Every route that reaches the engine goes through an `H1Pool`: the accounted completions, the
pass-through and the readiness check (which keeps a pool of one connection of its own, so a full
pool never makes /readyz say "not ready"). It is asyncio protocols with httptools' parser rather
than an HTTP client library because the body is handed over in the socket's own callback, without
a coroutine resumed per read.

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
import socket
import ssl
from collections.abc import Callable
from urllib.parse import unquote, urlsplit

import httptools

from collector.sidecar.exchange import (
    Exchange,
    UpstreamBodyBroken,
    UpstreamConnectError,
    UpstreamConnectTimeout,
    UpstreamDisconnected,
    UpstreamError,
    UpstreamReadTimeout,
    UpstreamUnparsable,
)

__all__ = ["H1Pool", "UpstreamPoolTimeout"]


_BODY_METHODS = frozenset({b"POST", b"PUT", b"PATCH"})  # they declare a length, even of 0


class UpstreamPoolTimeout(UpstreamError):
    """No pooled connection came free within the pool's wait deadline (--upstream-wait-timeout)."""


class _Connection(asyncio.Protocol):
    """One keep-alive connection of the pool, carrying one exchange at a time (the module doc
    says when it closes rather than going back to the pool)."""

    def __init__(self, pool: H1Pool) -> None:
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
        self._idle: collections.deque[_Connection] = collections.deque()
        self._open = 0
        self._waiters: collections.deque[asyncio.Future[None]] = collections.deque()
        self._all: set[_Connection] = set()

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

    async def _try(self, connection: _Connection, data: bytes) -> Exchange:
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
    async def _acquire(self) -> _Connection:
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

    async def _open_connection(self) -> _Connection:
        """A new connection (the single retry's may pass the bound by one)."""
        self._open += 1
        try:
            _, connection = await asyncio.wait_for(
                self.loop.create_connection(
                    lambda: _Connection(self),
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

    def _release(self, connection: _Connection) -> None:
        if not connection.pooled:  # never twice: two requests would share it
            connection.pooled = True
            self._idle.append(connection)
        self._wake()

    def _forget(self, connection: _Connection) -> None:
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
