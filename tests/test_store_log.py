"""The request log: batching writer, drops counted not fatal, restart, schema migration."""

from __future__ import annotations

import subprocess
import sys
import threading

import duckdb
import httpx
import pyarrow as pa
import pytest
from prometheus_client import CollectorRegistry
from support.sidecar import CHAT, sidecar_rig
from support.waiting import patient

from collector.sidecar.wiring import sidecar_state
from collector.store.db import RequestStore
from collector.store.schema import COLUMN_NAMES, MIGRATIONS, SCHEMA_VERSION
from collector.store.writer import LogWriter, RowsDropped


def _rows(n, prefix="r"):
    return [{"request_id": f"{prefix}{i}", "model": "m", "outcome": "ok", "e2e_s": 0.1 * i} for i in range(n)]


class _Recording:
    def __init__(self):
        self.batches = []

    def write_batch(self, rows):
        self.batches.append(len(rows))


def test_writer_batches_and_close_flushes_everything():
    sink = _Recording()
    writer = LogWriter(sink, CollectorRegistry(), batch_rows=100, flush_interval_s=5)
    for row in _rows(1050):
        writer.submit(row)
    writer.close()
    assert sum(sink.batches) == 1050 and max(sink.batches) <= 100
    assert len(sink.batches) < 50  # batched, never a write per row


class _Blocked:
    def __init__(self):
        self.gate = threading.Event()

    def write_batch(self, rows):
        self.gate.wait(10)


class _Gated(_Recording):
    """Records batch sizes; the first write waits at a gate, so a backlog builds behind it."""

    def __init__(self):
        super().__init__()
        self.gate, self.entered = threading.Event(), threading.Event()

    def write_batch(self, rows):
        self.entered.set()
        assert self.gate.wait(patient(10))
        super().write_batch(rows)


@pytest.mark.parametrize(("max_batch_rows", "largest"), [(None, 100), (1_000, 1_000)])
def test_a_backlog_is_written_in_batches_of_up_to_max_batch_rows(max_batch_rows, largest):
    """batch_rows queued rows wake the writer; what fell behind goes in batches of up to
    max_batch_rows (default batch_rows), every row once (BENCHMARKS.md §5h)."""
    sink = _Gated()
    writer = LogWriter(
        sink, CollectorRegistry(), batch_rows=100, max_batch_rows=max_batch_rows, flush_interval_s=5
    )
    rows = _rows(2_550)
    for row in rows[:100]:
        writer.submit(row)
    assert sink.entered.wait(patient(10))  # the first batch is being written: the rest queues behind it
    for row in rows[100:]:
        writer.submit(row)
    sink.gate.set()
    writer.close()
    assert sink.batches[0] == 100 and sum(sink.batches) == 2_550
    assert max(sink.batches) == largest  # 2,450 behind: filled batches of the most allowed


class _Poisoned(_Gated):
    """Fails any batch that holds the poison row, the way one bad row fails a whole INSERT."""

    def __init__(self, poison: str):
        super().__init__()
        self.poison, self.failed = poison, []

    def write_batch(self, rows):
        if any(row["request_id"] == self.poison for row in rows):
            self.failed.append(len(rows))
            raise duckdb.ConversionException("bad row")
        super().write_batch(rows)


def test_a_failed_catch_up_batch_is_retried_in_pieces_and_loses_only_the_bad_piece():
    """One failure in a 2,450-row catch-up batch costs the 100 rows around the bad one, not all."""
    registry = CollectorRegistry()
    sink = _Poisoned(poison="r1234")
    writer = LogWriter(sink, registry, batch_rows=100, max_batch_rows=5_000, flush_interval_s=5)
    rows = _rows(2_550)
    for row in rows[:100]:
        writer.submit(row)
    assert sink.entered.wait(patient(10))
    for row in rows[100:]:
        writer.submit(row)
    sink.gate.set()
    writer.close()
    assert sink.failed == [2_450, 100]  # the catch-up batch, then only the piece with r1234
    assert sum(sink.batches) == 2_450 and max(sink.batches) == 100
    assert registry.get_sample_value("headroom_log_rows_dropped_total", {"reason": "db_error"}) == 100
    assert registry.get_sample_value("headroom_log_rows_written_total") == 2_450


