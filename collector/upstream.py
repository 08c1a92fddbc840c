"""The probe's HTTP client: one pooled aiohttp session, retrying once on a fresh connection when a
*reused* pooled connection fails before any response byte arrived. (The sidecar has its own,
collector.sidecar.upstream, with the same rule.)

Why: llama.cpp's llama-server closes a keep-alive connection after a streamed answer without
saying `Connection: close`. The next request that the pool puts on that connection fails while
writing its body (`ClientOSError: Can not write request body`) or before the status line
(`ServerDisconnectedError`). The engine never saw that request, so sending it again is safe (RFC
9112 §9.3.1; aiohttp itself does this, but only for idempotent methods, and completions are
POSTs). The retry goes over a separate connector that never pools, so it cannot pick a second
stale connection.

Nothing else is retried: a failure on a new connection (the engine may have read the request), a
connect error, a timeout, and every HTTP answer — a 429 above all — reach the caller as they are.
Each retry is counted by the caller (metric and row), never hidden.
"""

from __future__ import annotations

import contextvars
import weakref
from dataclasses import dataclass
from typing import Any

import aiohttp

__all__ = ["UpstreamClient", "UpstreamResponse", "is_stale_connection_error"]


def is_stale_connection_error(exc: BaseException) -> bool:
    """A write or read failure of an open connection (not connecting, not a timeout)."""
    if isinstance(
        exc, (aiohttp.ClientConnectorError, aiohttp.ServerTimeoutError, aiohttp.ConnectionTimeoutError)
    ):
        return False
    return isinstance(exc, (aiohttp.ServerDisconnectedError, aiohttp.ClientOSError))


class _Sent:
    """Whether this request went out on a pooled connection that had carried one before."""

    __slots__ = ("reused",)

    def __init__(self) -> None:
        self.reused = False


_SENT: contextvars.ContextVar[_Sent | None] = contextvars.ContextVar("headroom_upstream_sent", default=None)


class _PoolConnector(aiohttp.TCPConnector):
    """A TCPConnector that tells the request in flight (a context variable) whether the connection
    it got had carried a request before.

    An aiohttp TraceConfig would say so too (`on_connection_reuseconn`), but a request with a
    trace config sends every trace signal, each an awaited call with its own parameters object:
    about a fifth of the sidecar's CPU per request (BENCHMARKS.md §2). This costs a set lookup.
    """

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self._used: weakref.WeakSet[object] = weakref.WeakSet()  # protocols that carried a request

    async def connect(self, req: Any, traces: Any, timeout: Any) -> Any:
        connection = await super().connect(req, traces, timeout)
        protocol = connection.protocol
        if protocol is not None:
            if protocol in self._used:
                sent = _SENT.get()
                if sent is not None:
                    sent.reused = True
            else:
                self._used.add(protocol)
        return connection


@dataclass(slots=True)
class UpstreamResponse:
    """The response and how many retries it took (0, or 1 after a stale pooled connection)."""

    response: aiohttp.ClientResponse
    retries: int
    retry_reason: str | None


class UpstreamClient:
    """A pooled session plus a non-pooling one for the single retry; open() inside the loop."""

    def __init__(
        self,
        *,
        max_connections: int = 1024,
        timeout: aiohttp.ClientTimeout,
        headers: dict[str, str] | None = None,
        auto_decompress: bool = True,
        skip_auto_headers: tuple[str, ...] = (),
    ) -> None:
        self.max_connections = max_connections
        self._timeout, self._headers = timeout, headers
        self._auto_decompress, self._skip_auto_headers = auto_decompress, skip_auto_headers
        self.session: aiohttp.ClientSession | None = None
        self._fresh: aiohttp.ClientSession | None = None

    async def open(self) -> None:
        """Create both sessions (they bind to the running event loop)."""
        self.session = aiohttp.ClientSession(
            connector=_PoolConnector(
                limit=self.max_connections, limit_per_host=0, ttl_dns_cache=300, keepalive_timeout=60
            ),
            **self._session_options(),
        )
        self._fresh = aiohttp.ClientSession(
            connector=aiohttp.TCPConnector(limit=0, force_close=True, ttl_dns_cache=300),
            **self._session_options(),
        )

    def _session_options(self) -> dict[str, Any]:
        return {
            "timeout": self._timeout,
            "headers": self._headers,
            "auto_decompress": self._auto_decompress,
            "skip_auto_headers": self._skip_auto_headers,
        }

    async def close(self) -> None:
        """Close both sessions; safe before open()."""
        for session in (self.session, self._fresh):
            if session is not None:
                await session.close()

    async def request(self, method: str, url: Any, **kwargs: Any) -> UpstreamResponse:
        """Send; on a stale reused connection, send once more on a new one. Raises as aiohttp."""
        assert self.session is not None and self._fresh is not None, "UpstreamClient not open"
        sent = _Sent()
        token = _SENT.set(sent)  # read by _PoolConnector.connect, in this task
        try:
            response = await self.session.request(method, url, **kwargs)
            return UpstreamResponse(response, 0, None)
        except aiohttp.ClientError as exc:
            if not (sent.reused and is_stale_connection_error(exc)):
                raise
            reason = type(exc).__name__
        finally:
            _SENT.reset(token)
        response = await self._fresh.request(method, url, **kwargs)
        return UpstreamResponse(response, 1, reason)
