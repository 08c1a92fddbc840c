"""The hourly rollup table `requests_hourly`: per hour, model, tenant, source and outcome.

Rollups outlive raw rows (retention deletes raw rows, not rollups), so long-range dashboards and
reviews stay cheap. Recomputing an hour replaces it, which makes the job safe to rerun and lets
late rows (replayed from a sidecar's spool) land in the right hour.
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from collector.store.db import RequestStore

__all__ = ["ROLLUP_DDL", "ensure_rollup_table", "rollup_hours", "truncate_to_hour"]

ROLLUP_DDL = """
CREATE TABLE IF NOT EXISTS requests_hourly (
    hour TIMESTAMPTZ NOT NULL,
    model VARCHAR, tenant VARCHAR, source VARCHAR, outcome VARCHAR,
    requests BIGINT, prompt_tokens BIGINT, completion_tokens BIGINT,
    ttft_p50_s DOUBLE, ttft_p95_s DOUBLE, ttft_p99_s DOUBLE,
    tpot_p50_s DOUBLE, tpot_p95_s DOUBLE,
    e2e_p50_s DOUBLE, e2e_p95_s DOUBLE, e2e_p99_s DOUBLE,
    max_inflight INTEGER, max_active_tokens BIGINT
)"""

_HOUR = "timezone('UTC', date_trunc('hour', timezone('UTC', admitted_at)))"
_INSERT = f"""
INSERT INTO requests_hourly
SELECT {_HOUR} AS hour, model, tenant, source, outcome,
       count(*), sum(prompt_tokens), sum(completion_tokens),
       quantile_cont(ttft_s, 0.5), quantile_cont(ttft_s, 0.95), quantile_cont(ttft_s, 0.99),
       quantile_cont(tpot_s, 0.5), quantile_cont(tpot_s, 0.95),
       quantile_cont(e2e_s, 0.5), quantile_cont(e2e_s, 0.95), quantile_cont(e2e_s, 0.99),
       max(inflight_at_admit), max(active_tokens_at_admit)
FROM requests WHERE admitted_at >= ? AND admitted_at < ?
GROUP BY ALL"""


def truncate_to_hour(moment: datetime) -> datetime:
    """2026-11-30T09:47:12Z -> 2026-11-30T09:00:00Z (tz-aware UTC)."""
    return moment.astimezone(UTC).replace(minute=0, second=0, microsecond=0)


def ensure_rollup_table(store: RequestStore) -> None:
    """Create requests_hourly when missing."""
    store.execute(ROLLUP_DDL)


def rollup_hours(store: RequestStore, start: datetime, end: datetime) -> int:
    """Recompute the rollup for whole hours in [start, end); returns rollup rows written."""
    start, end = truncate_to_hour(start), truncate_to_hour(end)
    if end <= start:
        return 0
    ensure_rollup_table(store)
    store.execute("DELETE FROM requests_hourly WHERE hour >= ? AND hour < ?", [start, end])
    store.execute(_INSERT, [start, end])
    return int(
        store.query("SELECT count(*) FROM requests_hourly WHERE hour >= ? AND hour < ?", [start, end])[0][0]
    )


def rollup_recent(store: RequestStore, now: datetime, lookback: timedelta = timedelta(hours=3)) -> int:
    """The hourly job: recompute the sealed hours of the last `lookback` (late rows included)."""
    end = truncate_to_hour(now)
    return rollup_hours(store, end - lookback, end)
