"""The store's token-protected routes as one router: what a sidecar that owns its database serves
under /headroom, so that readers work while it runs (collector.store.owner explains why).

    POST /v1/ingest        request-log rows (idempotent by request_id)
    GET  /v1/query/*       exact percentiles, curves, outcomes, probe runs, the latest estimate
    GET  /v1/report        the capacity review for a window, built now
    GET  /reports/latest   the weekly job's latest HTML report
    GET  /v1/snapshot      a consistent copy of the whole database (a DuckDB file) for readers
    POST /v1/estimates     save a capacity estimate (the probe's) and republish the gauges
                           (collector.store.decision decides what is published); a probe run
                           whose estimate is stored already (the sidecar's job built it) keeps
                           it: {"estimate_id": <the stored one>, "already_stored": true}
"""

from __future__ import annotations

import shutil
import tempfile
from collections.abc import Sequence
from pathlib import Path
from typing import Annotated, Any, Literal

from fastapi import APIRouter, Body, HTTPException, Query
from fastapi.concurrency import run_in_threadpool
from fastapi.responses import FileResponse, HTMLResponse, Response
from pydantic import BaseModel, ConfigDict, Field
from starlette.background import BackgroundTask

from collector.capacity import CapacityEstimate
from collector.service.ingest import build_ingest_router
from collector.service.queries import build_query_router
from collector.service.validation import StoreRoute
from collector.store.capacity_gauges import CapacityGauges
from collector.store.db import RequestStore
from collector.store.decision import PublishPolicy, publish
from collector.store.estimates import save_estimate_once
from collector.timewin import utc_now

__all__ = ["build_store_routes", "ReportQuery", "LATEST_REPORT_NAME"]

LATEST_REPORT_NAME = "latest.html"  # as collector.report.review.LATEST_REPORT_NAME (the weekly job's file)


class ReportQuery(BaseModel):
    """Window and format of an on-demand report."""

    model_config = ConfigDict(extra="forbid")
    since: str = Field("7d", pattern=r"^[0-9]{1,6}[smhdw]$", description="window back from now")
    format: Literal["md", "html", "json"] = "json"
    slo_ttft_p95_s: float | None = Field(None, gt=0, le=600, description="p95 TTFT SLO in seconds")


def _snapshot_file(store: RequestStore) -> tuple[Path, Path]:
    directory = Path(tempfile.mkdtemp(prefix="headroom-snapshot-"))
    return directory, store.snapshot(directory / "snapshot.duckdb")


def _add_report_routes(router: APIRouter, store: RequestStore, report_dir: Path | None) -> None:
    @router.get(
        "/v1/report", tags=["report"], summary="Build the capacity review for a window now (md, html or json)"
    )
    async def report(q: Annotated[ReportQuery, Query()]) -> Response:
        try:  # the review needs numpy and matplotlib, which a slim sidecar install does not carry
            from collector.report.review import render_report_from_store  # lazy, see above
        except ImportError as exc:
            raise HTTPException(
                501,
                detail=f"this install has no report extra ({exc.name} is missing): "
                "pip install 'llm-headroom[report]'",
            ) from None
        text = await run_in_threadpool(
            render_report_from_store, store, q.since, q.format, None, q.slo_ttft_p95_s
        )
        media = {"md": "text/markdown", "html": "text/html", "json": "application/json"}[q.format]
        return Response(text, media_type=media)

    @router.get(
        "/reports/latest",
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


def _add_owner_routes(
    router: APIRouter, store: RequestStore, gauges: CapacityGauges | None, policy: PublishPolicy | None
) -> None:
    @router.get(
        "/v1/snapshot",
        tags=["query"],
        response_class=FileResponse,
        summary="A consistent copy of the database as a DuckDB file, for readers that cannot open it",
    )
    async def snapshot() -> FileResponse:
        directory, path = await run_in_threadpool(_snapshot_file, store)
        return FileResponse(
            path,
            media_type="application/octet-stream",
            filename="snapshot.duckdb",
            background=BackgroundTask(shutil.rmtree, directory, True),
        )

    @router.post(
        "/v1/estimates", tags=["ingest"], summary="Save a capacity estimate (CapacityEstimate.to_dict())"
    )
    async def estimates(estimate: Annotated[dict[str, Any], Body()]) -> dict[str, str | bool]:
        try:
            saved = await run_in_threadpool(save_estimate_once, store, CapacityEstimate.from_dict(estimate))
        except (KeyError, TypeError, ValueError, AttributeError) as exc:
            raise HTTPException(
                400,
                detail=f"body is not a capacity estimate ({type(exc).__name__}: {exc}); "
                "send CapacityEstimate.to_dict() (docs/capacity.md)",
            ) from None
        if gauges is not None:
            await run_in_threadpool(publish, store, gauges, utc_now(), policy)  # the one decision
        # a run's second save is no error: 200 with the stored id (collector.store.estimates)
        return {"estimate_id": saved.estimate_id, "already_stored": saved.already_stored}


def build_store_routes(
    store: RequestStore,
    dependencies: Sequence[Any],
    *,
    report_dir: Path | None = None,
    gauges: CapacityGauges | None = None,
    policy: PublishPolicy | None = None,
) -> APIRouter:
    """Every token-protected store route on `store`, each behind `dependencies` (the token check);
    `policy` is the publication gate's (the job settings' probe age)."""
    router = APIRouter(dependencies=list(dependencies), route_class=StoreRoute)
    router.include_router(build_ingest_router(store))
    router.include_router(build_query_router(store, policy=policy))
    _add_report_routes(router, store, report_dir)
    _add_owner_routes(router, store, gauges, policy)
    return router
