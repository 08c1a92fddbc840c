"""The spool catches up while load continues: a 30 s store outage under steady load, through the
real path: client -> sidecar (build_sidecar, StoreShipper with its default settings) -> a
`headroom store` process stopped with SIGTERM and restarted on the same port and DuckDB file.

Once the store is back, the spool must empty within DRAIN_LIMIT_S (docs/store.md, "Shipping and
the spool": the replay thread's longest backoff, 10 s, plus the merged replay) while the load goes
on, every answered request must end up as exactly one row, no row may be counted dropped, and the
shipping-health metrics must show the spool rising during the outage and falling after it.
"""

from __future__ import annotations

import threading
import time

import duckdb
import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families
from support.processes import HeadroomProcess
from support.upstream import FakeUpstream
from support.waiting import wait_until

from collector.serving import serve_in_thread
from collector.sidecar.config import SidecarConfig
from collector.sidecar.wiring import build_sidecar
from collector.store.shipper import StoreShipper

pytestmark = [pytest.mark.slow, pytest.mark.subprocess]

TOKEN = "outage-token"
OUTAGE_S = 30.0  # the scenario's length, not a synchronisation
DRAIN_LIMIT_S = 20.0  # documented: 10 s longest backoff + the merged replay, with margin
MAX_REQUESTS = 20_000  # hard cap on the load, whatever the timings
DROP_REASONS = ("queue_full", "db_error", "spool_full", "store_rejected")


class Load:
    """Sequential proxied chat completions from a thread until stopped (or MAX_REQUESTS)."""

    def __init__(self, url: str) -> None:
        self.url = url
        self.statuses: list[int] = []
        self.errors: list[BaseException] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="outage-load", daemon=True)

    def _run(self) -> None:
        try:
            with httpx.Client(timeout=30) as client:
                while not self._stop.is_set() and len(self.statuses) < MAX_REQUESTS:
                    index = len(self.statuses)
                    body = {
                        "model": "m1",
                        "stream": index % 2 == 0,
                        "messages": [{"role": "user", "content": f"question {index}"}],
                    }
                    response = client.post(
                        f"{self.url}/v1/chat/completions",
                        json=body,
                        headers={"X-Tenant-ID": f"team-{index % 3}"},
                    )
                    response.read()
                    self.statuses.append(response.status_code)
                    self._stop.wait(0.01)  # pacing: about 50-100 requests a second, not a sync point
        except BaseException as exc:  # surfaced by the test
            self.errors.append(exc)

    @property
    def answered(self) -> int:
        return len(self.statuses)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(30)
        assert not self._thread.is_alive(), "load thread did not stop"


def _samples(sidecar_url: str) -> dict[str, float]:
    """{sample name or name{reason}: value} of the pipeline metrics."""
    text = httpx.get(f"{sidecar_url}/metrics", timeout=5).text
    found: dict[str, float] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            key = sample.name + (f"{{{sample.labels['reason']}}}" if "reason" in sample.labels else "")
            found[key] = found.get(key, 0.0) + sample.value
    return found


def _store_rows(store: HeadroomProcess) -> int | None:
    """Rows in the store, from the token-protected query API; None while it is unreachable."""
    try:
        response = httpx.get(
            f"{store.url}/v1/query/outcomes", timeout=5, headers={"Authorization": f"Bearer {TOKEN}"}
        )
    except httpx.HTTPError:
        return None
    assert response.status_code == 200, response.text
    return sum(row["n"] for row in response.json()["rows"])


def test_spool_drains_while_load_continues_after_a_30_s_outage(tmp_path):
    db, spool = tmp_path / "fleet.duckdb", tmp_path / "spool"
    store = HeadroomProcess(
        "store",
        "--db",
        str(db),
        "--no-jobs",
        health="/healthz",
        log=tmp_path / "store.log",
        env={"HEADROOM_TOKEN": TOKEN},
    ).start()
    upstream = FakeUpstream()
    config = SidecarConfig(
        upstream=upstream.url,
        db_path=None,
        instance="edge-1",
        store_url=store.url,
        store_token=TOKEN,
        spool_dir=str(spool),
        jobs=False,
    )
    app = build_sidecar(config)
    shipper = app.state.batch_sink
    assert isinstance(shipper, StoreShipper)
    sidecar = serve_in_thread(app, timeout_graceful_shutdown=5)
    load = Load(sidecar.url)
    timeline: list[tuple[float, float, float]] = []  # (t, spool files, ship lag) through the run
    began = time.monotonic()

    def sample() -> dict[str, float]:
        now = _samples(sidecar.url)
        timeline.append(
            (time.monotonic() - began, now["headroom_log_spool_files"], now["headroom_log_ship_lag_seconds"])
        )
        return now

    try:
        load.start()
        wait_until(lambda: (_store_rows(store) or 0) >= 20, 15, what="rows reaching the live store")
        assert store.stop() is not None  # SIGTERM; it exited
        outage_ends = time.monotonic() + OUTAGE_S
        while time.monotonic() < outage_ends:
            sample()
            time.sleep(1.0)  # sampling the metrics through the outage: the scenario's clock
        during = sample()
        assert during["headroom_store_up"] == 0 and during["headroom_log_spool_files"] > 0
        assert during["headroom_log_ship_lag_seconds"] >= OUTAGE_S / 2

        store.start()  # same port, same DuckDB file, load still running
        back = time.monotonic()
        answered_at_restart = load.answered
        wait_until(
            lambda: sample()["headroom_log_spool_files"] == 0,
            DRAIN_LIMIT_S,
            what=f"the spool to empty within {DRAIN_LIMIT_S} s of the store's return",
        )
        drain_s = time.monotonic() - back
        assert load.answered > answered_at_restart, "the load must go on while the spool drains"
        wait_until(lambda: load.answered >= answered_at_restart + 200, 30, what="more load after the drain")
        after = sample()
        load.stop()
        assert not load.errors, load.errors
        answered = load.answered
        wait_until(
            lambda: _store_rows(store) == answered,
            30,
            what=f"the store holding all {answered} answered requests",
        )
        final = _samples(sidecar.url)
    finally:
        load.stop()
        sidecar.stop()
        upstream.stop()
        shipper.close()
        store.stop()
    with duckdb.connect(str(db), read_only=True) as con:
        total, distinct, tenants = con.execute(
            "SELECT count(*), count(DISTINCT request_id), count(DISTINCT tenant) FROM requests"
        ).fetchone()
    peak = max(files for _, files, _ in timeline)
    print(
        f"\noutage: {answered} answered, spool peak {peak:.0f} files, drained in {drain_s:.1f} s, "
        f"spooled {shipper.spooled_rows}, replayed {shipper.replayed_rows}"
    )
    assert load.statuses == [200] * answered, "the sidecar must keep answering while the store is down"
    assert all(final.get(f"headroom_log_rows_dropped_total{{{reason}}}", 0.0) == 0 for reason in DROP_REASONS)
    assert final["headroom_log_rows_written_total"] == answered  # spooled rows counted once accepted
    assert after["headroom_store_up"] == 1 and after["headroom_log_spool_files"] == 0
    assert peak > 0 and timeline[-1][1] == 0  # depth rose, then fell
    assert shipper.spooled_rows > 0 and shipper.replayed_rows == shipper.spooled_rows
    assert (total, distinct, tenants) == (answered, answered, 3)
    assert list(spool.iterdir()) == []
