"""Records as Arrow: the request log's columns as an Arrow schema, and the one place records become
columns (`rows_to_arrow`), for the store's insert, its ingest and the lake's spool alike.

No DuckDB here: a `headroom run --lake` sidecar stages its rows through this module and never
loads the store (docs/operations.md, "Installing"). collector.store.db re-exports these names.
"""

from __future__ import annotations

import operator
from collections.abc import Mapping, Sequence
from typing import Any, TypeGuard

import pyarrow as pa

from collector.record import RequestRecord
from collector.store.schema import COLUMN_NAMES, COLUMNS

__all__ = ["ARROW_SCHEMA", "ARROW_STREAM_TYPE", "Rows", "rows_to_arrow", "rows_to_ipc"]

_ARROW_TYPES = {
    "VARCHAR": pa.string(),
    "BOOLEAN": pa.bool_(),
    "TIMESTAMPTZ": pa.timestamp("us", tz="UTC"),
    "INTEGER": pa.int32(),
    "BIGINT": pa.int64(),
    "DOUBLE": pa.float64(),
}
ARROW_SCHEMA = pa.schema([(name, _ARROW_TYPES[sql.split()[0]]) for name, sql in COLUMNS])
ARROW_STREAM_TYPE = "application/vnd.apache.arrow.stream"  # the IANA media type of an Arrow IPC stream


Rows = Sequence[RequestRecord | Mapping[str, Any]]


def _column_values(rows: Rows, name: str) -> list[Any]:
    return [row.get(name) if isinstance(row, Mapping) else getattr(row, name) for row in rows]


_GETTERS = tuple((name, operator.attrgetter(name)) for name in COLUMN_NAMES)  # a record's column, in C


def _plain_dicts(rows: Rows, kinds: set[type]) -> TypeGuard[Sequence[dict[str, Any]]]:
    """Whether every row is a plain dict, from `kinds`, the set of the rows' types."""
    return kinds == {dict}


def _columns(rows: Rows) -> dict[str, list[Any]]:
    """{column: values}. The kind of row is checked once per batch, not once per value: over
    5,000 rows x 28 columns the per-value check was 18 ms of a 50 ms insert (3 ms without).

    Records are read a column at a time by `operator.attrgetter` (2.98 ms per 5,000 records).
    Reading them a row at a time and transposing with `zip` looked faster under `timeit` (2.6
    ms), but `timeit` turns the garbage collector off: the 5,000 row tuples set it off, and with
    it on that took 4.8-8.2 ms (BENCHMARKS.md §2, "The garbage collector").
    """
    kinds = {type(row) for row in rows}
    if _plain_dicts(rows, kinds):
        return {name: [row.get(name) for row in rows] for name in COLUMN_NAMES}
    if not kinds:
        return {name: [] for name in COLUMN_NAMES}
    if not any(issubclass(kind, Mapping) for kind in kinds):
        return {name: list(map(getter, rows)) for name, getter in _GETTERS}
    return {name: _column_values(rows, name) for name in COLUMN_NAMES}


_SLICE_ROWS = 5_000  # rows converted at a time: pyarrow holds the interpreter for a column of them


def rows_to_arrow(rows: Rows, *, lenient: bool = False) -> pa.Table:
    """Turn records or row dicts (missing keys are NULL) into one Arrow table in column order.

    Example: [{"request_id": "a", "ttft_s": 0.2}] -> a 1-row table with 28 columns, 26 of them NULL.
    A value of the wrong type or out of its column's range raises (the store's ingest answers
    400), or with `lenient` becomes NULL so that it alone is lost, not its batch.

    More than 5,000 rows are converted 5,000 at a time into one table of several chunks (no
    copy): pyarrow holds the interpreter while it converts a column, about 1 ms for 5,000
    timestamps, and a writer thread converting a 50,000-row backlog must not hold the proxy's
    thread off for ten times that.
    """
    if len(rows) > _SLICE_ROWS:
        return pa.concat_tables(
            [_to_arrow(rows[at : at + _SLICE_ROWS], lenient) for at in range(0, len(rows), _SLICE_ROWS)]
        )
    return _to_arrow(rows, lenient)


def _to_arrow(rows: Rows, lenient: bool) -> pa.Table:
    columns = _columns(rows)
    try:
        return pa.Table.from_pydict(columns, schema=ARROW_SCHEMA)
    except (pa.ArrowInvalid, pa.ArrowTypeError, OverflowError, TypeError, ValueError):
        if not lenient:
            raise
        return pa.Table.from_arrays(
            [_column(columns[f.name], f.type) for f in ARROW_SCHEMA], schema=ARROW_SCHEMA
        )


def rows_to_ipc(rows: Rows) -> bytes:
    """Rows as one Arrow IPC stream, a body for the store's ingest (leniently, like the writer).

    The store reads it without parsing a value (`pa.ipc.open_stream`), which is what lets its
    ingest keep up with a fleet: JSON costs more to parse than DuckDB takes to insert.
    """
    table = rows_to_arrow(rows, lenient=True)
    sink = pa.BufferOutputStream()
    with pa.ipc.new_stream(sink, table.schema) as stream:
        stream.write_table(table)
    return bytes(sink.getvalue().to_pybytes())


def _column(values: list[Any], arrow_type: pa.DataType) -> pa.Array:
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
