"""The fleet's request log on Iceberg, end to end with real parts: writers in their own processes,
`headroom lake commit` processes on a real PostgreSQL (and sqlite), one writer and one committer
SIGKILLed; maintenance during commits; ClickHouse (chdb) as a second reader; the weekly review
from the table; the one-box import; a column added to the record."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pyarrow as pa
import pytest
from support.postgres import PostgresServer, postgres_server
from support.processes import stop_process
from support.waiting import wait_until

from collector.lake import table as lake_table
from collector.lake.layout import Lake
from collector.lake.read import open_lake_log
from collector.lake.stage import LakeWriter
from collector.record import RequestRecord
from collector.report.review import build_from_store
from collector.store.db import ARROW_SCHEMA, RequestStore
from collector.store.synthetic import synthetic_rows

pytestmark = [pytest.mark.subprocess, pytest.mark.slow]

HEADROOM = Path(sys.executable).parent / "headroom"
DAY0 = (datetime.now(UTC) - timedelta(days=3)).replace(hour=22, minute=0, second=0, microsecond=0)

# One writer process: batches of rows (spread over two UTC days) into a LakeWriter, rolling often;
# after each batch is spooled (write_batch returned: the row is on disk, owed) it is ledgered.
WRITER = r"""
import sys
from datetime import datetime, timedelta
from collector.lake.stage import LakeWriter
from collector.record import RequestRecord
lake, spool, name, ledger, batches, size, start = sys.argv[1:8]
start = datetime.fromisoformat(start)
w = LakeWriter(lake, name, spool, roll_seconds=0.2, roll_bytes=1 << 30)
with open(ledger, "a") as out:
    for b in range(int(batches)):
        rows = [
            RequestRecord(
                request_id=f"{name}-{b:04d}-{i:04d}", instance=name, source="traffic",
                model=("m1", "m2", "m3")[i % 3], outcome="ok",
                admitted_at=start + timedelta(seconds=b * 300 + i), ttft_s=0.05 + ((b * 7919 + i * 104729) % 1000) / 997,
            )
            for i in range(int(size))
        ]
        w.write_batch(rows)
        out.write(f"{b}\n")
        out.flush()
