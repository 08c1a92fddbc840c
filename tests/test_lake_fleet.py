"""The fleet's request log on Iceberg, end to end with real parts: `headroom run --lake` sidecars and
`headroom lake commit` processes on a real PostgreSQL (and sqlite), one sidecar and one committer
SIGKILLed; maintenance during commits; ClickHouse (chdb) as a second reader; the weekly review
from the table; the one-box import; a column added to the record."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path

import httpx
import pyarrow as pa
import pytest
from pyiceberg.partitioning import PartitionField, PartitionSpec
from pyiceberg.table import Table
from pyiceberg.transforms import DayTransform
from support.lake import stage
from support.postgres import PostgresServer, postgres_server
from support.processes import HeadroomProcess, stop_process
from support.sidecar import CHAT
from support.synthetic import synthetic_rows
from support.upstream import FakeUpstream
from support.waiting import patient, wait_until

from collector.lake import table as lake_table
from collector.lake.layout import Lake
from collector.lake.read import open_lake_log
from collector.report.review import build_from_store
from collector.store.db import ARROW_SCHEMA, RequestStore

pytestmark = [pytest.mark.subprocess, pytest.mark.slow]

HEADROOM = Path(sys.executable).parent / "headroom"
DAY0 = (datetime.now(UTC) - timedelta(days=3)).replace(hour=22, minute=0, second=0, microsecond=0)


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


SIDECARS = 6  # real `headroom run --lake` processes (the test's docstring says why not 16)
CLIENTS_PER_SIDECAR = 3
REQUESTS_PER_CLIENT = 2_000  # a bound; the phases below end the traffic long before it
CHAT_THROUGH = {"x-fake-delay": "0.01"}  # 5 tokens 10 ms apart: ~50 ms a request, CPU left for the rest


@dataclass(frozen=True)
class Sent:
    """One client request: the sidecar it went through, its unique tenant, when its answer ended."""

    sidecar: str
    tenant: str
    answered_at: float | None  # time.monotonic() once the whole answer arrived; None: it failed


class Clients:
    """Threads sending chat requests through each sidecar, each request tagged with a unique tenant
    (X-Tenant-ID, kept in its row), until stopped or bounded; a sidecar's clients pause while it is down."""

    def __init__(self, sidecars: dict[str, HeadroomProcess]) -> None:
        self.sidecars = sidecars
        self.sent: list[Sent] = []
        self.stop = threading.Event()
        self.up = {name: threading.Event() for name in sidecars}
        for event in self.up.values():
            event.set()
        self._lock = threading.Lock()
        self._threads = [
            threading.Thread(target=self._loop, args=(name, index), daemon=True)
            for name in sidecars
            for index in range(CLIENTS_PER_SIDECAR)
        ]
        for thread in self._threads:
            thread.start()

    def _loop(self, name: str, index: int) -> None:
        with httpx.Client(timeout=patient(30)) as client:
            for seq in range(REQUESTS_PER_CLIENT):
                while not self.stop.is_set() and not self.up[name].wait(1):
                    pass
                if self.stop.is_set():
                    return
                tenant = f"{name}-c{index}-{seq:05d}"
                try:
                    answer = client.post(
                        self.sidecars[name].url + "/v1/chat/completions",
                        json=CHAT,
                        headers={"X-Tenant-ID": tenant, **CHAT_THROUGH},
                    )
                    ok = answer.status_code == 200 and b"[DONE]" in answer.content
                except httpx.HTTPError:
                    ok = False
                with self._lock:
                    self.sent.append(Sent(name, tenant, time.monotonic() if ok else None))

    def answered(self, name: str, after: float = 0.0) -> int:
        with self._lock:
            return sum(1 for s in self.sent if s.sidecar == name and (s.answered_at or 0) > after)

    def close(self) -> list[Sent]:
        self.stop.set()
        for thread in self._threads:
            thread.join(patient(60))
        assert not any(thread.is_alive() for thread in self._threads), "a client did not stop"
        return list(self.sent)