def test_the_sidecars_writer_appends_a_backlog_of_rows_to_its_own_store_at_once(tmp_path):
    """A store takes large appends faster per row; the lake's writer spools --log-batch-rows at a time."""
    from collector.sidecar.config import SidecarConfig
    from collector.sidecar.wiring import SIDECAR_STORE_BATCH_ROWS, build_sidecar

    own = build_sidecar(
        SidecarConfig(upstream="http://127.0.0.1:9", db_path=str(tmp_path / "a.duckdb"), engine="none")
    )
    shipped = build_sidecar(
        SidecarConfig(
            upstream="http://127.0.0.1:9",
            db_path=None,
            lake=str(tmp_path / "lake"),
            spool_dir=str(tmp_path / "spool"),
            engine="none",
        )
    )
    try:
        assert sidecar_state(own).writer.max_batch_rows == SIDECAR_STORE_BATCH_ROWS == 50_000
        writer = sidecar_state(shipped).writer
        assert writer.max_batch_rows == writer.batch_rows == 1_000
    finally:
        for app in (own, shipped):
            sidecar_state(app).writer.close()


def test_full_queue_drops_and_counts():
    registry = CollectorRegistry()
    sink = _Blocked()
    writer = LogWriter(sink, registry, max_queue_rows=10, batch_rows=1)
    for row in _rows(100):
        writer.submit(row)
    dropped = registry.get_sample_value("headroom_log_rows_dropped_total", {"reason": "queue_full"})
    assert 80 <= dropped <= 90
    sink.gate.set()
    writer.close()


class _Failing:
    def write_batch(self, rows):
        if rows[0]["request_id"].startswith("spool"):
            raise RowsDropped("spool_full", len(rows))
        raise duckdb.IOException("disk full")


def test_sink_failures_are_counted_by_reason():
    registry = CollectorRegistry()
    writer = LogWriter(_Failing(), registry)
    for row in _rows(5) + _rows(3, prefix="spool"):
        writer.submit(row)
        writer.flush(patient(30))
    writer.close()

    def value(reason: str) -> float | None:
        return registry.get_sample_value("headroom_log_rows_dropped_total", {"reason": reason})

    assert value("db_error") == 5 and value("spool_full") == 3
    assert registry.get_sample_value("headroom_log_rows_written_total") == 0


def test_proxy_keeps_serving_when_the_database_fails(tmp_path):
    with sidecar_rig(tmp_path) as rig:
        sidecar_state(rig.app).batch_sink.close()  # the database goes away under the writer
        responses = [httpx.post(rig.url + "/v1/chat/completions", json=CHAT) for _ in range(5)]
        sidecar_state(rig.app).writer.flush(patient(30))
        metrics = rig.metrics()
    assert {r.status_code for r in responses} == {200}
    assert metrics[("headroom_log_rows_dropped_total", (("reason", "db_error"),))] == 5


def test_restart_keeps_every_row_and_duplicates_are_ignored(tmp_path):
    path = tmp_path / "log.duckdb"
    with sidecar_rig(tmp_path) as rig:
        for _ in range(7):
            httpx.post(rig.url + "/v1/chat/completions", json=CHAT)
    with sidecar_rig(tmp_path) as rig:  # same file, new process state
        httpx.post(rig.url + "/v1/chat/completions", json=CHAT)
        assert len(rig.rows()) == 8
    store = RequestStore(path)
    assert store.insert_rows(store.query_dicts("SELECT * FROM requests")) == 0
    assert store.count() == 8
    store.close()


def test_version_1_database_is_migrated_without_losing_rows(tmp_path):
    path = str(tmp_path / "old.duckdb")
    con = duckdb.connect(path)
    MIGRATIONS[0](con)  # a version-1 file: what the first migration creates
    con.execute(
        "INSERT INTO requests (request_id, model, outcome, e2e_s) "
        "SELECT 'old' || i, 'm', 'ok', i FROM range(1000) t(i)"
    )
    con.close()
    store = RequestStore(path)
    assert store.migrated_from == 1
    assert store.count() == 1000
    columns = [
        r[0]
        for r in store.query(
            "SELECT column_name FROM information_schema.columns WHERE table_name = 'requests'"
        )
    ]
    assert set(columns) == set(COLUMN_NAMES)
    assert store.query("SELECT version FROM headroom_schema") == [(SCHEMA_VERSION,)]
    store.insert_rows([{"request_id": "new", "kv_usage_at_admit": 0.5, "cached_prompt_tokens": 3}])
    assert store.query("SELECT sum(e2e_s), count(*) FROM requests") == [(499500.0, 1001)]
    store.close()
    assert RequestStore(path).migrated_from == SCHEMA_VERSION  # second open: nothing to do


