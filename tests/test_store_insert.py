"""The request log's one insert path: exactly once without a primary key, Arrow ingest, batching."""

from __future__ import annotations

import threading
import time
from datetime import UTC, datetime, timedelta

import duckdb
import pyarrow as pa
import pytest
from click.testing import CliRunner
from fastapi.testclient import TestClient
from prometheus_client import CollectorRegistry
from support.owner_routes import routes_app
from support.synthetic import synthetic_rows
from support.waiting import patient

from collector.cli import main
from collector.record import RequestRecord
from collector.store.db import (
    _UNKNOWN,
    ARROW_STREAM_TYPE,
    RequestStore,
    _batch_facts,
    _insert_sql,
    rows_to_arrow,
    rows_to_ipc,
)
from collector.store.schema import COLUMN_NAMES, MIGRATIONS, SCHEMA_VERSION, migrate
from collector.store.writer import LogWriter

T0 = datetime(2026, 11, 23, tzinfo=UTC)
TOKEN = "s3cret"
ARROW = {"Authorization": f"Bearer {TOKEN}", "Content-Type": ARROW_STREAM_TYPE}


def _ids(store: RequestStore) -> list[str]:
    return [row[0] for row in store.query("SELECT request_id FROM requests ORDER BY request_id")]


def test_a_batch_resent_whole_or_in_part_adds_nothing_and_the_count_is_what_was_added():
    store = RequestStore()
    rows = synthetic_rows(300, T0, prefix="a")
    assert store.insert_rows(rows[:200]) == 200
    assert store.insert_rows(rows) == 100  # the first 200 are already stored
    assert store.insert_rows(list(reversed(rows))) == 0
    assert store.query("SELECT count(*), count(DISTINCT request_id) FROM requests") == [(300, 300)]


def test_duplicates_inside_one_batch_are_stored_once():
    store = RequestStore()
    rows = synthetic_rows(20, T0, prefix="b")
    assert store.insert_rows(rows + rows[:5] + rows[3:4]) == 20
    assert _ids(store) == sorted(row["request_id"] for row in rows)


def test_a_batch_converted_in_several_slices_is_inserted_exactly_once():
    """More than 5,000 rows become one table of several chunks (rows_to_arrow's slices); a
    repeat across slices, a NULL admitted_at in a later slice and a resend are all caught."""
    store = RequestStore()
    rows = synthetic_rows(12_000, T0, span=timedelta(minutes=30), prefix="k")
    batch = rows + [rows[42]]  # the repeat lands in the third slice, its original in the first
    table = rows_to_arrow(batch)
    assert table.column("request_id").num_chunks == 3
    assert store.insert_rows(batch) == 12_000
    assert store.insert_rows(batch) == 0
    bare = [{"request_id": f"bare{i}", "model": "m"} for i in range(6_000)]  # slices 2 and 3: NULLs
    mixed = synthetic_rows(5_000, T0 + timedelta(hours=1), prefix="m") + bare
    admitted = rows_to_arrow(mixed).column("admitted_at")
    assert [chunk.null_count for chunk in admitted.chunks] == [0, 5_000, 1_000]
    assert store.insert_rows(mixed) == 11_000
    assert store.insert_rows(mixed) == 0
    assert store.query("SELECT count(*), count(DISTINCT request_id) FROM requests") == [(23_000, 23_000)]


def test_rows_far_apart_in_time_are_checked_against_their_own_span_only():
    # a batch spanning a week next to stored rows from every day of it: the duplicate check must
    # still find each stored row, whichever row group it sits in
    store = RequestStore()
    week = synthetic_rows(700, T0, span=timedelta(days=7), prefix="w")
    for day in range(7):
        store.insert_rows(week[day * 100 : (day + 1) * 100])
    assert store.insert_rows(week[::7] + synthetic_rows(3, T0 + timedelta(days=8), prefix="new")) == 3
    assert store.count() == 703


def test_rows_without_admitted_at_are_deduplicated_too():
    store = RequestStore()
    bare = [{"request_id": f"n{i}", "model": "m"} for i in range(4)]
    mixed = bare + synthetic_rows(2, T0, prefix="t")
    assert store.insert_rows(mixed) == 6
    assert store.insert_rows(mixed) == 0
    assert store.insert_rows(bare[:2]) == 0


def test_a_stored_id_with_another_admission_time_is_a_different_request_and_kept():
    store = RequestStore()
    row = synthetic_rows(1, T0, prefix="c")[0]
    store.insert_rows([row])
    assert store.insert_rows([dict(row, admitted_at=T0 + timedelta(hours=1))]) == 1
    assert store.count() == 2