def _stopped(pid: int) -> bool:
    """Every thread of `pid` is stopped (SIGSTOP delivered), from /proc."""
    states = [
        Path(f"/proc/{pid}/task/{task}/stat").read_text().rsplit(")", 1)[1].split()[0]
        for task in os.listdir(f"/proc/{pid}/task")
    ]
    return all(state in ("T", "t") for state in states)


def kill_while(process: subprocess.Popen[bytes], inside: Callable[[], bool], what: str) -> float:
    """SIGKILL `process` at a moment `inside()` holds, checked with the process stopped (SIGSTOP,
    then the check again, else SIGCONT and keep watching); returns when it was stopped (monotonic)."""

    def caught() -> float | None:
        if not inside():
            return None
        at = time.monotonic()
        process.send_signal(signal.SIGSTOP)
        wait_until(lambda: _stopped(process.pid), timeout_s=5, what="SIGSTOP", interval_s=0.001)
        if inside():
            process.send_signal(signal.SIGKILL)
            process.wait(patient(10))
            return at
        process.send_signal(signal.SIGCONT)
        return None

    return wait_until(caught, timeout_s=90, what=what, interval_s=0.0005)


def rolling(spool: Path) -> Callable[[], bool]:
    """The sidecar's roller is between its plan and forgetting the spool files (collector.lake.stage)."""
    return lambda: (spool / "lake-plan.json").exists()


def committing(pid: int, lake: Path) -> Callable[[], bool]:
    """The committer holds a staged file or an Iceberg manifest open: reading the files it is adding,
    or writing the commit's manifests, before the catalog's compare-and-swap."""
    base = str(lake) + "/"

    def holding() -> bool:
        for fd in os.listdir(f"/proc/{pid}/fd"):
            try:
                target = os.readlink(f"/proc/{pid}/fd/{fd}")
            except OSError:
                continue  # closed meanwhile
            if target.startswith(base) and target.endswith((".parquet", ".avro")):
                return True
        return False

    return holding


def sidecar(tmp: Path, name: str, upstream: str, lake: Path) -> HeadroomProcess:
    return HeadroomProcess(
        "run",
        "--upstream",
        upstream,
        "--instance",
        name,
        "--lake",
        str(lake),
        "--spool-dir",
        str(tmp / f"spool-{name}"),
        "--lake-roll-seconds",
        "1",
        "--engine",
        "none",
        "--no-jobs",
        health="/healthz",
        log=tmp / f"{name}.log",
    )


