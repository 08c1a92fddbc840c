"""The floor: a bare aiohttp proxy that only copies bytes (no parsing, no accounting, no log).

    python benchmarks/passthrough_proxy.py PORT UPSTREAM_URL

What any Python proxy on this machine costs at least: aiohttp's server and client (the sidecar's
upstream client too), uvloop, a pooled connector, each upstream read written to the client as it
arrives. The benchmarks compare the sidecar with it, round by round in the same run.
"""

from __future__ import annotations

import sys

import aiohttp
from aiohttp import web

_HOP_BY_HOP = {"connection", "keep-alive", "transfer-encoding", "content-length", "host", "upgrade"}


def _copy(headers) -> dict[str, str]:
    return {name: value for name, value in headers.items() if name.lower() not in _HOP_BY_HOP}


async def _session(app: web.Application):
    connector = aiohttp.TCPConnector(limit=1024, limit_per_host=0)
    app["session"] = aiohttp.ClientSession(connector=connector, auto_decompress=False)
    yield
    await app["session"].close()


async def _proxy(request: web.Request) -> web.StreamResponse:
    body = await request.read()
    url = request.app["upstream"] + request.path_qs
    async with request.app["session"].request(
        request.method, url, data=body, headers=_copy(request.headers)
    ) as upstream:
        response = web.StreamResponse(status=upstream.status, headers=_copy(upstream.headers))
        await response.prepare(request)
        async for data in upstream.content.iter_any():
            await response.write(data)
        await response.write_eof()
        return response


if __name__ == "__main__":
    import uvloop

    app = web.Application()
    app["upstream"] = sys.argv[2].rstrip("/")
    app.cleanup_ctx.append(_session)
    app.router.add_route("*", "/{tail:.*}", _proxy)
    web.run_app(
        app,
        host="127.0.0.1",
        port=int(sys.argv[1]),
        access_log=None,
        print=None,
        loop=uvloop.new_event_loop(),
    )
