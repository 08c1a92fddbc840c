"""Retention: export each sealed UTC day to hive-partitioned Parquet, then expire old raw rows.

Layout: `<export_dir>/day=YYYY-MM-DD/*.parquet`, readable with
`read_parquet('<export_dir>/**/*.parquet', hive_partitioning=true)` by DuckDB, Spark, Trino or
ClickHouse. The table `parquet_exports` records what each day's files hold. A day is rewritten
while its raw rows are all still here (late rows included); raw rows are deleted only for days
older than the retention whose export holds exactly the rows being deleted. Rows that arrive for
a day already expired are appended as extra files, then deleted.
"""

from __future__ import annotations

import shutil
from datetime import UTC, date, datetime, time, timedelta
from pathlib import Path

from collector.store.db import RequestStore

__all__ = ["EXPORTS_DDL", "export_and_expire", "export_day", "day_bounds"]

EXPORTS_DDL = """
CREATE TABLE IF NOT EXISTS parquet_exports (
    day DATE PRIMARY KEY, rows BIGINT NOT NULL, exported_at TIMESTAMPTZ NOT NULL,
    expired BOOLEAN NOT NULL DEFAULT false
)"""
_DAY = "CAST(timezone('UTC', admitted_at) AS DATE)"


def day_bounds(day: date) -> tuple[datetime, datetime]:
    """[00:00, next 00:00) of a UTC day, tz-aware."""
    start = datetime.combine(day, time(0), tzinfo=UTC)
    return start, start + timedelta(days=1)


def export_day(store: RequestStore, export_dir: Path, day: date, *, append: bool) -> None:
    """Write the raw rows of `day` under day=<day>/; replace that partition unless `append`."""
    partition = export_dir / f"day={day.isoformat()}"
    if not append and partition.exists():
        shutil.rmtree(partition)
    pattern = "late_{uuid}" if append else "data_{i}"
    start, end = day_bounds(day)
    store.execute(
        f"COPY (SELECT *, {_DAY} AS day FROM requests WHERE admitted_at >= ? AND admitted_at < ?) "
        f"TO ? (FORMAT parquet, PARTITION_BY (day), OVERWRITE_OR_IGNORE, FILENAME_PATTERN '{pattern}')",
        [start, end, str(export_dir)],
    )


def _raw_counts(store: RequestStore, before: date) -> dict[date, int]:
    rows = store.query(
        f"SELECT {_DAY} AS day, count(*) FROM requests WHERE admitted_at < ? GROUP BY day ORDER BY day",
        [day_bounds(before)[0]],
    )
    return {day: int(n) for day, n in rows}


def _records(store: RequestStore) -> dict[date, tuple[int, bool]]:
    return {
        day: (int(rows), bool(expired))
        for day, rows, expired in store.query("SELECT day, rows, expired FROM parquet_exports")
    }


def _record(store: RequestStore, day: date, rows: int, expired: bool, now: datetime) -> None:
    store.execute("INSERT OR REPLACE INTO parquet_exports VALUES (?, ?, ?, ?)", [day, rows, now, expired])


def _expire(store: RequestStore, export_dir: Path, day: date) -> None:
    """Delete the day's raw rows that its Parquet files hold (a row that arrived after the export
    stays, and is appended by the next run)."""
    files = str(export_dir / f"day={day.isoformat()}" / "*.parquet")
    store.execute(
        "DELETE FROM requests WHERE admitted_at >= ? AND admitted_at < ? AND request_id IN "
        "(SELECT request_id FROM read_parquet(?))",
        [*day_bounds(day), files],
    )


def export_and_expire(
    store: RequestStore, export_dir: str | Path, retention_days: int, now: datetime
) -> dict[str, list[date]]:
    """The retention job: export sealed days (before today, UTC) and expire those past retention.

    Returns {"exported": [...], "expired": [...]} for logs and tests.
    """
    if retention_days < 1:
        raise ValueError(f"retention_days must be at least 1, got {retention_days}")
    export_dir = Path(export_dir)
    export_dir.mkdir(parents=True, exist_ok=True)
    store.execute(EXPORTS_DDL)
    today = now.astimezone(UTC).date()
    oldest_kept = today - timedelta(days=retention_days)
    records = _records(store)
    done: dict[str, list[date]] = {"exported": [], "expired": []}
    for day, raw in _raw_counts(store, today).items():
        exported, expired = records.get(day, (0, False))
        if expired:  # late rows for a day whose raw rows are already gone: append, then expire
            export_day(store, export_dir, day, append=True)
            _record(store, day, exported + raw, True, now)
            _expire(store, export_dir, day)
            done["exported"].append(day)
            continue
        if exported != raw:
            export_day(store, export_dir, day, append=False)
            _record(store, day, raw, False, now)
            done["exported"].append(day)
        if day < oldest_kept:
            _expire(store, export_dir, day)
            _record(store, day, raw, True, now)
            done["expired"].append(day)
    return done
