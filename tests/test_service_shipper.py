"""StoreShipper against a fake store: retry, bounded spool, merged replay, health metrics, file modes.

The real `headroom store` stopped and restarted under load is tests/test_service_outage.py."""

from __future__ import annotations

import stat
import threading
from datetime import UTC, datetime

import httpx
import orjson
import pyarrow as pa
import pytest
from fastapi import HTTPException
from prometheus_client import CollectorRegistry
from support.waiting import wait_until

from collector.service.ingest import parse_arrow_batch, parse_batch
from collector.store.db import ARROW_STREAM_TYPE, rows_to_ipc
from collector.store.shipper import StoreShipper, merge_arrow_payloads
from collector.store.spool import JSON
from collector.store.synthetic import synthetic_rows
from collector.store.writer import LogWriter, RowsDropped

T0 = datetime(2026, 11, 23, tzinfo=UTC)
FAST = {"max_attempts": 2, "backoff_initial_s": 0.02, "backoff_max_s": 0.2, "timeout_s": 5.0}


class FakeStore:
    """An httpx transport standing in for the store: up or down, remembers request_ids and POSTs."""

    def __init__(self) -> None:
        self.up, self.status, self.ids, self.lock = True, 200, set(), threading.Lock()
        self.posts: list[int] = []  # rows per accepted POST
        self.kinds: list[str] = []  # the Content-Type of each accepted POST
        self.reject_marker: str | None = None  # a POST holding this request_id gets 400

    def __call__(self, request: httpx.Request) -> httpx.Response:
        if not self.up:
            raise httpx.ConnectError("connection refused", request=request)
        if self.status != 200:
            return httpx.Response(self.status, json={"detail": "no"})
        kind = request.headers.get("content-type", "")
        try:  # the store's own validation of each kind of body
            if kind == ARROW_STREAM_TYPE:
                ids = parse_arrow_batch(request.content).column("request_id").to_pylist()
            else:
                ids = [record.request_id for record in parse_batch(request.content)]
        except HTTPException as exc:
            return httpx.Response(exc.status_code, json={"detail": exc.detail})
        if self.reject_marker in ids:
            return httpx.Response(400, json={"detail": "bad row"})
        with self.lock:
            self.ids.update(ids)
            self.posts.append(len(ids))
            self.kinds.append(kind)
        return httpx.Response(200, json={"received": len(ids)})


def test_outage_spools_then_replays_every_row(tmp_path):
    fake = FakeStore()
    shipper = StoreShipper(
        "http://store", "t", tmp_path / "spool", transport=httpx.MockTransport(fake), **FAST
    )
    rows = synthetic_rows(300, T0)
    shipper.write_batch(rows[:100])
    fake.up = False
    shipper.write_batch(rows[100:200])
    shipper.write_batch(rows[200:])
    assert shipper.spool.rows() == 200 and len(fake.ids) == 100
    fake.up = True
    wait_until(lambda: not shipper.spool.files(), 20, what="the spool to drain")
    shipper.close()
    assert fake.ids == {row["request_id"] for row in rows}
    assert (shipper.sent_rows, shipper.spooled_rows, shipper.replayed_rows) == (100, 200, 200)


def test_full_spool_raises_rows_dropped_and_keeps_what_fits(tmp_path):
    fake = FakeStore()
    fake.up = False
    shipper = StoreShipper(
        "http://store",
        "t",
        tmp_path / "spool",
        transport=httpx.MockTransport(fake),
        max_spool_bytes=60_000,
        **FAST,
    )
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
    shipper = StoreShipper(
        "http://store", "t", tmp_path / "spool", transport=httpx.MockTransport(fake), **FAST
    )
    with pytest.raises(RowsDropped) as caught:
        shipper.write_batch(synthetic_rows(5, T0))
    assert caught.value.reason == "store_rejected" and not shipper.spool.files()
    shipper.close()


def test_spool_survives_a_restart_of_the_shipper(tmp_path):
    fake = FakeStore()
    fake.up = False
    first = StoreShipper("http://store", "t", tmp_path / "spool", transport=httpx.MockTransport(fake), **FAST)
    first.write_batch(synthetic_rows(40, T0))
    first.close()
    assert first.spool.rows() == 40  # the sidecar stopped while the store was down
    assert first.spool.size_bytes() > 0 and not fake.ids  # on disk, nothing delivered
    fake.up = True
    second = StoreShipper(
        "http://store", "t", tmp_path / "spool", transport=httpx.MockTransport(fake), **FAST
    )
    wait_until(lambda: not second.spool.files(), 20, what="the spool left by the previous run to drain")
    second.close()
    assert len(fake.ids) == 40 and second.spool.size_bytes() == 0


def _sample(registry: CollectorRegistry, name: str) -> float | None:
    return registry.get_sample_value(name)


