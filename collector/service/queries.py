"""The token-protected query API: exact percentiles, capacity curves, estimates, probe runs and
outcomes, on the owning sidecar under /headroom/v1/query.

Every parameter is validated by a pydantic model that forbids unknown names; metric, group-by and
caliber names come from whitelists (querysql.py) and values are bound as SQL parameters. Anything
else is a 400 that names the parameter.
"""

from __future__ import annotations

from collections.abc import Collection, Sequence
from datetime import datetime
from typing import Annotated, Any, Literal

from fastapi import APIRouter, HTTPException, Query, params
from fastapi.concurrency import run_in_threadpool
from pydantic import BaseModel, ConfigDict, Field, field_validator

from collector.service import querysql
from collector.service.querysql import Where
from collector.service.validation import StoreRoute
from collector.store.db import RequestStore
from collector.store.decision import PublishPolicy, published_estimates
from collector.timewin import parse_instant, utc_now

__all__ = ["FILTER_VALUE_PATTERN", "WindowQuery", "PercentilesQuery", "build_query_router"]

# Model names, tenants, instances and run ids are identifier-like ("meta-llama/Llama-3-8B",
# "key-1a2b3c4d", "qwen2.5:7b"); quotes, spaces, semicolons and brackets never belong in them.
FILTER_VALUE_PATTERN = r"^[A-Za-z0-9][A-Za-z0-9._:/@+=-]{0,199}$"
_TIME_PATTERN = r"^[0-9][0-9A-Za-z:.+-]{0,39}$"
_FilterValue = Annotated[str | None, Field(default=None, pattern=FILTER_VALUE_PATTERN)]
_TimeValue = Annotated[str | None, Field(default=None, pattern=_TIME_PATTERN)]
Row = dict[str, Any]  # one result row, {column: value}: the columns follow the query asked


class WindowQuery(BaseModel):
    """Time window and filters shared by every query endpoint."""

    model_config = ConfigDict(extra="forbid")
    since: _TimeValue = Field(None, description="start: a duration back from now (7d, 24h) or ISO-8601")
    until: _TimeValue = Field(None, description="end (exclusive): a duration back from now or ISO-8601")
    model: _FilterValue = None
    tenant: _FilterValue = None
    outcome: _FilterValue = None
    source: _FilterValue = None
    instance: _FilterValue = None
    run_id: _FilterValue = None
    endpoint: _FilterValue = None

    def to_where(self, now: datetime | None = None) -> Where:
        """The SQL window; 400 when a time does not parse."""
        now = now or utc_now()
        try:
            since = parse_instant(self.since, now) if self.since else None
            until = parse_instant(self.until, now) if self.until else None
        except ValueError as exc:
            raise HTTPException(400, detail=f"since/until: {exc}") from None
        filters = {
            name: getattr(self, name) for name in querysql.FILTER_COLUMNS if getattr(self, name) is not None
        }
        return Where(since=since, until=until, filters=filters)


def _split_names(value: str, allowed: Collection[str], what: str) -> tuple[str, ...]:
    names = tuple(part.strip() for part in value.split(",") if part.strip())
    bad = [name for name in names if name not in allowed]
    if bad or len(names) > 4:
        raise ValueError(f"{what} {bad or names!r} not allowed; choose up to 4 of {sorted(allowed)}")
    return names


class GroupedQuery(WindowQuery):
    """A window plus a comma-separated group_by from the whitelist."""

    group_by: str = Field("", max_length=200, description="comma-separated: " + ", ".join(querysql.GROUP_BY))

    @field_validator("group_by")
    @classmethod
    def _check_group_by(cls, value: str) -> str:
        _split_names(value, querysql.GROUP_BY, "group_by")
        return value

    def group_names(self) -> tuple[str, ...]:
        """The validated group_by names."""
        return _split_names(self.group_by, querysql.GROUP_BY, "group_by")


