"""Passive capacity curves from live traffic: no load test, just the request log (docs/domain.md §7).

Every `source='traffic'` row carries the concurrency it saw at admission, in both calibers
(`inflight_at_admit`, `active_tokens_at_admit`), and, when the sidecar reads the engine, the
engine's queue (`engine_waiting_at_admit`). Method:

1. Latency and queueing per bucket: rows are bucketed on their concurrency by the nearest power
   of two (log scale, so 6..11 -> 8); each bucket gets n, p50/p95/p99 TTFT, TPOT and e2e, the
   capacity errors (429, 503, timeouts) and the mean engine queue its requests saw.
2. Throughput per bucket, from time windows, never from single requests: [since, until) is cut
   into windows of `window_s` (default 3 x the median generating time, e2e minus TTFT: queue
   wait left out, so an overload leaves as many windows as calm traffic); each window gets its time-weighted
   mean concurrency and its token throughput (prompt tokens when the first token arrives,
   completion tokens spread over the decode), and is bucketed by that mean. A bucket's
   throughput is the mean over its windows, so a bucket that happened to get many windows (the
   quiet night) weighs no more than one that got a few (the peak): how much traffic a bucket
   received changes its confidence, not its value.
3. The knee rule (knee.py) runs on the buckets with at least MIN_BUCKET_SAMPLES requests and one
   window. Its confidence comes from the data: the knee must be reached (traffic crossed it:
   a bucket above shows queueing, capacity errors or the plateau), and the knee's bucket, the one
   above it and one below it need enough requests and windows (`confidence_bar`).

Both steps are SQL run by DuckDB (multi-threaded, off the Python interpreter), so the cost grows
with the rows in the window, not with its length: a list of rows is loaded into an in-memory
DuckDB and goes through the same queries.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

import duckdb

from collector.analysis.knee import detect_knee
from collector.analysis.levels import latency_fields
from collector.analysis.stats import power_of_two_bucket, seconds
from collector.capacity import KneeResult, LevelStats
from collector.store.db import RequestStore, rows_to_arrow

__all__ = [
    "PassiveCurve",
    "passive_curve",
    "CALIBER_COLUMNS",
    "MIN_BUCKET_SAMPLES",
    "confidence_bar",
    "RowSource",
    "rows_sql",
]

Row = Mapping[str, Any]
CALIBER_COLUMNS = {"requests": "inflight_at_admit", "tokens": "active_tokens_at_admit"}
MIN_BUCKET_SAMPLES = 5
# (level, least requests, least windows) in the knee's bucket, the one above and one below
_BARS = (("high", 200, 5), ("medium", 50, 3))

_BUCKET = "CASE WHEN {x} < 1.5 THEN 1 ELSE CAST(pow(2, round(log2({x}))) AS BIGINT) END"
_ROWS = """SELECT *, epoch(admitted_at) AS a, epoch(coalesce(first_token_at, completed_at)) AS f,
    epoch(completed_at) AS e FROM requests
    WHERE source = ? AND completed_at IS NOT NULL AND {column} IS NOT NULL
      AND (? IS NULL OR admitted_at >= ?) AND (? IS NULL OR admitted_at < ?)
      AND (? IS NULL OR model = ?) AND (? IS NULL OR task_class = ?)"""


def rows_sql(
    source: str,
    since: datetime | None,
    until: datetime | None,
    model: str | None,
    task_class: str | None,
    column: str = "inflight_at_admit",
) -> tuple[str, list[Any]]:
    """The SELECT of the completed rows the curves read (with a, f, e: admission, first token and
    completion in POSIX seconds) and its parameters; rows without `column` are left out."""
    params = [source, since, since, until, until, model, model, task_class, task_class]
    return _ROWS.format(column=column), params


_BUCKETS = """WITH r AS ({rows})
SELECT {bucket} AS bucket, count(*) AS n,
    quantile_cont(ttft_s, [0.5, 0.95, 0.99]) FILTER (WHERE outcome = 'ok') AS ttft,
    quantile_cont(tpot_s, [0.5, 0.95, 0.99]) FILTER (WHERE outcome = 'ok') AS tpot,
    quantile_cont(e2e_s, [0.5, 0.95, 0.99]) FILTER (WHERE outcome = 'ok') AS e2e,
    count(*) FILTER (WHERE outcome = 'ok') AS ok,
    count(*) FILTER (WHERE outcome = 'rate_limited') AS limited,
    count(*) FILTER (WHERE outcome = 'timeout') AS timeouts,
    count(*) FILTER (WHERE outcome IN ('rate_limited', 'overloaded', 'timeout')
                     OR status_code IN (429, 503)) AS capacity_errors,
    avg(active_tokens_at_admit) AS active, avg(engine_waiting_at_admit) AS waiting
