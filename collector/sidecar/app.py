"""create_app: the sidecar's HTTP surface, serving and running the parts it is given.

Routes: POST /v1/chat/completions and /v1/completions (accounted), any other /v1/* (passed
through), GET /metrics (Prometheus text format), GET /healthz. The lifespan opens the pooled
upstream client, starts the engine poller and the in-process store's jobs, and on shutdown stops
them and closes every sink, which writes every request-log row that is still queued.

The proxy routes are called straight from the server, not through FastAPI's middleware stack:
each of those layers wraps every `send`, once per streamed chunk, and together they cost about
a tenth of the sidecar's CPU under a stream flood (BENCHMARKS.md §2). FastAPI keeps the rest.

Which parts a sidecar has (sources, sinks, jobs) is decided in one place, collector.sidecar.wiring;
this module never looks at the config to choose them.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Sequence
from dataclasses import dataclass
from urllib.parse import urlsplit, urlunsplit

import aiohttp
from apscheduler.schedulers.background import BackgroundScheduler
from fastapi import FastAPI
from fastapi.responses import JSONResponse, Response
from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry
from starlette.routing import Route

from collector import __version__
from collector.record import RowSink
from collector.sidecar.config import SidecarConfig
from collector.sidecar.exposition import MetricsPage
from collector.sidecar.proxy import CompletionsProxy, PassThrough
from collector.sidecar.tracker import Tracker
from collector.sources import EngineSource
from collector.upstream import UpstreamClient

__all__ = ["create_app", "SidecarApp", "SidecarParts", "ACCOUNTED_PATHS"]

log = logging.getLogger(__name__)
ACCOUNTED_PATHS = ("/v1/chat/completions", "/v1/completions")
PASSTHROUGH_METHODS = ("GET", "POST", "PUT", "PATCH", "DELETE", "OPTIONS")


class SidecarApp(FastAPI):
    """FastAPI for /metrics, /healthz and the lifespan; the proxy routes skip its layers.

    `proxy_routes(accounted, passthrough)` names the two ASGI handlers; they are registered as
    routes too, so the framework path (FastAPI.__call__) serves the same thing, only slower.
    """

    accounted = passthrough = None

    def proxy_routes(self, accounted, passthrough) -> None:
        """Serve POST ACCOUNTED_PATHS with `accounted` and other /v1/* with `passthrough`."""
        self.accounted, self.passthrough = accounted, passthrough
        for path in ACCOUNTED_PATHS:
            self.router.routes.append(Route(path, accounted, methods=["POST"]))
        self.router.routes.append(Route("/v1/{path:path}", passthrough, methods=list(PASSTHROUGH_METHODS)))

    async def __call__(self, scope, receive, send) -> None:
        if scope["type"] == "http" and self.accounted is not None:
            path, method = scope["path"], scope["method"]
            if method == "POST" and path in ACCOUNTED_PATHS:
                return await self.accounted(scope, receive, send)
            if path.startswith("/v1/") and method in PASSTHROUGH_METHODS:
                return await self.passthrough(scope, receive, send)
        await super().__call__(scope, receive, send)


@dataclass
class SidecarParts:
    """What a sidecar runs besides its proxy; collector.sidecar.wiring builds them from a config."""

    registry: CollectorRegistry  # what /metrics exports: the tracker's metrics, sources, gauges, sinks'
    tracker: Tracker  # live requests and per-request metrics; every finished row goes to the sinks
    sinks: Sequence[RowSink] = ()  # each finished row goes to every sink; closed in order at shutdown
    engine: EngineSource | None = None  # polled while serving; its latest snapshot goes into each row
    scheduler: BackgroundScheduler | None = None  # the in-process store's jobs, run while serving


def _upstream_client(config: SidecarConfig) -> UpstreamClient:
    """The pooled upstream client: connect fast or fail; between chunks a prefill may take minutes."""
    return UpstreamClient(
        max_connections=config.max_connections,
        timeout=aiohttp.ClientTimeout(total=None, sock_connect=config.connect_timeout_s,
                                      sock_read=config.read_timeout_s),
        auto_decompress=False,  # bytes reach the client exactly as the upstream sent them
        skip_auto_headers=("User-Agent",))


def _without_credentials(url: str) -> str:
    """'http://user:secret@engine:8000' -> 'http://engine:8000' (never show credentials)."""
    parts = urlsplit(url)
    return urlunsplit(parts._replace(netloc=parts.netloc.rpartition("@")[2]))


def _lifespan(parts: SidecarParts, session: UpstreamClient):
    """Start the upstream client, the engine poller and the jobs; stop them, then close the sinks."""

    @contextlib.asynccontextmanager
    async def lifespan(app: FastAPI):
        await session.open()
        if parts.engine is not None:
            await parts.engine.start()
        if parts.scheduler is not None:
            parts.scheduler.start()
        try:
            yield
        finally:
            if parts.scheduler is not None:
                parts.scheduler.shutdown(wait=False)
            if parts.engine is not None:
                await parts.engine.stop()
            await session.close()
            for sink in parts.sinks:
                sink.close()

    return lifespan


def create_app(config: SidecarConfig, parts: SidecarParts) -> SidecarApp:
    """The sidecar's ASGI app around `parts`: it starts and stops them, and closes every sink."""
    tracker = parts.tracker
    for sink in parts.sinks:
        tracker.add_row_sink(sink.submit)
    session = _upstream_client(config)
    app = SidecarApp(title="llm-headroom sidecar", version=__version__, lifespan=_lifespan(parts, session),
                     docs_url=None, redoc_url=None, openapi_url=None)
    proxy = CompletionsProxy(session, config.upstream, tracker, tenant_header=config.tenant_header,
                             engine=parts.engine)

    page = MetricsPage(parts.registry, [tracker.exported])

    @app.get("/metrics", include_in_schema=False)
    async def metrics() -> Response:
        return Response(page.render(), media_type=CONTENT_TYPE_LATEST)

    @app.get("/healthz", include_in_schema=False)
    async def healthz() -> JSONResponse:
        return JSONResponse({"status": "ok", "inflight_requests": len(tracker.live),
                             "upstream": _without_credentials(config.upstream),
                             "instance": config.instance})

    app.proxy_routes(proxy, PassThrough(session, config.upstream))
    app.state.config, app.state.tracker, app.state.registry = config, tracker, parts.registry
    app.state.scheduler = parts.scheduler
    return app
