"""How fast does the request log take rows when its table already holds 10 million?

    python benchmarks/ingest_10m.py                    # 10 M rows first (about 30 s), then ingest
    python benchmarks/ingest_10m.py --rows 200000      # a quick run on a small table
    python benchmarks/ingest_10m.py --base FILE --batches 160 --sidecar-checkpoint-mb 64

Two ways in, each measured over --batches batches of --batch-rows new rows (sidecar-shaped
rows: 28 columns, four timestamps, every column set as the tracker sets it; RequestRecords, as
the tracker submits them; the in-process store on one DuckDB thread, as `headroom run` opens it):

* `insert_rows`: RequestStore.insert_rows, the one insert path (Arrow in bulk, duplicates left
  out by an anti-join over the batch's admitted_at span, the count DuckDB returns), on a file-backed store;
* `log_writer`: the sidecar's LogWriter in front of that store, from submit() to flush(), as
  `headroom run` builds it (a backlog appended up to 50,000 rows at a time), then with every
  append a batch of --batch-rows.

(The `headroom store` ingest service this script also measured was retired with #35: a fleet's rows
go to the Iceberg table, benchmarks/lake_commit.py.)

Every row of every batch must be new and inserted once; the script checks the returned counts
and the table's final count, then resends one batch to check that nothing is inserted twice.
"""

from __future__ import annotations

import argparse
import itertools
import os
import shutil
import tempfile
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path

from prometheus_client import CollectorRegistry
from store_query_10m import generate

from collector.record import RequestRecord
from collector.sidecar.wiring import SIDECAR_STORE_BATCH_ROWS, SIDECAR_STORE_THREADS
from collector.store.db import RequestStore
from collector.store.writer import LogWriter

_NOW = datetime(2026, 12, 1, 9, tzinfo=UTC)


_SLOTS = itertools.count()  # each batch its own stretch of time, as a live log's batches are


def sample_rows(count: int, prefix: str) -> list[dict]:
    """`count` rows shaped like the tracker's, ids `prefix`-0 … (new to the 10 M table),
    admitted after every earlier batch's rows: a sidecar's batches follow one another in time,
    so each one's duplicate check looks at its own span of the log, not at every batch before."""
    start = _NOW + timedelta(microseconds=next(_SLOTS) * count * 997)
    rows = []
    for i in range(count):
        admitted = start + timedelta(microseconds=i * 997)
        rows.append(
            {
                "request_id": f"{prefix}-{i:08d}",
                "source": "traffic",
                "run_id": None,
                "instance": "bench",
                "model": f"model-{i % 4}",
                "tenant": f"tenant-{i % 50}",
                "endpoint": "/v1/chat/completions",
                "stream": True,
                "admitted_at": admitted,
                "first_byte_at": admitted + timedelta(milliseconds=30),
                "first_token_at": admitted + timedelta(milliseconds=45),
                "completed_at": admitted + timedelta(seconds=2.5),
                "status_code": 200,
                "outcome": "ok",
                "error": None,
                "prompt_tokens": 40 + i % 900,
                "cached_prompt_tokens": i % 7,
                "completion_tokens": 64,
                "max_tokens": 256,
                "usage_source": "upstream",
                "ttft_s": 0.045,
                "tpot_s": 0.038,
                "e2e_s": 2.5,
                "inflight_at_admit": 1 + i % 64,
                "active_tokens_at_admit": 3000 + i % 5000,
                "engine_waiting_at_admit": i % 3,
                "kv_usage_at_admit": 0.42,
                "upstream_retries": 0,
            }
        )
    return rows


def _rate(rows: int, seconds: float) -> str:
    return f"{rows:>9,} rows in {seconds:6.2f} s = {rows / seconds:>9,.0f} rows/s"


def bench_insert_rows(store: RequestStore, batches: list[list[RequestRecord]]) -> None:
    began = time.perf_counter()
    inserted = sum(store.insert_rows(batch) for batch in batches)
    seconds = time.perf_counter() - began
    assert inserted == sum(map(len, batches)), f"inserted {inserted}"
    print(f"insert_rows      {_rate(inserted, seconds)}")


def _submit_all(
    writer: LogWriter, registry: CollectorRegistry, batches: list[list[RequestRecord]]
) -> tuple[int, float]:
    """Every row submitted, then flushed: (rows written, seconds from the first submit)."""
    began = time.perf_counter()
    for batch in batches:
        for row in batch:
            writer.submit(row)
    assert writer.flush(600)
    seconds = time.perf_counter() - began
    return int(registry.get_sample_value("headroom_log_rows_written_total") or 0), seconds


def bench_log_writer(
    store: RequestStore, batches: list[list[RequestRecord]], batch_rows: int, max_batch_rows: int | None
) -> None:
    """The writer as `headroom run` builds it in front of its own store (a backlog written up to
    SIDECAR_STORE_BATCH_ROWS at a time), or with `max_batch_rows` None in batches of `batch_rows`."""
    registry = CollectorRegistry()
    writer = LogWriter(
        store,
        registry,
        max_queue_rows=sum(map(len, batches)) + 1,
        batch_rows=batch_rows,
        max_batch_rows=max_batch_rows,
    )
    written, seconds = _submit_all(writer, registry, batches)
    assert written == sum(map(len, batches)), f"written {written}"
    writer.close()
    most = f"up to {max_batch_rows:,}" if max_batch_rows else f"of {batch_rows:,}"
    print(f"log_writer       {_rate(written, seconds)}   batches {most}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=10_000_000, help="rows in the table before ingest")
    parser.add_argument("--batches", type=int, default=40)
    parser.add_argument("--batch-rows", type=int, default=5_000)
    parser.add_argument(
        "--base",
        type=Path,
        default=None,
        help="reuse (copy) this pre-filled DuckDB file instead of generating one",
    )
    parser.add_argument(
        "--sidecar-checkpoint-mb",
        type=int,
        default=None,
        help="`headroom run --checkpoint-mb` for the in-process paths (default: DuckDB's 16)",
    )
    args = parser.parse_args()
    scratch = Path(tempfile.mkdtemp())
    db = scratch / "ingest.duckdb"
    try:
        if args.base:
            shutil.copy(args.base, db)
        # as `headroom run [--checkpoint-mb N]` opens its own
        store = RequestStore(db, threads=SIDECAR_STORE_THREADS, checkpoint_mb=args.sidecar_checkpoint_mb)
        if store.count() < args.rows:
            print(f"generated {args.rows:,} rows in {generate(store, args.rows):.1f} s")
        print(f"table holds {store.count():,} rows; batches of {args.batch_rows:,}")

        def batches(prefix: str) -> list[list[dict]]:
            return [sample_rows(args.batch_rows, f"{prefix}{b}") for b in range(args.batches)]

        def records(prefix: str) -> list[list[RequestRecord]]:  # what the tracker submits
            return [[RequestRecord(**row) for row in batch] for batch in batches(prefix)]

        bench_insert_rows(store, records("insert"))
        bench_log_writer(store, records("writer"), args.batch_rows, SIDECAR_STORE_BATCH_ROWS)
        bench_log_writer(store, records("small"), args.batch_rows, None)
        store.close()
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
        os.sync()


if __name__ == "__main__":
    main()