def test_sidecars_and_two_committers_with_kills_lose_and_repeat_nothing(catalog: str, tmp_path: Path) -> None:
    """Real `headroom run --lake` sidecars in front of a fake upstream and 2 concurrent `headroom lake
    commit --every 1`; one sidecar SIGKILLed mid-roll (then restarted on its spool) and one committer
    SIGKILLed mid-commit: rows = distinct request_id = the requests answered, every one answered more
    than 1 s before the kill among them, and no row a client did not get an answer for. Six sidecars,
    not the issue's 16: with their clients, 16 do not fit the suite's 2 cores in a bounded test."""
    lake = tmp_path / "lake"
    upstream = FakeUpstream()
    names = [f"s{i}" for i in range(SIDECARS)]
    sidecars = {name: sidecar(tmp_path, name, upstream.url, lake) for name in names}
    with ThreadPoolExecutor(SIDECARS) as pool:
        list(pool.map(lambda process: process.start(60), sidecars.values()))
    committers = [committer(catalog, lake), committer(catalog, lake)]
    clients = Clients(sidecars)
    victim = sidecars["s0"]
    try:
        wait_until(
            lambda: (
                sum(1 for f in Lake.parse(lake).staged() if f.writer.startswith("s0.")) >= 3
                and _table_exists(catalog, lake)
            ),
            timeout_s=60,
            what="s0's files staged and a commit",
            interval_s=0.2,
        )
        assert victim.process is not None
        killed_at = kill_while(victim.process, rolling(tmp_path / "spool-s0"), "s0 mid-roll")
        clients.up["s0"].clear()
        kill_while(committers[0], committing(committers[0].pid, lake), "a committer mid-commit")
        revived_at = time.monotonic()
        victim.start(60)  # the pod restarted: the same spool repairs the roll and stages the rest
        clients.up["s0"].set()
        wait_until(lambda: clients.answered("s0", revived_at) >= 30, timeout_s=60, what="s0 serving again")
    finally:
        sent = clients.close()
        stopped = {name: process.stop() for name, process in sidecars.items()}
        upstream.stop()
    assert set(stopped.values()) <= {0, -signal.SIGTERM}, f"a sidecar did not stop on SIGTERM: {stopped}"
    assert stop_process(committers[1]) in (0, -signal.SIGTERM)
    final = subprocess.run(
        [str(HEADROOM), "lake", "commit", "--catalog", catalog, "--lake", str(lake)],
        capture_output=True,
        text=True,
        timeout=patient(120),
    )
    assert final.returncode == 0, final.stderr[-2000:]
    shared = [  # tenant names are in the rows and in the metadata's column bounds
        f"{path.relative_to(lake)} {path.stat().st_mode & 0o777:o}"
        for path in lake.rglob("*")
        if path.is_file() and path.stat().st_mode & 0o077
    ]
    assert not shared, f"lake files readable by others: {shared[:5]}"

    with open_lake_log(catalog, str(lake)) as store:
        rows, distinct = store.query("SELECT count(*), count(DISTINCT request_id) FROM requests")[0]
        table = {
            tenant: instance for tenant, instance in store.query("SELECT tenant, instance FROM requests")
        }
    by_tenant = {s.tenant: s for s in sent}
    last_second = {
        s.tenant
        for s in sent
        if s.sidecar == "s0" and s.answered_at and killed_at - 1 <= s.answered_at <= revived_at
    }
    owed = {s.tenant for s in sent if s.answered_at is not None} - last_second
    maybe = last_second | {s.tenant for s in sent if s.answered_at is None}  # a request cut by the kill
    assert rows == distinct == len(table), "a row was added twice"
    assert owed <= set(table), (
        f"{len(owed - set(table))} owed rows lost, e.g. {sorted(owed - set(table))[:5]}"
    )
    assert set(table) <= owed | maybe, (
        f"rows no client was answered for: {sorted(set(table) - owed - maybe)[:5]}"
    )
    assert all(by_tenant[tenant].sidecar == instance for tenant, instance in table.items())
    before = sum(1 for t in owed if by_tenant[t].sidecar == "s0" and by_tenant[t].answered_at < killed_at)
    assert before >= 30 and all(sum(1 for t in owed if by_tenant[t].sidecar == n) >= 30 for n in names)


def _table_exists(catalog: str, lake: Path) -> bool:
    try:
        lake_table.open_table(lake_table.open_catalog(catalog, Lake.parse(lake)), create=False)
    except Exception:
        return False
    return True


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
        thread.join(patient(60))
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
    first = subprocess.run(args, capture_output=True, text=True, timeout=patient(120))
    assert first.returncode == 0, first.stderr
    today = datetime(now.year, now.month, now.day, tzinfo=UTC)
    sealed = [r for r in rows if r["admitted_at"] < today]
    rows_in, distinct, _ = table_ids(catalog, lake)
    assert rows_in == distinct == len(sealed) > 0
    again = subprocess.run(args, capture_output=True, text=True, timeout=patient(120))
    assert again.returncode == 0 and "0 files and 0 rows added" in again.stderr
    assert table_ids(catalog, lake)[0] == len(sealed)