def test_backlog_replays_in_merged_batches_and_metrics_rise_and_fall(tmp_path):
    fake = FakeStore()
    fake.up = False
    shipper = StoreShipper(
        "http://store",
        "t",
        tmp_path / "spool",
        transport=httpx.MockTransport(fake),
        replay_batch_rows=400,
        **FAST,
    )
    registry = CollectorRegistry()
    registry.register(shipper)
    for start in range(0, 1000, 10):  # 100 small batches, as a LogWriter flushes them
        assert shipper.write_batch(synthetic_rows(10, T0, prefix=f"b{start}")) == 0  # spooled: not written
    assert _sample(registry, "headroom_log_spool_files") == 100
    assert _sample(registry, "headroom_log_rows_spooled_total") == 1000
    assert (
        _sample(registry, "headroom_store_up") == 0 and _sample(registry, "headroom_log_ship_lag_seconds") > 0
    )
    replayed = []
    shipper.on_accepted = replayed.append
    fake.up = True
    wait_until(lambda: not shipper.spool.files(), 20, what="the spool to drain")
    shipper.close()
    assert len(fake.ids) == 1000 and sum(replayed) == 1000
    assert max(fake.posts) == 400 and len(fake.posts) <= 4  # merged: 3 POSTs, not 100
    assert _sample(registry, "headroom_log_spool_files") == 0
    assert _sample(registry, "headroom_log_ship_lag_seconds") == 0
    assert _sample(registry, "headroom_store_up") == 1


def _spooled(tmp_path, fake: FakeStore, rows: int) -> StoreShipper:
    """A shipper that spooled `rows` rows in batches of 10 (ids b0-…, b10-…) while `fake` was down."""
    fake.up = False
    shipper = StoreShipper(
        "http://store", "t", tmp_path / "spool", transport=httpx.MockTransport(fake), **FAST
    )
    for start in range(0, rows, 10):
        shipper.write_batch(synthetic_rows(10, T0, prefix=f"b{start}"))
    return shipper


def test_a_rejected_merged_batch_loses_only_its_bad_file(tmp_path):
    fake = FakeStore()
    shipper = _spooled(tmp_path, fake, 50)
    fake.reject_marker = "b20-00000003"
    fake.up = True
    wait_until(lambda: not shipper.spool.files(), 20, what="the spool to drain")
    shipper.close()
    assert len(fake.ids) == 40 and not any(i.startswith("b20-") for i in fake.ids)


def test_while_the_store_is_down_batches_spool_without_waiting_on_it(tmp_path):
    fake = FakeStore()
    fake.up = False
    shipper = StoreShipper(
        "http://store", "t", tmp_path / "spool", transport=httpx.MockTransport(fake), **FAST
    )
    shipper.write_batch(synthetic_rows(5, T0, prefix="first"))  # tries, fails: now known down
    attempts_before = shipper.store_up
    shipper.write_batch(synthetic_rows(5, T0, prefix="second"))
    assert attempts_before is False and shipper.spool.rows() == 10
    shipper.close()


def test_spool_directory_and_files_are_private(tmp_path):
    fake = FakeStore()
    fake.up = False
    shipper = StoreShipper(
        "http://store", "t", tmp_path / "spool", transport=httpx.MockTransport(fake), **FAST
    )
    shipper.write_batch(synthetic_rows(5, T0))
    shipper.close()
    assert stat.S_IMODE((tmp_path / "spool").stat().st_mode) == 0o700
    assert {stat.S_IMODE(p.stat().st_mode) for p in (tmp_path / "spool").iterdir()} == {0o600}


def test_batches_ship_as_arrow_streams_the_store_accepts_with_every_value(tmp_path):
    """Live batches are Arrow IPC (what the store ingests fastest), and nothing is lost on the way."""
    fake = FakeStore()
    shipper = StoreShipper(
        "http://store", "t", tmp_path / "spool", transport=httpx.MockTransport(fake), **FAST
    )
    rows = synthetic_rows(50, T0)
    assert shipper.write_batch(rows) == 50
    shipper.close()
    assert fake.kinds == [ARROW_STREAM_TYPE] and fake.ids == {row["request_id"] for row in rows}
    shipped = parse_arrow_batch(rows_to_ipc(rows)).to_pylist()
    for sent, row in zip(shipped, rows, strict=True):
        assert {name: sent[name] for name in row} == row


