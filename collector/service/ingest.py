"""POST /v1/ingest: batches of request-log rows from sidecars, idempotent by request_id.

Body: `{"rows": [{<COLUMN_NAMES>...}, ...]}` with timestamps as ISO-8601 strings. A row whose
request_id is already stored is ignored (RequestStore.insert_rows uses INSERT OR IGNORE), so a
shipper may resend a batch after a timeout without creating duplicates.
"""

from __future__ import annotations

from datetime import datetime, timezone
from typing import Any

import orjson
import pyarrow as pa
from fastapi import APIRouter, HTTPException, Request
from fastapi.concurrency import run_in_threadpool
from pydantic import BaseModel

from collector.store.db import RequestStore
from collector.store.schema import COLUMN_NAMES, COLUMNS

__all__ = ["MAX_BATCH_ROWS", "IngestResult", "parse_batch", "build_ingest_router"]

MAX_BATCH_ROWS = 50_000
_TIMESTAMP_COLUMNS = frozenset(name for name, sql in COLUMNS if sql.startswith("TIMESTAMPTZ"))
_KNOWN = frozenset(COLUMN_NAMES)


class IngestResult(BaseModel):
    """What the store did with one batch."""

    received: int
    inserted: int
    duplicates: int


def _bad(message: str) -> HTTPException:
    return HTTPException(status_code=400, detail=message)


def _parse_timestamp(value: Any, column: str, index: int) -> datetime | None:
    if value is None or isinstance(value, datetime):
        return value
    if not isinstance(value, str):
        raise _bad(f"rows[{index}].{column}: expected an ISO-8601 timestamp string, got {type(value).__name__}")
    try:
        parsed = datetime.fromisoformat(value)
    except ValueError:
        raise _bad(f"rows[{index}].{column}: {value[:40]!r} is not an ISO-8601 timestamp") from None
    return parsed if parsed.tzinfo else parsed.replace(tzinfo=timezone.utc)


def _parse_row(row: Any, index: int) -> dict[str, Any]:
    if not isinstance(row, dict):
        raise _bad(f"rows[{index}]: expected an object of request-log columns")
    unknown = set(row) - _KNOWN
    if unknown:
        raise _bad(f"rows[{index}]: unknown column(s) {sorted(unknown)[:5]}; "
                   "send only collector.store.schema.COLUMN_NAMES")
    if not isinstance(row.get("request_id"), str) or not row["request_id"]:
        raise _bad(f"rows[{index}]: request_id is required and must be a non-empty string")
    for column in _TIMESTAMP_COLUMNS.intersection(row):
        row[column] = _parse_timestamp(row[column], column, index)
    return row


def parse_batch(body: bytes) -> list[dict[str, Any]]:
    """Validate an ingest body into row dicts; raises HTTPException(400) naming the bad part.

    Example: b'{"rows":[{"request_id":"a","admitted_at":"2026-11-30T09:00:00+00:00"}]}'
    -> [{"request_id": "a", "admitted_at": datetime(2026, 11, 30, 9, tzinfo=UTC)}]
    """
    try:
        payload = orjson.loads(body)
    except orjson.JSONDecodeError as exc:
        raise _bad(f"body is not valid JSON ({exc}); send {{\"rows\": [...]}}") from None
    rows = payload.get("rows") if isinstance(payload, dict) else None
    if not isinstance(rows, list):
        raise _bad('body must be an object {"rows": [...]}')
    if len(rows) > MAX_BATCH_ROWS:
        raise _bad(f"batch of {len(rows)} rows is over the limit of {MAX_BATCH_ROWS}; split it")
    return [_parse_row(row, index) for index, row in enumerate(rows)]


def _insert(store: RequestStore, rows: list[dict[str, Any]]) -> int:
    try:
        return store.insert_rows(rows)
    except (pa.ArrowInvalid, pa.ArrowTypeError, TypeError, OverflowError) as exc:
        raise _bad(f"a column has the wrong type for the request-log schema: {exc}") from None


def build_ingest_router(store: RequestStore, on_rows=None) -> APIRouter:
    """The ingest route; `on_rows(inserted)` is called after each batch (for the written counter)."""
    router = APIRouter(tags=["ingest"])

    @router.post("/v1/ingest", response_model=IngestResult,
                 summary="Store a batch of request-log rows (idempotent by request_id)")
    async def ingest(request: Request) -> IngestResult:
        rows = parse_batch(await request.body())
        inserted = await run_in_threadpool(_insert, store, rows)
        if on_rows is not None:
            on_rows(inserted)
        return IngestResult(received=len(rows), inserted=inserted, duplicates=len(rows) - inserted)

    return router
