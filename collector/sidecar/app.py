"""create_app: wire the proxy, the tracker, the request log and the sources into one ASGI app.

Routes: POST /v1/chat/completions and /v1/completions (accounted), any other /v1/* (passed
through), GET /metrics (Prometheus text format), GET /healthz. The lifespan opens the pooled
upstream client, starts the engine poller, and on shutdown flushes every request-log row.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Callable, Iterable, Sequence
from urllib.parse import urlsplit, urlunsplit

import aiohttp
from fastapi import FastAPI
from fastapi.responses import JSONResponse, Response
from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, generate_latest
from starlette.routing import Route

from collector import __version__
from collector.sidecar.capacity_gauges import CapacityGauges
from collector.sidecar.config import SidecarConfig
from collector.sidecar.proxy import CompletionsProxy, PassThrough
from collector.sidecar.tenants import LabelCap
from collector.sidecar.tracker import Tracker
from collector.sidecar.upstream import UpstreamClient
from collector.store.writer import BatchSink, LogWriter

__all__ = ["create_app", "ACCOUNTED_PATHS"]

log = logging.getLogger(__name__)
ACCOUNTED_PATHS = ("/v1/chat/completions", "/v1/completions")


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


def _open_batch_sink(config: SidecarConfig) -> BatchSink | None:
    if config.db_path is None:
        return None
    from collector.store.db import RequestStore

    return RequestStore(config.db_path)


def create_app(config: SidecarConfig, *, row_sinks: Sequence[Callable[[dict], None] | object] = (),
               engine=None, collectors: Iterable[object] = (),
               capacity: CapacityGauges | None = None,
               batch_sink: BatchSink | None = None,
               jobs: Callable[[object, CapacityGauges], object] | None = None,
               close_batch_sink: bool | None = None) -> FastAPI:
    """Build the sidecar. `batch_sink` defaults to an in-process RequestStore at config.db_path.

    `jobs(store, capacity)` returns an APScheduler scheduler (not started) for the in-process
    store; the lifespan starts it and shuts it down. It is ignored when rows go elsewhere.
    `close_batch_sink` (default: only when the app opened the sink itself) closes the sink at
    shutdown, after the last rows were written.
    """
    registry = CollectorRegistry()
    tracker = Tracker(registry, instance=config.instance, source=config.source, run_id=config.run_id)
    capacity = capacity or CapacityGauges()
    registry.register(capacity)
    for extra in collectors:
        registry.register(extra)
    if engine is not None:
        registry.register(engine)
    sink = batch_sink if batch_sink is not None else _open_batch_sink(config)
    writer = None
    if sink is not None:
        writer = LogWriter(sink, registry, max_queue_rows=config.log_queue_rows,
                           batch_rows=config.log_batch_rows,
                           flush_interval_s=config.log_flush_interval_s)
        tracker.add_row_sink(writer.submit)
    for extra_sink in row_sinks:
        tracker.add_row_sink(getattr(extra_sink, "submit", extra_sink))
    session = _upstream_client(config)
    scheduler = jobs(sink, capacity) if jobs is not None and batch_sink is None and sink else None

    @contextlib.asynccontextmanager
    async def lifespan(app: FastAPI):
        await session.open()
        if engine is not None:
            await engine.start()
        if scheduler is not None:
            scheduler.start()
        try:
            yield
        finally:
            if scheduler is not None:
                scheduler.shutdown(wait=False)
            if engine is not None:
                await engine.stop()
            await session.close()
            if writer is not None:
                writer.close()
            for extra_sink in row_sinks:
                close = getattr(extra_sink, "close", None)
                if close is not None:
                    close()
            sink_close = getattr(sink, "close", None)
            if sink_close is not None and (batch_sink is None if close_batch_sink is None
                                           else close_batch_sink):
                sink_close()

    app = FastAPI(title="llm-headroom sidecar", version=__version__, lifespan=lifespan,
                  docs_url=None, redoc_url=None, openapi_url=None)
    proxy = CompletionsProxy(session, config.upstream, tracker, tenant_header=config.tenant_header,
                             tenant_cap=LabelCap(config.max_tenants),
                             model_cap=LabelCap(config.max_models), engine=engine)
    passthrough = PassThrough(session, config.upstream)
    for path in ACCOUNTED_PATHS:
        app.router.routes.append(Route(path, proxy, methods=["POST"]))

    @app.get("/metrics", include_in_schema=False)
    async def metrics() -> Response:
        return Response(generate_latest(registry), media_type=CONTENT_TYPE_LATEST)

    @app.get("/healthz", include_in_schema=False)
    async def healthz() -> JSONResponse:
        return JSONResponse({"status": "ok", "inflight_requests": len(tracker.live),
                             "upstream": _without_credentials(config.upstream),
                             "instance": config.instance})

    app.router.routes.append(Route("/v1/{path:path}", passthrough,
                                   methods=["GET", "POST", "PUT", "PATCH", "DELETE", "OPTIONS"]))
    app.state.tracker, app.state.registry, app.state.writer = tracker, registry, writer
    app.state.capacity, app.state.batch_sink, app.state.config = capacity, sink, config
    app.state.scheduler = scheduler
    return app
