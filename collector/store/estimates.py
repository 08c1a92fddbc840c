"""The `capacity_estimates` table: every saved capacity estimate, and the candidates for publication.

An estimate (collector.capacity.CapacityEstimate) is saved as its JSON (`to_dict()`, schema in
docs/capacity.md) plus the columns a person filters on, and read back as the same type: JSON only
at this edge. The table is created on the
first save; readers on a read-only store see no estimates until then. What is *published* out of
these is decided in one place, collector.store.decision; nothing else picks an estimate.

    save_estimate(store, estimate)    -> "est-20261130T090000-1a2b3c"
    candidate_estimates(store, 0.05)  -> per model, task class, replica class and source: the
                                         newest estimate and the newest publishable one
    candidates_in(arrow_table, 0.05)  -> the same over estimate rows held elsewhere (the fleet's
                                         Iceberg table, collector.lake.estimates)
    estimate_row(estimate, id)        -> the table's columns for one estimate (ESTIMATE_COLUMNS)
"""

from __future__ import annotations

import logging
import secrets
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import duckdb
import orjson
import pyarrow as pa

from collector.capacity import CapacityEstimate
from collector.store.db import RequestStore

log = logging.getLogger(__name__)

__all__ = [
    "ESTIMATE_COLUMNS",
    "candidate_estimates",
    "candidates_in",
    "estimate_row",
    "import_estimates",
    "new_estimate_id",
    "save_estimate",
]

# the table's columns in the order of every row here (estimate_row) and in the fleet's table
ESTIMATE_COLUMNS = (
    ("estimate_id", "VARCHAR"),
    ("created_at", "TIMESTAMPTZ"),
    ("model", "VARCHAR"),
    ("source", "VARCHAR"),
    ("run_id", "VARCHAR"),
    ("profile", "VARCHAR"),
    ("knee_requests", "INTEGER"),
    ("knee_tokens", "BIGINT"),
    ("knee_reached", "BOOLEAN"),
    ("slo_max", "INTEGER"),
    ("recommended_pool", "INTEGER"),
    ("confidence", "VARCHAR"),
    ("estimate_json", "VARCHAR"),
    ("task_class", "VARCHAR"),
    ("replica_class", "VARCHAR"),
)

_DDL = """CREATE TABLE IF NOT EXISTS capacity_estimates (
    estimate_id VARCHAR PRIMARY KEY, created_at TIMESTAMPTZ NOT NULL, model VARCHAR,
    source VARCHAR, run_id VARCHAR, profile VARCHAR, knee_requests INTEGER, knee_tokens BIGINT,
    knee_reached BOOLEAN, slo_max INTEGER, recommended_pool INTEGER, confidence VARCHAR,
    estimate_json VARCHAR NOT NULL)"""
_TASK_CLASS = "ALTER TABLE capacity_estimates ADD COLUMN IF NOT EXISTS task_class VARCHAR"
_REPLICA_CLASS = "ALTER TABLE capacity_estimates ADD COLUMN IF NOT EXISTS replica_class VARCHAR"
_EXISTS = "SELECT count(*) FROM information_schema.tables WHERE table_name = 'capacity_estimates'"
# per (model, task class, replica class, source): the newest row, and the newest that could be
# published (knee reached, a pool above 0, confidence not none, few non-capacity errors); the one
# decision (collector.store.decision) re-checks each in full
_CANDIDATES = """
SELECT estimate_json FROM (
    SELECT estimate_json, created_at, estimate_id, source,
        coalesce(model, '') AS m,
        coalesce(json_extract_string(estimate_json, '$.task_class'), 'all') AS t,
        coalesce(json_extract_string(estimate_json, '$.replica_class'), 'default') AS r,
        coalesce(knee_reached, false) AND coalesce(recommended_pool, 1) > 0
            AND coalesce(confidence, '') <> 'none'
            AND coalesce(TRY_CAST(json_extract_string(estimate_json, '$.error_ratio') AS DOUBLE), 0)
                <= ? AS usable
    FROM capacity_estimates WHERE created_at <= ?)
QUALIFY row_number() OVER (PARTITION BY m, t, r, source, usable
                           ORDER BY created_at DESC, estimate_id DESC) = 1
ORDER BY m, t, r, source, created_at"""


