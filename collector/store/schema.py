"""The `requests` table (contract in docs/design.md §4.5) and its versioned migrations.

The columns are collector.record.RequestRecord's fields, in order, with the DuckDB type of each
field's Python type.

The schema version lives in a one-row table `headroom_schema`. Opening a file written by an older
program runs each migration in order inside one transaction, so rows are never lost: a migration
adds columns or tables, or (version 5) rebuilds `requests` from its own rows.
"""

from __future__ import annotations

from datetime import datetime
from typing import TYPE_CHECKING

from collector.record import INT64_FIELDS, field_types

if TYPE_CHECKING:  # only the store's connections: the --lake sidecar derives its columns without DuckDB
    import duckdb

__all__ = [
    "COLUMNS",
    "COLUMN_NAMES",
    "SCHEMA_VERSION",
    "MIGRATIONS",
    "SchemaTooNew",
    "migrate",
    "schema_version",
]

# The DuckDB type of each record field's Python type; INT64_FIELDS are BIGINT.
_SQL_TYPES: dict[type, str] = {
    str: "VARCHAR",
    bool: "BOOLEAN",
    datetime: "TIMESTAMPTZ",
    int: "INTEGER",
    float: "DOUBLE",
}


def _sql_type(name: str, python_type: type) -> str:
    sql = "BIGINT" if name in INT64_FIELDS else _SQL_TYPES[python_type]
    return f"{sql} NOT NULL" if name == "request_id" else sql


# (name, DuckDB type) in table order, from collector.record.RequestRecord's fields. The contract;
# other parts and external readers depend on it (e.g. ("request_id", "VARCHAR NOT NULL")).
COLUMNS: tuple[tuple[str, str], ...] = tuple(
    (name, _sql_type(name, python_type)) for name, python_type in field_types().items()
)
COLUMN_NAMES: tuple[str, ...] = tuple(name for name, _ in COLUMNS)

# Version 1 shipped without the engine snapshot and prefix-cache columns; version 2 added them.
# Version 3 added upstream_retries (a request re-sent after a stale pooled connection), version 4
# task_class (collector.tasks: short, medium, long, or what a probe's workload named). Version 5
# dropped the primary key on request_id: duplicates are left out by the insert itself
# (collector.store.db), which is 2-3x faster without the index to maintain. Version 6 added
# adapter (the LoRA adapter a request named; `model` is then its base model). Version 7 added what a
# probe request measured (probe_level, probe_rate_per_s, probe_warmup), read from its headers;
# version 8 the replica class of the engine that served it, version 9 the client's own request id
# (its X-Request-Id) and the failure class of an exchange that failed, version 10 the tokens the
# active-token gauge held for the request (held_prompt_tokens, held_generated_tokens), version 11
# goodput (the SLO bounds a request was judged by and its verdict), the engine's own timings, the
# sidecar's hop, the time to the second token, the longest inter-token gap and output_short.
_V11_COLUMNS = (
    "slo_ttft_s",
    "slo_tpot_s",
    "slo_e2e_s",
    "verdict",
    "engine_timings",
    "engine_queue_s",
    "engine_prefill_s",
    "engine_decode_s",
    "engine_prompt_computed",
    "engine_prompt_cached",
    "engine_generated",
    "sidecar_hop_s",
    "ttst_s",
    "itl_max_s",
    "output_short",
)
_ADDED_AFTER_V5 = (
    "adapter",
    "probe_level",
    "probe_rate_per_s",
    "probe_warmup",
    "replica_class",
    "client_request_id",
    "failure",
    "held_prompt_tokens",
    "held_generated_tokens",
    *_V11_COLUMNS,
)
_V5_COLUMNS = tuple(c for c in COLUMNS if c[0] not in _ADDED_AFTER_V5)
_V1_COLUMNS = (("request_id", "VARCHAR PRIMARY KEY"),) + tuple(
    c
    for c in _V5_COLUMNS[1:]
    if c[0]
    not in (
        "cached_prompt_tokens",
        "engine_waiting_at_admit",
        "kv_usage_at_admit",
        "upstream_retries",
        "task_class",
    )
)


def _ddl(columns: tuple[tuple[str, str], ...]) -> str:
    body = ",\n    ".join(f"{name} {sql_type}" for name, sql_type in columns)
    return f"CREATE TABLE IF NOT EXISTS requests (\n    {body}\n)"


def _v1(con: duckdb.DuckDBPyConnection) -> None:
    con.execute(_ddl(_V1_COLUMNS))


def _v2(con: duckdb.DuckDBPyConnection) -> None:
    con.execute("ALTER TABLE requests ADD COLUMN IF NOT EXISTS cached_prompt_tokens INTEGER")
    con.execute("ALTER TABLE requests ADD COLUMN IF NOT EXISTS engine_waiting_at_admit INTEGER")
    con.execute("ALTER TABLE requests ADD COLUMN IF NOT EXISTS kv_usage_at_admit DOUBLE")


def _v3(con: duckdb.DuckDBPyConnection) -> None:
    con.execute("ALTER TABLE requests ADD COLUMN IF NOT EXISTS upstream_retries INTEGER")


