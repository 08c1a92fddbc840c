"""An experiment: the sidecar's accounting on a relay made of protocol callbacks, not coroutines.

    python benchmarks/callback_proxy.py PORT UPSTREAM_URL                          # bytes only
    python benchmarks/callback_proxy.py PORT UPSTREAM_URL --accounted              # the sidecar's work
    python benchmarks/callback_proxy.py PORT UPSTREAM_URL --accounted --db X.duckdb  # and its log
    python benchmarks/callback_proxy.py PORT UPSTREAM_URL --accounted --server uvicorn  # client side as now

Not a product and not served by `headroom run`: a measurement of what a structural change to the
proxy could buy (BENCHMARKS.md §2, stop 34). The sidecar relays each upstream read in a
coroutine: aiohttp's parser feeds a StreamReader, which wakes the relay's task, which reads the
bytes, accounts for them and writes them to uvicorn's transport. Here the upstream side is a plain
asyncio protocol with httptools' parser (the one uvicorn uses): a socket read of the upstream's
response is parsed in C, and its body goes from the protocol's `data_received` to the client's
transport in the same callback, with no future, task step or coroutine resumed per read. The body
pieces of one socket read (httptools calls `on_body` once per HTTP chunk, and engines write a
chunk per event) are relayed together, once, as aiohttp's `readany` hands them over: relayed piece
by piece, the accounted relay made the load generator read 5 chunks a read instead of 8, and
lost its lead.

The client side is either a plain asyncio protocol too (`--server raw`, the default), or
uvicorn's httptools server with a raw ASGI app (`--server uvicorn`, as `headroom run` serves):
then only the upstream side and the relay change, and each request still runs as an ASGI task
that awaits its answer's end.

With --accounted each request gets what the sidecar's own request path does that is not I/O:
`parse_request` (body parse, `stream_options` injected), the tenant from the headers, the
sidecar's own Tracker (`build_sidecar`'s) admitting and finishing a LiveRequest (labels, gauges,
histograms, the record; with --db, its row through the sidecar's LogWriter into DuckDB), and per
read the sidecar's reading: EventSplitter.take, `read_plain`, the slow path (`_Reading.events`)
for the read that ends a stream, our usage chunk stripped, `Tracker.relayed`; and a read-timeout
timer armed and cancelled per exchange. No disconnect watch beyond the connection's own
`connection_lost`, no retries, no error answers: whatever of those a product needs is cost this
experiment does not carry, so it bounds the gain from above.

    python benchmarks/proxy_overhead.py --workloads 64:flood,256:flood --no-litellm --vllm-targets "" \\
        --extra-target "cbacct={python} benchmarks/callback_proxy.py {port} {upstream} --accounted" \\
        --extra-target "cbuv={python} benchmarks/callback_proxy.py {port} {upstream} --accounted --server uvicorn"
"""

from __future__ import annotations

import argparse
import asyncio
import time
from typing import Any, Protocol
from urllib.parse import urlsplit

import httptools
import uvicorn
import uvloop

from collector.sidecar.config import SidecarConfig
from collector.sidecar.relay import _Reading, read_body, read_plain
from collector.sidecar.requests import parse_request
from collector.sidecar.tenants import resolve_tenant
from collector.sidecar.tracker import LiveRequest, Tracker
from collector.sidecar.wiring import build_sidecar
from collector.sse import EventSplitter

_HOP_BY_HOP = frozenset(
    {b"connection", b"keep-alive", b"transfer-encoding", b"content-length", b"host", b"upgrade", b"te"}
)
_HEALTHY = b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\nok"
_READ_TIMEOUT_S = 600.0
_MAX_BODY_BYTES = 64 * 2**20  # the sidecar's --max-request-body-bytes default


class Exchange(Protocol):
    """What an upstream connection tells the side that waits for its answer."""

    def start(self, status: int, headers: list[tuple[bytes, bytes]]) -> None: ...
    def body(self, data: bytes) -> None: ...
    def end(self) -> None: ...
    def broken(self) -> None: ...


class Settings:
    """The process's one upstream, its pool and the sidecar's tracker (None: bytes only)."""

    host = "127.0.0.1"
    port = 80
    pool: list[Upstream] = []
    tracker: Tracker | None = None


