"""PassThrough: every other /v1/* path, forwarded as-is and streamed back, not accounted.

The body is bounded like the accounted endpoints' (413 past --max-request-body-bytes); a failure
before the answer started is our own 502 JSON naming the exception's type, never its text.
"""

from __future__ import annotations

import asyncio
from typing import Any

from collector.sidecar.client import (
    BodyTooLarge,
    ClientChannel,
    read_body,
    send_error,
    wait_disconnect,
)
from collector.sidecar.config import MAX_REQUEST_BODY_BYTES
from collector.sidecar.ending import describe_failure
from collector.sidecar.exchange import BufferedBody, Exchange
from collector.sidecar.faults import FaultLog
from collector.sidecar.headers import request_headers, response_headers, upstream_target
from collector.sidecar.upstream import H1Pool

__all__ = ["PassThrough"]

Scope = dict[str, Any]


class PassThrough:
    """ASGI app for every other /v1/* path: forwarded as-is, streamed back, not accounted."""

    def __init__(
        self,
        pool: H1Pool,
        *,
        faults: FaultLog,
        max_request_body_bytes: int = MAX_REQUEST_BODY_BYTES,
        read_timeout_s: float = 600.0,
    ) -> None:
        self._pool, self._faults = pool, faults
        self._max_body, self._read_timeout_s = max_request_body_bytes, read_timeout_s

    async def __call__(self, scope: Scope, receive: Any, send: Any) -> None:
        try:
            body = await read_body(receive, scope, self._max_body)
        except BodyTooLarge as exc:
            await send_error(send, 413, "bad_request", str(exc), "--max-request-body-bytes")
            return
        if body is None:
            return
        work = asyncio.ensure_future(self._forward(scope, body, ClientChannel(send)))
        watcher = asyncio.ensure_future(wait_disconnect(receive))
        try:
            await asyncio.wait((work, watcher), return_when=asyncio.FIRST_COMPLETED)
        finally:
            watcher.cancel()
            if not work.done():
                work.cancel()  # client gone: drop the upstream request (a stream would run on)

    async def _forward(self, scope: Scope, body: bytes, client: ClientChannel) -> None:
        exchange: Exchange | None = None
        try:
            method = scope["method"].encode("ascii")
            exchange = await self._pool.send(method, upstream_target(scope), request_headers(scope), body)
            await client.start(exchange.status, response_headers(exchange.headers, keep_length=True))
            reader = BufferedBody(exchange)
            while data := await reader.readany():
                await client.body(data)
            await client.end_body()
        except Exception as exc:  # never let client or upstream input crash the request unanswered
            ending = describe_failure(exc, self._read_timeout_s)
            self._faults.warn(f"passthrough_{ending.outcome}", f"pass-through failed: {ending.error}")
            await client.end(ending)
        finally:
            if exchange is not None and exchange.connection is not None:
                exchange.abandon()  # unfinished (a cancel, a failure): its connection closes