def test_version_6_probe_rows_get_their_level_rate_and_warmup_from_the_old_request_ids(tmp_path):
    path = str(tmp_path / "v6.duckdb")
    con = duckdb.connect(path)
    for migration in MIGRATIONS[:6]:
        migration(con)
    con.execute("CREATE TABLE headroom_schema (version INTEGER)")
    con.execute("INSERT INTO headroom_schema VALUES (6)")
    old_ids = [
        ("probe-r1-c0008-000012", "probe"),  # closed loop, level 8, measured
        ("probe-r1-c0016-000013-w", "probe"),  # closed loop, level 16, warm-up
        ("probe-r1-o0002500-000014", "probe"),  # open loop, 2.5 requests/s
        ("probe-r1-o0002500-000015-w", "probe"),
        ("probe-r1-c0008-000016", "traffic"),  # looks like one, but is traffic: untouched
        ("probe-r1-000017", "probe"),  # no level in it: untouched
    ]
    con.executemany("INSERT INTO requests (request_id, source) VALUES (?, ?)", old_ids)
    con.close()
    store = RequestStore(path)
    assert store.migrated_from == 6
    assert store.query(
        "SELECT request_id, probe_level, probe_rate_per_s, probe_warmup FROM requests ORDER BY request_id"
    ) == [
        ("probe-r1-000017", None, None, None),
        ("probe-r1-c0008-000012", 8, None, False),
        ("probe-r1-c0008-000016", None, None, None),
        ("probe-r1-c0016-000013-w", 16, None, True),
        ("probe-r1-o0002500-000014", None, 2.5, False),
        ("probe-r1-o0002500-000015-w", None, 2.5, True),
    ]


def test_newer_database_is_refused_with_a_clear_error(tmp_path):
    path = str(tmp_path / "future.duckdb")
    RequestStore(path).close()
    con = duckdb.connect(path)
    con.execute("UPDATE headroom_schema SET version = 99")
    con.close()
    with pytest.raises(RuntimeError, match="newer than this program"):
        RequestStore(path)


def test_headroom_run_starts_the_scheduled_jobs_on_the_in_process_store(tmp_path):
    from collector.serving import serve_in_thread
    from collector.sidecar.config import SidecarConfig
    from collector.sidecar.wiring import build_sidecar

    config = SidecarConfig(upstream="http://127.0.0.1:9", db_path=str(tmp_path / "h.duckdb"), engine="none")
    app = build_sidecar(config)
    handle = serve_in_thread(app)
    try:
        scheduler = sidecar_state(app).scheduler
        assert scheduler.running
        names = {job.id for job in scheduler.get_jobs()}
        assert names == {"rollup", "retention", "capacity_estimates", "probe_runs", "weekly_report"}
    finally:
        handle.stop()
    assert not scheduler.running