class Upstream(asyncio.Protocol):
    """One pooled keep-alive connection to the upstream, carrying one exchange at a time."""

    def __init__(self) -> None:
        self.transport: asyncio.Transport | None = None
        self.parser = httptools.HttpResponseParser(self)
        self.exchange: Exchange | None = None
        self.headers: list[tuple[bytes, bytes]] = []
        self.parts: list[bytes] = []  # the body pieces of the socket read being parsed

    @staticmethod
    async def get() -> Upstream:
        if Settings.pool:
            return Settings.pool.pop()
        loop = asyncio.get_running_loop()
        _, upstream = await loop.create_connection(Upstream, Settings.host, Settings.port)
        return upstream

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]

    def send(self, exchange: Exchange, head: bytes, body: bytes) -> None:
        self.exchange, self.headers = exchange, []
        assert self.transport is not None
        self.transport.write(head + body)

    def data_received(self, data: bytes) -> None:
        try:
            self.parser.feed_data(data)
        except httptools.HttpParserError:
            self._broken()
            return
        self._flush()

    def _flush(self) -> None:
        parts = self.parts
        if parts and self.exchange is not None:
            self.exchange.body(parts[0] if len(parts) == 1 else b"".join(parts))
        parts.clear()

    def on_header(self, name: bytes, value: bytes) -> None:
        self.headers.append((name, value))

    def on_headers_complete(self) -> None:
        if self.exchange is not None:
            self.exchange.start(self.parser.get_status_code(), self.headers)

    def on_body(self, body: bytes) -> None:
        self.parts.append(body)

    def on_message_complete(self) -> None:
        self._flush()
        exchange, self.exchange = self.exchange, None
        keep = self.parser.should_keep_alive()
        if exchange is not None:
            exchange.end()
        if keep:
            Settings.pool.append(self)
        elif self.transport is not None:
            self.transport.close()

    def connection_lost(self, exc: Exception | None) -> None:
        if self in Settings.pool:
            Settings.pool.remove(self)
        self._broken()

    def abandon(self) -> None:
        """The client went away: this connection's answer is nobody's; close it."""
        self.exchange = None
        if self.transport is not None:
            self.transport.close()

    def _broken(self) -> None:
        exchange, self.exchange = self.exchange, None
        self.parts.clear()
        if exchange is not None:
            exchange.broken()
        if self.transport is not None:
            self.transport.close()


def request_head(path: bytes, headers: list[tuple[bytes, bytes]], length: int) -> bytes:
    lines = [b"POST ", path, b" HTTP/1.1\r\nhost: ", Settings.host.encode(), b"\r\n"]
    for name, value in headers:
        if name.lower() not in _HOP_BY_HOP:
            lines += (name, b": ", value, b"\r\n")
    lines.append(b"content-length: %d\r\n\r\n" % length)
    return b"".join(lines)


def response_head(status: int, headers: list[tuple[bytes, bytes]]) -> bytes:
    lines = [b"HTTP/1.1 %d OK\r\n" % status]
    for name, value in headers:
        if name.lower() not in _HOP_BY_HOP:
            lines += (name, b": ", value, b"\r\n")
    lines.append(b"transfer-encoding: chunked\r\n\r\n")
    return b"".join(lines)


class Accounting:
    """The sidecar's own work on one request: admission, each read, the finish (and its row)."""

    __slots__ = ("tracker", "request", "splitter", "reading", "strip_usage", "timer", "body_out")

    def __init__(
        self, tracker: Tracker, path: bytes, headers: list[tuple[bytes, bytes]], body: bytes
    ) -> None:
        self.tracker = tracker
        parsed = parse_request(body)
        self.body_out = parsed.body
        found = {name.lower(): value for name, value in headers}
        tenant = resolve_tenant(_text(found.get(b"x-tenant-id")), _text(found.get(b"authorization")))
        self.request = LiveRequest(
            parsed.model,
            tenant,
            path.decode("latin-1"),
            parsed.stream,
            parsed.max_tokens,
            parsed.prompt_tokens_estimate,
        )
        tracker.admit(self.request)
        self.strip_usage = parsed.usage_injected
        self.splitter = EventSplitter()
        self.reading = _Reading(tracker, self.request, parsed.usage_injected)
        self.timer: asyncio.TimerHandle | None = None

    def arm(self, on_timeout: Any) -> None:
        """What a product's read timeout costs: a timer per exchange."""
        self.timer = asyncio.get_running_loop().call_later(_READ_TIMEOUT_S, on_timeout)

    def read(self, data: bytes) -> bytes:
        """One socket read of the answer's body: accounted; returns the bytes to forward."""
        began = time.monotonic()
        data = self.splitter.take(data)
        tokens = 0
        if data:
            read = read_plain(data, self.strip_usage)
            if read is None:
                tokens, data = self.reading.events(self.splitter, data)
            else:
                tokens, data = read
        self.tracker.relayed(self.request, tokens, time.monotonic() - began)
        return data

    def finish(self, outcome: str | None, status: int | None) -> None:
        if self.timer is not None:
            self.timer.cancel()
        if outcome is None:
            outcome = self.reading.ending(200, b"").outcome
        self.tracker.finish(self.request, outcome, status_code=status)


