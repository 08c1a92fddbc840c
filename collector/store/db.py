"""RequestStore: the one read-write owner of a DuckDB request-log file, and its one insert path.

Only one process may open a DuckDB file read-write (docs/design.md §2, process model). The
sidecar's in-process store holds one RequestStore; everything
else reads through it. Rows arrive in batches and are inserted once per batch through Arrow,
never with a per-row `executemany` (docs/domain.md §11): `rows_to_arrow` is the one place records
become columns, and `RequestStore.insert_arrow` the one INSERT, for the sidecar's writer and the
store's ingest alike.

Exactly once without a primary key. A row is a duplicate when a stored row has its request_id
and its admitted_at (a resent batch repeats both). The INSERT keeps the first of the batch's own
duplicates and leaves out the rows already stored, looking only at stored rows whose admitted_at
lies within the batch's span: DuckDB's per-row-group min/max of admitted_at skips the rest of the
table, so the check costs the same at 10 million rows as at ten. DuckDB returns the number of
rows it inserted, so no count of the table is needed. (A primary-key index costs about 3.5 µs per
row to maintain on the project's machine, more than everything else the insert does:
BENCHMARKS.md.)

A live log's batches follow one another in time, so most of them begin after every stored row.
The store remembers the newest admitted_at it holds (one `max()` when it does not know, then
kept up to date by each insert), and a batch that begins after it cannot repeat a stored row:
its INSERT has no duplicate check at all. A resent batch, or a late one from another sidecar,
begins at or before that instant and is checked as above. Any other write (`execute`)
makes the store forget the instant, so a delete can never make it skip a check it needed; stores of the same file in one process share what they know.
"""

from __future__ import annotations

import contextlib
import enum
import os
import threading
from collections.abc import Iterator, Mapping, Sequence
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import TYPE_CHECKING, Any, Final

import duckdb
import pyarrow as pa

if TYPE_CHECKING:  # numpy is the report's and the analysis' extra, not the sidecar's
    import numpy as np

from collector.store.arrow import ARROW_SCHEMA, ARROW_STREAM_TYPE, Rows, rows_to_arrow, rows_to_ipc
from collector.store.schema import COLUMN_NAMES, COLUMNS, migrate

__all__ = [
    "RequestStore",
    "SnapshotReads",
    "ARROW_SCHEMA",
    "ARROW_STREAM_TYPE",
    "rows_to_arrow",
    "rows_to_ipc",
]

_COLUMN_LIST = ", ".join(COLUMN_NAMES)


class _Unknown(enum.Enum):
    UNKNOWN = enum.auto()


_UNKNOWN: Final = _Unknown.UNKNOWN  # the store does not know the newest admitted_at it holds
Newest = datetime | None | _Unknown  # the newest admitted_at stored (None: no row has one)
BatchFacts = tuple[bool, datetime | None, datetime | None, bool]  # what _batch_facts returns


class _Newest:
    """The newest admitted_at stored in one database (None: no row has one), or _UNKNOWN; shared
    by every RequestStore of that database in this process, under its own lock."""

    __slots__ = ("lock", "value")

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.value: Newest = _UNKNOWN


_NEWEST: dict[str, _Newest] = {}
_NEWEST_LOCK = threading.Lock()


def _newest_for(path: str, store: object) -> _Newest:
    key = f":memory:{id(store)}" if path == ":memory:" else os.path.realpath(path)
    with _NEWEST_LOCK:
        return _NEWEST.setdefault(key, _Newest())


_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)


def _sql_text(text: str) -> str:
    """A SQL string literal: 'it''s' for it's."""
    return "'" + text.replace("'", "''") + "'"


def _utc(moment: datetime) -> datetime:
    """An aware datetime in UTC; a naive one is taken as UTC (the log's clock)."""
    return moment.replace(tzinfo=UTC) if moment.tzinfo is None else moment.astimezone(UTC)


