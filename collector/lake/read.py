"""The readers' view of the fleet's table: a RequestStore whose `requests` is the table's rows.

`open_lake_log(catalog, lake, since=...)` scans the Iceberg table with pyiceberg, pruned to the
days at or after `since` (the day partition and each file's admitted_at bounds), streams the
Arrow batches into one temporary Parquet file, and opens it with RequestStore.over_parquet: every
reader (the weekly review, the passive curve, the alert backtest, the estimate) runs the same SQL
over it as over a one-box DuckDB file. DuckDB's own iceberg extension would read the table
without the copy, but its wheels pin DuckDB 1.5.5 and the project runs 2.x
(BENCHMARKS.md, "The fleet's request log", measures both paths).

The fleet's capacity estimates (`headroom.capacity_estimates` beside the table,
collector.lake.estimates) are copied into the store's `capacity_estimates`, so the readers'
published estimate is the one the fleet's sidecars publish (collector.store.decision).
"""

from __future__ import annotations

import contextlib
import shutil
import tempfile
from collections.abc import Iterator
from datetime import datetime
from pathlib import Path

import orjson
import pyarrow as pa
import pyarrow.parquet as pq
from pyiceberg.exceptions import NoSuchTableError

from collector.capacity import CapacityEstimate
from collector.lake.estimates import estimates_table, read_estimates
from collector.lake.layout import Lake
from collector.lake.stage import conform
from collector.lake.table import DEFAULT_TABLE, open_catalog, open_table
from collector.store.db import ARROW_SCHEMA, RequestStore
from collector.store.estimates import save_estimate

__all__ = ["open_lake_log", "scan_to_parquet", "copy_estimates"]


def scan_to_parquet(
    catalog_uri: str,
    lake_uri: str,
    path: Path,
    *,
    table: str = DEFAULT_TABLE,
    since: datetime | None = None,
    until: datetime | None = None,
) -> int:
    """Write the table's rows admitted in [since, until) to a Parquet file at `path`; returns rows.

    Raises FileNotFoundError when the table does not exist (nothing committed yet).
    """
    lake = Lake.parse(lake_uri)
    try:
        iceberg = open_table(open_catalog(catalog_uri, lake), table, create=False)
    except NoSuchTableError:
        raise FileNotFoundError(
            f"no table {table} in {catalog_uri} yet; `headroom lake commit` creates it with the first rows"
        ) from None
    bounds = []
    if since is not None:
        bounds.append(f"admitted_at >= '{since.isoformat()}'")  # datetimes, formatted by us
    if until is not None:
        bounds.append(f"admitted_at < '{until.isoformat()}'")
    scan = iceberg.scan(row_filter=" AND ".join(bounds) or "True")
    rows = 0
    with pq.ParquetWriter(str(path), ARROW_SCHEMA, compression="zstd") as writer:
        for batch in scan.to_arrow_batch_reader():
            part = conform(pa.Table.from_batches([batch]))
            writer.write_table(part)
            rows += part.num_rows
    return rows


def copy_estimates(
    catalog_uri: str, lake_uri: str, store: RequestStore, *, table: str = DEFAULT_TABLE
) -> int:
    """Copy the fleet's estimates (the table beside `table`) into `store`'s capacity_estimates,
    each estimate_id once; returns how many."""
    rows = read_estimates(open_catalog(catalog_uri, Lake.parse(lake_uri)), estimates_table(table))
    seen: set[str] = set()
    for row in rows.select(["estimate_id", "estimate_json"]).to_pylist():
        if row["estimate_id"] in seen:
            continue
        seen.add(row["estimate_id"])
        estimate = CapacityEstimate.from_dict(orjson.loads(row["estimate_json"]))
        save_estimate(store, estimate, estimate_id=row["estimate_id"])
    return len(seen)


@contextlib.contextmanager
def open_lake_log(
    catalog_uri: str,
    lake_uri: str,
    *,
    table: str = DEFAULT_TABLE,
    since: datetime | None = None,
    until: datetime | None = None,
) -> Iterator[RequestStore]:
    """A read-only RequestStore over the table's rows admitted in [since, until) (module docstring)."""
    directory = Path(tempfile.mkdtemp(prefix="headroom-lake-"))
    try:
        path = directory / "requests.parquet"
        scan_to_parquet(catalog_uri, lake_uri, path, table=table, since=since, until=until)
        store = RequestStore.over_parquet(path)
        try:
            copy_estimates(catalog_uri, lake_uri, store, table=table)
            yield store
        finally:
            store.close()
    finally:
        shutil.rmtree(directory, ignore_errors=True)