w.close()
"""


def start_writer(tmp: Path, name: str, batches: int, size: int) -> subprocess.Popen[bytes]:
    return subprocess.Popen(
        [
            sys.executable,
            "-c",
            WRITER,
            str(tmp / "lake"),
            str(tmp / f"spool-{name}"),
            name,
            str(tmp / f"ledger-{name}"),
            str(batches),
            str(size),
            DAY0.isoformat(),
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
    )


def owed(tmp: Path, name: str, size: int) -> set[str]:
    path = tmp / f"ledger-{name}"
    batches = [int(line) for line in path.read_text().split()] if path.exists() else []
    return {f"{name}-{b:04d}-{i:04d}" for b in batches for i in range(size)}


@pytest.fixture(scope="module")
def postgres() -> Iterator[PostgresServer]:
    with postgres_server() as server:
        yield server


_DB_COUNTER = iter(range(1_000_000))


def catalog_uri(kind: str, tmp: Path, postgres: PostgresServer | None) -> str:
    if kind == "sqlite":
        return f"sqlite:///{tmp / 'catalog.db'}"
    assert postgres is not None
    import sqlalchemy

    name = f"lake{next(_DB_COUNTER)}_{os.getpid()}"  # a database per test: tables never shared
    engine = sqlalchemy.create_engine(postgres.url, isolation_level="AUTOCOMMIT")
    with engine.connect() as connection:
        connection.execute(sqlalchemy.text(f'CREATE DATABASE "{name}"'))  # a name we made
    engine.dispose()
    return postgres.url.rsplit("/", 1)[0] + "/" + name


@pytest.fixture(params=["postgresql", "sqlite"])
def catalog(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    server = request.getfixturevalue("postgres") if request.param == "postgresql" else None
    return catalog_uri(request.param, tmp_path, server)


def committer(catalog: str, lake: Path) -> subprocess.Popen[bytes]:
    return subprocess.Popen(
        [str(HEADROOM), "lake", "commit", "--catalog", catalog, "--lake", str(lake), "--every", "1"],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
    )


def table_ids(catalog: str, lake: Path) -> tuple[int, int, set[str]]:
    with open_lake_log(catalog, str(lake)) as store:
        rows, distinct = store.query("SELECT count(*), count(DISTINCT request_id) FROM requests")[0]
        ids = {row[0] for row in store.query("SELECT request_id FROM requests")}
    return int(rows), int(distinct), ids


def test_writers_and_two_committers_with_kills_lose_and_repeat_nothing(catalog: str, tmp_path: Path) -> None:
    """6 writer processes (one SIGKILLed mid-roll, then restarted on its spool) and 2 concurrent
    `headroom lake commit --every 1` (one SIGKILLed while committing): rows = distinct request_id
    = the requests owed, and nothing the writers did not write."""
    lake = tmp_path / "lake"
    names, batches, size = [f"w{i}" for i in range(6)], 30, 100
    writers = {name: start_writer(tmp_path, name, batches, size) for name in names}
    committers = [committer(catalog, lake), committer(catalog, lake)]
    victim = writers["w0"]
    wait_until(
        lambda: len(owed(tmp_path, "w0", size)) >= 10 * size, timeout_s=60, what="w0 to write 10 batches"
    )
    victim.send_signal(signal.SIGKILL)
    victim.wait(10)
    wait_until(
        lambda: Lake.parse(lake).staged() != [] and _table_exists(catalog, lake),
        timeout_s=60,
        what="a commit",
    )
    committers[0].send_signal(signal.SIGKILL)  # while the loop commits every second
    committers[0].wait(10)
    writers["w0"] = start_writer(tmp_path, "w0", 0, size)  # the same spool: repairs and stages the rest
    for name, process in writers.items():
        assert process.wait(120) == 0, (
            f"writer {name}: {process.stderr.read().decode()[-1500:] if process.stderr else ''}"
        )
    assert stop_process(committers[1]) in (0, -signal.SIGTERM)
    lake_table.commit_staged(lake_table.open_catalog(catalog, Lake.parse(lake)), Lake.parse(lake))
    rows, distinct, ids = table_ids(catalog, lake)
    promised = set().union(*(owed(tmp_path, name, size) for name in names))
    last = max(int(line) for line in (tmp_path / "ledger-w0").read_text().split())
    maybe = {f"w0-{last + 1:04d}-{i:04d}" for i in range(size)}  # spooled just before the kill, not ledgered
    assert rows == distinct, "a row was added twice"
    assert promised <= ids, f"{len(promised - ids)} owed rows lost"
    assert ids - promised <= maybe
    assert len(promised) >= (len(names) - 1) * batches * size + 10 * size


def _table_exists(catalog: str, lake: Path) -> bool:
    try:
        lake_table.open_table(lake_table.open_catalog(catalog, Lake.parse(lake)), create=False)
    except Exception:
        return False
    return True


def stage(lake: Path, writer: str, rows: list[dict[str, object]], per_file: int) -> None:
    """Stage `rows` as files of `per_file` rows each (one writer, its own spool)."""
    w = LakeWriter(lake, writer, lake.parent / f"spool-{writer}", roll_seconds=3600)
    try:
        for at in range(0, len(rows), per_file):
            w.write_batch([RequestRecord.from_row(row) for row in rows[at : at + per_file]])
            assert w.flush(30)
    finally:
        w.close()


def summary(store: RequestStore) -> list[tuple[object, ...]]:
    return store.query(
        "SELECT model, count(*), count(DISTINCT request_id), quantile_cont(ttft_s, [0.5, 0.95, 0.99]) "
        "FROM requests GROUP BY model ORDER BY model"
    )


def test_maintain_during_commits_compacts_without_loss(postgres: PostgresServer, tmp_path: Path) -> None:
    """Two sealed days of 40 files each, compacted while a committer keeps adding late files to
    the same days: files per day drop at least 10x, every row is there once, results unchanged."""
    catalog = catalog_uri("postgresql", tmp_path, postgres)
    lake = tmp_path / "lake"
    location = Lake.parse(lake)
    early = synthetic_rows(
        8_000, DAY0 - timedelta(hours=22), span=timedelta(hours=44), models=("a", "b"), seed=3
    )
    late = synthetic_rows(
        800, DAY0 - timedelta(hours=22), span=timedelta(hours=44), models=("a", "b"), seed=4, prefix="late"
    )
    stage(lake, "early", early, 200)
    lake_table.commit_staged(lake_table.open_catalog(catalog, location), location)
    before = lake_table._files_per_day(lake_table.open_table(lake_table.open_catalog(catalog, location)))
    assert min(before.values()) >= 15

    stop = threading.Event()

    def keep_committing() -> None:
        own = lake_table.open_catalog(catalog, location)
        while not stop.is_set():
            lake_table.commit_staged(own, location)

    thread = threading.Thread(target=keep_committing)
    thread.start()
    try:
        stage(lake, "late", late, 100)  # late rows of the same days, committed during maintenance
        result = lake_table.maintain(
            lake_table.open_catalog(catalog, location),
            location,
            snapshot_age=timedelta(0),
            orphan_age=timedelta(0),
        )
    finally:
        stop.set()
        thread.join(60)
    lake_table.commit_staged(lake_table.open_catalog(catalog, location), location)
    final = lake_table.maintain(lake_table.open_catalog(catalog, location), location)
    after = lake_table._files_per_day(lake_table.open_table(lake_table.open_catalog(catalog, location)))
    assert result.days_compacted and set(after) == set(before)
    for day, count in after.items():
        assert count * 10 <= before[day], f"{day}: {before[day]} files -> {count}"
    assert final.duplicates_dropped == 0
    reference = RequestStore()
    reference.insert_rows(early + late)
    with open_lake_log(catalog, str(lake)) as store:
        assert summary(store) == summary(reference)
        assert store.count() == len(early) + len(late)


def test_chdb_reads_the_same_counts_and_exact_percentiles(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """ClickHouse in-process (chdb, icebergLocal) and DuckDB through the product's reader agree on
    counts and exact p50/p95/p99 TTFT per model over the same table."""
    chdb = pytest.importorskip("chdb") if os.environ.get("CI", "").lower() != "true" else __import__("chdb")
    catalog = catalog_uri("sqlite", tmp_path, None)
    lake = tmp_path / "lake"
    stage(
        lake,
        "w",
        synthetic_rows(5_000, DAY0, span=timedelta(hours=30), models=("a", "b", "c"), seed=9),
        1_000,
    )
    location = Lake.parse(lake)
    iceberg = lake_table.open_table(lake_table.open_catalog(catalog, location))
    lake_table.commit_staged(lake_table.open_catalog(catalog, location), location)
    with open_lake_log(catalog, str(lake)) as store:
        duck = store.query(
            "SELECT model, count(*), quantile_cont(ttft_s, [0.5, 0.95, 0.99]) FROM requests GROUP BY model ORDER BY model"
        )
    monkeypatch.chdir(tmp_path)  # chdb reads files under its working directory only
    where = os.path.relpath(location.path_of(iceberg.location()), tmp_path)
    text = chdb.query(
        "SELECT model, count(), quantilesExactInclusive(0.5, 0.95, 0.99)(ttft_s) "
        f"FROM icebergLocal('{where}') GROUP BY model ORDER BY model",  # a path we made
        "JSONCompact",
    )
    import json

    click = [(m, int(n), q) for m, n, q in json.loads(str(text))["data"]]
    assert [(m, n) for m, n, _ in duck] == [(m, n) for m, n, _ in click]
    for (_, _, ours), (_, _, theirs) in zip(duck, click):
        assert ours == pytest.approx(theirs, rel=1e-12, abs=1e-12)


def test_weekly_review_from_the_table_equals_the_review_from_a_duckdb_file(tmp_path: Path) -> None:
    now = datetime.now(UTC).replace(microsecond=0)
    rows = synthetic_rows(3_000, now - timedelta(days=12), span=timedelta(days=11), models=("a", "b"), seed=5)
    db = RequestStore(tmp_path / "one.duckdb")
    db.insert_rows(rows)
    catalog = catalog_uri("sqlite", tmp_path, None)
    stage(tmp_path / "lake", "w", rows, 500)
    location = Lake.parse(tmp_path / "lake")
    lake_table.commit_staged(lake_table.open_catalog(catalog, location), location)
    with open_lake_log(catalog, str(tmp_path / "lake"), since=now - timedelta(days=15)) as store:
        from_table = build_from_store(store, "7d", now)
    assert from_table == build_from_store(db, "7d", now)
    assert from_table["models"], "the review is not empty"
    db.close()


def test_import_adds_sealed_days_once(tmp_path: Path) -> None:
    now = datetime.now(UTC)
    rows = synthetic_rows(900, now - timedelta(days=3), span=timedelta(days=3), seed=11)
    db = tmp_path / "one.duckdb"
    store = RequestStore(db)
    store.insert_rows(rows)
    store.close()
    catalog = catalog_uri("sqlite", tmp_path, None)
    lake = tmp_path / "lake"
    args = [str(HEADROOM), "lake", "import", "--catalog", catalog, "--lake", str(lake), "--db", str(db)]
    first = subprocess.run(args, capture_output=True, text=True, timeout=120)
    assert first.returncode == 0, first.stderr
    today = datetime(now.year, now.month, now.day, tzinfo=UTC)
    sealed = [r for r in rows if r["admitted_at"] < today]
    rows_in, distinct, _ = table_ids(catalog, lake)
    assert rows_in == distinct == len(sealed) > 0
    again = subprocess.run(args, capture_output=True, text=True, timeout=120)
    assert again.returncode == 0 and "0 files and 0 rows added" in again.stderr
    assert table_ids(catalog, lake)[0] == len(sealed)


def test_a_new_record_column_is_added_and_older_files_read_null(tmp_path: Path) -> None:
    catalog = catalog_uri("sqlite", tmp_path, None)
    lake = tmp_path / "lake"
    stage(lake, "old", synthetic_rows(100, DAY0, seed=1, prefix="old"), 100)
    location = Lake.parse(lake)
    lake_table.commit_staged(lake_table.open_catalog(catalog, location), location)
    newer = pa.Table.from_pylist(synthetic_rows(50, DAY0, seed=2, prefix="new"), schema=ARROW_SCHEMA)
    newer = newer.append_column("gpu_class", pa.array(["h100"] * 50))  # a field a later RequestRecord has
    import pyarrow.parquet as pq

    (lake / "staged" / "new.1").mkdir(parents=True)
    pq.write_table(newer, lake / "staged" / "new.1" / "new.1-000000000000.parquet")
    lake_table.commit_staged(lake_table.open_catalog(catalog, location), location)
    iceberg = lake_table.open_table(lake_table.open_catalog(catalog, location))
    assert "gpu_class" in [f.name for f in iceberg.schema().fields]
    read = iceberg.scan().to_arrow()
    values = dict(zip(read["request_id"].to_pylist(), read["gpu_class"].to_pylist()))
    assert {v for k, v in values.items() if k.startswith("old")} == {None}
    assert {v for k, v in values.items() if k.startswith("new")} == {"h100"}


def test_lake_cli_errors_are_clear(tmp_path: Path) -> None:
    bad = subprocess.run(
        [str(HEADROOM), "lake", "commit", "--catalog", "mysql://x", "--lake", str(tmp_path)],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert bad.returncode != 0 and "not a catalog URI" in bad.stderr
    missing = subprocess.run(
        [str(HEADROOM), "report", "--lake", str(tmp_path), "--catalog", f"sqlite:///{tmp_path / 'c.db'}"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert missing.returncode != 0 and "lake commit" in missing.stderr
