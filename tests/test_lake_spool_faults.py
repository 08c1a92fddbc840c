"""Issue 47, the writer's side: one owner per spool, sequences that never go backwards, bad spool
files set aside, and a sidecar that serves whatever its lake or spool does (collector.lake.stage,
collector.store.spool)."""

from __future__ import annotations

import errno
import json
import logging
import os
import subprocess
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path

import httpx
import pyarrow as pa
import pyarrow.fs as pafs
import pyarrow.parquet as pq
import pytest
from prometheus_client.parser import text_string_to_metric_families
from support.processes import HEADROOM, HeadroomProcess, free_port
from support.sidecar import CHAT, sidecar_rig
from support.upstream import FakeUpstream
from support.waiting import patient, wait_until

import collector.store.spool as spool_module
from collector.catalog import SINK_REASONS
from collector.lake.layout import STAGED, Lake
from collector.lake.stage import LakeWriter, lake_reason
from collector.lake.table import commit_staged, maintain, marks, open_catalog, open_table
from collector.record import RequestRecord
from collector.sidecar.wiring import sidecar_state
from collector.store.db import rows_to_ipc
from collector.store.spool import QUARANTINE, SpoolBusy
from collector.store.writer import RowsDropped

MB = 2**20
T0 = datetime(2026, 3, 1, 23, 59, 58, tzinfo=UTC)


def records(count: int, start: datetime = T0, prefix: str = "r") -> list[RequestRecord]:
    """`count` rows half a second apart (from T0: across a UTC midnight)."""
    return [
        RequestRecord(
            request_id=f"{prefix}{i:06d}",
            instance="w",
            model="m1",
            admitted_at=start + timedelta(seconds=i / 2),
            completed_at=start + timedelta(seconds=i / 2 + 1),
            ttft_s=0.1,
            outcome="ok",
        )
        for i in range(count)
    ]


def staged_rows(lake: Lake) -> list[dict[str, object]]:
    return [row for name in lake.staged() for row in pq.read_table(name.path, filesystem=lake.fs).to_pylist()]


@pytest.fixture
def upstream() -> Iterator[FakeUpstream]:
    fake = FakeUpstream()
    try:
        yield fake
    finally:
        fake.stop()


def sidecar(
    tmp: Path, upstream: str, lake: str, spool: Path, name: str = "a", env: dict[str, str] | None = None
) -> HeadroomProcess:
    return HeadroomProcess(
        "run",
        "--upstream",
        upstream,
        "--instance",
        name,
        "--lake",
        lake,
        "--spool-dir",
        str(spool),
        "--lake-roll-seconds",
        "1",
        "--engine",
        "none",
        "--no-jobs",
        health="/healthz",
        log=tmp / f"{name}.log",
        env=env,
    )


def scrape(url: str) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    text = httpx.get(url + "/metrics", timeout=patient(10)).text
    return {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
    }


def chat(url: str, count: int) -> int:
    """`count` chat requests through the sidecar; how many were answered 200."""
    return sum(
        httpx.post(url + "/v1/chat/completions", json=CHAT, timeout=patient(10)).status_code == 200
        for _ in range(count)
    )


def assert_all_rows_staged(lake: Lake, answered: int) -> None:
    ids = [row["request_id"] for row in staged_rows(lake)]
    assert len(ids) == len(set(ids)) == answered, (len(ids), len(set(ids)), answered)


Metrics = dict[tuple[str, tuple[tuple[str, str], ...]], float]


def sink_up(metrics: Metrics) -> tuple[str, float] | None:
    """headroom_log_sink_up's one series as (reason, value); None before the roller's first try.
    Never two series at once: a reason that changed leaves none behind."""
    found = [
        (dict(labels), value) for (name, labels), value in metrics.items() if name == "headroom_log_sink_up"
    ]
    assert len(found) <= 1, found
    if not found:
        return None
    labels, value = found[0]
    assert set(labels) == {"reason"} and value == (1.0 if SINK_REASONS[labels["reason"]] else 0.0), found
    return labels["reason"], value