class PercentilesQuery(GroupedQuery):
    """Which metric, which quantiles."""

    metric: Literal["ttft_s", "tpot_s", "e2e_s", "prompt_tokens", "completion_tokens"] = "ttft_s"
    quantiles: str = Field(
        "0.5,0.95,0.99",
        max_length=100,
        pattern=r"^[0-9.,]+$",
        description="comma-separated, each strictly between 0 and 1",
    )

    def quantile_values(self) -> list[float]:
        """Parsed quantiles; 400 unless 1-9 numbers in (0, 1)."""
        try:
            values = [float(part) for part in self.quantiles.split(",") if part]
        except ValueError:
            values = []
        if not values or len(values) > 9 or not all(0.0 < q < 1.0 for q in values):
            raise HTTPException(
                400, detail=f"quantiles {self.quantiles!r}: give 1-9 numbers in (0, 1), e.g. 0.5,0.95"
            )
        return values


class CurveQuery(WindowQuery):
    """The caliber of the concurrency axis."""

    caliber: Literal["requests", "tokens"] = "requests"


def _percentile_rows(rows: list[Row], quantiles: list[float]) -> list[Row]:
    for row in rows:
        values = row.pop("quantiles") or [None] * len(quantiles)
        row.update({querysql.quantile_label(q): v for q, v in zip(quantiles, values)})
    return rows


def _curve_rows(rows: list[Row]) -> list[Row]:
    for row in rows:
        for metric in ("ttft_s", "tpot_s", "e2e_s"):
            values = row.pop(metric) or [None, None, None]
            row.update({f"{metric}_{label}": v for label, v in zip(("p50", "p95", "p99"), values)})
    return rows


def build_query_router(
    store: RequestStore, dependencies: Sequence[params.Depends] = (), policy: PublishPolicy | None = None
) -> APIRouter:
    """The /v1/query/* routes, each behind `dependencies` (the token check); /estimate answers
    what `policy` publishes (collector.store.decision), as the gauges do."""
    router = APIRouter(
        prefix="/v1/query", tags=["query"], dependencies=list(dependencies), route_class=StoreRoute
    )

    async def run(sql_and_params: tuple[str, list[object]]) -> list[Row]:
        return await run_in_threadpool(store.query_dicts, *sql_and_params)

    @router.get("/percentiles", summary="Exact percentiles of a metric from the request log")
    async def percentiles(q: Annotated[PercentilesQuery, Query()]) -> dict[str, Any]:
        quantiles = q.quantile_values()
        rows = await run(querysql.percentiles_sql(q.metric, quantiles, q.group_names(), q.to_where()))
        return {
            "metric": q.metric,
            "quantiles": quantiles,
            "group_by": list(q.group_names()),
            "rows": _percentile_rows(rows, quantiles),
        }

    @router.get("/curve", summary="Passive capacity curve by concurrency bucket (requests or tokens)")
    async def curve(q: Annotated[CurveQuery, Query()]) -> dict[str, Any]:
        rows = await run(querysql.curve_sql(q.caliber, q.to_where()))
        return {"caliber": q.caliber, "rows": _curve_rows(rows)}

    @router.get("/outcomes", summary="Counts of requests by outcome")
    async def outcomes(q: Annotated[GroupedQuery, Query()]) -> dict[str, Any]:
        group = tuple(name for name in q.group_names() if name != "outcome")
        rows = await run(querysql.outcomes_sql(group, q.to_where()))
        for row in rows:
            row["outcome"] = row.pop("outcome_name")
        return {"group_by": list(group), "rows": rows}

    @router.get("/probe-runs", summary="Probe runs in the request log (source = probe)")
    async def probe_runs(q: Annotated[WindowQuery, Query()]) -> dict[str, Any]:
        return {"rows": await run(querysql.probe_runs_sql(q.to_where()))}

    @router.get(
        "/estimate",
        summary="The published capacity estimate per model, task class and replica class, "
        "with the reason it is published (the gauges' decision)",
    )
    async def estimate(q: Annotated[WindowQuery, Query()]) -> dict[str, Any]:
        at = q.to_where().until  # `until`: what was published at that moment; default now
        rows = await run_in_threadpool(lambda: published_estimates(store, None, policy, as_of=at))
        return {"rows": [row.to_dict() for row in rows if q.model is None or row.estimate.model == q.model]}

    return router
