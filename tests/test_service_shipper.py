"""StoreShipper: retry, bounded spool, replay; and a real `headroom store` process restarted under load."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from datetime import datetime, timezone

import httpx
import pytest

from collector.store.shipper import StoreShipper
from collector.store.synthetic import synthetic_rows
from collector.store.writer import RowsDropped
from conftest import free_port

T0 = datetime(2026, 11, 23, tzinfo=timezone.utc)
FAST = {"max_attempts": 2, "backoff_initial_s": 0.02, "backoff_max_s": 0.2, "timeout_s": 5.0}


class FakeStore:
    """An httpx transport standing in for the store: up or down, remembers request_ids."""

    def __init__(self) -> None:
        self.up, self.status, self.ids, self.lock = True, 200, set(), threading.Lock()

    def __call__(self, request: httpx.Request) -> httpx.Response:
        if not self.up:
            raise httpx.ConnectError("connection refused", request=request)
        if self.status != 200:
            return httpx.Response(self.status, json={"detail": "no"})
        import orjson
        rows = orjson.loads(request.content)["rows"]
        with self.lock:
            self.ids.update(row["request_id"] for row in rows)
        return httpx.Response(200, json={"received": len(rows)})


def _wait_for(condition, timeout_s: float, what: str) -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout_s} s waiting for {what}")
        time.sleep(0.05)


def test_outage_spools_then_replays_every_row(tmp_path):
    fake = FakeStore()
    shipper = StoreShipper("http://store", "t", tmp_path / "spool", transport=httpx.MockTransport(fake), **FAST)
    rows = synthetic_rows(300, T0)
    shipper.write_batch(rows[:100])
    fake.up = False
    shipper.write_batch(rows[100:200])
    shipper.write_batch(rows[200:])
    assert shipper.spool.rows() == 200 and len(fake.ids) == 100
    fake.up = True
    _wait_for(lambda: not shipper.spool.files(), 20, "the spool to drain")
    shipper.close()
    assert fake.ids == {row["request_id"] for row in rows}
    assert (shipper.sent_rows, shipper.spooled_rows, shipper.replayed_rows) == (100, 200, 200)


def test_full_spool_raises_rows_dropped_and_keeps_what_fits(tmp_path):
    fake = FakeStore()
    fake.up = False
    shipper = StoreShipper("http://store", "t", tmp_path / "spool", transport=httpx.MockTransport(fake),
                           max_spool_bytes=60_000, **FAST)
    kept = dropped = 0
    for start in range(0, 400, 50):
        try:
            shipper.write_batch(synthetic_rows(50, T0, prefix=f"b{start}"))
            kept += 50
        except RowsDropped as exc:
            assert exc.reason == "spool_full" and exc.count == 50
            dropped += 50
    assert kept > 0 and dropped > 0 and kept + dropped == 400
    assert shipper.spool.rows() == kept and shipper.spool.size_bytes() <= 60_000
    shipper.close()


def test_rejected_batch_is_dropped_not_retried_forever(tmp_path):
    fake = FakeStore()
    fake.status = 400
    shipper = StoreShipper("http://store", "t", tmp_path / "spool", transport=httpx.MockTransport(fake), **FAST)
    with pytest.raises(RowsDropped) as caught:
        shipper.write_batch(synthetic_rows(5, T0))
    assert caught.value.reason == "store_rejected" and not shipper.spool.files()
    shipper.close()


def _start_store(db, port: int, token: str) -> subprocess.Popen:
    command = [sys.executable, "-c", "from collector.cli import main; main()", "store", "--db", str(db),
               "--listen", f"127.0.0.1:{port}", "--token", token, "--no-jobs"]
    process = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        assert process.poll() is None, process.stderr.read().decode()
        try:
            if httpx.get(f"http://127.0.0.1:{port}/healthz", timeout=1).status_code == 200:
                return process
        except httpx.HTTPError:
            time.sleep(0.1)
    process.kill()
    raise AssertionError("headroom store did not answer /healthz within 60 s")


def _stop(process: subprocess.Popen) -> None:
    process.send_signal(signal.SIGTERM)
    try:
        process.wait(30)
    except subprocess.TimeoutExpired:
        process.kill()
        process.wait(10)


def test_real_store_process_stopped_and_restarted_under_load_loses_no_row(tmp_path):
    db, port, token = tmp_path / "fleet.duckdb", free_port(), "restart-token"
    process = _start_store(db, port, token)
    shipper = StoreShipper(f"http://127.0.0.1:{port}", token, tmp_path / "spool", **FAST)
    rows = synthetic_rows(1200, T0)
    batches_done = []

    def load() -> None:  # the sidecar's LogWriter: a batch every 20 ms, whatever the store does
        for start in range(0, len(rows), 30):
            shipper.write_batch(rows[start:start + 30])
            batches_done.append(start)
            time.sleep(0.02)

    writer = threading.Thread(target=load)
    writer.start()
    try:
        _wait_for(lambda: len(batches_done) >= 8, 60, "some batches to be sent")
        _stop(process)
        _wait_for(lambda: shipper.spooled_rows >= 150 or not writer.is_alive(), 60, "rows to be spooled")
        process = _start_store(db, port, token)
        writer.join(120)
        _wait_for(lambda: not shipper.spool.files(), 60, "the spool to drain into the restarted store")
        health = httpx.get(f"http://127.0.0.1:{port}/healthz", timeout=5).json()
        outcomes = httpx.get(f"http://127.0.0.1:{port}/v1/query/outcomes", timeout=5,
                             headers={"Authorization": f"Bearer {token}"}).json()["rows"]
    finally:
        shipper.close()
        _stop(process)
    assert shipper.spooled_rows >= 150, "the outage should have sent rows to the spool"
    assert health["rows"] == len(rows) == sum(row["n"] for row in outcomes)
    assert os.listdir(tmp_path / "spool") == []


def test_spool_survives_a_restart_of_the_shipper(tmp_path):
    fake = FakeStore()
    fake.up = False
    first = StoreShipper("http://store", "t", tmp_path / "spool", transport=httpx.MockTransport(fake), **FAST)
    first.write_batch(synthetic_rows(40, T0))
    first.close()
    assert first.spool.rows() == 40  # the sidecar stopped while the store was down
    fake.up = True
    second = StoreShipper("http://store", "t", tmp_path / "spool", transport=httpx.MockTransport(fake), **FAST)
    assert second.spool.size_bytes() > 0
    _wait_for(lambda: not second.spool.files(), 20, "the spool left by the previous run to drain")
    second.close()
    assert len(fake.ids) == 40 and second.spool.size_bytes() == 0