def commit_all(tmp: Path, lake: Lake) -> list[str]:
    """A committer pass (what `headroom lake commit` runs) into a SQLite catalog beside the test;
    the table's request ids."""
    catalog = open_catalog(f"sqlite:///{tmp / 'catalog.db'}", lake)
    result = commit_staged(catalog, lake)
    assert not result.quarantined and not result.unreadable, result
    return [str(v) for v in open_table(catalog, create=False).scan().to_arrow()["request_id"].to_pylist()]


def assert_all_rows_committed(tmp: Path, lake: Lake, answered: int) -> None:
    ids = commit_all(tmp, lake)
    assert len(ids) == len(set(ids)) == answered, (len(ids), len(set(ids)), answered)


# --- 1. one owner per spool -----------------------------------------------------------------------
@pytest.mark.subprocess
def test_a_second_sidecar_on_one_spool_refuses_naming_it_and_the_first_loses_nothing(
    tmp_path: Path, upstream: FakeUpstream
) -> None:
    spool, lake = tmp_path / "spool", tmp_path / "lake"
    first = sidecar(tmp_path, upstream.url, str(lake), spool).start(60)
    try:
        answered = chat(first.url, 10)
        writer = json.loads((spool / "lake-state.json").read_text())["writer"]
        second = subprocess.run(
            [str(HEADROOM), "run", "--upstream", upstream.url, "--lake", str(lake), "--spool-dir", str(spool)]
            + ["--engine", "none", "--no-jobs", "--listen", f"127.0.0.1:{free_port()}"],
            capture_output=True,
            text=True,
            timeout=patient(60),
        )
        assert second.returncode != 0
        assert str(spool) in second.stderr and f"pid {first.process.pid}" in second.stderr, second.stderr
        assert json.loads((spool / "lake-state.json").read_text())["writer"] == writer  # not taken over
        answered += chat(first.url, 10)
    finally:
        first.stop()
    assert_all_rows_staged(Lake.parse(str(lake)), answered)


def test_the_spool_lock_is_held_until_close(tmp_path: Path) -> None:
    writer = LakeWriter(tmp_path / "lake", "pod", tmp_path / "spool", roll_seconds=3600)
    with pytest.raises(SpoolBusy, match=str(tmp_path / "spool")):
        LakeWriter(tmp_path / "lake", "pod", tmp_path / "spool", roll_seconds=3600)
    writer.close()
    LakeWriter(tmp_path / "lake", "pod", tmp_path / "spool", roll_seconds=3600).close()


# --- 1. sequences never go backwards; a staged name is written once ----------------------------------
def staged_bytes(lake: Lake) -> dict[str, bytes]:
    return {name.path: Path(name.path).read_bytes() for name in lake.staged()}


