"""create_store_app: the store service's FastAPI application.

Routes: /healthz (open), /metrics (open, for Prometheus: rows written, capacity gauges),
POST /v1/ingest, /v1/query/*, /v1/report and /reports/latest (all behind the bearer token).
The lifespan starts the job scheduler when job settings are given and stops it on shutdown.
"""

from __future__ import annotations

from contextlib import asynccontextmanager
from pathlib import Path
from typing import Annotated, Literal

from fastapi import Depends, FastAPI, HTTPException, Query, Request
from fastapi.concurrency import run_in_threadpool
from fastapi.exceptions import RequestValidationError
from fastapi.responses import HTMLResponse, JSONResponse, PlainTextResponse, Response
from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, Counter, generate_latest
from pydantic import BaseModel, ConfigDict, Field

from collector.analysis.refresh import refresh_estimates
from collector.catalog import spec
from collector.report.review import LATEST_REPORT_NAME, render_report_from_store, write_report_files
from collector.service.auth import require_token
from collector.service.ingest import build_ingest_router
from collector.service.queries import build_query_router
from collector.store.capacity_gauges import CapacityGauges
from collector.store.db import RequestStore
from collector.store.estimates import publish_stored
from collector.store.jobs import JobSettings, build_scheduler

__all__ = ["create_store_app", "LATEST_REPORT_NAME"]
_WRITTEN = spec("headroom_log_rows_written_total")


def _validation_as_400(request: Request, exc: RequestValidationError) -> JSONResponse:
    problems = [
        {
            "parameter": ".".join(str(p) for p in err.get("loc", ())[1:]) or "body",
            "problem": err.get("msg", "invalid"),
        }
        for err in exc.errors()
    ]
    return JSONResponse(status_code=400, content={"detail": problems})


def _registry(gauges: CapacityGauges | None) -> tuple[CollectorRegistry, Counter]:
    registry = CollectorRegistry()
    written = Counter(_WRITTEN.name, _WRITTEN.help, registry=registry)
    if gauges is not None:
        registry.register(gauges)
    return registry, written


def _lifespan(store: RequestStore, gauges: CapacityGauges | None, job_settings: JobSettings | None):
    @asynccontextmanager
    async def lifespan(app: FastAPI):
        scheduler = None
        if gauges is not None:
            await run_in_threadpool(publish_stored, store, gauges)
        if job_settings is not None:
            scheduler = build_scheduler(
                store, gauges, job_settings, refresh=refresh_estimates, review=write_report_files
            )
            scheduler.start()
        app.state.scheduler = scheduler
        try:
            yield
        finally:
            if scheduler is not None:
                scheduler.shutdown(wait=False)

    return lifespan


class ReportQuery(BaseModel):
    """Window and format of an on-demand report."""

    model_config = ConfigDict(extra="forbid")
    since: str = Field("7d", pattern=r"^[0-9]{1,6}[smhdw]$", description="window back from now")
    format: Literal["md", "html", "json"] = "json"
    slo_ttft_p95_s: float | None = Field(None, gt=0, le=600, description="p95 TTFT SLO in seconds")


def _add_report_routes(app: FastAPI, store: RequestStore, report_dir: Path | None, auth) -> None:
    @app.get(
        "/v1/report",
        dependencies=[auth],
        tags=["report"],
        summary="Build the capacity review for a window now (md, html or json)",
    )
    async def report(q: Annotated[ReportQuery, Query()]) -> Response:
        text = await run_in_threadpool(
            render_report_from_store, store, q.since, q.format, None, q.slo_ttft_p95_s
        )
        media = {"md": "text/markdown", "html": "text/html", "json": "application/json"}[q.format]
        return Response(text, media_type=media)

    @app.get(
        "/reports/latest",
        dependencies=[auth],
        tags=["report"],
        response_class=HTMLResponse,
        summary="The latest weekly report written by the scheduled job (self-contained HTML)",
    )
    async def latest_report() -> HTMLResponse:
        path = (report_dir / LATEST_REPORT_NAME) if report_dir else None
        if path is None or not path.exists():
            raise HTTPException(
                404,
                detail="no weekly report yet; it is written by the weekly job "
                "(or GET /v1/report?format=html builds one now)",
            )
        return HTMLResponse(path.read_text())


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
    async def healthz() -> dict:
        rows = await run_in_threadpool(store.count)
        return {"status": "ok", "rows": rows}

    @app.get("/metrics", tags=["health"], summary="Prometheus exposition (no token)")
    async def metrics() -> PlainTextResponse:
        return PlainTextResponse(generate_latest(registry), media_type=CONTENT_TYPE_LATEST)

    app.include_router(build_ingest_router(store, on_rows=written.inc), dependencies=[auth])
    app.include_router(build_query_router(store, dependencies=[auth]))
    _add_report_routes(app, store, Path(report_dir) if report_dir else None, auth)
    return app