def _batch_facts(batch: pa.Table) -> BatchFacts:
    """What the INSERT needs to know of a batch: (an id repeats or is NULL, earliest and latest
    admitted_at, some admitted_at is NULL). Read from the columns' own buffers: pyarrow.compute
    would cost every sidecar 8 MiB more, a DuckDB pass 1.3 ms more per batch."""
    ids, admitted = batch.column("request_id"), batch.column("admitted_at")
    seen: set[str] = set()
    for chunk in ids.chunks:  # a chunk at a time: the interpreter can switch threads between them
        seen.update(chunk.to_pylist())
    repeated = ids.null_count > 0 or len(seen) < batch.num_rows
    if admitted.null_count:  # rare (ingest from other clients): the slow way
        present = [value for value in admitted.to_pylist() if value is not None]
        return repeated, min(present, default=None), max(present, default=None), True
    lows, highs = [], []
    for chunk in admitted.chunks:  # timestamp[us]: int64 microseconds since the epoch
        if len(chunk):
            values = memoryview(chunk.buffers()[1]).cast("q")[chunk.offset : chunk.offset + len(chunk)]
            lows.append(min(values))
            highs.append(max(values))
    if not lows:
        return repeated, None, None, False
    low, high = (_EPOCH + timedelta(microseconds=us) for us in (min(lows), max(highs)))
    return repeated, low, high, False


def _insert_sql(
    facts: BatchFacts, newest: Newest = _UNKNOWN
) -> tuple[str, list[datetime | None], datetime | None]:
    """The INSERT for a batch (bound as `batch`), its parameters and the batch's newest admitted_at.

    `facts` are _batch_facts(batch): (ids repeat in it, earliest and latest admitted_at, some
    admitted_at is NULL). Example: a batch admitted between 09:00 and 09:05 without NULLs ->
    "... WHERE NOT EXISTS (... r.admitted_at = b.admitted_at AND r.admitted_at BETWEEN ? AND ?)",
    [09:00, 09:05]; the same batch when `newest` (the newest admitted_at stored) is 08:59 -> no
    check, [].
    """
    repeated, low, high, nulls = facts
    source = "(SELECT DISTINCT ON (request_id, admitted_at) * FROM batch)" if repeated else "batch"
    insert = f"INSERT INTO requests ({_COLUMN_LIST}) SELECT {_COLUMN_LIST} FROM {source} AS b"
    if not nulls and newest is not _UNKNOWN and (newest is None or (low is not None and low > newest)):
        return insert, [], high  # begins after every stored row: nothing stored can repeat
    same_time = "r.admitted_at = b.admitted_at"
    span, params = "r.admitted_at BETWEEN ? AND ?", [low, high]
    if nulls:  # rare (only ingest from other clients): NULL must match NULL
        same_time = "r.admitted_at IS NOT DISTINCT FROM b.admitted_at"
        span = f"({span} OR r.admitted_at IS NULL)" if low is not None else "r.admitted_at IS NULL"
        params = params if low is not None else []
    sql = (
        f"{insert} WHERE NOT EXISTS (SELECT 1 FROM requests r WHERE r.request_id = b.request_id "
        f"AND {same_time} AND {span})"
    )
    return sql, params, high


def _unmasked(values: np.ndarray) -> np.ndarray:
    """fetchnumpy's masked array as a plain one: NaN for a float's NULL, None for others'."""
    import numpy as np  # the report's extra: the slim sidecar never calls this

    if not isinstance(values, np.ma.MaskedArray):
        return values
    if not values.mask.any():
        return np.asarray(values.data)
    if values.dtype.kind == "f":
        return np.asarray(values.filled(np.nan))
    plain = np.asarray(values.data, dtype=object)
    plain[np.ma.getmaskarray(values)] = None
    return plain


class SnapshotReads:
    """Queries on one snapshot of a store (RequestStore.one_snapshot): query, query_dicts, numpy."""

    def __init__(self, cursor: duckdb.DuckDBPyConnection, lock: threading.Lock) -> None:
        self._cursor, self._lock = cursor, lock

    def query(self, sql: str, params: Sequence[Any] | Mapping[str, Any] = ()) -> list[tuple[Any, ...]]:
        """All rows of a parameterised query, as RequestStore.query."""
        with self._lock:
            return self._cursor.execute(sql, params).fetchall()

    def query_dicts(self, sql: str, params: Sequence[Any] | Mapping[str, Any] = ()) -> list[dict[str, Any]]:
        """Each row as a {column: value} dict, as RequestStore.query_dicts."""
        with self._lock:
            cursor = self._cursor.execute(sql, params)
            names = [d[0] for d in cursor.description]
            return [dict(zip(names, row)) for row in cursor.fetchall()]

    def numpy(self, sql: str, params: Sequence[Any] | Mapping[str, Any] = ()) -> dict[str, np.ndarray]:
        """One numpy array per column, as RequestStore.numpy."""
        with self._lock:
            found = self._cursor.execute(sql, params).fetchnumpy()
        return {name: _unmasked(values) for name, values in found.items()}