def test_a_rolled_back_sequence_goes_on_past_what_the_lake_holds(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    spool, lake_dir = tmp_path / "spool", tmp_path / "lake"
    writer = LakeWriter(lake_dir, "pod", spool, roll_seconds=3600)
    writer.write_batch(records(8))  # two UTC days: sequences 0 and 1
    assert writer.flush(10)
    writer.write_batch(records(4, start=T0 + timedelta(days=3), prefix="b"))  # sequence 2
    writer.close()
    before = staged_bytes(writer.lake)
    assert [name.seq for name in writer.lake.staged()] == [0, 1, 2]
    state = json.loads((spool / "lake-state.json").read_text())
    (spool / "lake-state.json").write_text(json.dumps(state | {"next_seq": 0}))  # rolled back
    caplog.set_level(logging.WARNING, logger="collector.lake.stage")
    again = LakeWriter(lake_dir, "pod", spool, roll_seconds=3600)
    again.write_batch(records(6, start=T0 + timedelta(days=5, hours=1), prefix="c"))
    assert again.flush(10)
    again.close()
    after = staged_bytes(again.lake)
    assert {path: after[path] for path in before} == before  # not one staged file rewritten
    assert [name.seq for name in again.lake.staged()] == [0, 1, 2, 3]
    assert_all_rows_staged(again.lake, 18)
    assert json.loads((spool / "lake-state.json").read_text())["next_seq"] == 4
    warned = [r.getMessage() for r in caplog.records]
    assert len(warned) == 1 and "up to sequence 2, past this spool's 0: going on from 3" in warned[0], warned


def test_a_leftover_plan_never_overwrites_a_different_staged_file(tmp_path: Path) -> None:
    """A plan whose sequence is taken by a file with other rows (a state rolled back before a crash):
    that file stays as it is and the plan's rows go to the next free sequence."""
    spool, lake_dir = tmp_path / "spool", tmp_path / "lake"
    writer = LakeWriter(lake_dir, "pod", spool, roll_seconds=3600)
    writer.write_batch(records(3))
    writer.close()
    before = staged_bytes(writer.lake)
    assert [name.seq for name in writer.lake.staged()] == [0]
    crashed = LakeWriter(lake_dir, "pod", spool, roll_seconds=3600)
    crashed.close()
    crashed.write_batch(records(2, prefix="x"))
    crashed.next_seq = 0  # a state rolled back, then a crash after the plan
    crashed._save_state()
    crashed._write_plan(crashed.spool.take(2**62, 2**62))
    crashed.spool.close()
    restarted = LakeWriter(lake_dir, "pod", spool, roll_seconds=3600)
    assert restarted.flush(10)
    restarted.close()
    after = staged_bytes(restarted.lake)
    assert {path: after[path] for path in before} == before
    assert [name.seq for name in restarted.lake.staged()] == [0, 1]
    assert_all_rows_staged(restarted.lake, 5)


def committed_files(tmp: Path, lake: Lake) -> dict[str, bytes]:
    """The table's data files (every one a staged file the committer registered) and their bytes."""
    table = open_table(open_catalog(f"sqlite:///{tmp / 'catalog.db'}", lake), create=False)
    paths = [lake.path_of(task.file.file_path) for task in table.scan().plan_files()]
    return {path: Path(path).read_bytes() for path in paths}


@pytest.mark.parametrize("crash", [False, True], ids=["restart", "crash-after-the-plan"])
def test_a_rolled_back_writer_never_rewrites_a_committed_file_and_the_table_loses_nothing(
    tmp_path: Path, crash: bool
) -> None:
    """Staged files committed to the table, then the writer's state rolled back to sequence 0 (a
    spool volume restored from a snapshot), a restart (or one that crashed after writing its
    plan for sequence 0) and more rows: the writer goes on past what the lake holds, the next
    pass commits only the new file, no committed file's bytes change, and the table's rows =
    the rows in its data files = distinct ids = every row written."""
    spool, lake_dir = tmp_path / "spool", tmp_path / "lake"
    writer = LakeWriter(lake_dir, "pod", spool, roll_seconds=3600)
    writer.write_batch(records(8))  # two UTC days: sequences 0 and 1
    assert writer.flush(10)
    writer.write_batch(records(4, start=T0 + timedelta(days=3), prefix="b"))  # sequence 2
    writer.close()
    assert len(commit_all(tmp_path, writer.lake)) == 12
    committed = committed_files(tmp_path, writer.lake)
    assert sorted(committed) == [name.path for name in writer.lake.staged()] and len(committed) == 3

    state = json.loads((spool / "lake-state.json").read_text())
    (spool / "lake-state.json").write_text(json.dumps(state | {"next_seq": 0}))  # rolled back
    more = records(6, start=T0 + timedelta(days=5, hours=1), prefix="c")
    if crash:  # the plan names sequence 0, a committed file's; then the process dies
        crashed = LakeWriter(lake_dir, "pod", spool, roll_seconds=3600)
        crashed.close()
        crashed.write_batch(more)
        crashed._write_plan(crashed.spool.take(2**62, 2**62))
        crashed.spool.close()
    again = LakeWriter(lake_dir, "pod", spool, roll_seconds=3600)
    if not crash:
        again.write_batch(more)
    assert again.flush(10)
    again.close()
    assert [name.seq for name in again.lake.staged()] == [0, 1, 2, 3]  # forward, not over 0

    ids = commit_all(tmp_path, again.lake)
    now = committed_files(tmp_path, again.lake)
    assert {path: now[path] for path in committed} == committed  # not one committed file rewritten
    assert len(now) == 4 and set(now) == {name.path for name in again.lake.staged()}
    in_files = sum(pq.read_metadata(path).num_rows for path in now)
    expected = (
        {f"r{i:06d}" for i in range(8)} | {f"b{i:06d}" for i in range(4)} | {f"c{i:06d}" for i in range(6)}
    )
    assert len(ids) == in_files == len(set(ids)) == 18 and set(ids) == expected
    table = open_table(open_catalog(f"sqlite:///{tmp_path / 'catalog.db'}", again.lake), create=False)
    assert marks(table) == {again.writer: 3}


def test_a_rolled_back_writer_after_maintain_removed_its_staged_files_loses_nothing(tmp_path: Path) -> None:
    """Once `lake maintain` compacted a day and removed its staged files, a writer whose state
    rolled back finds no file of its own in staged/: it goes on past the mark maintain left
    (staged/<writer>/.removed-through), never from 0 again, whose names the committer would skip
    as committed and the next maintain delete (12 of 18 rows reached the table before)."""
    spool, lake_dir = tmp_path / "spool", tmp_path / "lake"
    day = (datetime.now(UTC) - timedelta(days=3)).replace(hour=1, minute=0, second=0, microsecond=0)
    writer = LakeWriter(lake_dir, "pod", spool, roll_seconds=3600)
    for k in range(3):  # three files of one sealed day: maintain compacts them, then removes them
        writer.write_batch(records(4, start=day + timedelta(minutes=k), prefix=f"a{k}"))
        assert writer.flush(10)
    writer.close()
    assert len(commit_all(tmp_path, writer.lake)) == 12
    catalog = open_catalog(f"sqlite:///{tmp_path / 'catalog.db'}", writer.lake)
    maintain(catalog, writer.lake, seal_hours=0, snapshot_age=timedelta(0), orphan_age=timedelta(0))
    assert writer.lake.staged() == []
    state = json.loads((spool / "lake-state.json").read_text())
    (spool / "lake-state.json").write_text(json.dumps(state | {"next_seq": 0}))  # rolled back
    again = LakeWriter(lake_dir, "pod", spool, roll_seconds=3600)
    again.write_batch(records(6, start=day + timedelta(days=1), prefix="c"))
    assert again.flush(10)
    again.close()
    assert [name.seq for name in again.lake.staged()] == [3]
    ids = commit_all(tmp_path, again.lake)
    assert len(ids) == len(set(ids)) == 18, (len(ids), len(set(ids)))


# --- 2. bad spool files: set aside, the rest staged ----------------------------------------------------
def spool_file(spool: Path, seq: int, rows: int, payload: bytes) -> Path:
    path = spool / f"{1_700_000_000_000_000_000 + seq:020d}-{seq:06d}-{rows}.arrow"
    path.write_bytes(payload)
    return path


def old_schema_payload(count: int) -> bytes:
    """A spool file of an older version: fewer columns, one of them an int32 where the record has int64."""
    table = pa.table(
        {
            "request_id": [f"old{i}" for i in range(count)],
            "instance": ["w"] * count,
            "model": ["m-old"] * count,
            "admitted_at": pa.array([T0] * count, pa.timestamp("us", tz="UTC")),
        }
    )
    sink = pa.BufferOutputStream()
    with pa.ipc.new_stream(sink, table.schema) as stream:
        stream.write_table(table)
    return bytes(sink.getvalue())


def test_truncated_empty_and_old_schema_spool_files_never_block_staging(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    spool, lake_dir = tmp_path / "spool", tmp_path / "lake"
    spool.mkdir()
    good = rows_to_ipc(records(5))
    spool_file(spool, 1, 5, good)
    truncated = spool_file(spool, 2, 7, rows_to_ipc(records(7, prefix="t"))[:3000])
    spool_file(spool, 3, 4, old_schema_payload(4))
    empty = spool_file(spool, 4, 1, b"")
    missing = spool / "00000000000000000009-000009-1.arrow"
    plan = {"first_seq": 0, "entries": [empty.name, missing.name]}  # a crash left a plan naming these
    (spool / "lake-plan.json").write_text(json.dumps(plan))
    caplog.set_level(logging.WARNING, logger="collector.lake.stage")
    writer = LakeWriter(lake_dir, "pod", spool, roll_seconds=3600)
    try:
        assert writer.flush(10)
        rows = staged_rows(writer.lake)
        assert sorted(str(row["request_id"]) for row in rows) == sorted(
            [f"r{i:06d}" for i in range(5)] + [f"old{i}" for i in range(4)]
        )
        old = [row for row in rows if row["model"] == "m-old"]
        assert all(row["ttft_s"] is None and row["outcome"] is None for row in old)
        assert sorted(path.name for path in (spool / QUARANTINE).iterdir()) == [truncated.name, empty.name]
        assert sorted(path.name for path in spool.glob("*.arrow")) == []
        named = [r.getMessage() for r in caplog.records if "set aside" in r.getMessage()]
        assert (
            len(named) == 2
            and any(truncated.name in m for m in named)
            and any(empty.name in m for m in named)
        )
        counted = {m.name: m.samples[0] for m in writer.collect()}
        assert counted["headroom_log_spool_quarantined"].value == 2
        up = counted["headroom_log_sink_up"]
        assert (up.labels, up.value) == ({"reason": "ok"}, 1)
    finally:
        writer.close()


# --- 3. serve first ----------------------------------------------------------------------------------
@pytest.mark.slow
@pytest.mark.subprocess
def test_an_unwritable_lake_serves_from_the_start_and_stages_everything_once_it_is_back(
    tmp_path: Path, upstream: FakeUpstream
) -> None:
    """The lake's parent is a regular file: no user, root included, can create it (chmod would not
    stop root). The sidecar starts and answers, sink_up is 0 with reason="unwritable" and one
    WARNING naming the lake, rows stay spooled; once the file is gone the roller stages every
    answered row by itself (sink_up 1, reason="ok") and a committer pass puts them all in the table."""
    blocker = tmp_path / "blocker"
    blocker.write_text("not a folder")
    lake = blocker / "lake"
    process = sidecar(tmp_path, upstream.url, str(lake), tmp_path / "spool").start(60)
    try:
        answered = chat(process.url, 20)  # from the first second
        assert answered == 20
        wait_until(
            lambda: sink_up(scrape(process.url)) == ("unwritable", 0), 20, what="sink down, unwritable"
        )
        wait_until(lambda: scrape(process.url)[("headroom_log_spool_files", ())] > 0, 20, what="rows spooled")
        blocker.unlink()  # the fault clears
        answered += chat(process.url, 5)
        wait_until(lambda: sink_up(scrape(process.url)) == ("ok", 1), 40, what="sink back")
        metrics = scrape(process.url)
        assert not [v for key, v in metrics.items() if key[0] == "headroom_log_rows_dropped_total" and v]
    finally:
        process.stop()
    log = process.log_tail(100_000)
    assert log.count("cannot write to the lake") == 1 and str(lake) in log, log
    assert "(unwritable: " in log, log
    assert_all_rows_staged(Lake.parse(str(lake)), answered)
    assert_all_rows_committed(tmp_path, Lake.parse(str(lake)), answered)


@pytest.mark.slow
@pytest.mark.subprocess
def test_an_unreachable_object_store_serves_from_the_start_and_keeps_rows_spooled(
    tmp_path: Path, upstream: FakeUpstream
) -> None:
    """`--lake s3://...` whose endpoint refuses connections: the sidecar answers at once (it exited 2
    before), sink_up turns 0 with reason="unreachable" once the store's client gives up (about
    12-18 s of its retries), with one WARNING naming the store; the rows wait in the spool. A
    malformed URI is still refused."""
    uri = f"s3://bucket/x?endpoint_override=127.0.0.1:{free_port()}&scheme=http"
    spool = tmp_path / "spool"
    process = sidecar(tmp_path, upstream.url, uri, spool).start(60)
    try:
        answered = chat(process.url, 10)
        assert answered == 10
        wait_until(lambda: sink_up(scrape(process.url)) is not None, 60, what="the roller's first try")
        assert sink_up(scrape(process.url)) == ("unreachable", 0)
        rows = lambda: sum(int(path.name.rsplit("-", 1)[1].split(".")[0]) for path in spool.glob("*.arrow"))  # noqa: E731
        wait_until(lambda: rows() == answered, 10, what="every answered row spooled")
    finally:
        process.stop()
    log = process.log_tail(100_000)
    assert log.count("cannot write to the lake") == 1 and "127.0.0.1" in log, log
    assert "(unreachable: " in log, log
    refused = subprocess.run(
        [str(HEADROOM), "run", "--upstream", upstream.url, "--lake", "s3:///no-bucket", "--spool-dir"]
        + [str(tmp_path / "other"), "--engine", "none", "--listen", f"127.0.0.1:{free_port()}"],
        capture_output=True,
        text=True,
        timeout=patient(60),
    )
    assert refused.returncode == 2 and "Missing bucket name" in refused.stderr, refused.stderr


S3_KEYS = {"access_key": "testing", "secret_key": "testing", "region": "us-east-1"}
S3_ENV = {  # the sidecar's and the committer's credentials (the AWS SDK's chain); moto takes any
    "AWS_ACCESS_KEY_ID": "testing",
    "AWS_SECRET_ACCESS_KEY": "testing",
    "AWS_DEFAULT_REGION": "us-east-1",
}


@pytest.mark.slow
@pytest.mark.subprocess
def test_an_object_store_that_comes_up_late_gets_every_answered_row_staged_and_committed(
    tmp_path: Path, upstream: FakeUpstream
) -> None:
    """The endpoint of `--lake s3://...` refuses connections, then an S3 server (moto) comes up on
    that port: the sidecar answered throughout, sink_up goes 0 (reason="unreachable") then back
    to 1 (reason="ok") with one WARNING each way, every answered row is staged on the bucket exactly once, and `headroom lake commit`
    puts them all in the Iceberg table."""
    from moto.server import ThreadedMotoServer

    port = free_port()
    endpoint = f"127.0.0.1:{port}"
    uri = f"s3://bucket/x?endpoint_override={endpoint}&scheme=http"
    process = sidecar(tmp_path, upstream.url, uri, tmp_path / "spool", env=S3_ENV).start(60)
    store = ThreadedMotoServer(ip_address="127.0.0.1", port=port, verbose=False)
    started = False
    try:
        answered = chat(process.url, 10)
        wait_until(lambda: sink_up(scrape(process.url)) is not None, 60, what="the roller's first try")
        assert sink_up(scrape(process.url)) == ("unreachable", 0)
        answered += chat(process.url, 5)  # served while the store is down
        assert answered == 15
        store.start()  # the fault clears: a store on the port the sidecar was pointed at
        started = True
        s3 = pafs.S3FileSystem(
            endpoint_override=endpoint, scheme="http", allow_bucket_creation=True, **S3_KEYS
        )
        s3.create_dir("bucket")
        answered += chat(process.url, 5)
        lake = Lake(uri="s3://bucket/x", fs=s3, base="bucket/x")
        wait_until(lambda: sink_up(scrape(process.url)) == ("ok", 1), 60, what="sink back")
        wait_until(lambda: len(staged_rows(lake)) >= answered, 30, what="every answered row staged")
        metrics = scrape(process.url)
        assert not [v for key, v in metrics.items() if key[0] == "headroom_log_rows_dropped_total" and v]
        process.stop()
        assert_all_rows_staged(lake, answered)
        log = process.log_tail(100_000)
        assert log.count("cannot write to the lake") == 1 and endpoint in log, log
        assert log.count(f"the lake {uri} is back") == 1, log

        catalog = f"sqlite:///{tmp_path / 'c.db'}"
        properties = {
            "s3.endpoint": f"http://{endpoint}",
            "s3.access-key-id": "testing",
            "s3.secret-access-key": "testing",
            "s3.region": "us-east-1",
        }
        committed = subprocess.run(
            [str(HEADROOM), "lake", "commit", "--catalog", catalog, "--lake", uri]
            + [arg for key, value in properties.items() for arg in ("--catalog-property", f"{key}={value}")],
            capture_output=True,
            text=True,
            timeout=patient(120),
            env=os.environ | S3_ENV,
        )
        assert committed.returncode == 0, committed.stderr
        table = open_table(open_catalog(catalog, lake, properties=properties), create=False)
        ids = table.scan().to_arrow().column("request_id").to_pylist()
        assert len(ids) == len(set(ids)) == answered, (len(ids), len(set(ids)), answered)
    finally:
        process.stop()
        if started:
            store.stop()


def enospc(_descriptor: int, _payload: bytes) -> None:
    raise OSError(errno.ENOSPC, "No space left on device")


def test_a_full_spool_volume_serves_holds_rows_in_memory_and_commits_them_when_it_clears(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """ENOSPC on every spool write: the sidecar answers, sink_up is 0 with reason="disk_full" (the
    dropped-rows counter's word for it), the rows wait in memory; once the volume takes writes,
    sink_up is 1 with reason="ok", every answered row is staged once and a committer pass puts
    them all in the table."""
    spool, lake_dir = tmp_path / "spool", tmp_path / "lake"
    caplog.set_level(logging.WARNING, logger="collector.lake.stage")
    with sidecar_rig(tmp_path, db_path=None, lake=str(lake_dir), spool_dir=str(spool)) as rig:
        writer: LakeWriter = sidecar_state(rig.app).batch_sink
        wait_until(lambda: sink_up(rig.metrics()) == ("ok", 1), what="sink up")
        monkeypatch.setattr(spool_module, "write_synced", enospc)  # every write to the spool's volume
        answered = chat(rig.url, 20)
        assert answered == 20
        wait_until(lambda: sink_up(rig.metrics()) == ("disk_full", 0), what="sink down, disk full")
        assert not list(spool.glob("*.tmp")) and not list(spool.glob("*.arrow"))  # no half files left
        monkeypatch.undo()  # space again
        assert sidecar_state(rig.app).writer.flush(30)
        metrics = rig.metrics()
        assert sink_up(metrics) == ("ok", 1)
        assert metrics[("headroom_log_rows_written_total", ())] == answered
        assert not [v for key, v in metrics.items() if key[0] == "headroom_log_rows_dropped_total" and v]
    faults = [r.getMessage() for r in caplog.records if "cannot write the spool" in r.getMessage()]
    assert len(faults) == 1 and str(spool) in faults[0] and "No space left" in faults[0]
    assert_all_rows_staged(writer.lake, answered)
    assert_all_rows_committed(tmp_path, writer.lake, answered)


def test_rows_past_the_memory_bound_are_counted_by_the_volumes_real_reason(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    writer = LakeWriter(
        tmp_path / "lake", "pod", tmp_path / "spool", roll_seconds=3600, max_held_bytes=MB // 2
    )
    try:
        monkeypatch.setattr(spool_module, "write_synced", enospc)
        writer.write_batch(records(10))  # held in memory
        with pytest.raises(RowsDropped) as full:
            writer.write_batch(records(5000, prefix="big"))
        assert (full.value.reason, full.value.count) == ("disk_full", 5000)
        assert writer.lake_up is False and writer.sink_reason == "disk_full"
        readonly = OSError(errno.EROFS, "Read-only file system")
        monkeypatch.setattr(spool_module, "write_synced", lambda *_: (_ for _ in ()).throw(readonly))
        wait_until(lambda: writer._held_reason == "spool_error", what="the roller saw the read-only volume")
        with pytest.raises(RowsDropped) as refused:
            writer.write_batch(records(5000, prefix="ro"))
        assert refused.value.reason == "spool_error" and writer.lake_up is False
        assert writer.sink_reason == "spool_error"
        monkeypatch.undo()
        assert writer.flush(10) and writer.lake_up is True and writer.sink_reason == "ok"
        assert_all_rows_staged(writer.lake, 10)
    finally:
        writer.close()


@pytest.mark.parametrize(
    ("raised", "reason"),
    [
        (
            OSError(
                "When testing for existence of bucket 'b': AWS Error NETWORK_CONNECTION during "
                "HeadBucket operation: curlCode: 7, Could not connect to server"
            ),
            "unreachable",
        ),
        (ValueError("--lake 's3://b/x': cannot reach its store now (timed out)"), "unreachable"),
        (ConnectionRefusedError(errno.ECONNREFUSED, "Connection refused"), "unreachable"),
        (OSError(errno.ETIMEDOUT, "Connection timed out"), "unreachable"),
        (
            NotADirectoryError(errno.ENOTDIR, "Cannot create directory '/x/lake'. Not a directory"),
            "unwritable",
        ),
        (PermissionError(errno.EACCES, "Permission denied"), "unwritable"),
        (OSError(errno.EROFS, "Read-only file system"), "unwritable"),
        (OSError(errno.ENOSPC, "No space left on device"), "unwritable"),
        (OSError("AWS Error ACCESS_DENIED during PutObject operation: Access Denied"), "unwritable"),
        (OSError("AWS Error NO_SUCH_BUCKET during PutObject operation"), "lake_error"),
        (RuntimeError("something else"), "lake_error"),
    ],
)
def test_the_lakes_faults_are_named_by_a_closed_set_of_reasons(raised: BaseException, reason: str) -> None:
    assert lake_reason(raised) == reason and SINK_REASONS[reason] is False


def test_a_stray_name_far_ahead_never_moves_the_writers_sequence(tmp_path: Path) -> None:
    """A file named far ahead under this writer's name (garbage, or another process's) is not the
    writer's own run: its next files follow its own, where the committer expects them."""
    spool, lake_dir = tmp_path / "spool", tmp_path / "lake"
    writer = LakeWriter(lake_dir, "pod", spool, roll_seconds=3600)
    writer.write_batch(records(4))  # sequence 0 (and 1: the rows cross a UTC midnight)
    assert writer.flush(10)
    writer.close()
    own = [name.seq for name in writer.lake.staged()]
    stray = Path(writer.lake.path(STAGED, writer.writer, f"{writer.writer}-999999999999.parquet"))
    stray.write_bytes(b"not this writer's")
    for restart in range(2):  # a restart before and after its next roll: never past the stray
        again = LakeWriter(lake_dir, "pod", spool, roll_seconds=3600)
        again.write_batch(records(2, start=T0 + timedelta(days=2 + restart), prefix=f"n{restart}"))
        assert again.flush(10)
        again.close()
    seqs = sorted(name.seq for name in again.lake.staged())
    assert seqs == [*own, len(own), len(own) + 1, 999_999_999_999]
