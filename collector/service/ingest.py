"""POST /v1/ingest: batches of request-log rows from sidecars, idempotent by request_id.

Two bodies, told apart by Content-Type:

* `application/vnd.apache.arrow.stream`: an Arrow IPC stream whose columns are request-log
  columns (any subset with request_id; types cast safely to the schema's), e.g.
  collector.store.db.rows_to_ipc(rows). Nothing is parsed value by value, so a batch of 5,000
  rows costs about what DuckDB takes to insert it (BENCHMARKS.md §5).
* `application/json` (anything else): `{"rows": [{<COLUMN_NAMES>...}, ...]}` with timestamps as
  ISO-8601 strings, for clients that are not Python.

Both go through the store's one insert (RequestStore.insert_arrow): a row already stored (same
request_id, same admitted_at) is left out, so a client may resend a batch after a timeout
without creating duplicates.
"""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

import orjson
import pyarrow as pa
from fastapi import APIRouter, HTTPException, Request
from fastapi.concurrency import run_in_threadpool
from pydantic import BaseModel

from collector.record import FIELD_NAMES, INT64_FIELDS, RequestRecord, field_types
from collector.service.validation import StoreRoute
from collector.store.db import ARROW_SCHEMA, ARROW_STREAM_TYPE, RequestStore, rows_to_arrow
from collector.store.schema import COLUMN_NAMES

__all__ = [
    "MAX_BATCH_ROWS",
    "MAX_BODY_BYTES",
    "MAX_TEXT_CHARS",
    "IngestResult",
    "parse_batch",
    "parse_arrow_batch",
    "build_ingest_router",
]

MAX_BATCH_ROWS = 50_000
MAX_BODY_BYTES = 64 * 2**20  # a full batch of sidecar rows is about 40 MB
MAX_TEXT_CHARS = 4096  # no column holds text longer than a short reason or an id
_TYPES = field_types()
_KNOWN = frozenset(FIELD_NAMES)


class IngestResult(BaseModel):
    """What the store did with one batch."""

    received: int
    inserted: int
    duplicates: int


def _bad(message: str) -> HTTPException:
    return HTTPException(status_code=400, detail=message)


def _parse_timestamp(value: str, where: str) -> datetime:
    try:
        parsed = datetime.fromisoformat(value)
    except ValueError:
        raise _bad(f"{where}: {value[:40]!r} is not an ISO-8601 timestamp") from None
    return parsed if parsed.tzinfo else parsed.replace(tzinfo=UTC)


def _parse_value(value: Any, column: str, where: str) -> Any:
    """One JSON value as the record field `column` holds it; raises a 400 naming it."""
    expected = _TYPES[column]
    if value is None:
        return None
    if expected is datetime and isinstance(value, str):
        return _parse_timestamp(value, where)
    if expected is float and isinstance(value, int) and not isinstance(value, bool):
        return float(value)
    if expected is int and isinstance(value, int) and not isinstance(value, bool):
        limit = 2**63 if column in INT64_FIELDS else 2**31
        if not -limit <= value < limit:
            raise _bad(f"{where}: {value} is out of range for a {limit.bit_length()}-bit column")
        return value
    if isinstance(value, expected) and (expected is bool or not isinstance(value, bool)):
        if isinstance(value, str) and len(value) > MAX_TEXT_CHARS:
            raise _bad(f"{where}: {len(value)} characters is over the limit of {MAX_TEXT_CHARS}")
        return value
    raise _bad(f"{where}: expected {expected.__name__}, got {type(value).__name__}")


def _parse_row(row: Any, index: int) -> RequestRecord:
    if not isinstance(row, dict):
        raise _bad(f"rows[{index}]: expected an object of request-log columns")
    unknown = set(row) - _KNOWN
    if unknown:
        raise _bad(
            f"rows[{index}]: unknown column(s) {sorted(unknown)[:5]}; "
            "send only the fields of collector.record.RequestRecord"
        )
    if not isinstance(row.get("request_id"), str) or not row["request_id"]:
        raise _bad(f"rows[{index}]: request_id is required and must be a non-empty string")
    return RequestRecord(
        **{column: _parse_value(value, column, f"rows[{index}].{column}") for column, value in row.items()}
    )


def parse_batch(body: bytes) -> list[RequestRecord]:
    """Validate an ingest body into records; raises HTTPException(400) naming the bad part.

    Every column is checked against its RequestRecord field's type (and an INTEGER's range).
    Example: b'{"rows":[{"request_id":"a","admitted_at":"2026-11-30T09:00:00+00:00"}]}'
    -> [RequestRecord(request_id="a", admitted_at=datetime(2026, 11, 30, 9, tzinfo=UTC))]
    """
    try:
        payload = orjson.loads(body)
    except orjson.JSONDecodeError as exc:
        raise _bad(f'body is not valid JSON ({exc}); send {{"rows": [...]}}') from None
    rows = payload.get("rows") if isinstance(payload, dict) else None
    if not isinstance(rows, list):
        raise _bad('body must be an object {"rows": [...]}')
    if len(rows) > MAX_BATCH_ROWS:
        raise _bad(f"batch of {len(rows)} rows is over the limit of {MAX_BATCH_ROWS}; split it")
    return [_parse_row(row, index) for index, row in enumerate(rows)]