def test_a_batch_after_every_stored_row_is_inserted_without_a_duplicate_check():
    rows = synthetic_rows(10, T0 + timedelta(hours=1), span=timedelta(minutes=5), prefix="d")
    facts = _batch_facts(rows_to_arrow(rows))
    low, high = min(r["admitted_at"] for r in rows), max(r["admitted_at"] for r in rows)
    assert facts == (False, low, high, False)
    checked, params, newest = _insert_sql(facts, T0)  # the store knows its newest row: T0
    assert "NOT EXISTS" not in checked and params == [] and newest == high
    for stored_newest in (low, T0 + timedelta(hours=2), _UNKNOWN):  # at or after its start, or unknown
        sql, params, _ = _insert_sql(facts, stored_newest)
        assert "NOT EXISTS" in sql and params == [low, high]
    bare = _batch_facts(rows_to_arrow(rows + [{"request_id": rows[0]["request_id"]}]))
    assert bare == (True, low, high, True)  # an id repeats, an admitted_at is NULL
    repeated = _insert_sql(bare, None)[0]
    assert "DISTINCT ON" in repeated and "IS NOT DISTINCT FROM" in repeated
    assert _batch_facts(rows_to_arrow([{"request_id": "x"}])) == (False, None, None, True)
    table = rows_to_arrow(synthetic_rows(300, T0, span=timedelta(hours=1), prefix="s"))
    pieces = pa.concat_tables([table.slice(40, 30), table.slice(250, 20)])  # chunks with offsets
    instants = pieces.column("admitted_at").to_pylist()
    assert _batch_facts(pieces) == (False, min(instants), max(instants), False)


def test_the_newest_stored_instant_is_followed_by_every_write_and_shared_by_stores_of_one_file(tmp_path):
    path = tmp_path / "log.duckdb"
    first, second = RequestStore(path), RequestStore(path)
    early = synthetic_rows(50, T0, span=timedelta(minutes=1), prefix="e")
    late = synthetic_rows(50, T0 + timedelta(hours=1), span=timedelta(minutes=1), prefix="l")
    assert second.insert_rows(early) == 50  # second learns the newest instant: within `early`
    assert first.insert_rows(late) == 50
    assert second.insert_rows(late) == 0  # second must know that `late` is stored now
    first.execute("DELETE FROM requests WHERE request_id LIKE 'l%'")
    assert second.insert_rows(late) == 50  # deleted rows come back once, and only once
    assert first.insert_rows(late) == 0
    assert first.count() == second.count() == 100
    first.close()
    second.close()


def test_an_older_file_is_rebuilt_without_the_primary_key_keeping_every_row(tmp_path):
    path = str(tmp_path / "v3.duckdb")
    con = duckdb.connect(path)
    MIGRATIONS[0](con)  # a version-1 file: what the first migration creates
    con.execute(
        "INSERT INTO requests (request_id, admitted_at, e2e_s) SELECT 'old' || i, "
        "TIMESTAMPTZ '2026-11-23 00:00:00+00' + to_seconds(1000 - i), i FROM range(1000) t(i)"
    )
    con.execute("CREATE TABLE headroom_schema (version INTEGER NOT NULL)")
    con.execute("INSERT INTO headroom_schema VALUES (1)")
    migrate(con)
    assert con.execute("SELECT version FROM headroom_schema").fetchall() == [(SCHEMA_VERSION,)]
    assert con.execute(
        "SELECT count(*) FROM duckdb_constraints() WHERE table_name = 'requests' "
        "AND constraint_type = 'PRIMARY KEY'"
    ).fetchall() == [(0,)]
    assert con.execute("SELECT count(*), sum(e2e_s) FROM requests").fetchall() == [(1000, 499500.0)]
    con.close()
    store = RequestStore(path)
    assert store.insert_rows(store.query_dicts("SELECT * FROM requests")) == 0  # still exactly once
    store.close()


@pytest.fixture
def client():
    store = RequestStore()
    with TestClient(routes_app(store, TOKEN)) as client:
        client.store = store
        yield client
    store.close()


def test_arrow_ingest_inserts_once_and_counts_duplicates(client):
    body = rows_to_ipc(synthetic_rows(50, T0, prefix="ipc"))
    first = client.post("/v1/ingest", content=body, headers=ARROW).json()
    again = client.post("/v1/ingest", content=body, headers=ARROW).json()
    assert first == {"received": 50, "inserted": 50, "duplicates": 0}
    assert again == {"received": 50, "inserted": 0, "duplicates": 50}
    assert client.store.query("SELECT count(*), count(DISTINCT request_id) FROM requests") == [(50, 50)]


