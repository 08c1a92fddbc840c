"""The floor on uvicorn: the bare pass-through as a raw ASGI app on uvicorn's httptools server.

    python benchmarks/passthrough_asgi.py PORT UPSTREAM_URL

The same copy loop as benchmarks/passthrough_proxy.py (aiohttp's pooled client, each upstream
read forwarded as it arrives, no parsing, no accounting, no log), served the way `headroom run`
serves its proxy routes: uvloop, uvicorn's httptools protocol, raw ASGI. Run it beside the
sidecar to tell the server's cost from the sidecar's own work (BENCHMARKS.md §2, stop 28):

    python benchmarks/proxy_overhead.py --workloads 64:flood,256:flood --no-litellm \\
        --extra-target "uvpass={python} benchmarks/passthrough_asgi.py {port} {upstream}"
"""

from __future__ import annotations

import sys
from typing import Any

import aiohttp
import uvicorn

_HOP_BY_HOP = {b"connection", b"keep-alive", b"transfer-encoding", b"content-length", b"host", b"upgrade"}


class PassThrough:
    """ASGI app: /healthz answers ok; anything else is copied to and from the upstream."""

    def __init__(self, upstream: str) -> None:
        self.upstream = upstream.rstrip("/")
        self.session: aiohttp.ClientSession | None = None

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] == "lifespan":
            await self._lifespan(receive, send)
        elif scope["path"] == "/healthz":
            await send({"type": "http.response.start", "status": 200, "headers": []})
            await send({"type": "http.response.body", "body": b"ok"})
        else:
            await self._proxy(scope, receive, send)

    async def _lifespan(self, receive: Any, send: Any) -> None:
        while True:
            message = await receive()
            if message["type"] == "lifespan.startup":
                connector = aiohttp.TCPConnector(limit=1024, limit_per_host=0)
                self.session = aiohttp.ClientSession(connector=connector, auto_decompress=False)
                await send({"type": "lifespan.startup.complete"})
            elif message["type"] == "lifespan.shutdown":
                if self.session is not None:
                    await self.session.close()
                await send({"type": "lifespan.shutdown.complete"})
                return

    async def _proxy(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        assert self.session is not None
        chunks = []
        while True:
            message = await receive()
            chunks.append(message.get("body", b""))
            if not message.get("more_body"):
                break
        headers = {
            k.decode("latin-1"): v.decode("latin-1") for k, v in scope["headers"] if k not in _HOP_BY_HOP
        }
        async with self.session.request(
            scope["method"], self.upstream + scope["path"], data=b"".join(chunks), headers=headers
        ) as upstream:
            kept = [(k, v) for k, v in upstream.raw_headers if k.lower() not in _HOP_BY_HOP]
            await send({"type": "http.response.start", "status": upstream.status, "headers": kept})
            async for data in upstream.content.iter_any():
                await send({"type": "http.response.body", "body": data, "more_body": True})
            await send({"type": "http.response.body", "body": b"", "more_body": False})


if __name__ == "__main__":
    uvicorn.run(
        PassThrough(sys.argv[2]),
        host="127.0.0.1",
        port=int(sys.argv[1]),
        loop="uvloop",
        http="httptools",
        log_level="error",
        access_log=False,
    )
