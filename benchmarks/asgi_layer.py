"""The ASGI-layer question: what does each way of serving the sidecar's proxy routes cost?

    python benchmarks/asgi_layer.py SERVING PORT UPSTREAM [--log duckdb|none]

A target for benchmarks/proxy_overhead.py (`--extra-target 'name=python benchmarks/asgi_layer.py
framework {port} {upstream}'`). The same sidecar (build_sidecar, in-process DuckDB log, no engine
source) served three ways:

    framework  uvicorn -> FastAPI's middleware stack and router -> the proxy handlers (before)
    direct     uvicorn -> SidecarApp calling the proxy handlers itself (what `headroom run` does)
    aiohttp    aiohttp's own server, through a small ASGI adapter (below), -> SidecarApp

`--log none` replaces the DuckDB request log with a sink that drops rows, to see what the log
costs the proxy in the same run. Only the happy path is adapted for aiohttp (no disconnect
watching): enough to measure, not to serve.
"""

from __future__ import annotations

import argparse
import asyncio
import tempfile

import uvicorn
from aiohttp import web
from fastapi import FastAPI

from collector.sidecar.config import SidecarConfig
from collector.sidecar.wiring import build_sidecar


class _DropRows:
    def write_batch(self, rows) -> None:
        pass

    def close(self) -> None:
        pass


def _scope(request: web.BaseRequest) -> dict:
    path, _, _ = request.raw_path.partition("?")
    return {
        "type": "http",
        "asgi": {"version": "3.0"},
        "http_version": "1.1",
        "method": request.method,
        "scheme": "http",
        "path": request.path,
        "raw_path": path.encode("latin-1"),
        "query_string": request.query_string.encode("latin-1"),
        "root_path": "",
        "headers": [(k.lower(), v) for k, v in request.raw_headers],
        "client": None,
        "server": None,
    }


def aiohttp_handler(app):
    """An aiohttp low-level handler running the ASGI `app` for one request."""

    async def handle(request: web.BaseRequest) -> web.StreamResponse:
        state = {"response": None, "body_read": False}
        gone = asyncio.Event()

        async def receive() -> dict:
            if not state["body_read"]:
                state["body_read"] = True
                return {"type": "http.request", "body": await request.read(), "more_body": False}
            await gone.wait()
            return {"type": "http.disconnect"}

        async def send(message: dict) -> None:
            if message["type"] == "http.response.start":
                response = web.StreamResponse(status=message["status"])
                for name, value in message.get("headers", ()):
                    response.headers.add(name.decode("latin-1"), value.decode("latin-1"))
                state["response"] = response
                await response.prepare(request)
                return
            if message.get("body"):
                await state["response"].write(message["body"])
            if not message.get("more_body"):
                await state["response"].write_eof()

        await app(_scope(request), receive, send)
        gone.set()
        return state["response"]

    return handle


async def _serve_aiohttp(app, port: int) -> None:
    lifespan = app.router.lifespan_context(app)
    async with lifespan:
        server = web.Server(aiohttp_handler(app))
        loop = asyncio.get_running_loop()
        await loop.create_server(server, "127.0.0.1", port, backlog=4096)
        await asyncio.Event().wait()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("serving", choices=["framework", "direct", "aiohttp"])
    parser.add_argument("port", type=int)
    parser.add_argument("upstream")
    parser.add_argument("--log", choices=["duckdb", "none"], default="duckdb")
    args = parser.parse_args()
    config = SidecarConfig(
        upstream=args.upstream, db_path=tempfile.mkdtemp() + "/bench.duckdb", engine="none", jobs=False
    )
    app = build_sidecar(config, log_sink=_DropRows() if args.log == "none" else None)
    if args.serving == "aiohttp":
        import uvloop

        uvloop.run(_serve_aiohttp(app, args.port))
        return
    served = app
    if args.serving == "framework":

        async def served(scope, receive, send):  # FastAPI's own path, skipping SidecarApp's
            await FastAPI.__call__(app, scope, receive, send)

    uvicorn.run(
        served,
        host="127.0.0.1",
        port=args.port,
        log_level="error",
        access_log=False,
        proxy_headers=args.serving != "framework",
        lifespan="on",
    )


if __name__ == "__main__":
    main()
