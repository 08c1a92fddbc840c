"""The readers' view of the fleet's table: a RequestStore whose `requests` is the table's rows.

`open_lake_log(catalog, lake, since=...)` plans the scan with pyiceberg (the current snapshot's
data files, pruned by the day partition and each file's admitted_at bounds) and lets DuckDB read
exactly those Parquet files where they lie (collector.lake.scan), through
RequestStore.over_parquet: columns matched by name (a file older than a column reads it as NULL),
rows outside [since, until) filtered out. Every reader (the weekly review, the passive curve, the
alert backtest, the estimate) runs the same SQL over it as over a one-box DuckDB file, and nothing
is copied first. DuckDB's own iceberg extension would do the planning too, but its wheels pin
DuckDB 1.5.5 and the project runs 2.x (BENCHMARKS.md §9 measures this reader against the
scan-and-copy it replaced).

The fleet's capacity estimates (`headroom.capacity_estimates` beside the table,
collector.lake.estimates) are copied into the store's `capacity_estimates`, so the readers'
published estimate is the one the fleet's sidecars publish (collector.store.decision).
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from datetime import datetime

import orjson
from pyiceberg.exceptions import NoSuchTableError

from collector.capacity import CapacityEstimate
from collector.lake.estimates import estimates_table, read_estimates
from collector.lake.layout import Lake
from collector.lake.scan import data_files, duckdb_paths
from collector.lake.table import DEFAULT_TABLE, open_catalog, open_table
from collector.store.db import RequestStore
from collector.store.estimates import save_estimate

__all__ = ["open_lake_log", "copy_estimates"]


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
    """A read-only RequestStore over the table's rows admitted in [since, until) (module docstring).

    FileNotFoundError when the table does not exist (nothing committed yet); ValueError as
    collector.lake.scan.data_files.
    """
    lake = Lake.parse(lake_uri)
    try:
        iceberg = open_table(open_catalog(catalog_uri, lake), table, create=False)
    except NoSuchTableError:
        raise FileNotFoundError(
            f"no table {table} in {catalog_uri} yet; `headroom lake commit` creates it with the first rows"
        ) from None
    paths, filesystem = duckdb_paths(lake, data_files(iceberg, since=since, until=until))
    store = RequestStore.over_parquet(paths, since=since, until=until, filesystem=filesystem)
    try:
        copy_estimates(catalog_uri, lake_uri, store, table=table)
        yield store
    finally:
        store.close()