def test_a_column_the_committer_knows_is_added_and_older_files_read_null(tmp_path: Path) -> None:
    """A table an older committer created lacks a column of today's record: the committer adds it
    from its own schema (never from a file's), and the files from before read it as NULL."""
    catalog = catalog_uri("sqlite", tmp_path, None)
    lake = tmp_path / "lake"
    location = Lake.parse(lake)
    older = pa.schema([f for f in ARROW_SCHEMA if f.name != "replica_class"])
    own = lake_table.open_catalog(catalog, location)
    own.create_namespace("headroom")
    admitted = lake_table.iceberg_schema(older).find_field("admitted_at").field_id
    spec = PartitionSpec(
        PartitionField(source_id=admitted, field_id=1000, transform=DayTransform(), name="day")
    )
    created = own.create_table(
        lake_table.DEFAULT_TABLE, schema=lake_table.iceberg_schema(older), partition_spec=spec
    )
    with created.transaction() as txn:
        txn.set_properties({"schema.name-mapping.default": created.schema().name_mapping.model_dump_json()})
    old = pa.Table.from_pylist(synthetic_rows(100, DAY0, seed=1, prefix="old"), schema=older)
    import pyarrow.parquet as pq

    (lake / "staged" / "old.1").mkdir(parents=True)
    pq.write_table(old, lake / "staged" / "old.1" / "old.1-000000000000.parquet")
    newer = synthetic_rows(50, DAY0, seed=2, prefix="new")
    for row in newer:
        row["replica_class"] = "h100"
    stage(lake, "new", newer, 50)
    result = lake_table.commit_staged(lake_table.open_catalog(catalog, location), location)
    assert result.files == 2 and not result.quarantined
    iceberg = lake_table.open_table(lake_table.open_catalog(catalog, location))
    assert sorted(f.name for f in iceberg.schema().fields) == sorted(ARROW_SCHEMA.names)
    read = iceberg.scan().to_arrow()
    values = dict(zip(read["request_id"].to_pylist(), read["replica_class"].to_pylist()))
    assert {v for k, v in values.items() if k.startswith("old")} == {None}
    assert {v for k, v in values.items() if k.startswith("new")} == {"h100"}


def test_lake_cli_errors_are_clear(tmp_path: Path) -> None:
    bad = subprocess.run(
        [str(HEADROOM), "lake", "commit", "--catalog", "mysql://x", "--lake", str(tmp_path)],
        capture_output=True,
        text=True,
        timeout=patient(60),
    )
    assert bad.returncode != 0 and "not a catalog URI" in bad.stderr
    missing = subprocess.run(
        [str(HEADROOM), "report", "--lake", str(tmp_path), "--catalog", f"sqlite:///{tmp_path / 'c.db'}"],
        capture_output=True,
        text=True,
        timeout=patient(60),
    )
    assert missing.returncode != 0 and "lake commit" in missing.stderr


def test_a_committer_that_loses_the_race_recomputes_from_the_marks(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Committer A has chosen its files when committer B commits the same ones: A's commit must
    fail and be computed again from B's marks, not rebased by pyiceberg onto B's snapshot."""
    catalog = catalog_uri("sqlite", tmp_path, None)
    lake = tmp_path / "lake"
    location = Lake.parse(lake)
    stage(lake, "w", synthetic_rows(300, DAY0, seed=6), 100)
    lake_table.open_table(lake_table.open_catalog(catalog, location))
    evolve = lake_table._evolve
    raced: list[lake_table.CommitResult] = []

    def b_commits_first(table: Table, schema: pa.Schema) -> Table:
        if not raced:  # A has read the marks and chosen its files: B commits them now
            monkeypatch.setattr(lake_table, "_evolve", evolve)
            raced.append(lake_table.commit_staged(lake_table.open_catalog(catalog, location), location))
        return evolve(table, schema)

    monkeypatch.setattr(lake_table, "_evolve", b_commits_first)
    a = lake_table.commit_staged(lake_table.open_catalog(catalog, location), location)
    assert raced[0].files == 3 and a.files == 0 and a.conflicts == 1
    rows, distinct, _ = table_ids(catalog, lake)
    assert rows == distinct == 300
