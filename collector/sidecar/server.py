"""Serving the sidecar: uvicorn with header and body deadlines, an idle timeout, a connection cap,
per-source bounds and a write-stall deadline.

uvicorn alone lets a connection that never finishes its headers (slowloris), never finishes its
body, or never sends anything live forever, until they fill the cap or the file descriptors and
even /metrics gets 503 (issue #36 N2, N7). `ConnectionGuard` (uvicorn's httptools protocol plus
these rules) closes them:

- headers must be complete within `header_timeout_s` of the connection opening, or of the
  request's first byte on a kept-alive connection; else `408` JSON and close;
- the body must be complete within `body_timeout_s` of the headers; else `408` JSON (when no
  response has started) and close: the request was never admitted, so it has no row;
- past `max_connections` open connections, a new one gets one of `ADMIN_SLOTS` reserved slots,
  which serve only `GET`/`HEAD` of /metrics, /healthz and /readyz (and must send their headers
  within `ADMIN_HEADER_TIMEOUT_S`), so Prometheus and the kubelet still see a sidecar whose
  client slots are full; any other request there, or a connection past the reserved slots too,
  gets `503` JSON and is closed at once, so descriptors are never exhausted;
- a reserved slot serves one answer and closes (`Connection: close`), and one client address
  holds at most `ADMIN_SLOTS_PER_SOURCE` of them at a time: keep-alive pollers cannot sit on them
  (issue #48);
- per client address (`source_of`: an IPv4 address, an IPv6 /64), at most
  `max_connections_per_source` open connections (default: the connection cap): past it a
  connection from that address is served like one past the cap (a reserved slot, within its
  address's share), and any other request there gets `429`; and at most
  `max_partial_per_source` requests not yet fully sent (headers or body still arriving after the
  read that began them; default a quarter of the cap, at least `MIN_PARTIAL_PER_SOURCE`), past
  which the newest gets `429`. A 429 has `Retry-After: 1` and closes the connection;
- a client that takes nothing of its answer for `write_stall_timeout_s` (its connection's write
  buffer stays above the high-water mark, so the stream feeding it is paused and holds its
  upstream connection) is cut off (the transport aborted): its request ends `client_cancelled`
  and its upstream connection closes, free for the next request.

Idle kept-alive connections close after uvicorn's `timeout_keep_alive` (`--idle-timeout`). Every
refusal counts in headroom_connections_refused_total{reason} (header_timeout, body_timeout,
connection_cap, source_connections, source_partial_requests, write_stall) and is logged: one
WARNING per reason per minute, with how many more there were.

The cap must bite before the kernel's open-file limit does: `headroom run` fits it to
RLIMIT_NOFILE first (collector.sidecar.descriptors). The per-address counting and its default
bounds are in collector.sidecar.addresses.
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any, ClassVar

import httptools
import orjson
from prometheus_client import CollectorRegistry, Counter
from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

from collector.catalog import spec
from collector.sidecar.addresses import SourceCounts, source_limits, source_of
from collector.sidecar.faults import FaultLog

__all__ = ["ConnectionGuard", "guarded_protocol", "uvicorn_options"]

log = logging.getLogger(__name__)
_REFUSED = spec("headroom_connections_refused_total")
ADMIN_SLOTS = 8  # connections past the cap that may still scrape or probe health
ADMIN_PATHS = frozenset({b"metrics", b"healthz", b"readyz"})  # their paths, slashes stripped
ADMIN_HEADER_TIMEOUT_S = 2.0  # a reserved slot's header deadline: scrapers send theirs at once
ADMIN_SLOTS_PER_SOURCE = ADMIN_SLOTS // 2  # reserved slots one client address may hold at once
_ERROR_TYPES = {408: "bad_request", 429: "rate_limited"}


def _canned(status: int, reason: str, message: str, limit: str) -> bytes:
    body = orjson.dumps(
        {
            "error": {
                "message": message,
                "type": _ERROR_TYPES.get(status, "overloaded"),
                "code": status,
                "limit": limit,
            }
        }
    )
    retry = "retry-after: 1\r\n" if status == 429 else ""
    head = (
        f"HTTP/1.1 {status} {reason}\r\ncontent-type: application/json\r\n{retry}"
        f"content-length: {len(body)}\r\nconnection: close\r\n\r\n"
    )
    return head.encode("ascii") + body


class ConnectionGuard(HttpToolsProtocol):
    """uvicorn's protocol with header and body deadlines, a connection cap, reserved admin slots,
    per-source bounds and a write-stall deadline (see the module docstring)."""

    header_timeout_s: ClassVar[float] = 10.0
    body_timeout_s: ClassVar[float] = 60.0
    max_connections: ClassVar[int] = 4096
    max_connections_per_source: ClassVar[int] = 4096
    max_partial_per_source: ClassVar[int] = 1024
    write_stall_timeout_s: ClassVar[float] = 60.0
    refused: ClassVar[Any] = None  # the Counter, set by guarded_protocol
    faults: ClassVar[FaultLog | None] = None  # the rate-limited WARNINGs, set by guarded_protocol
    sources: ClassVar[SourceCounts | None] = None  # this server's per-address counts, set by guarded_protocol
    _timer: asyncio.TimerHandle | None
    _in_body: bool  # the timer is the body's deadline (else the headers')
    _admin_only: bool  # a reserved slot: /metrics, /healthz, /readyz only, one answer
    _closed_by_us: bool  # refused: the parser's later callbacks change nothing
    _source: str | None  # the client address this connection counts under (None: not counted)
    _reserved: bool  # counted among its address's reserved slots
    _over_source: bool  # opened past its address's bound: a reserved slot, or refused with 429
    _begun: bool  # a request's first bytes arrived and its last have not
    _partial: bool  # ... and it counts among its address's partial requests
    _stalled_since: float | None  # when the client's connection stopped taking writes
    _stall_timer: asyncio.TimerHandle | None

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        self._timer = self._stall_timer = self._stalled_since = self._source = None
        self._in_body = self._admin_only = self._closed_by_us = False
        self._reserved = self._begun = self._partial = self._over_source = False
        self._cycles: list[Any] = []  # this connection's request cycles not yet answered
        open_now = len(self.connections)
        if open_now > self.max_connections + ADMIN_SLOTS:
            self._cap_refusal()
            return
        self._admin_only = open_now > self.max_connections
        sources, client = self.sources, self.client
        if sources is not None and client is not None:
            source = self._source = source_of(client[0])
            over = sources.add(sources.connections, source) > self.max_connections_per_source
            self._over_source = over and not self._admin_only  # (past the cap too: the cap's 503)
            if self._admin_only or self._over_source:  # a reserved slot, if its address may have one
                self._admin_only = True
                if sources.reserved.get(source, 0) >= ADMIN_SLOTS_PER_SOURCE:
                    self._cap_refusal(f"; this address holds {ADMIN_SLOTS_PER_SOURCE} of the reserved slots")
                    return
                sources.add(sources.reserved, source)
                self._reserved = True
        self._arm()

    def data_received(self, data: bytes) -> None:
        if self._closed_by_us:
            return
        super().data_received(data)
        if self._closed_by_us:
            return
        # a body this read did not finish has its deadline from now (armed here, not at the
        # headers: most requests' bodies end in the read that holds their headers, no timer)
        if self._in_body and self._timer is None:
            self._timer = self.loop.call_later(self.body_timeout_s, self._body_late)
        if self._begun and not self._partial and self._source is not None:
            self._count_partial()

    def on_message_begin(self) -> None:
        super().on_message_begin()
        self._begun = True
        if self._timer is None:
            self._arm()

    def on_headers_complete(self) -> None:
        self._disarm()
        if self._admin_only and not self._admin_request():
            self._cap_refusal()
            return
        super().on_headers_complete()
        if self._admin_only and self.cycle is not None:  # one answer, then the slot is free again
            self.cycle.keep_alive = False
        cycles = self._cycles
        if cycles and cycles[0].response_complete:  # the usual case: one request at a time
            cycles[:] = [cycle for cycle in cycles if not cycle.response_complete]
        cycles.append(self.cycle)
        self._in_body = True  # the body's deadline is armed after this read, if it did not end

    def on_body(self, body: bytes) -> None:
        if not self._closed_by_us:
            super().on_body(body)

    def on_message_complete(self) -> None:
        if self._closed_by_us:
            return
        if self._in_body:
            self._disarm()
        self._begun = False
        if self._partial:
            self._partial = False
            assert self.sources is not None and self._source is not None
            self.sources.remove(self.sources.partial, self._source)
        super().on_message_complete()

    def pause_writing(self) -> None:
        """The client's connection stopped taking writes: its stall deadline starts (one timer,
        moved on only when it fires, so a client that pauses and resumes often costs nothing)."""
        super().pause_writing()
        if self._stalled_since is None:
            self._stalled_since = self.loop.time()
            if self._stall_timer is None and not self._closed_by_us:
                self._stall_timer = self.loop.call_at(
                    self._stalled_since + self.write_stall_timeout_s, self._stall_check
                )

    def resume_writing(self) -> None:
        super().resume_writing()
        self._stalled_since = None

    def connection_lost(self, exc: Exception | None) -> None:
        self._disarm()
        if self._stall_timer is not None:
            self._stall_timer.cancel()
            self._stall_timer = None
        self._uncount()
        # uvicorn tells only its newest cycle; with pipelined requests that is one still queued,
        # and the one running would run on for nobody (issue #36 N6): every cycle hears it
        for cycle in self._cycles:
            if cycle is not self.cycle and not cycle.response_complete:
                cycle.disconnected = True
                cycle.message_event.set()
        super().connection_lost(exc)

    def _uncount(self) -> None:
        """This connection leaves its address's counts (once)."""
        sources, source = self.sources, self._source
        if sources is None or source is None:
            return
        self._source = None
        sources.remove(sources.connections, source)
        if self._reserved:
            self._reserved = False
            sources.remove(sources.reserved, source)
        if self._partial:
            self._partial = False
            sources.remove(sources.partial, source)

    def _count_partial(self) -> None:
        """A read ended inside a request: it counts among its address's partial requests, and
        past the bound it is refused. A request pipelined behind a response still being sent is
        not counted (its reading waits for that response)."""
        earlier = self._cycles[:-1] if self._in_body else self._cycles
        if any(not cycle.response_complete for cycle in earlier):
            return
        assert self.sources is not None and self._source is not None
        self._partial = True
        if self.sources.add(self.sources.partial, self._source) > self.max_partial_per_source:
            self._source_refusal(
                "source_partial_requests",
                f"over {self.max_partial_per_source} requests from this address not fully sent",
                "--max-partial-requests-per-source",
            )

    def _stall_check(self) -> None:
        self._stall_timer = None
        since = self._stalled_since
        if since is None or self._closed_by_us:
            return
        due = since + self.write_stall_timeout_s
        if self.loop.time() < due:  # it drained and stalled again since: wait out the rest
            self._stall_timer = self.loop.call_at(due, self._stall_check)
            return
        self._count(
            "write_stall",
            f"the client took nothing of its answer for {self.write_stall_timeout_s:g} s; "
            "its request is cancelled and its upstream connection closed",
            "--write-stall-timeout",
        )
        self._closed_by_us = True
        self.transport.abort()  # a close would wait for the buffer the client never reads

    def _admin_request(self) -> bool:
        method = self.parser.get_method()
        path = httptools.parse_url(self.url).path
        return method in (b"GET", b"HEAD") and path.strip(b"/") in ADMIN_PATHS

    def _arm(self) -> None:
        self._in_body = False
        deadline = (
            min(self.header_timeout_s, ADMIN_HEADER_TIMEOUT_S) if self._admin_only else self.header_timeout_s
        )
        self._timer = self.loop.call_later(deadline, self._headers_late)

    def _disarm(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        self._in_body = False

    def _headers_late(self) -> None:
        self._timer = None
        if self.cycle is not None and not self.cycle.response_complete:
            # a pipelined request's headers wait behind a response still being sent: its
            # deadline counts once that response is done, never a 408 inside it
            self._arm()
            return
        self._refuse(
            408,
            "Request Timeout",
            "header_timeout",
            f"request headers not complete within {self.header_timeout_s:g} s",
            "--header-timeout",
        )

    def _body_late(self) -> None:
        self._timer = None
        self._in_body = False
        cycle = self.cycle
        if cycle is None or not cycle.more_body:
            return  # complete after all
        message = f"request body not complete within {self.body_timeout_s:g} s of its headers"
        if cycle.response_started:  # the app answered without the body: just close
            self._count("body_timeout", message, "--body-timeout")
            self._closed_by_us = True
            self.transport.close()
            return
        self._refuse(408, "Request Timeout", "body_timeout", message, "--body-timeout")

    def _cap_refusal(self, why: str = "") -> None:
        if self._over_source:
            self._refuse(
                429,
                "Too Many Requests",
                "source_connections",
                f"over {self.max_connections_per_source} open connections from this address; "
                f"only /metrics, /healthz, /readyz{why}; retry shortly",
                "--max-connections-per-source",
            )
            return
        limit = f"over {self.max_connections} open connections"
        self._refuse(
            503,
            "Service Unavailable",
            "connection_cap",
            f"{limit}; retry shortly"
            if not self._admin_only
            else f"{limit}; only /metrics, /healthz, /readyz{why}",
            "--max-client-connections",
        )

    def _source_refusal(self, label: str, message: str, limit: str) -> None:
        self._refuse(429, "Too Many Requests", label, f"{message}; retry shortly", limit)

    def _count(self, label: str, message: str, limit: str) -> None:
        if self.refused is not None:
            self.refused.labels(label).inc()
        if self.faults is not None:
            self.faults.warn(f"refused:{label}", f"refused a client connection: {message} ({limit})")

    def _refuse(self, status: int, reason: str, label: str, message: str, limit: str) -> None:
        self._count(label, message, limit)
        self._closed_by_us = True
        if not self.transport.is_closing():
            self.transport.write(_canned(status, reason, message, limit))
            self.transport.close()


def guarded_protocol(
    registry: CollectorRegistry | None,
    *,
    header_timeout_s: float,
    max_connections: int,
    body_timeout_s: float = 60.0,
    max_connections_per_source: int | None = None,
    max_partial_requests_per_source: int | None = None,
    write_stall_timeout_s: float = 60.0,
) -> type[ConnectionGuard]:
    """A ConnectionGuard class with these bounds, counting refusals in `registry`; the per-source
    bounds left None take their defaults (`source_limits`)."""
    refused = Counter(_REFUSED.name.removesuffix("_total"), _REFUSED.help, _REFUSED.labels, registry=registry)
    per_source, partial = source_limits(
        max_connections, max_connections_per_source, max_partial_requests_per_source
    )
    attributes = {
        "header_timeout_s": header_timeout_s,
        "body_timeout_s": body_timeout_s,
        "max_connections": max_connections,
        "max_connections_per_source": per_source,
        "max_partial_per_source": partial,
        "write_stall_timeout_s": write_stall_timeout_s,
        "refused": refused,
        "faults": FaultLog(log),
        "sources": SourceCounts(),
    }
    return type("SidecarConnectionGuard", (ConnectionGuard,), attributes)


def uvicorn_options(
    registry: CollectorRegistry | None,
    *,
    header_timeout_s: float,
    idle_timeout_s: float,
    max_connections: int,
    body_timeout_s: float = 60.0,
    max_connections_per_source: int | None = None,
    max_partial_requests_per_source: int | None = None,
    write_stall_timeout_s: float = 60.0,
) -> dict[str, Any]:
    """uvicorn.run / uvicorn.Config keyword arguments for a guarded sidecar."""
    return {
        "http": guarded_protocol(
            registry,
            header_timeout_s=header_timeout_s,
            max_connections=max_connections,
            body_timeout_s=body_timeout_s,
            max_connections_per_source=max_connections_per_source,
            max_partial_requests_per_source=max_partial_requests_per_source,
            write_stall_timeout_s=write_stall_timeout_s,
        ),
        "timeout_keep_alive": idle_timeout_s,
    }