@pytest.mark.subprocess
def test_a_db_sidecar_loads_no_aiohttp(tmp_path):
    """`headroom run --db` builds its jobs (the estimates' refresh, collector.analysis.refresh ->
    estimate -> openloop) without loading aiohttp: only the probe, which sends, needs its client."""
    code = (
        "import sys\n"
        "import collector.sidecar.wiring\n"
        "assert 'aiohttp' not in sys.modules, 'importing the wiring loaded aiohttp'\n"
        "from collector.sidecar.config import SidecarConfig\n"
        "from collector.sidecar.wiring import build_sidecar, sidecar_state\n"
        f"app = build_sidecar(SidecarConfig(upstream='http://127.0.0.1:9', db_path={str(tmp_path / 'h.duckdb')!r},"
        " engine='none'))\n"
        "assert sidecar_state(app).scheduler is not None  # the jobs were built\n"
        "print(sorted(m for m in ('collector.analysis.refresh', 'collector.analysis.openloop') if m in sys.modules))\n"
        "print(sorted(m for m in sys.modules if m.split('.')[0] in ('aiohttp', 'yarl')))\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=patient(120))
    assert done.returncode == 0, done.stderr[-2000:]
    jobs_modules, http_clients = done.stdout.splitlines()
    assert jobs_modules == "['collector.analysis.openloop', 'collector.analysis.refresh']"  # the chain loaded
    assert http_clients == "[]"


class _Fatal(BaseException):
    """Not an Exception: what a KeyboardInterrupt-like error from a sink's C extension looks like."""


class _FatalOnce:
    def __init__(self):
        self.rows = []
        self.raised = False

    def write_batch(self, rows):
        if not self.raised:
            self.raised = True
            raise _Fatal("sink died")
        self.rows += rows


def test_a_sink_raising_baseexception_does_not_kill_the_writer():
    registry = CollectorRegistry()
    sink = _FatalOnce()
    writer = LogWriter(sink, registry, batch_rows=10)
    writer.submit(_rows(1)[0])
    assert writer.flush(patient(5))
    for row in _rows(20, prefix="later"):
        writer.submit(row)
    writer.close()
    assert len(sink.rows) == 20  # the thread survived and wrote everything after the failure
    assert registry.get_sample_value("headroom_log_rows_dropped_total", {"reason": "db_error"}) == 1


def test_close_and_flush_are_bounded_when_the_sink_is_stuck_and_the_queue_full():
    sink = _Blocked()
    writer = LogWriter(sink, CollectorRegistry(), max_queue_rows=5, batch_rows=1)
    for row in _rows(20):
        writer.submit(row)
    assert writer.flush(0.2) is False  # a full queue answers "not flushed", it does not raise
    done = threading.Event()
    closer = threading.Thread(target=lambda: (writer.close(timeout_s=0.5), done.set()), daemon=True)
    closer.start()
    assert done.wait(5), "close() blocked past its timeout on a full queue"
    sink.gate.set()


@pytest.mark.parametrize("kind", ["newer", "not-duckdb"])
def test_headroom_run_names_a_bad_db_and_what_to_do(tmp_path, kind):
    from click.testing import CliRunner

    from collector.sidecar.cli import run

    path = tmp_path / "h.duckdb"
    if kind == "newer":
        RequestStore(path).close()
        con = duckdb.connect(str(path))
        con.execute("UPDATE headroom_schema SET version = 99")
        con.close()
    else:
        path.write_text("these are not the rows you are looking for\n" * 100)
    result = CliRunner().invoke(
        run, ["--upstream", "http://127.0.0.1:9", "--db", str(path), "--engine", "none", "--no-jobs"]
    )
    assert result.exit_code == 1 and isinstance(result.exception, (SystemExit, type(None)))
    assert "Traceback" not in result.output
    assert f"cannot open --db {path}" in result.output
    assert ("upgrade llm-headroom" if kind == "newer" else "a new path") in result.output


def test_one_out_of_range_value_does_not_lose_the_batch():
    store = RequestStore()
    rows = _rows(3) + [
        {
            "request_id": "huge",
            "max_tokens": 99_999_999_999,
            "prompt_tokens": -(2**40),
            "e2e_s": "1.5",
            "stream": "yes",
        }
    ]
    with pytest.raises((pa.ArrowInvalid, pa.ArrowTypeError, OverflowError, TypeError, ValueError)):
        store.insert_rows(rows)  # strict by default: the store's ingest answers such rows 400
    store.write_batch(rows)  # the sidecar's writer path: the other rows of the batch are kept
    assert store.count() == 4
    assert store.query("SELECT max_tokens, prompt_tokens, e2e_s FROM requests WHERE request_id = 'huge'") == [
        (None, None, None)
    ]  # NULL, not a lost batch
    store.close()


def test_client_max_tokens_beyond_the_column_is_not_recorded_as_garbage():
    from collector.sidecar.requests import parse_request

    assert parse_request(b'{"model":"m","max_tokens":99999999999}').max_tokens is None
    assert parse_request(b'{"model":"m","max_tokens":-5}').max_tokens is None
    assert parse_request(b'{"model":"m","max_completion_tokens":64}').max_tokens == 64


def test_many_rows_convert_in_slices_into_one_table_with_the_same_values():
    """Over 5,000 rows are converted 5,000 at a time (a bounded hold on the interpreter);
    the table has every row, in order, and a bad value nulls only itself, even in a later slice."""
    from collector.store.db import rows_to_arrow

    rows = _rows(12_001)
    rows[7_000] = {**rows[7_000], "max_tokens": 2**40}  # past INTEGER, in the second slice
    table = rows_to_arrow(rows, lenient=True)
    assert table.num_rows == 12_001 and table.column("request_id").num_chunks == 3
    assert table.column("request_id").to_pylist() == [row["request_id"] for row in rows]
    assert table.column("max_tokens").null_count == 12_001  # the one bad value too, alone
    assert table.column("e2e_s").to_pylist()[11_999] == pytest.approx(1_199.9)
    with pytest.raises((pa.ArrowInvalid, OverflowError)):
        rows_to_arrow(rows)  # strict: the whole batch is refused, as before