def _v4(con: duckdb.DuckDBPyConnection) -> None:
    con.execute("ALTER TABLE requests ADD COLUMN IF NOT EXISTS task_class VARCHAR")


def _v5(con: duckdb.DuckDBPyConnection) -> None:
    """Rebuild `requests` without the primary key: same rows, contract column order, by admission.

    Sorting by admitted_at keeps each row group's admitted_at span narrow, which is what lets the
    insert's duplicate check skip the rest of the table.
    """
    names = ", ".join(name for name, _ in _V5_COLUMNS)
    con.execute(_ddl(_V5_COLUMNS).replace("TABLE IF NOT EXISTS requests", "TABLE requests_v5"))
    con.execute(f"INSERT INTO requests_v5 SELECT {names} FROM requests ORDER BY admitted_at")
    con.execute("DROP TABLE requests")
    con.execute("ALTER TABLE requests_v5 RENAME TO requests")


def _v6(con: duckdb.DuckDBPyConnection) -> None:
    con.execute("ALTER TABLE requests ADD COLUMN IF NOT EXISTS adapter VARCHAR")


def _v7(con: duckdb.DuckDBPyConnection) -> None:
    """Probe rows written before version 7 carried their level in the request id
    (`...-c0008-000123`, `...-o2500-000123`, warm-up ones ending in `-w`): moved into the columns."""
    con.execute("ALTER TABLE requests ADD COLUMN IF NOT EXISTS probe_level INTEGER")
    con.execute("ALTER TABLE requests ADD COLUMN IF NOT EXISTS probe_rate_per_s DOUBLE")
    con.execute("ALTER TABLE requests ADD COLUMN IF NOT EXISTS probe_warmup BOOLEAN")
    con.execute(
        r"""UPDATE requests SET
            probe_level = TRY_CAST(regexp_extract(request_id, '-c(\d+)-\d+(-w)?$', 1) AS INTEGER),
            probe_rate_per_s = TRY_CAST(regexp_extract(request_id, '-o(\d+)-\d+(-w)?$', 1) AS DOUBLE) / 1000,
            probe_warmup = request_id LIKE '%-w'
        WHERE source = 'probe' AND regexp_matches(request_id, '-[co]\d+-\d+(-w)?$')"""
    )


def _v8(con: duckdb.DuckDBPyConnection) -> None:
    con.execute("ALTER TABLE requests ADD COLUMN IF NOT EXISTS replica_class VARCHAR")


def _v9(con: duckdb.DuckDBPyConnection) -> None:
    con.execute("ALTER TABLE requests ADD COLUMN IF NOT EXISTS client_request_id VARCHAR")
    con.execute("ALTER TABLE requests ADD COLUMN IF NOT EXISTS failure VARCHAR")


def _v10(con: duckdb.DuckDBPyConnection) -> None:
    con.execute("ALTER TABLE requests ADD COLUMN IF NOT EXISTS held_prompt_tokens INTEGER")
    con.execute("ALTER TABLE requests ADD COLUMN IF NOT EXISTS held_generated_tokens INTEGER")


def _v11(con: duckdb.DuckDBPyConnection) -> None:
    for name, sql_type in COLUMNS:
        if name in _V11_COLUMNS:  # (names and types from the record: no text from outside)
            con.execute(f"ALTER TABLE requests ADD COLUMN IF NOT EXISTS {name} {sql_type}")


# MIGRATIONS[i] brings a database from version i to version i + 1.
MIGRATIONS = (_v1, _v2, _v3, _v4, _v5, _v6, _v7, _v8, _v9, _v10, _v11)
SCHEMA_VERSION = len(MIGRATIONS)


class SchemaTooNew(RuntimeError):
    """The file was written by a newer program; we never downgrade it."""


def schema_version(con: duckdb.DuckDBPyConnection) -> int:
    """Version recorded in the file; 0 for a new file, 1 for a pre-versioning file with `requests`."""
    con.execute("CREATE TABLE IF NOT EXISTS headroom_schema (version INTEGER NOT NULL)")
    row = con.execute("SELECT max(version) FROM headroom_schema").fetchone()
    if row and row[0] is not None:
        return int(row[0])
    found = con.execute(
        "SELECT count(*) FROM information_schema.tables WHERE table_name = 'requests'"
    ).fetchone()
    has_requests = bool(found and found[0])
    return 1 if has_requests else 0


def migrate(con: duckdb.DuckDBPyConnection) -> int:
    """Bring the database to SCHEMA_VERSION; returns the version it started at.

    Raises SchemaTooNew (a RuntimeError) when the file was written by a newer program.
    """
    start = schema_version(con)
    if start > SCHEMA_VERSION:
        raise SchemaTooNew(
            f"database schema version {start} is newer than this program's {SCHEMA_VERSION}; "
            "upgrade llm-headroom before opening it"
        )
    if start == SCHEMA_VERSION:
        return start
    con.execute("BEGIN TRANSACTION")
    try:
        for step in MIGRATIONS[start:]:
            step(con)
        con.execute("DELETE FROM headroom_schema")
        con.execute("INSERT INTO headroom_schema VALUES (?)", [SCHEMA_VERSION])
        con.execute("COMMIT")
    except Exception:
        con.execute("ROLLBACK")
        raise
    return start
