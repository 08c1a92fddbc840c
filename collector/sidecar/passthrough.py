"""PassThrough: every other /v1/* path, forwarded as-is and streamed back, not accounted.

The body is bounded like the accounted endpoints' (413 past --max-request-body-bytes); a failure
before the answer started is our own 502 JSON naming the exception's type, never its text.
"""

from __future__ import annotations

import asyncio
from typing import Any

from collector.sidecar.faults import FaultLog
from collector.sidecar.relay import (
    BodyTooLarge,
    ClientChannel,
    describe_failure,
    read_body,
    request_headers,
    response_headers,
    send_error,
    target_url,
    wait_disconnect,
)
from collector.upstream import UpstreamClient

__all__ = ["PassThrough"]

Scope = dict[str, Any]


class PassThrough:
    """ASGI app for every other /v1/* path: forwarded as-is, streamed back, not accounted."""

    def __init__(
        self,
        client: UpstreamClient,
        upstream: str,
        *,
        faults: FaultLog,
        max_request_body_bytes: int = 64 * 2**20,
        read_timeout_s: float = 600.0,
    ) -> None:
        self._client, self._upstream, self._faults = client, upstream, faults
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
        try:
            upstream = await self._client.request(
                scope["method"],
                target_url(self._upstream, scope),
                data=body or None,
                headers=request_headers(scope),
                allow_redirects=False,
            )
            async with upstream.response as resp:
                await client.start(resp.status, response_headers(resp.raw_headers, keep_length=True))
                async for data in resp.content.iter_any():
                    await client.body(data)
                await client.end_body()
        except Exception as exc:  # never let client or upstream input crash the request unanswered
            ending = describe_failure(exc, self._read_timeout_s)
            self._faults.warn(f"passthrough_{ending.outcome}", f"pass-through failed: {ending.error}")
            await client.end(ending)