FROM r GROUP BY bucket ORDER BY bucket"""
_WINDOWS = """WITH r AS ({rows}),
w AS (SELECT ? + range * ? AS lo, ? + (range + 1) * ? AS hi FROM range(?))
SELECT w.lo,
    sum({busy}) / ? AS load,
    sum(CASE WHEN r.outcome = 'ok' THEN
            (CASE WHEN r.f >= w.lo AND r.f < w.hi THEN coalesce(r.prompt_tokens, 0) ELSE 0 END)
            + coalesce(r.completion_tokens, 0)
              * greatest(0, least(r.e, w.hi) - greatest(r.f, w.lo)) / greatest(r.e - r.f, 1e-9)
        ELSE 0 END) / ? AS rate
FROM w JOIN r ON r.a < w.hi AND r.e > w.lo GROUP BY w.lo ORDER BY w.lo"""
# time-weighted concurrency a row adds to a window: its overlap (requests), or prompt over its
# overlap plus generated tokens growing linearly over the decode (tokens)
_BUSY = {
    "requests": "greatest(0, least(r.e, w.hi) - greatest(r.a, w.lo))",
    "tokens": """coalesce(r.prompt_tokens, 0) * greatest(0, least(r.e, w.hi) - greatest(r.a, w.lo))
        + coalesce(r.completion_tokens, 0) * greatest(0, least(r.e, w.hi) - greatest(r.f, w.lo))
          * ((greatest(r.f, w.lo) - r.f) + (least(r.e, w.hi) - r.f)) / 2
          / greatest(r.e - r.f, 1e-9)""",
}


@dataclass
class PassiveCurve:
    """The per-bucket table of one caliber, the knee found on it, and how much to trust it."""

    caliber: str
    window_s: float
    buckets: list[LevelStats]
    windows_per_bucket: dict[int, int]
    knee: KneeResult | None
    confidence: str
    confidence_reason: str
    rows: int = 0
    extra: dict[str, Any] = field(default_factory=dict)

    def usable_buckets(self) -> list[LevelStats]:
        """Buckets with enough requests and at least one window: the ones the knee is judged on."""
        return [
            b
            for b in self.buckets
            if b.samples >= MIN_BUCKET_SAMPLES and self.windows_per_bucket.get(b.concurrency)
        ]

    def to_dict(self) -> dict[str, Any]:
        """Plain dict for JSON: levels are the buckets, each with its window count."""
        return {
            "caliber": self.caliber,
            "window_s": self.window_s,
            "rows": self.rows,
            "levels": [
                b.to_dict() | {"windows": self.windows_per_bucket.get(b.concurrency, 0)} for b in self.buckets
            ],
            "knee": self.knee.to_dict() if self.knee else None,
            "confidence": self.confidence,
            "confidence_reason": self.confidence_reason,
        }


class RowSource:
    """Run a curve's SQL on a RequestStore, or on rows loaded into an in-memory DuckDB."""

    def __init__(self, store_or_rows: Any) -> None:
        self._db: RequestStore | duckdb.DuckDBPyConnection
        if isinstance(store_or_rows, RequestStore):
            self._db = store_or_rows
        else:
            self._db = duckdb.connect()
            self._db.register("requests", rows_to_arrow(list(store_or_rows)))

    def query(self, sql: str, params: Sequence[Any]) -> list[tuple[Any, ...]]:
        if isinstance(self._db, RequestStore):
            return self._db.query(sql, params)
        return self._db.execute(sql, list(params)).fetchall()

    def close(self) -> None:
        if not isinstance(self._db, RequestStore):  # the store is the caller's to close
            self._db.close()


def _stats(row: tuple[Any, ...], rates: list[float], window_s: float) -> LevelStats:
    bucket, n, ttft, tpot, e2e, ok, limited, timeouts, capacity_errors, active, waiting = row
    ttft, tpot, e2e = (value or [None, None, None] for value in (ttft, tpot, e2e))
    return LevelStats(
        concurrency=int(bucket),
        samples=int(n),
        window_s=len(rates) * window_s,
        requests_per_s=0.0,
        output_tokens_per_s=0.0,
        total_tokens_per_s=sum(rates) / len(rates) if rates else 0.0,
        **latency_fields(ttft, tpot, e2e),
        rate_limited_ratio=limited / n,
        timeout_ratio=timeouts / n,
        error_ratio=1 - ok / n,
        mean_active_tokens=active,
        littles_law=None,
        capacity_errors=int(capacity_errors),
        engine_waiting_mean=waiting,
    )