def new_estimate_id(created_at: datetime) -> str:
    """A fresh estimate id, e.g. "est-20261130T090000-1a2b3c"."""
    return f"est-{created_at:%Y%m%dT%H%M%S}-{secrets.token_hex(3)}"


def estimate_row(estimate: CapacityEstimate, estimate_id: str | None = None) -> dict[str, Any]:
    """The table's columns (ESTIMATE_COLUMNS) for one estimate."""
    return {
        "estimate_id": estimate_id or new_estimate_id(estimate.created_at),
        "created_at": estimate.created_at,
        "model": estimate.model,
        "source": estimate.source,
        "run_id": estimate.run_id,
        "profile": estimate.profile,
        "knee_requests": estimate.knee.requests,
        "knee_tokens": estimate.knee_tokens,  # the published token capacity (None: withheld)
        "knee_reached": estimate.knee.reached,
        "slo_max": estimate.slo_max,
        "recommended_pool": estimate.recommended_pool,
        "confidence": estimate.confidence,
        "estimate_json": orjson.dumps(estimate.to_dict()).decode(),
        "task_class": estimate.task_class,
        "replica_class": estimate.replica_class,
    }


def save_estimate(store: RequestStore, estimate: CapacityEstimate, *, estimate_id: str | None = None) -> str:
    """Insert one estimate; returns its estimate_id."""
    store.execute(_DDL)
    store.execute(_TASK_CLASS)
    store.execute(_REPLICA_CLASS)
    row = estimate_row(estimate, estimate_id)
    names = [name for name, _ in ESTIMATE_COLUMNS]
    store.execute(
        f"INSERT INTO capacity_estimates ({', '.join(names)}) VALUES ({', '.join('?' * len(names))})",
        [row[name] for name in names],
    )
    return str(row["estimate_id"])


def import_estimates(store: RequestStore, path: str | Path) -> int:
    """Copy into `store` the estimates saved in another headroom DuckDB file (`headroom probe
    --db PATH` while a sidecar owns its own file); returns how many were new.

    The other file is opened read-only and closed again; while its writer still holds it, this
    returns 0 and the next call tries again.
    """
    try:
        con = duckdb.connect(str(path), read_only=True)
    except (duckdb.Error, OSError) as exc:
        log.debug("estimates in %s not readable now: %s", path, exc)
        return 0
    try:
        exists = con.execute(_EXISTS).fetchone()
        if exists is None or not exists[0]:
            return 0
        theirs = con.execute("SELECT estimate_id, estimate_json FROM capacity_estimates").fetchall()
    finally:
        con.close()
    ours = set()
    if store.query(_EXISTS)[0][0]:
        ours = {row[0] for row in store.query("SELECT estimate_id FROM capacity_estimates")}
    new = [(estimate_id, body) for estimate_id, body in theirs if estimate_id not in ours]
    for estimate_id, body in new:
        save_estimate(store, CapacityEstimate.from_dict(orjson.loads(body)), estimate_id=estimate_id)
    return len(new)


def candidate_estimates(
    store: RequestStore, max_error_ratio: float, until: datetime | None = None
) -> list[CapacityEstimate]:
    """Per model, task class, replica class and source: the newest saved estimate and the newest
    one that could be published, among those saved up to `until` (default: all)."""
    if not store.query(_EXISTS)[0][0]:
        return []
    until = until or datetime.max.replace(tzinfo=UTC)
    return [_loaded(row[0]) for row in store.query(_CANDIDATES, [max_error_ratio, until])]


def candidates_in(
    rows: pa.Table, max_error_ratio: float, until: datetime | None = None
) -> list[CapacityEstimate]:
    """candidate_estimates() over estimate rows held in Arrow (ESTIMATE_COLUMNS; a row repeated
    under the same estimate_id counts once): the same SQL, on a DuckDB of its own."""
    until = until or datetime.max.replace(tzinfo=UTC)
    con = duckdb.connect()
    try:
        con.register("estimate_rows", rows)
        con.execute(
            "CREATE TABLE capacity_estimates AS SELECT * FROM estimate_rows "
            "QUALIFY row_number() OVER (PARTITION BY estimate_id ORDER BY created_at) = 1"
        )
        return [_loaded(row[0]) for row in con.execute(_CANDIDATES, [max_error_ratio, until]).fetchall()]
    finally:
        con.close()


def _loaded(body: str) -> CapacityEstimate:
    return CapacityEstimate.from_dict(orjson.loads(body))