# --- the client side as a plain protocol (--server raw) -----------------------------------------


class Client(asyncio.Protocol):
    """One client connection: requests parsed by httptools, each answered from the upstream."""

    def __init__(self) -> None:
        self.transport: asyncio.Transport | None = None
        self.parser = httptools.HttpRequestParser(self)
        self.url = b""
        self.headers: list[tuple[bytes, bytes]] = []
        self.parts: list[bytes] = []
        self.upstream: Upstream | None = None
        self.accounting: Accounting | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]

    def data_received(self, data: bytes) -> None:
        try:
            self.parser.feed_data(data)
        except httptools.HttpParserError:
            assert self.transport is not None
            self.transport.close()

    def on_message_begin(self) -> None:
        self.url, self.headers, self.parts = b"", [], []

    def on_url(self, url: bytes) -> None:
        self.url += url

    def on_header(self, name: bytes, value: bytes) -> None:
        self.headers.append((name, value))

    def on_body(self, body: bytes) -> None:
        self.parts.append(body)

    def on_message_complete(self) -> None:
        assert self.transport is not None
        if self.url == b"/healthz":
            self.transport.write(_HEALTHY)
            return
        body = b"".join(self.parts)
        if Settings.tracker is not None:
            self.accounting = Accounting(Settings.tracker, self.url, self.headers, body)
            body = self.accounting.body_out
        head = request_head(self.url, self.headers, len(body))
        if Settings.pool:
            self._exchange(Settings.pool.pop(), head, body)
        else:
            asyncio.ensure_future(self._connect(head, body))

    async def _connect(self, head: bytes, body: bytes) -> None:
        self._exchange(await Upstream.get(), head, body)

    def _exchange(self, upstream: Upstream, head: bytes, body: bytes) -> None:
        self.upstream = upstream
        if self.accounting is not None:
            self.accounting.arm(self.broken)
        upstream.send(self, head, body)

    def start(self, status: int, headers: list[tuple[bytes, bytes]]) -> None:
        assert self.transport is not None
        if self.accounting is not None:
            self.accounting.tracker.responded(self.accounting.request, status)
        self.transport.write(response_head(status, headers))

    def body(self, data: bytes) -> None:
        if self.accounting is not None:
            data = self.accounting.read(data)
        if data:
            assert self.transport is not None
            self.transport.write(b"%x\r\n%b\r\n" % (len(data), data))

    def end(self) -> None:
        assert self.transport is not None
        accounting, self.accounting, self.upstream = self.accounting, None, None
        if accounting is not None:
            accounting.finish(None, 200)
        self.transport.write(b"0\r\n\r\n")

    def broken(self) -> None:
        accounting, self.accounting, self.upstream = self.accounting, None, None
        if accounting is not None:
            accounting.finish("upstream_error", 502)
        if self.transport is not None:
            self.transport.close()

    # flow control: a slow client pauses the upstream's reads
    def pause_writing(self) -> None:
        if self.upstream is not None and self.upstream.transport is not None:
            self.upstream.transport.pause_reading()

    def resume_writing(self) -> None:
        if self.upstream is not None and self.upstream.transport is not None:
            self.upstream.transport.resume_reading()

    def connection_lost(self, exc: Exception | None) -> None:
        upstream, self.upstream = self.upstream, None
        if upstream is not None:
            upstream.abandon()
        accounting, self.accounting = self.accounting, None
        if accounting is not None:
            accounting.finish("client_cancelled", None)