def confidence_bar(
    knee: KneeResult | None, buckets: Sequence[LevelStats], windows: Mapping[int, int]
) -> tuple[str, str]:
    """How far a traffic knee can be trusted: high, medium, low (or none), and why.

    The knee must be reached, and the knee's bucket, the bucket above it and a bucket below it
    need >= 200 requests and >= 5 windows each for high, >= 50 and >= 3 for medium.
    """
    if knee is None:
        return "none", "too few buckets with samples and windows"
    if not knee.reached:
        return "low", f"traffic never crossed the knee: nothing above {knee.requests} showed it"
    ordered = sorted(buckets, key=lambda b: b.concurrency)
    at = next(i for i, b in enumerate(ordered) if b.concurrency == knee.requests)
    around = ordered[at : at + 2]
    below = ordered[at - 1] if at > 0 else None
    if below is None:
        return "low", f"no traffic below the knee ({knee.requests}) to compare with"
    checked = [*around, below]
    n = min(b.samples for b in checked)
    w = min(windows.get(b.concurrency, 0) for b in checked)
    names = [b.concurrency for b in checked]
    for level, least_n, least_w in _BARS:
        if n >= least_n and w >= least_w:
            return level, f"{n} requests and {w} windows in the thinnest of buckets {names}"
    return "low", (
        f"only {n} requests and {w} windows in the thinnest of buckets {names} "
        f"(medium needs {_BARS[1][1]} and {_BARS[1][2]})"
    )


def passive_curve(
    store_or_rows: Any,
    caliber: str,
    since: datetime | None = None,
    until: datetime | None = None,
    model: str | None = None,
    *,
    window_s: float | None = None,
    source: str = "traffic",
    task_class: str | None = None,
) -> PassiveCurve:
    """Capacity curve of `caliber` ('requests' or 'tokens') from rows admitted in [since, until).

    `store_or_rows` is a RequestStore or a sequence of row dicts; `task_class` keeps one class
    of requests (collector.tasks; None = all). Raises ValueError naming the window when there
    are no rows to analyse.
    """
    if caliber not in CALIBER_COLUMNS:
        raise ValueError(f"caliber {caliber!r} is not one of {', '.join(CALIBER_COLUMNS)}")
    db = RowSource(store_or_rows)
    try:
        return _curve(db, caliber, since, until, model, window_s, source, task_class)
    finally:
        db.close()


def _curve(
    db: RowSource,
    caliber: str,
    since: datetime | None,
    until: datetime | None,
    model: str | None,
    window_s: float | None,
    source: str,
    task_class: str | None,
) -> PassiveCurve:
    column = CALIBER_COLUMNS[caliber]
    rows, params = rows_sql(source, since, until, model, task_class, column)
    # windows of 3 x the median time a request spends generating (queue wait excluded: under
    # overload e2e balloons and would leave too few windows to read the knee from)
    n, first, last, median_e2e = db.query(
        f"SELECT count(*), min(a), max(e), median(e2e_s - coalesce(ttft_s, 0)) "
        f"FILTER (WHERE outcome = 'ok') FROM ({rows})",
        params,
    )[0]
    if not n:
        window = f" between {since or 'the first row'} and {until or 'now'}" if since or until else ""
        raise ValueError(
            f"no traffic rows with {column}{window}"
            f"{f' for model {model!r}' if model else ''}"
            f"{f' of task class {task_class!r}' if task_class else ''}; widen the "
            "window or send traffic through the sidecar first"
        )
    start, end = seconds(since) or first, seconds(until) or last
    window_s = window_s or max(1.0, 3 * (median_e2e or 1.0))
    count = max(int((end - start) // window_s), 0)
    rates: dict[int, list[float]] = defaultdict(list)
    for _, load, rate in db.query(
        _WINDOWS.format(rows=rows, busy=_BUSY[caliber]),
        [*params, start, window_s, start, window_s, count, window_s, window_s],
    ):
        bucket = power_of_two_bucket(load)
        if bucket is not None:
            rates[bucket].append(rate)
    table = db.query(_BUCKETS.format(rows=rows, bucket=_BUCKET.format(x=column)), params)
    buckets = [_stats(row, rates.get(int(row[0]), []), window_s) for row in table]
    windows = {b: len(v) for b, v in rates.items()}
    usable = [b for b in buckets if b.samples >= MIN_BUCKET_SAMPLES and windows.get(b.concurrency)]
    knee = detect_knee(usable) if len(usable) >= 2 else None
    confidence, reason = confidence_bar(knee, usable, windows)
    return PassiveCurve(caliber, window_s, buckets, windows, knee, confidence, reason, int(n))