def _ipc(table: pa.Table) -> bytes:
    sink = pa.BufferOutputStream()
    with pa.ipc.new_stream(sink, table.schema) as stream:
        stream.write_table(table)
    return sink.getvalue().to_pybytes()


@pytest.mark.parametrize(
    "table, named",
    [
        (pa.table({"request_id": ["a"], "mood": ["x"]}), "mood"),
        (pa.table({"model": ["m"]}), "request_id"),
        (pa.table({"request_id": [""]}), "request_id"),
        (pa.table({"request_id": ["a"], "prompt_tokens": [2**40]}), "prompt_tokens"),
        (pa.table({"request_id": ["a"], "ttft_s": ["fast"]}), "ttft_s"),
    ],
)
def test_arrow_ingest_refuses_bad_batches_naming_the_column(client, table, named):
    response = client.post("/v1/ingest", content=_ipc(table), headers=ARROW)
    assert response.status_code == 400 and named in response.json()["detail"]
    assert client.store.count() == 0


def test_arrow_ingest_takes_a_subset_of_columns_in_narrower_types(client):
    table = pa.table(
        {
            "request_id": ["s1", "s2"],
            "ttft_s": pa.array([0.25, 0.5], pa.float32()),
            "prompt_tokens": pa.array([7, 9], pa.int8()),
        }
    )
    assert client.post("/v1/ingest", content=_ipc(table), headers=ARROW).json()["inserted"] == 2
    assert client.store.query("SELECT ttft_s, prompt_tokens, model FROM requests ORDER BY 1") == [
        (0.25, 7, None),
        (0.5, 9, None),
    ]
    assert client.post("/v1/ingest", content=b"not arrow", headers=ARROW).status_code == 400


class _Recording:
    def __init__(self):
        self.batches: list[int] = []
        self.wrote = threading.Event()

    def write_batch(self, rows):
        self.batches.append(len(rows))
        self.wrote.set()


def test_a_steady_trickle_of_rows_is_written_as_one_batch_per_interval_not_per_row():
    sink = _Recording()
    writer = LogWriter(sink, CollectorRegistry(), batch_rows=1000, flush_interval_s=30)
    for row in synthetic_rows(40, T0, prefix="trickle"):
        writer.submit(row)
        time.sleep(0.002)  # pacing a trickle, not waiting for anything
    assert sink.batches == []  # nothing woke the writer: no batch is full, no interval has passed
    writer.close()
    assert sink.batches == [40]


def test_a_full_batch_is_written_without_waiting_for_the_interval():
    sink = _Recording()
    writer = LogWriter(sink, CollectorRegistry(), batch_rows=10, flush_interval_s=60)
    for row in synthetic_rows(10, T0, prefix="full"):
        writer.submit(row)
    assert sink.wrote.wait(patient(10))  # long before the 60 s interval
    assert sink.batches == [10]
    writer.close()


def test_rows_to_arrow_keeps_every_value_of_a_row_and_nulls_the_missing_columns():
    row = synthetic_rows(1, T0, prefix="x")[0] | {"upstream_retries": 1}
    (converted,) = rows_to_arrow([row]).to_pylist()
    assert {name: value for name, value in converted.items() if name in row} == row
    assert {name for name, value in converted.items() if value is None} == {
        name for name in converted if row.get(name) is None
    }


def test_a_store_told_to_fold_its_write_ahead_log_less_often_than_duckdb_would(tmp_path):
    tuned = RequestStore(tmp_path / "tuned.duckdb", checkpoint_mb=64)
    default = RequestStore(tmp_path / "default.duckdb")
    try:
        threshold = "SELECT current_setting('checkpoint_threshold')"
        assert tuned.query(threshold) == [("61.0 MiB",)]  # 64 MB in DuckDB's binary units
        assert default.query(threshold) == [("16.0 MiB",)]  # DuckDB's own: what a sidecar keeps
    finally:
        tuned.close()
        default.close()
    shown = CliRunner().invoke(main, ["run", "--help"]).output
    assert "--checkpoint-mb" in shown and "16, DuckDB's" in shown


@pytest.mark.parametrize("count", [0, 1, 3])
def test_records_become_columns_value_for_value_in_column_order(count):
    """The writer's records are read one row at a time in C (attrgetter) and transposed: every
    column must still hold each record's own value, in order."""
    records = [RequestRecord(**row) for row in synthetic_rows(count, T0, prefix=f"r{count}")]
    table = rows_to_arrow(records)
    assert table.num_rows == count and table.column_names == list(COLUMN_NAMES)
    for record, converted in zip(records, table.to_pylist(), strict=True):
        assert converted == {name: getattr(record, name) for name in COLUMN_NAMES}
