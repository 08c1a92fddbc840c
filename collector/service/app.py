"""create_store_app: the store service's FastAPI application.

Routes: /healthz (open), /metrics (open, for Prometheus: rows written, capacity gauges), and
behind the bearer token the routes of collector.service.routes: POST /v1/ingest, /v1/query/*,
/v1/report, /reports/latest, /v1/snapshot and POST /v1/estimates.
The lifespan starts the job scheduler when job settings are given and stops it on shutdown.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable
from contextlib import AbstractAsyncContextManager, asynccontextmanager
from pathlib import Path

from fastapi import Depends, FastAPI, Request
from fastapi.concurrency import run_in_threadpool
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, PlainTextResponse
from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, Counter, generate_latest

from collector.analysis.refresh import refresh_estimates_isolated
from collector.catalog import spec
from collector.exposition import new_registry
from collector.report.review import LATEST_REPORT_NAME, write_report_files
from collector.service.auth import require_token
from collector.service.routes import build_store_routes
from collector.store.capacity_gauges import CapacityGauges
from collector.store.db import RequestStore
from collector.store.decision import PublishPolicy, publish
from collector.store.jobs import JobSettings, build_scheduler

__all__ = ["create_store_app", "LATEST_REPORT_NAME"]
_WRITTEN = spec("headroom_log_rows_written_total")


def _validation_as_400(request: Request, exc: Exception) -> JSONResponse:
    assert isinstance(exc, RequestValidationError)  # registered for that class only
    problems = [
        {
            "parameter": ".".join(str(p) for p in err.get("loc", ())[1:]) or "body",
            "problem": err.get("msg", "invalid"),
        }
        for err in exc.errors()
    ]
    return JSONResponse(status_code=400, content={"detail": problems})


def _registry(gauges: CapacityGauges | None) -> tuple[CollectorRegistry, Counter]:
    registry = new_registry()
    written = Counter(_WRITTEN.name, _WRITTEN.help, registry=registry)
    if gauges is not None:
        registry.register(gauges)
    return registry, written


def _lifespan(
    store: RequestStore, gauges: CapacityGauges | None, job_settings: JobSettings | None
) -> Callable[[FastAPI], AbstractAsyncContextManager[None]]:
    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        scheduler = None
        if gauges is not None:
            policy = job_settings.policy if job_settings is not None else PublishPolicy()
            await run_in_threadpool(publish, store, gauges, None, policy)
        if job_settings is not None:
            scheduler = build_scheduler(
                store, gauges, job_settings, refresh=refresh_estimates_isolated, review=write_report_files
            )
            scheduler.start()
        app.state.scheduler = scheduler
        try:
            yield
        finally:
            if scheduler is not None:
                scheduler.shutdown(wait=False)

    return lifespan


def create_store_app(
    store: RequestStore,
    token: str,
    *,
    gauges: CapacityGauges | None = None,
    job_settings: JobSettings | None = None,
    report_dir: str | Path | None = None,
) -> FastAPI:
    """The store service around an open RequestStore; `token` guards everything but health/metrics."""
    if not token:
        raise ValueError(
            "create_store_app needs a non-empty token (see collector.service.auth.resolve_token)"
        )
    if report_dir is None and job_settings is not None:
        report_dir = job_settings.report_dir
    registry, written = _registry(gauges)
    auth = Depends(require_token(token))
    # No /docs or /redoc: FastAPI's pages load their scripts from a public CDN (blank when
    # air-gapped, blocked by a strict CSP). /openapi.json describes the API for any local viewer.
    app = FastAPI(
        title="llm-headroom store",
        lifespan=_lifespan(store, gauges, job_settings),
        docs_url=None,
        redoc_url=None,
        description="Ingest, query and review the fleet's request log. "
        "Send `Authorization: Bearer <token>` to every /v1 route.",
    )
    app.add_exception_handler(RequestValidationError, _validation_as_400)
    app.state.store = store

    @app.get("/healthz", tags=["health"], summary="Liveness and row count (no token)")
    async def healthz() -> dict[str, object]:
        rows = await run_in_threadpool(store.count)
        return {"status": "ok", "rows": rows}

    @app.get("/metrics", tags=["health"], summary="Prometheus exposition (no token)")
    async def metrics() -> PlainTextResponse:
        return PlainTextResponse(generate_latest(registry), media_type=CONTENT_TYPE_LATEST)

    app.include_router(
        build_store_routes(
            store,
            [auth],
            report_dir=Path(report_dir) if report_dir else None,
            gauges=gauges,
            on_rows=written.inc,
            policy=job_settings.policy if job_settings is not None else None,
        )
    )
    return app