class RequestStore:
    """Owns a DuckDB connection; thread-safe through one lock (DuckDB connections are not)."""

    def __init__(
        self,
        path: str | Path = ":memory:",
        *,
        read_only: bool = False,
        checkpoint_mb: int | None = None,
        threads: int | None = None,
        memory_mb: int | None = None,
    ) -> None:
        """Open (or create and migrate) the request log at `path`.

        `checkpoint_mb`: fold DuckDB's write-ahead log into the file once it holds this many MB
        (DuckDB's default: 16). At 10 M rows a fold took 64-452 ms, as long as the inserts
        between folds, so fewer folds take batches faster; the rows of an unfolded log stay in
        memory meanwhile.
        A bulk writer may raise it; a sidecar keeps the default (BENCHMARKS.md §5c).

        `threads`: DuckDB's worker threads for this database (DuckDB's default: one per core).
        A sidecar's store takes one, leaving the other cores to the proxy; on 2 cores its inserts
        were faster too, 8.3-8.7 against 10.0-10.5 ms per 5,000 rows into 10 M (BENCHMARKS.md §5f).

        `memory_mb`: DuckDB's memory_limit for this database (DuckDB's default: 80 % of the
        machine's memory). DuckDB keeps each block it writes or reads until it reaches that
        limit, so a long-lived writer's memory grows with its file (BENCHMARKS.md §10).
        """
        self.path = str(path)
        self.memory_mb = memory_mb
        new = self.path != ":memory:" and not Path(self.path).exists()
        if new:
            Path(self.path).parent.mkdir(parents=True, exist_ok=True, mode=0o700)
        self._con = duckdb.connect(self.path, read_only=read_only)
        if new and Path(self.path).exists():
            os.chmod(self.path, 0o600)  # rows carry tenants and timings: the owner's alone
        self._lock = threading.Lock()
        self._closed = False
        self.migrated_from = None if read_only else migrate(self._con)
        if checkpoint_mb is not None and not read_only:
            self._con.execute("SET checkpoint_threshold = ?", [f"{int(checkpoint_mb)}MB"])
        if threads is not None:
            self._con.execute("SET threads = ?", [int(threads)])
        if memory_mb is not None:
            self._con.execute("SET memory_limit = ?", [f"{int(memory_mb)}MB"])
        self._newest = _newest_for(self.path, self)
        with self._newest.lock:  # the file may have changed since a store of it last looked
            self._newest.value = _UNKNOWN

    def insert_rows(self, rows: Rows, *, lenient: bool = False) -> int:
        """Insert a batch of records or row dicts; duplicates (module docstring) are ignored.
        Returns rows added.

        A value that does not fit its column raises, or with `lenient` is stored as NULL.
        """
        if not rows:
            return 0
        return self.insert_arrow(rows_to_arrow(rows, lenient=lenient))

    def insert_arrow(self, batch: pa.Table) -> int:
        """Insert an Arrow table in ARROW_SCHEMA; duplicates are ignored. Returns rows added."""
        if batch.num_rows == 0:
            return 0
        newest = self._newest
        with newest.lock, self._lock:
            stored = newest.value
            if stored is _UNKNOWN:
                found = self._con.execute("SELECT max(admitted_at) FROM requests").fetchall()
                stored = newest.value = found[0][0]
            # the SQL reads the local `batch` (a DuckDB replacement scan)
            sql, params, high = _insert_sql(_batch_facts(batch), stored)
            try:
                inserted = int(self._con.execute(sql, params).fetchall()[0][0])
            except BaseException:
                newest.value = _UNKNOWN  # ask again rather than trust what a failure left
                raise
            if high is not None and (stored is None or high > stored):
                newest.value = high
            return inserted

    def copy_out(
        self, sql: str, params: Sequence[Any], path: str | Path, *, threads: int | None = None
    ) -> int:
        """Write a parameterised query's rows to a Parquet file at `path`; returns how many.

        One DuckDB `COPY (sql) TO ?` statement: no Arrow or Python object per row, and the
        interpreter lock is released while it runs (DuckDB's client takes it back between its
        steps, to check for Ctrl-C: BENCHMARKS.md §5b). `threads` caps DuckDB's threads for it.
        """
        with self._lock:
            cursor = self._con.cursor()
            try:
                if threads is not None:
                    previous = cursor.execute("SELECT current_setting('threads')").fetchall()[0][0]
                    cursor.execute("SET threads = ?", [threads])
                try:
                    done = cursor.execute(f"COPY ({sql}) TO ? (FORMAT parquet)", [*params, str(path)])
                    return int(done.fetchall()[0][0])
                finally:
                    if threads is not None:
                        cursor.execute("SET threads = ?", [previous])
            finally:
                cursor.close()

    @classmethod
    def over_parquet(
        cls,
        paths: str | Path | Sequence[str | Path],
        *,
        since: datetime | None = None,
        until: datetime | None = None,
        filesystem: Any = None,
    ) -> RequestStore:
        """A read-only in-memory store whose `requests` is a view over Parquet files read in place:
        the refresh's copy_out() file, or the fleet table's data files (collector.lake.read).

        Columns are matched by name across the files (`union_by_name`); a column no file has reads
        as NULL; with `since`/`until` only rows admitted in [since, until) are in the view. No file:
        the empty table. Each query scans the files for what it needs; nothing is copied into
        memory first (BENCHMARKS.md §8d, §9). `filesystem` (an fsspec filesystem) is registered with
        DuckDB for paths of its protocol. Paths and bounds are ours, quoted into the SQL here (a
        view keeps no parameters).
        """
        store = cls()
        files = [str(paths)] if isinstance(paths, (str, Path)) else [str(p) for p in paths]
        if not files:
            return store
        if filesystem is not None:
            store._con.register_filesystem(filesystem)
        listed = ", ".join(_sql_text(f) for f in files)
        source = f"read_parquet([{listed}], union_by_name = true)"
        present = {row[0] for row in store._con.execute(f"DESCRIBE SELECT * FROM {source}").fetchall()}
        columns = ", ".join(
            name if name in present else f"CAST(NULL AS {sql.split()[0]}) AS {name}" for name, sql in COLUMNS
        )
        bounds = [
            f"admitted_at {op} TIMESTAMPTZ {_sql_text(_utc(moment).isoformat())}"
            for op, moment in ((">=", since), ("<", until))
            if moment is not None
        ]
        where = f" WHERE {' AND '.join(bounds)}" if bounds else ""
        with store._newest.lock, store._lock:
            store._newest.value = _UNKNOWN
            store._con.execute("DROP TABLE requests")
            store._con.execute(f"CREATE VIEW requests AS SELECT {columns} FROM {source}{where}")
        return store

    def write_batch(self, rows: Rows) -> None:
        """BatchSink interface for the LogWriter: insert the batch (duplicates ignored).

        Lenient: one bad value (say a client's max_tokens beyond INTEGER) must not cost the other
        rows of the batch their place in the log.
        """
        self.insert_rows(rows, lenient=True)

    def query(self, sql: str, params: Sequence[Any] | Mapping[str, Any] = ()) -> list[tuple[Any, ...]]:
        """Run a parameterised query and return all rows. Never format values into `sql`."""
        return SnapshotReads(self._con, self._lock).query(sql, params)

    def query_dicts(self, sql: str, params: Sequence[Any] | Mapping[str, Any] = ()) -> list[dict[str, Any]]:
        """Like query(), with each row as a {column: value} dict (its columns follow `sql`)."""
        return SnapshotReads(self._con, self._lock).query_dicts(sql, params)

    def numpy(self, sql: str, params: Sequence[Any] | Mapping[str, Any] = ()) -> dict[str, np.ndarray]:
        """Like query(), as one numpy array per column (a long result without a tuple per row);
        NULL reads as NaN in a float column, None in any other."""
        with self._lock:
            cursor = self._con.cursor()  # its own result: the connection may hold a fetchone()'s
        try:
            return SnapshotReads(cursor, self._lock).numpy(sql, params)
        finally:
            with self._lock:
                cursor.close()

    def execute(self, sql: str, params: Sequence[Any] | Mapping[str, Any] = ()) -> None:
        """Run a parameterised statement (DDL, rollups, deletes) under the lock."""
        with self._newest.lock, self._lock:
            self._newest.value = _UNKNOWN  # it may have changed the rows: the next insert asks again
            self._con.execute(sql, params)

    def arrow(self, sql: str, params: Sequence[Any] = (), *, threads: int | None = None) -> pa.Table:
        """Run a parameterised query and return an Arrow table (for analysis and export).

        `threads` caps DuckDB's threads for this query (then restores the setting): a copy made
        beside a proxy takes one core, not all of them.
        """
        with self._lock:
            cursor = self._con.cursor()  # its own result: the connection may hold a fetchone()'s
            try:
                if threads is not None:
                    previous = cursor.execute("SELECT current_setting('threads')").fetchall()[0][0]
                    cursor.execute("SET threads = ?", [threads])
                try:
                    return cursor.sql(sql, params=list(params) or None).to_arrow_table()
                finally:
                    if threads is not None:
                        cursor.execute("SET threads = ?", [previous])
            finally:
                cursor.close()

    @contextlib.contextmanager
    def memory_at_least(self, mb: int) -> Iterator[None]:
        """DuckDB's memory_limit raised to at least `mb` for the block, then the store's bound
        again: a store bounded for a long-lived writer (a sidecar's 256 MB) lends a large read,
        such as the weekly review's exact quantiles over millions of rows, the memory it needs."""
        if self.memory_mb is None or self.memory_mb >= mb:
            yield
            return
        with self._lock:
            self._con.execute("SET memory_limit = ?", [f"{int(mb)}MB"])
        try:
            yield
        finally:
            with self._lock:
                self._con.execute("SET memory_limit = ?", [f"{int(self.memory_mb)}MB"])

    @contextlib.contextmanager
    def one_snapshot(self) -> Iterator[SnapshotReads]:
        """Reads that all see the database as it was when the block began: a read-only transaction
        on a cursor of its own, while the writer goes on appending on the store's connection. A
        reader that runs several queries (the weekly review) then never meets a row, or a model,
        that arrived between two of them. An in-memory store (a view over Parquet files: nothing
        writes to it) reads on its own connection, where its registered filesystems are."""
        if self.path == ":memory:":
            yield SnapshotReads(self._con, self._lock)
            return
        with self._lock:
            cursor = self._con.cursor()
            cursor.execute("BEGIN TRANSACTION")
            cursor.execute("SELECT 1 FROM requests LIMIT 0").fetchall()  # the snapshot starts here
        try:
            yield SnapshotReads(cursor, self._lock)
        finally:
            with self._lock:
                cursor.execute("ROLLBACK")
                cursor.close()

    def count(self) -> int:
        """Number of rows in `requests`."""
        return int(self.query("SELECT count(*) FROM requests")[0][0])

    def snapshot(self, path: str | Path) -> Path:
        """Copy the whole database, consistently, into a new DuckDB file at `path` (for readers).

        Inserts wait for the copy (one lock); the writer thread is off the request path, so no
        client waits. `path` is a file this process creates (a temporary one), never user input:
        ATTACH takes no parameters, so it is quoted here.
        """
        target = str(path).replace("'", "''")
        with self._lock:
            name = self._con.execute("SELECT current_database()").fetchall()[0][0].replace('"', '""')
            self._con.execute(f"ATTACH '{target}' AS headroom_snapshot")
            try:
                self._con.execute(f'COPY FROM DATABASE "{name}" TO headroom_snapshot')
            finally:
                self._con.execute("DETACH headroom_snapshot")
        return Path(path)

    def checkpoint(self) -> None:
        """Flush the write-ahead log into the database file."""
        with self._lock:
            self._con.execute("CHECKPOINT")

    def close(self) -> None:
        """Checkpoint and close; safe to call twice."""
        with self._lock:
            if not self._closed:
                try:
                    self._con.execute("CHECKPOINT")
                except duckdb.Error:
                    pass
                self._con.close()
                self._closed = True