# --- the client side on uvicorn (--server uvicorn) ----------------------------------------------
class AsgiExchange:
    """One ASGI request's answer: its head awaited by the request's task, its body written to
    uvicorn's transport from the upstream's callbacks, its end awaited again."""

    __slots__ = ("head", "done", "write", "held", "accounting")

    def __init__(self, accounting: Accounting | None) -> None:
        loop = asyncio.get_running_loop()
        self.head: asyncio.Future[tuple[int, list[tuple[bytes, bytes]]]] = loop.create_future()
        self.done: asyncio.Future[bool] = loop.create_future()
        self.write: Any = None  # uvicorn's transport.write, once the response has started
        self.held: list[bytes] = []  # body framed before the response started
        self.accounting = accounting

    def start(self, status: int, headers: list[tuple[bytes, bytes]]) -> None:
        if self.accounting is not None:
            self.accounting.tracker.responded(self.accounting.request, status)
        if not self.head.done():
            self.head.set_result((status, [(k, v) for k, v in headers if k.lower() not in _HOP_BY_HOP]))

    def body(self, data: bytes) -> None:
        if self.accounting is not None:
            data = self.accounting.read(data)
        if data:
            framed = b"%x\r\n%b\r\n" % (len(data), data)
            if self.write is None:
                self.held.append(framed)
            else:
                self.write(framed)

    def end(self) -> None:
        if not self.done.done():
            self.done.set_result(True)

    def broken(self) -> None:
        if not self.head.done():
            self.head.set_result((502, []))
        if not self.done.done():
            self.done.set_result(False)


class AsgiProxy:
    """Raw ASGI app on uvicorn: /healthz, and every other request relayed through Upstream."""

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] == "lifespan":
            while (await receive())["type"] != "lifespan.shutdown":
                await send({"type": "lifespan.startup.complete"})
            await send({"type": "lifespan.shutdown.complete"})
            return
        if scope["path"] == "/healthz":
            await send({"type": "http.response.start", "status": 200, "headers": []})
            await send({"type": "http.response.body", "body": b"ok"})
            return
        body = await read_body(receive, scope, _MAX_BODY_BYTES)  # as the sidecar reads it
        if body is None:
            return  # the client left before its request was read
        path, headers = scope["raw_path"], scope["headers"]
        accounting = None if Settings.tracker is None else Accounting(Settings.tracker, path, headers, body)
        if accounting is not None:
            body = accounting.body_out
        exchange = AsgiExchange(accounting)
        upstream = await Upstream.get()
        if accounting is not None:
            accounting.arm(exchange.broken)
        upstream.send(exchange, request_head(path, headers, len(body)), body)
        outcome, status = "client_cancelled", None
        try:
            status, kept = await exchange.head
            await send({"type": "http.response.start", "status": status, "headers": kept})
            cycle = send.__self__  # uvicorn's request cycle: the body goes to its transport
            exchange.write = cycle.transport.write
            if exchange.held:
                exchange.write(b"".join(exchange.held))
                exchange.held.clear()
            whole = await exchange.done
            outcome = None if whole else "upstream_error"
        finally:
            if not exchange.done.done():
                upstream.abandon()
            if accounting is not None:
                accounting.finish(outcome, status)
        await send({"type": "http.response.body", "body": b"", "more_body": False})


def _text(value: bytes | None) -> str | None:
    return None if value is None else value.decode("latin-1")


async def serve_raw(port: int) -> None:
    server = await asyncio.get_running_loop().create_server(Client, "127.0.0.1", port, backlog=2048)
    async with server:
        await server.serve_forever()


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("port", type=int)
    parser.add_argument("upstream", help="the upstream's base URL, http://host:port/")
    parser.add_argument("--accounted", action="store_true", help="do the sidecar's work per request and read")
    parser.add_argument("--db", help="with --accounted: the request log's DuckDB file (default: no log)")
    parser.add_argument(
        "--server", choices=("raw", "uvicorn"), default="raw", help="the client side (default: raw)"
    )
    args = parser.parse_args()
    where = urlsplit(args.upstream)
    Settings.host, Settings.port = where.hostname or "127.0.0.1", where.port or 80
    writer = None
    if args.accounted:  # the sidecar's own tracker, with its request log when there is a database
        config = SidecarConfig(
            upstream=args.upstream, db_path=args.db, engine="none", jobs=False, instance="bench"
        )
        app = build_sidecar(config)
        Settings.tracker, writer = app.state.tracker, app.state.writer
    try:
        if args.server == "raw":
            uvloop.run(serve_raw(args.port))
        else:
            uvicorn.run(
                AsgiProxy(),
                host="127.0.0.1",
                port=args.port,
                loop="uvloop",
                http="httptools",
                log_level="warning",
                access_log=False,
            )
    except KeyboardInterrupt:  # SIGINT: stop, and keep the rows written so far
        pass
    finally:
        if writer is not None:
            writer.close()


if __name__ == "__main__":
    main()
