"""The `capacity_estimates` table: every saved capacity estimate, and the candidates for publication.

An estimate (collector.capacity.CapacityEstimate) is saved as its JSON (`to_dict()`, schema in
docs/capacity.md) plus the columns a person filters on, and read back as the same type: JSON only
at this edge. The table is created on the
first save; readers on a read-only store see no estimates until then. What is *published* out of
these is decided in one place, collector.store.decision; nothing else picks an estimate.

One estimate per probe run. A probe run is built by two processes, the probe itself
(`headroom probe`, which saves to --db, through the owning sidecar's POST /v1/estimates, or to the
lake) and the sidecar whose log holds the run's rows (its refresh job); whichever saves first
keeps the run, and a later save of a probe estimate with the same run_id inserts nothing and
answers the stored estimate's id. The key is (source 'probe', run_id) alone: a run id names one
gradient of one task class against one model (a workload's classes get run ids of their own,
`<base>-<class>`), so model and task class follow from it, and the replica class is the first
saver's label. The check and the insert are one statement (INSERT ... WHERE NOT EXISTS) on the
store's one connection, under its lock, and DuckDB lets one process write a file: no second save
can slip between them. Traffic estimates (no run_id) are all kept, one per refresh.

    save_estimate(store, estimate)    -> "est-20261130T090000-1a2b3c"
    save_estimate_once(store, estimate)
                                      -> SavedEstimate("est-...", already_stored=True) when the
                                         run's estimate was stored before (nothing inserted)
    candidate_estimates(store, 0.05)  -> per model, task class, replica class and source: the
                                         newest estimate and the newest publishable one
    candidates_in(arrow_table, 0.05)  -> the same over estimate rows held elsewhere (the fleet's
                                         Iceberg table, collector.lake.estimates)
    estimate_row(estimate, id)        -> the table's columns for one estimate (ESTIMATE_COLUMNS)
"""

from __future__ import annotations

import logging
import secrets
from dataclasses import dataclass
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
    "SavedEstimate",
    "candidate_estimates",
    "candidates_in",
    "estimate_row",
    "import_estimates",
    "new_estimate_id",
    "save_estimate",
    "save_estimate_once",
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
_NAMES = [name for name, _ in ESTIMATE_COLUMNS]
_INSERT = f"INSERT INTO capacity_estimates ({', '.join(_NAMES)}) VALUES ({', '.join('?' * len(_NAMES))})"
# a probe run's estimate only while none of the run is stored: check and insert in one statement
_INSERT_RUN = (
    f"INSERT INTO capacity_estimates ({', '.join(_NAMES)}) SELECT {', '.join('?' * len(_NAMES))} "
    "WHERE NOT EXISTS (SELECT 1 FROM capacity_estimates WHERE source = 'probe' AND run_id = ?) "
    "RETURNING estimate_id"
)
# the run's stored estimate: the first saved (a file from before this rule may hold several)
_RUN_ESTIMATE = """SELECT estimate_id FROM capacity_estimates WHERE source = 'probe' AND run_id = ?
ORDER BY created_at, estimate_id LIMIT 1"""
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


@dataclass(frozen=True)
class SavedEstimate:
    """What a save did: the id stored for the estimate, and whether its probe run was stored before
    (then nothing was inserted, and estimate_id is the stored estimate's)."""

    estimate_id: str
    already_stored: bool = False


def save_estimate_once(
    store: RequestStore, estimate: CapacityEstimate, *, estimate_id: str | None = None
) -> SavedEstimate:
    """Insert one estimate, unless it is a probe run's whose estimate is stored already (module
    docstring): then nothing is inserted and the stored estimate's id is answered."""
    store.execute(_DDL)
    store.execute(_TASK_CLASS)
    store.execute(_REPLICA_CLASS)
    row = estimate_row(estimate, estimate_id)
    values = [row[name] for name in _NAMES]
    if estimate.source != "probe" or estimate.run_id is None:
        store.execute(_INSERT, values)
        return SavedEstimate(str(row["estimate_id"]))
    # RETURNING: the one statement says whether it inserted (store.query, as it answers rows; it
    # writes no request row, so the store's newest admitted_at stays true)
    if store.query(_INSERT_RUN, [*values, estimate.run_id]):
        return SavedEstimate(str(row["estimate_id"]))
    stored = store.query(_RUN_ESTIMATE, [estimate.run_id])[0][0]
    log.debug("probe run %s: estimate %s was stored before; nothing saved", estimate.run_id, stored)
    return SavedEstimate(str(stored), already_stored=True)


def save_estimate(store: RequestStore, estimate: CapacityEstimate, *, estimate_id: str | None = None) -> str:
    """Insert one estimate; returns its estimate_id. A probe run's estimate is saved once: when the
    run's estimate is stored already, nothing is inserted and the stored one's id is returned
    (save_estimate_once says which happened)."""
    return save_estimate_once(store, estimate, estimate_id=estimate_id).estimate_id


def import_estimates(store: RequestStore, path: str | Path) -> int:
    """Copy into `store` the estimates saved in another headroom DuckDB file (`headroom probe
    --db PATH` while a sidecar owns its own file); returns how many were new. A probe run whose
    estimate is stored here already (the sidecar's job built it from the run's rows) is not copied.

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
        theirs = con.execute(
            "SELECT estimate_id, source, run_id, estimate_json FROM capacity_estimates"
        ).fetchall()
    finally:
        con.close()
    ours: set[str] = set()
    runs: set[str] = set()  # the probe runs whose estimate is stored here: theirs is not copied
    if store.query(_EXISTS)[0][0]:
        for stored_id, source, run_id in store.query(
            "SELECT estimate_id, source, run_id FROM capacity_estimates"
        ):
            ours.add(stored_id)
            if source == "probe" and run_id is not None:
                runs.add(run_id)
    new = 0
    for estimate_id, source, run_id, body in theirs:
        if estimate_id in ours or (source == "probe" and run_id in runs):
            continue
        estimate = CapacityEstimate.from_dict(orjson.loads(body))
        # the same rule once more, in the statement that inserts (a save may have come between)
        new += not save_estimate_once(store, estimate, estimate_id=estimate_id).already_stored
    return new


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
