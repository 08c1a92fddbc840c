"""create_app: the sidecar's HTTP surface, serving and running the parts it is given.

Routes: POST /v1/chat/completions, /v1/completions, /v1/responses and /v1/embeddings (accounted),
/v1 and any other /v1/* (passed through), and the admin routes (collector.sidecar.admin: /metrics,
/healthz, /readyz, the store's /headroom routes), on this port or on --admin-listen. Every path is
normalised first (collector.sidecar.paths). The lifespan starts the engine poller, the in-process
store's jobs and the admin listener, writes the `<db>.owner` file readers look for, and on
shutdown stops them, closes the upstream pools and closes every sink, which writes every
request-log row that is still queued.

The proxy routes are called straight from the server, not through FastAPI's middleware stack,
whose layers would wrap every `send`, once per streamed chunk (BENCHMARKS.md §2 has the cost).
FastAPI serves only the admin routes.

Which parts a sidecar has (sources, sinks, jobs) is decided in one place, collector.sidecar.wiring;
this module never looks at the config to choose them.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import gc
import logging
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from dataclasses import dataclass
from typing import Any

from apscheduler.schedulers.background import BackgroundScheduler
from fastapi import APIRouter, FastAPI
from prometheus_client import CollectorRegistry, Counter

from collector import __version__
from collector.catalog import spec
from collector.record import RowSink
from collector.sidecar.admin import STORE_ROUTES_PREFIX, AdminListener, admin_routes, base_url
from collector.sidecar.config import SidecarConfig
from collector.sidecar.exchange import BufferedBody, Exchange, UpstreamError
from collector.sidecar.exposition import MetricsPage
from collector.sidecar.faults import FaultLog
from collector.sidecar.memory import MemoryReturn, glibc_malloc_trim
from collector.sidecar.passthrough import PassThrough
from collector.sidecar.paths import normalised_scope, refuse_climbing
from collector.sidecar.proxy import CompletionsProxy, ProxyLimits
from collector.sidecar.tracecontext import SpanSink
from collector.sidecar.tracker import Tracker
from collector.sidecar.upstream import H1Pool
from collector.sources import EngineSource
from collector.store.owner import remove_owner, write_owner

__all__ = [
    "create_app",
    "SidecarApp",
    "SidecarParts",
    "ACCOUNTED_PATHS",
    "READINESS_PATH",
]

log = logging.getLogger(__name__)
ACCOUNTED_PATHS = ("/v1/chat/completions", "/v1/completions", "/v1/responses", "/v1/embeddings")
PASSTHROUGH_ROOT = "/v1"  # itself passed through too (`/v1/` is normalised to it): never a redirect
PASSTHROUGH_METHODS = ("GET", "POST", "PUT", "PATCH", "DELETE", "OPTIONS")
READINESS_PATH = "/v1/models"  # every OpenAI-compatible engine answers it once its model is loaded
READINESS_TIMEOUT_S = 2.0
_WAIT_TIMEOUTS = spec("headroom_upstream_wait_timeouts_total")

ASGIApp = Callable[[dict[str, Any], Any, Any], Awaitable[None]]


class SidecarApp(FastAPI):
    """FastAPI for /metrics, /healthz, /readyz, the store routes and the lifespan; the proxy
    routes skip its layers.

    Every HTTP path is normalised first (collector.sidecar.paths), then POST ACCOUNTED_PATHS go
    straight to `accounted`, /v1 and other /v1/* in PASSTHROUGH_METHODS to `passthrough`, and
    anything else to FastAPI, which has no route for them (404).
    """

    accounted: ASGIApp | None = None
    passthrough: ASGIApp | None = None
    admin: AdminListener | None = None  # the admin routes' own listener (--admin-listen), else None

    def proxy_routes(self, accounted: ASGIApp, passthrough: ASGIApp) -> None:
        """Serve POST ACCOUNTED_PATHS with `accounted`, /v1 and other /v1/* with `passthrough`."""
        self.accounted, self.passthrough = accounted, passthrough
        # every path is normalised without its trailing slash first, so the router's redirect to
        # the slashed spelling would come straight back: a 307 loop (issue #36 N5)
        self.router.redirect_slashes = False

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:  # type: ignore[override]
        # normalised and dispatched in this one coroutine, not through middleware: each level of
        # awaiting coroutines is resumed at every upstream read of a stream on other servers
        if scope["type"] != "http" or self.accounted is None:
            await super().__call__(scope, receive, send)
            return
        normal = normalised_scope(scope)
        if normal is None:
            await refuse_climbing(send)
            return
        path, method = normal["path"], normal["method"]
        if method == "POST" and path in ACCOUNTED_PATHS:
            await self.accounted(normal, receive, send)
        elif (
            (path.startswith("/v1/") or path == PASSTHROUGH_ROOT)
            and method in PASSTHROUGH_METHODS
            and self.passthrough is not None
        ):
            await self.passthrough(normal, receive, send)
        else:
            await super().__call__(normal, receive, send)


@dataclass
class SidecarParts:
    """What a sidecar runs besides its proxy; collector.sidecar.wiring builds them from a config."""

    registry: CollectorRegistry  # what /metrics exports: the tracker's metrics, sources, gauges, sinks'
    tracker: Tracker  # live requests and per-request metrics; every finished row goes to the sinks
    sinks: Sequence[RowSink] = ()  # each finished row goes to every sink; closed in order at shutdown
    # each finished row goes to every span sink too, with its request's trace context (tracing is
    # on: collector.sidecar.tracecontext); closed after the sinks
    span_sinks: Sequence[SpanSink] = ()
    engine: EngineSource | None = None  # polled while serving; its latest snapshot goes into each row
    scheduler: BackgroundScheduler | None = None  # the in-process store's jobs, run while serving
    store_routes: APIRouter | None = None  # the owned database's store routes, served under /headroom
    owned_db: str | None = None  # the database file this sidecar owns: readers find it via <db>.owner
    token_in_file: bool = True  # the store routes' token is in <db>.token (else HEADROOM_TOKEN)
    # the sidecar's token, which also makes a request a probe's (X-Headroom-Probe-Token); None:
    # no probe marks are trusted (docs/sidecar.md "Probe load")
    probe_token: str | None = None

    @property
    def tracing(self) -> bool:
        """A span sink is wired: propagate trace context, note the response facts spans report."""
        return bool(self.span_sinks)


def _pool(config: SidecarConfig, max_connections: int, registry: CollectorRegistry | None = None) -> H1Pool:
    """A pool of the upstream client: connect fast or fail; between chunks a prefill may take
    minutes; a request waits --upstream-wait-timeout at most for a free connection (counted in
    `registry`'s headroom_upstream_wait_timeouts_total)."""
    waits = _WAIT_TIMEOUTS
    counter = (
        Counter(waits.name.removesuffix("_total"), waits.help, registry=registry)
        if registry is not None
        else None
    )
    return H1Pool(
        config.upstream,
        max_connections=max_connections,
        connect_timeout_s=config.connect_timeout_s,
        read_timeout_s=config.read_timeout_s,
        wait_timeout_s=config.upstream_wait_timeout_s,
        on_wait_timeout=None if counter is None else counter.inc,
    )


async def upstream_ready(pool: H1Pool) -> tuple[bool, str]:
    """(ready, why): the engine answered GET /v1/models below 500 within READINESS_TIMEOUT_S."""
    exchange: Exchange | None = None
    try:
        async with asyncio.timeout(READINESS_TIMEOUT_S):
            exchange = await pool.send(b"GET", READINESS_PATH.encode(), [], b"")
            reader = BufferedBody(exchange)
            while await reader.readany():  # read to its end: the connection is kept for the next check
                pass
    except (TimeoutError, UpstreamError, OSError) as exc:
        return False, f"upstream unreachable ({type(exc).__name__})"
    finally:
        if exchange is not None and exchange.connection is not None:
            exchange.abandon()
    if exchange.status >= 500:
        return False, f"upstream answered {exchange.status} on {READINESS_PATH} (loading or failing)"
    return True, f"upstream answered {exchange.status}"


class _DeliberateBreak(logging.Filter):
    """Drop uvicorn's ERROR for a response we end without its last message on purpose.

    When the upstream breaks a stream after the headers, the proxy returns without the final
    body so the client sees the break; uvicorn then logs an ERROR per request. The sidecar's
    FaultLog already says it once per interval, and the row and counter have it.
    """

    def filter(self, record: logging.LogRecord) -> bool:
        return record.getMessage() != "ASGI callable returned without completing response."


_QUIET_BREAKS = _DeliberateBreak()


_frozen = False
YOUNG_COLLECTION_THRESHOLD = 20_000  # CPython's default is 700


def _freeze_startup_objects() -> None:
    """Tune the garbage collector for serving, once per process: freeze what start-up made (so a
    full collection never walks it, stalling every stream) and collect the youngest generation
    every YOUNG_COLLECTION_THRESHOLD allocations, not 700, so that live requests, which die young,
    are not walked and promoted at nearly every collection (BENCHMARKS.md §2, "The garbage
    collector", has the measurements)."""
    global _frozen
    if not _frozen:
        gc.collect()
        gc.freeze()
        _, older, oldest = gc.get_threshold()
        gc.set_threshold(YOUNG_COLLECTION_THRESHOLD, older, oldest)
        _frozen = True


def _lifespan(
    parts: SidecarParts,
    config: SidecarConfig,
    pools: tuple[H1Pool, ...],
    admin: AdminListener | None,
) -> Callable[[FastAPI], contextlib.AbstractAsyncContextManager[None]]:
    """Start the admin listener, the engine poller, the jobs and the memory's return; stop them,
    then close the sinks."""

    @contextlib.asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        if admin is not None:
            admin.start()
        if parts.engine is not None:
            await parts.engine.start()
        if parts.scheduler is not None:
            parts.scheduler.start()
        if parts.owned_db is not None:
            proxy = base_url(config.listen_host, config.listen_port)
            routes = proxy if admin is None else base_url(admin.host, admin.port)
            write_owner(
                parts.owned_db, routes + STORE_ROUTES_PREFIX, proxy=proxy, token_in_file=parts.token_in_file
            )
        _freeze_startup_objects()
        returning = asyncio.create_task(
            MemoryReturn(glibc_malloc_trim()).run(), name="headroom-memory-return"
        )
        try:
            yield
        finally:
            returning.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await returning
            if parts.owned_db is not None:
                remove_owner(parts.owned_db)
            if parts.scheduler is not None:
                parts.scheduler.shutdown(wait=False)
            if parts.engine is not None:
                await parts.engine.stop()
            if admin is not None:
                await admin.stop()
            for pool in pools:
                pool.close()
            for sink in parts.sinks:
                sink.close()
            for span_sink in parts.span_sinks:
                span_sink.close()

    return lifespan


def create_app(config: SidecarConfig, parts: SidecarParts) -> SidecarApp:
    """The sidecar's ASGI app around `parts`: it starts and stops them, and closes every sink."""
    tracker = parts.tracker
    for sink in parts.sinks:
        tracker.add_row_sink(sink.submit)
    for span_sink in parts.span_sinks:
        tracker.add_span_sink(span_sink.submit)
    # one bound (--max-upstream-connections) for every client request; readiness keeps a
    # connection of its own, so a full pool never makes /readyz say "not ready"
    pool, readiness = _pool(config, config.max_connections, parts.registry), _pool(config, 1)
    page = MetricsPage(parts.registry, [tracker.exported])
    routes = admin_routes(
        config, tracker, page, functools.partial(upstream_ready, readiness), parts.store_routes
    )
    admin = None if config.admin_listen is None else AdminListener(routes, *config.admin_listen, config)
    app = SidecarApp(
        title="llm-headroom sidecar",
        version=__version__,
        lifespan=_lifespan(parts, config, (pool, readiness), admin),
        docs_url=None,
        redoc_url=None,
        openapi_url=None,
    )
    logging.getLogger("uvicorn.error").addFilter(_QUIET_BREAKS)  # a set: adding twice is once
    faults = FaultLog(log)
    limits = ProxyLimits(
        max_request_body_bytes=config.max_request_body_bytes,
        max_buffered_response_bytes=config.max_buffered_response_bytes,
        max_sse_event_bytes=config.max_sse_event_bytes,
    )
    proxy = CompletionsProxy(
        pool,
        tracker,
        tenant_header=config.tenant_header,
        engine=parts.engine,
        limits=limits,
        faults=faults,
        read_timeout_s=config.read_timeout_s,
        tracing=parts.tracing,
        probe_token=parts.probe_token,
        slo_headers=config.goodput_headers,
    )
    if admin is None:
        app.include_router(routes)
    passthrough = PassThrough(
        pool,
        faults=faults,
        max_request_body_bytes=config.max_request_body_bytes,
        read_timeout_s=config.read_timeout_s,
    )
    app.proxy_routes(proxy, passthrough)
    app.admin = admin
    return app