def _cast(column: pa.ChunkedArray, name: str) -> pa.ChunkedArray:
    target = ARROW_SCHEMA.field(name).type
    try:
        return column.cast(target)  # safe: an overflow or a lossy conversion raises
    except (pa.ArrowInvalid, pa.ArrowNotImplementedError, pa.ArrowTypeError) as exc:
        raise _bad(f"column {name}: {column.type} does not convert to {target} ({exc})") from None


def parse_arrow_batch(body: bytes) -> pa.Table:
    """Validate an Arrow IPC stream into a table in ARROW_SCHEMA; HTTPException(400) naming the problem.

    Example: a stream with columns (request_id: string, ttft_s: float32) -> a table with all 28
    columns, ttft_s cast to float64, the other 26 NULL.
    """
    try:
        table = pa.ipc.open_stream(body).read_all()
    except (pa.ArrowInvalid, OSError) as exc:
        raise _bad(f"body is not an Arrow IPC stream ({exc}); send {ARROW_STREAM_TYPE} or JSON") from None
    unknown = set(table.column_names) - _KNOWN
    if unknown:
        raise _bad(f"unknown column(s) {sorted(unknown)[:5]}; send only collector.store.schema.COLUMN_NAMES")
    if table.num_rows > MAX_BATCH_ROWS:
        raise _bad(f"batch of {table.num_rows} rows is over the limit of {MAX_BATCH_ROWS}; split it")
    import pyarrow.compute as pc  # lazily: 8 MiB that a sidecar which is never sent Arrow never loads

    ids = table.column("request_id") if "request_id" in table.column_names else None
    if (
        ids is None
        or ids.null_count
        or (table.num_rows and not pa.types.is_string(ids.type))
        or (table.num_rows and pc.min(pc.utf8_length(ids)).as_py() == 0)
    ):
        raise _bad("request_id is required in every row and must be a non-empty string")
    for name in table.column_names:
        column = table.column(name)
        if table.num_rows and pa.types.is_string(column.type) and column.null_count < table.num_rows:
            longest = pc.max(pc.utf8_length(column)).as_py()
            if longest > MAX_TEXT_CHARS:
                raise _bad(f"column {name}: {longest} characters is over the limit of {MAX_TEXT_CHARS}")
    columns = [
        _cast(table.column(name), name)
        if name in table.column_names
        else pa.nulls(table.num_rows, ARROW_SCHEMA.field(name).type)
        for name in COLUMN_NAMES
    ]
    return pa.Table.from_arrays(columns, schema=ARROW_SCHEMA)


def _insert(store: RequestStore, rows: list[RequestRecord] | pa.Table) -> int:
    try:
        return store.insert_arrow(rows if isinstance(rows, pa.Table) else rows_to_arrow(rows))
    except (pa.ArrowInvalid, pa.ArrowTypeError, TypeError, OverflowError) as exc:
        raise _bad(f"a column has the wrong type for the request-log schema: {exc}") from None


async def _read_limited(request: Request) -> bytes:
    """The body, refused with 413 naming the limit once it passes MAX_BODY_BYTES."""
    declared = request.headers.get("content-length", "")
    if declared.isdigit() and int(declared) > MAX_BODY_BYTES:
        raise _too_large(int(declared))
    chunks, size = [], 0
    async for chunk in request.stream():
        size += len(chunk)
        if size > MAX_BODY_BYTES:
            raise _too_large(size)
        chunks.append(chunk)
    return b"".join(chunks)


def _too_large(size: int) -> HTTPException:
    return HTTPException(
        status_code=413,
        detail=f"body of {size} bytes or more is over the ingest "
        f"limit of {MAX_BODY_BYTES} bytes (MAX_BODY_BYTES); send smaller batches",
    )


def build_ingest_router(store: RequestStore) -> APIRouter:
    """The ingest route (`headroom probe --db` sends its rows here while a sidecar owns the file)."""
    router = APIRouter(tags=["ingest"], route_class=StoreRoute)

    @router.post(
        "/v1/ingest",
        response_model=IngestResult,
        summary="Store a batch of request-log rows (idempotent by request_id)",
    )
    async def ingest(request: Request) -> IngestResult:
        body = await _read_limited(request)
        arrow = request.headers.get("content-type", "").startswith(ARROW_STREAM_TYPE)
        rows = parse_arrow_batch(body) if arrow else parse_batch(body)
        inserted = await run_in_threadpool(_insert, store, rows)
        return IngestResult(received=len(rows), inserted=inserted, duplicates=len(rows) - inserted)

    return router
