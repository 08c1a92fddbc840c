"""How long does a p95-by-concurrency-bucket query take on 10 million request-log rows?

Generates the rows inside DuckDB (range() and random(), no Python loop) into a real RequestStore
file with the contract schema (primary key included), then times the store API's own SQL
(collector.service.querysql) for: p50/p95/p99 TTFT by in-flight bucket over the whole table,
by model x bucket over one day, and by hour over the week. Prints one line per query.

    .venv/bin/python benchmarks/store_query_10m.py              # 10 M rows in a temp dir
    .venv/bin/python benchmarks/store_query_10m.py --rows 200000 --db /tmp/small.duckdb
"""

from __future__ import annotations

import argparse
import tempfile
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path

from collector.service.querysql import Where, percentiles_sql
from collector.store.db import RequestStore

START = datetime(2026, 11, 23, tzinfo=UTC)
WEEK_US = 7 * 86400 * 1_000_000

GENERATE = """
INSERT INTO requests (request_id, source, instance, model, tenant, endpoint, stream, admitted_at,
    completed_at, status_code, outcome, prompt_tokens, completion_tokens, usage_source, ttft_s, tpot_s,
    e2e_s, inflight_at_admit, active_tokens_at_admit)
SELECT 'bench-' || i, 'traffic', 'sidecar-' || (i % 8), 'model-' || (i % 4), 'tenant-' || (i % 50),
    '/v1/chat/completions', true, admitted, admitted + to_microseconds(CAST(e2e * 1e6 AS BIGINT)),
    CASE WHEN r < 0.02 THEN 429 ELSE 200 END, CASE WHEN r < 0.02 THEN 'rate_limited' ELSE 'ok' END,
    prompt, completion, 'upstream', ttft, tpot, e2e, inflight, inflight * (prompt + completion // 2)
FROM (
    SELECT i, admitted, r, inflight, prompt, completion, ttft, tpot,
           ttft + tpot * (completion - 1) AS e2e
    FROM (
        SELECT range AS i, random() AS r,
               ? + to_microseconds(CAST(range * ? AS BIGINT)) AS admitted,
               CAST(1 + floor(random() * 64) AS INTEGER) AS inflight,
               CAST(20 + floor(random() * 4000) AS INTEGER) AS prompt,
               CAST(2 + floor(random() * 500) AS INTEGER) AS completion
        FROM range(?)
    ) base, LATERAL (SELECT 0.03 + 0.01 * inflight * (0.5 + random()) AS ttft,
                            0.01 + 0.0005 * inflight * random() AS tpot)
)"""


def generate(store: RequestStore, rows: int) -> float:
    """Fill `requests` with `rows` synthetic rows over one week; returns seconds taken."""
    began = time.perf_counter()
    store.execute("SELECT setseed(0.42)")
    store.execute(GENERATE, [START, WEEK_US / rows, rows])
    store.checkpoint()
    return time.perf_counter() - began


def timed(store: RequestStore, label: str, group_by: tuple[str, ...], where: Where) -> None:
    """Run one percentile query twice (cold, warm) and print both times."""
    sql, params = percentiles_sql("ttft_s", [0.5, 0.95, 0.99], group_by, where)
    times = []
    for _ in range(2):
        began = time.perf_counter()
        result = store.query(sql, params)
        times.append(time.perf_counter() - began)
    print(f"{label:<44} {len(result):>5} groups  first {times[0]:6.2f} s  again {times[1]:6.2f} s")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=10_000_000)
    parser.add_argument("--db", type=Path, default=None, help="DuckDB file (default: a temp dir)")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as scratch:
        store = RequestStore(args.db or Path(scratch) / "bench.duckdb")
        if store.count() < args.rows:
            print(f"generated {args.rows:,} rows in {generate(store, args.rows):.1f} s")
        print(f"rows in table: {store.count():,}")
        timed(store, "p50/p95/p99 TTFT by inflight_bucket (week)", ("inflight_bucket",), Where())
        day = Where(since=START + timedelta(days=3), until=START + timedelta(days=4))
        timed(store, "... by model x inflight_bucket (one day)", ("model", "inflight_bucket"), day)
        timed(store, "... by model x active_tokens_bucket (week)", ("model", "active_tokens_bucket"), Where())
        timed(store, "... by hour (week)", ("hour",), Where())
        store.close()


if __name__ == "__main__":
    main()