def test_json_left_in_the_spool_by_an_earlier_version_still_replays(tmp_path):
    """An upgrade keeps the rows an older sidecar spooled as JSON; one body never mixes the kinds."""
    fake = FakeStore()
    fake.up = False
    shipper = StoreShipper(
        "http://store", "t", tmp_path / "spool", transport=httpx.MockTransport(fake), **FAST
    )
    old = synthetic_rows(30, T0, prefix="old")
    for start in (0, 10, 20):  # what an earlier version wrote: JSON bodies, .json files
        shipper.spool.put(orjson.dumps({"rows": old[start : start + 10]}), 10, JSON)
    shipper.write_batch(synthetic_rows(20, T0, prefix="new"))  # down: spooled as Arrow
    shipper.write_batch(synthetic_rows(20, T0, prefix="newer"))
    assert sorted(p.suffix for p in shipper.spool.files()) == [".arrow"] * 2 + [".json"] * 3
    fake.up = True
    wait_until(lambda: not shipper.spool.files(), 20, what="the spool to drain")
    shipper.close()
    assert len(fake.ids) == 70 and {row["request_id"] for row in old} <= fake.ids
    # oldest first: the three JSON files merged into one body, then the two Arrow ones into another
    assert list(zip(fake.kinds, fake.posts)) == [("application/json", 30), (ARROW_STREAM_TYPE, 40)]


def test_arrow_payloads_merge_batch_by_batch_in_order():
    first, second = synthetic_rows(3, T0, prefix="a"), synthetic_rows(2, T0, prefix="b")
    merged = pa.ipc.open_stream(merge_arrow_payloads([rows_to_ipc(first), rows_to_ipc(second)])).read_all()
    assert merged.column("request_id").to_pylist() == [row["request_id"] for row in first + second]
    with pytest.raises(pa.ArrowInvalid):
        merge_arrow_payloads([rows_to_ipc(first), b"not a stream"])


def test_a_spooled_file_that_is_not_arrow_is_discarded_alone(tmp_path):
    """A damaged .arrow file cannot be merged: the others are sent one by one and arrive."""
    fake = FakeStore()
    shipper = _spooled(tmp_path, fake, 30)
    damaged = shipper.spool.files()[1]
    damaged.write_bytes(b"\x00" * damaged.stat().st_size)
    fake.up = True
    wait_until(lambda: not shipper.spool.files(), 20, what="the spool to drain")
    shipper.close()
    assert len(fake.ids) == 20 and not any(i.startswith("b10-") for i in fake.ids)


class _HeldStore(FakeStore):
    """A FakeStore whose POSTs wait until `release` is set, counting the ones in flight."""

    def __init__(self) -> None:
        super().__init__()
        self.release, self.arrived = threading.Event(), threading.Semaphore(0)

    def __call__(self, request: httpx.Request) -> httpx.Response:
        self.arrived.release()
        assert self.release.wait(20), "the test never released the store"
        return super().__call__(request)


def test_pipelined_the_next_batch_is_handed_over_while_the_store_takes_this_one(tmp_path):
    fake = _HeldStore()
    shipper = StoreShipper(
        "http://store", "t", tmp_path / "spool", transport=httpx.MockTransport(fake), pipelined=True, **FAST
    )
    accepted: list[int] = []
    shipper.on_accepted = accepted.append
    assert shipper.write_batch(synthetic_rows(10, T0, prefix="first")) == 0  # handed over
    assert fake.arrived.acquire(timeout=20)  # the first batch is at the store, held there
    assert shipper.write_batch(synthetic_rows(20, T0, prefix="second")) == 0  # did not wait for it
    assert not fake.ids and not accepted and shipper.flush(0.05) is False
    fake.release.set()
    assert shipper.flush(20)
    assert fake.posts == [10, 20] and accepted == [10, 20]
    shipper.close()


def test_pipelined_rows_count_once_accepted_and_losses_by_reason_in_the_writer(tmp_path):
    fake = FakeStore()
    fake.reject_marker = "bad-00000000"
    shipper = StoreShipper(
        "http://store", "t", tmp_path / "spool", transport=httpx.MockTransport(fake), pipelined=True, **FAST
    )
    registry = CollectorRegistry()
    writer = LogWriter(shipper, registry, batch_rows=25, owns_sink=True)
    shipper.report_to(writer)
    for row in synthetic_rows(50, T0, prefix="good") + synthetic_rows(25, T0, prefix="bad"):
        writer.submit(row)
    assert writer.flush(20)  # waits for the sender, not only for the hand-over
    assert _sample(registry, "headroom_log_rows_written_total") == 50 and len(fake.ids) == 50
    assert registry.get_sample_value("headroom_log_rows_dropped_total", {"reason": "store_rejected"}) == 25
    writer.close()


def test_pipelined_close_with_the_store_down_spools_every_batch_handed_over(tmp_path):
    fake = FakeStore()
    fake.up = False
    shipper = StoreShipper(
        "http://store", "t", tmp_path / "spool", transport=httpx.MockTransport(fake), pipelined=True, **FAST
    )
    shipper.store_up = True  # not yet known down: the batches go to the sender
    for start in range(0, 30, 10):
        shipper.write_batch(synthetic_rows(10, T0, prefix=f"b{start}"))
    shipper.close()
    assert shipper.spool.rows() == 30 and shipper.spooled_rows == 30 and not fake.ids
