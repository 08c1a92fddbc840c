"""create_app: the sidecar's HTTP surface, serving and running the parts it is given.

Routes: POST /v1/chat/completions and /v1/completions (accounted), any other /v1/* (passed
through), GET /metrics (Prometheus text format, rendered in a worker thread so a large scrape
never stalls the proxy), GET /healthz. Every path is normalised first
(collector.sidecar.paths). The lifespan opens the pooled upstream client, starts the engine
poller and the in-process store's jobs, and on shutdown stops them and closes every sink, which
writes every request-log row that is still queued.

Which parts a sidecar has (sources, sinks, jobs) is decided in one place, collector.sidecar.wiring;
this module never looks at the config to choose them.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator, Callable, Sequence
from dataclasses import dataclass
from urllib.parse import urlsplit, urlunsplit

import aiohttp
from apscheduler.schedulers.background import BackgroundScheduler
from fastapi import FastAPI
from fastapi.responses import JSONResponse, Response
from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, generate_latest
from starlette.routing import Route

from collector import __version__
from collector.record import RowSink
from collector.sidecar.config import SidecarConfig
from collector.sidecar.faults import FaultLog
from collector.sidecar.passthrough import PassThrough
from collector.sidecar.paths import PathNormaliser
from collector.sidecar.proxy import CompletionsProxy, ProxyLimits
from collector.sidecar.tenants import LabelCap
from collector.sidecar.tracker import Tracker
from collector.sources import EngineSource
from collector.upstream import UpstreamClient

__all__ = ["create_app", "SidecarParts", "ACCOUNTED_PATHS"]

log = logging.getLogger(__name__)
ACCOUNTED_PATHS = ("/v1/chat/completions", "/v1/completions")


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
        timeout=aiohttp.ClientTimeout(
            total=None, sock_connect=config.connect_timeout_s, sock_read=config.read_timeout_s
        ),
        auto_decompress=False,  # bytes reach the client exactly as the upstream sent them
        skip_auto_headers=("User-Agent",),
    )


def _without_credentials(url: str) -> str:
    """'http://user:secret@engine:8000' -> 'http://engine:8000' (never show credentials)."""
    parts = urlsplit(url)
    return urlunsplit(parts._replace(netloc=parts.netloc.rpartition("@")[2]))


class _DeliberateBreak(logging.Filter):
    """Drop uvicorn's ERROR for a response we end without its last message on purpose.

    When the upstream breaks a stream after the headers, the proxy returns without the final
    body so the client sees the break; uvicorn then logs an ERROR per request. The sidecar's
    FaultLog already says it once per interval, and the row and counter have it.
    """

    def filter(self, record: logging.LogRecord) -> bool:
        return record.getMessage() != "ASGI callable returned without completing response."


_QUIET_BREAKS = _DeliberateBreak()


def _lifespan(
    parts: SidecarParts, session: UpstreamClient
) -> Callable[[FastAPI], contextlib.AbstractAsyncContextManager[None]]:
    """Start the upstream client, the engine poller and the jobs; stop them, then close the sinks."""

    @contextlib.asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
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


def create_app(config: SidecarConfig, parts: SidecarParts) -> FastAPI:
    """The sidecar's ASGI app around `parts`: it starts and stops them, and closes every sink."""
    tracker = parts.tracker
    for sink in parts.sinks:
        tracker.add_row_sink(sink.submit)
    session = _upstream_client(config)
    app = FastAPI(
        title="llm-headroom sidecar",
        version=__version__,
        lifespan=_lifespan(parts, session),
        docs_url=None,
        redoc_url=None,
        openapi_url=None,
    )
    app.add_middleware(PathNormaliser)
    logging.getLogger("uvicorn.error").addFilter(_QUIET_BREAKS)  # a set: adding twice is once
    faults = FaultLog(log)
    limits = ProxyLimits(
        max_request_body_bytes=config.max_request_body_bytes,
        max_buffered_response_bytes=config.max_buffered_response_bytes,
        max_sse_event_bytes=config.max_sse_event_bytes,
    )
    proxy = CompletionsProxy(
        session,
        config.upstream,
        tracker,
        tenant_header=config.tenant_header,
        tenant_cap=LabelCap(config.max_tenants),
        model_cap=LabelCap(config.max_models),
        engine=parts.engine,
        limits=limits,
        faults=faults,
        read_timeout_s=config.read_timeout_s,
    )
    for path in ACCOUNTED_PATHS:
        app.router.routes.append(Route(path, proxy, methods=["POST"]))

    @app.get("/metrics", include_in_schema=False)
    async def metrics() -> Response:
        # off the event loop: the live gauges read the tracker's dicts, which is safe under the GIL
        text = await asyncio.to_thread(generate_latest, parts.registry)
        return Response(text, media_type=CONTENT_TYPE_LATEST)

    @app.get("/healthz", include_in_schema=False)
    async def healthz() -> JSONResponse:
        return JSONResponse(
            {
                "status": "ok",
                "inflight_requests": len(tracker.live),
                "upstream": _without_credentials(config.upstream),
                "instance": config.instance,
            }
        )

    passthrough = PassThrough(
        session,
        config.upstream,
        faults=faults,
        max_request_body_bytes=config.max_request_body_bytes,
        read_timeout_s=config.read_timeout_s,
    )
    app.router.routes.append(
        Route("/v1/{path:path}", passthrough, methods=["GET", "POST", "PUT", "PATCH", "DELETE", "OPTIONS"])
    )
    app.state.config, app.state.tracker, app.state.registry = config, tracker, parts.registry
    app.state.scheduler = parts.scheduler
    return app
