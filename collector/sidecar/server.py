"""Serving the sidecar: uvicorn with a header timeout, an idle timeout and a connection cap.

uvicorn alone lets a connection that never finishes its headers (slowloris) or never sends
anything live forever: 1,100 idle sockets against a 1,024 file-descriptor limit made every
canary request fail. `ConnectionGuard` (uvicorn's httptools protocol plus two rules) closes
them:

- headers must be complete within `header_timeout_s` of the connection opening, or of the
  request's first byte on a kept-alive connection; else `408` JSON and close;
- past `max_connections` open connections, a new one gets `503` JSON and is closed at once, so
  descriptors are never exhausted.

Idle kept-alive connections close after uvicorn's `timeout_keep_alive` (`--idle-timeout`). Both
refusals count in headroom_connections_refused_total{reason}.

The cap must bite before the kernel's open-file limit does, or connections past the limit fail
silently in accept() (issue #36 N7). `fit_connection_cap` first lifts the soft RLIMIT_NOFILE
toward the hard one (`raise_file_limit`), then clamps the cap to what the limit leaves
(`connection_cap`) and logs one WARNING when it had to:

    descriptors left = soft limit - FILE_RESERVE (64: log files, the store, DuckDB's WAL, sockets)
    upstream share   = min(upstream pool bound, half of what is left)
    cap              = min(requested, descriptors left - upstream share), at least 1

e.g. a soft limit of 1,024 with the default 1,024-connection upstream pool: 960 left, 480 for the
upstream, a cap of 480; a limit of 256 and a pool of 64: 192 left, a cap of 128.
"""

from __future__ import annotations

import asyncio
import logging
import resource
from typing import Any, ClassVar

import orjson
from prometheus_client import CollectorRegistry, Counter
from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

from collector.catalog import spec

__all__ = ["ConnectionGuard", "guarded_protocol", "raise_file_limit", "uvicorn_options"]

log = logging.getLogger(__name__)
_REFUSED = spec("headroom_connections_refused_total")
FILE_RESERVE = 64  # descriptors kept for what is not a connection: log files, the store, DuckDB's WAL


def _canned(status: int, reason: str, message: str, limit: str) -> bytes:
    body = orjson.dumps(
        {
            "error": {
                "message": message,
                "type": "bad_request" if status == 408 else "overloaded",
                "code": status,
                "limit": limit,
            }
        }
    )
    head = (
        f"HTTP/1.1 {status} {reason}\r\ncontent-type: application/json\r\n"
        f"content-length: {len(body)}\r\nconnection: close\r\n\r\n"
    )
    return head.encode("ascii") + body


class ConnectionGuard(HttpToolsProtocol):
    """uvicorn's protocol with a header deadline and a connection cap (see the module docstring)."""

    header_timeout_s: ClassVar[float] = 10.0
    max_connections: ClassVar[int] = 4096
    refused: ClassVar[Any] = None  # the Counter, set by guarded_protocol
    _timer: asyncio.TimerHandle | None

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        self._timer = None
        if len(self.connections) > self.max_connections:
            self._refuse(
                503,
                "Service Unavailable",
                "connection_cap",
                f"over {self.max_connections} open connections; retry shortly",
                "--max-client-connections",
            )
            return
        self._arm()

    def on_message_begin(self) -> None:
        super().on_message_begin()
        if self._timer is None:
            self._arm()

    def on_headers_complete(self) -> None:
        self._disarm()
        super().on_headers_complete()

    def connection_lost(self, exc: Exception | None) -> None:
        self._disarm()
        super().connection_lost(exc)

    def _arm(self) -> None:
        self._timer = self.loop.call_later(self.header_timeout_s, self._headers_late)

    def _disarm(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None

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

    def _refuse(self, status: int, reason: str, label: str, message: str, limit: str) -> None:
        if self.refused is not None:
            self.refused.labels(label).inc()
        if not self.transport.is_closing():
            self.transport.write(_canned(status, reason, message, limit))
            self.transport.close()


def guarded_protocol(
    registry: CollectorRegistry | None, *, header_timeout_s: float, max_connections: int
) -> type[ConnectionGuard]:
    """A ConnectionGuard class with these bounds, counting refusals in `registry`."""
    refused = Counter(_REFUSED.name.removesuffix("_total"), _REFUSED.help, _REFUSED.labels, registry=registry)
    attributes = {
        "header_timeout_s": header_timeout_s,
        "max_connections": max_connections,
        "refused": refused,
    }
    return type("SidecarConnectionGuard", (ConnectionGuard,), attributes)


def raise_file_limit(wanted: int) -> int:
    """Lift the soft RLIMIT_NOFILE to `wanted` (at most the hard limit); returns the new soft one
    (the old one where the kernel refuses)."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft == resource.RLIM_INFINITY:
        return soft
    target = wanted if hard == resource.RLIM_INFINITY else min(wanted, hard)
    if target > soft:
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))
        except (ValueError, OSError):
            return soft
        return target
    return soft


def connection_cap(requested: int, file_limit: int, upstream_connections: int) -> int:
    """The client connection cap that fits `file_limit` open files (the module docstring):
    (4096, 1024, 1024) -> 480; (4096, 256, 64) -> 128; (100, 1024, 1024) -> 100; an unlimited
    `file_limit` (resource.RLIM_INFINITY) keeps `requested`."""
    if file_limit == resource.RLIM_INFINITY:
        return requested
    left = file_limit - FILE_RESERVE
    upstream_share = min(upstream_connections, left // 2)
    return max(1, min(requested, left - upstream_share))


def fit_connection_cap(requested: int, upstream_connections: int) -> int:
    """The cap to serve with: the soft RLIMIT_NOFILE lifted to cover `requested` (at most to the
    hard limit), then the cap clamped to it, with one WARNING naming both numbers when clamped."""
    limit = raise_file_limit(requested + upstream_connections + FILE_RESERVE)
    cap = connection_cap(requested, limit, upstream_connections)
    if cap < requested:
        wanted = requested + upstream_connections + FILE_RESERVE
        log.warning(
            "--max-client-connections %d lowered to %d: the open-file limit (RLIMIT_NOFILE) is %d "
            "and cannot be raised further (hard limit), and %d descriptors stay for the upstream "
            "pool and files; raise it to %d to keep %d (`ulimit -n %d` before starting, "
            "LimitNOFILE=%d in the systemd unit, or --ulimit nofile=%d in Docker)",
            requested,
            cap,
            limit,
            limit - cap,
            wanted,
            requested,
            wanted,
            wanted,
            wanted,
        )
    return cap


def uvicorn_options(
    registry: CollectorRegistry | None,
    *,
    header_timeout_s: float,
    idle_timeout_s: float,
    max_connections: int,
) -> dict[str, Any]:
    """uvicorn.run / uvicorn.Config keyword arguments for a guarded sidecar."""
    return {
        "http": guarded_protocol(
            registry, header_timeout_s=header_timeout_s, max_connections=max_connections
        ),
        "timeout_keep_alive": idle_timeout_s,
    }
