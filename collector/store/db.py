"""RequestStore: the one read-write owner of a DuckDB request-log file.

Only one process may open a DuckDB file read-write (docs/design.md §2, process model). The
sidecar's in-process store and the `headroom store` service both hold one RequestStore; everything
else reads through them. Rows arrive in batches and are inserted once per batch through Arrow,
never with a per-row `executemany` (docs/domain.md §11).
"""

from __future__ import annotations

import os
import threading
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import duckdb
import pyarrow as pa

from collector.record import RequestRecord
from collector.store.schema import COLUMN_NAMES, COLUMNS, migrate

__all__ = ["RequestStore", "ARROW_SCHEMA", "rows_to_arrow"]

_ARROW_TYPES = {
    "VARCHAR": pa.string(),
    "BOOLEAN": pa.bool_(),
    "TIMESTAMPTZ": pa.timestamp("us", tz="UTC"),
    "INTEGER": pa.int32(),
    "BIGINT": pa.int64(),
    "DOUBLE": pa.float64(),
}
ARROW_SCHEMA = pa.schema([(name, _ARROW_TYPES[sql.split()[0]]) for name, sql in COLUMNS])
_COLUMN_LIST = ", ".join(COLUMN_NAMES)


Rows = Sequence[RequestRecord | Mapping[str, Any]]


def _column_values(rows: Rows, name: str) -> list[Any]:
    return [row.get(name) if isinstance(row, Mapping) else getattr(row, name) for row in rows]


def rows_to_arrow(rows: Rows, *, lenient: bool = False) -> pa.Table:
    """Turn records or row dicts (missing keys are NULL) into one Arrow table in column order.

    Example: [{"request_id": "a", "ttft_s": 0.2}] -> a 1-row table with 28 columns, 26 of them NULL.
    A value of the wrong type or out of its column's range raises (the store's ingest answers
    400), or with `lenient` becomes NULL so that it alone is lost, not its batch.
    """
    columns = {name: _column_values(rows, name) for name in COLUMN_NAMES}
    try:
        return pa.Table.from_pydict(columns, schema=ARROW_SCHEMA)
    except (pa.ArrowInvalid, pa.ArrowTypeError, OverflowError, TypeError, ValueError):
        if not lenient:
            raise
        return pa.Table.from_arrays(
            [_column(columns[f.name], f.type) for f in ARROW_SCHEMA], schema=ARROW_SCHEMA
        )


def _column(values: list, arrow_type: pa.DataType) -> pa.Array:
    try:
        return pa.array(values, type=arrow_type)
    except (pa.ArrowInvalid, pa.ArrowTypeError, OverflowError, TypeError, ValueError):
        return pa.array([_value(v, arrow_type) for v in values], type=arrow_type)


def _value(value: Any, arrow_type: pa.DataType) -> Any:
    try:
        pa.array([value], type=arrow_type)
    except (pa.ArrowInvalid, pa.ArrowTypeError, OverflowError, TypeError, ValueError):
        return None
    return value


class RequestStore:
    """Owns a DuckDB connection; thread-safe through one lock (DuckDB connections are not)."""

    def __init__(self, path: str | Path = ":memory:", *, read_only: bool = False) -> None:
        self.path = str(path)
        new = self.path != ":memory:" and not Path(self.path).exists()
        if new:
            Path(self.path).parent.mkdir(parents=True, exist_ok=True, mode=0o700)
        self._con = duckdb.connect(self.path, read_only=read_only)
        if new and Path(self.path).exists():
            os.chmod(self.path, 0o600)  # rows carry tenants and timings: the owner's alone
        self._lock = threading.Lock()
        self.migrated_from = None if read_only else migrate(self._con)

    def insert_rows(self, rows: Rows, *, lenient: bool = False) -> int:
        """Insert a batch; rows whose request_id already exists are ignored. Returns rows added.

        A value that does not fit its column raises, or with `lenient` is stored as NULL.
        """
        if not rows:
            return 0
        batch = rows_to_arrow(rows, lenient=lenient)  # noqa: F841 -- referenced by name in the SQL
        with self._lock:
            before = self._con.execute("SELECT count(*) FROM requests").fetchone()[0]
            self._con.execute(
                f"INSERT OR IGNORE INTO requests ({_COLUMN_LIST}) SELECT {_COLUMN_LIST} FROM batch"
            )
            after = self._con.execute("SELECT count(*) FROM requests").fetchone()[0]
        return int(after - before)

    def write_batch(self, rows: Rows) -> None:
        """BatchSink interface for the LogWriter: insert the batch (duplicates ignored).

        Lenient: one bad value (say a client's max_tokens beyond INTEGER) must not cost the other
        rows of the batch their place in the log.
        """
        self.insert_rows(rows, lenient=True)

    def query(self, sql: str, params: Sequence[Any] | Mapping[str, Any] = ()) -> list[tuple]:
        """Run a parameterised query and return all rows. Never format values into `sql`."""
        with self._lock:
            return self._con.execute(sql, params).fetchall()

    def query_dicts(self, sql: str, params: Sequence[Any] | Mapping[str, Any] = ()) -> list[dict]:
        """Like query(), with each row as a {column: value} dict."""
        with self._lock:
            cursor = self._con.execute(sql, params)
            names = [d[0] for d in cursor.description]
            return [dict(zip(names, row)) for row in cursor.fetchall()]

    def execute(self, sql: str, params: Sequence[Any] | Mapping[str, Any] = ()) -> None:
        """Run a parameterised statement (DDL, rollups, deletes) under the lock."""
        with self._lock:
            self._con.execute(sql, params)

    def arrow(self, sql: str, params: Sequence[Any] = ()) -> pa.Table:
        """Run a parameterised query and return an Arrow table (for analysis and export)."""
        with self._lock:
            return self._con.sql(sql, params=list(params) or None).to_arrow_table()

    def count(self) -> int:
        """Number of rows in `requests`."""
        return int(self.query("SELECT count(*) FROM requests")[0][0])

    def checkpoint(self) -> None:
        """Flush the write-ahead log into the database file."""
        with self._lock:
            self._con.execute("CHECKPOINT")

    def close(self) -> None:
        """Checkpoint and close; safe to call twice."""
        with self._lock:
            if self._con is not None:
                try:
                    self._con.execute("CHECKPOINT")
                except duckdb.Error:
                    pass
                self._con.close()
                self._con = None  # type: ignore[assignment]
