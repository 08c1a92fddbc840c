"""A store outage under load, through the real path: client -> sidecar (build_sidecar, StoreShipper
with its default retry/backoff/spool settings) -> a `headroom store` process that is stopped with
SIGTERM and restarted on the same port and DuckDB file. Every request the sidecar answered must end
up as exactly one row in the store, and the sidecar must count no dropped row.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import duckdb
import httpx
from prometheus_client.parser import text_string_to_metric_families

from collector.serving import serve_in_thread
from collector.sidecar.config import SidecarConfig
from collector.sidecar.wiring import build_sidecar
from collector.store.shipper import StoreShipper
from conftest import free_port
from fake_upstream import FakeUpstream

TOKEN = "outage-token"
MAX_REQUESTS = 2_000  # hard cap on the load, whatever the timings
DROP_REASONS = ("queue_full", "db_error", "spool_full", "store_rejected")


def _headroom() -> list[str]:
    """The installed `headroom` console script next to this interpreter (else the module)."""
    script = Path(sys.executable).with_name("headroom")
    return [str(script)] if script.exists() else [sys.executable, "-c", "from collector.cli import main; main()"]


class StoreProcess:
    """`headroom store` as a child process; the token comes from HEADROOM_TOKEN."""

    def __init__(self, db: Path, port: int, log: Path) -> None:
        self.db, self.port, self.log = db, port, log
        self.url = f"http://127.0.0.1:{port}"
        self.process: subprocess.Popen | None = None

    def start(self, timeout_s: float = 30.0) -> None:
        env = os.environ | {"HEADROOM_TOKEN": TOKEN}
        with self.log.open("ab") as log:
            self.process = subprocess.Popen(
                [*_headroom(), "store", "--db", str(self.db), "--listen", f"127.0.0.1:{self.port}", "--no-jobs"],
                env=env, stdout=log, stderr=subprocess.STDOUT)
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            assert self.process.poll() is None, f"headroom store exited: {self.log.read_text()}"
            try:
                if httpx.get(f"{self.url}/healthz", timeout=1).status_code == 200:
                    return
            except httpx.HTTPError:
                pass
            time.sleep(0.05)  # /healthz has no event to await: poll it
        self.process.kill()
        raise AssertionError(f"headroom store did not answer /healthz within {timeout_s} s: {self.log.read_text()}")

    def stop(self) -> int:
        """SIGTERM, then wait for the exit; returns the exit code."""
        assert self.process is not None
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
            try:
                self.process.wait(20)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait(10)
        return self.process.returncode

    def rows_via_api(self) -> int | None:
        """Rows in the store, from the token-protected query API; None while it is unreachable."""
        try:
            response = httpx.get(f"{self.url}/v1/query/outcomes", timeout=5,
                                 headers={"Authorization": f"Bearer {TOKEN}"})
        except httpx.HTTPError:
            return None
        assert response.status_code == 200, response.text
        return sum(row["n"] for row in response.json()["rows"])


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
                    body = {"model": "m1", "stream": index % 2 == 0,
                            "messages": [{"role": "user", "content": f"question {index}"}]}
                    response = client.post(f"{self.url}/v1/chat/completions", json=body,
                                           headers={"X-Tenant-ID": f"team-{index % 3}"})
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


def _wait_for(predicate, timeout_s: float, what: str):
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(0.05)
    raise AssertionError(f"{what}: not reached within {timeout_s} s")


def _dropped_by_reason(sidecar_url: str) -> dict[str, float]:
    text = httpx.get(f"{sidecar_url}/metrics", timeout=5).text
    families = {family.name: family for family in text_string_to_metric_families(text)}
    assert "headroom_log_rows_dropped" in families, "the sidecar must expose headroom_log_rows_dropped_total"
    dropped = dict.fromkeys(DROP_REASONS, 0.0)
    for sample in families["headroom_log_rows_dropped"].samples:
        if sample.name == "headroom_log_rows_dropped_total":
            dropped[sample.labels["reason"]] = dropped.get(sample.labels["reason"], 0.0) + sample.value
    written = sum(sample.value for sample in families["headroom_log_rows_written"].samples
                  if sample.name == "headroom_log_rows_written_total")
    return dropped | {"<written>": written}


def test_store_process_down_under_load_then_back_every_answered_request_arrives(tmp_path):
    began = time.monotonic()
    db, spool = tmp_path / "fleet.duckdb", tmp_path / "spool"
    store = StoreProcess(db, free_port(), tmp_path / "store.log")
    store.start()
    upstream = serve_in_thread(FakeUpstream(), timeout_graceful_shutdown=1)
    config = SidecarConfig(upstream=upstream.url, db_path=None, instance="edge-1", store_url=store.url,
                           store_token=TOKEN, spool_dir=str(spool), jobs=False)
    app = build_sidecar(config)
    shipper = app.state.batch_sink
    assert isinstance(shipper, StoreShipper)
    # the shipper's defaults are what `headroom run --store-url` uses; nothing is tuned here
    assert (shipper.max_attempts, shipper.backoff_initial_s, shipper.backoff_max_s) == (3, 0.2, 10.0)
    sidecar = serve_in_thread(app, timeout_graceful_shutdown=5)
    load = Load(sidecar.url)
    timeline: dict[str, float] = {}
    try:
        load.start()
        _wait_for(lambda: (store.rows_via_api() or 0) >= 20, 15, "rows reaching the live store")
        timeline["answered_before_stop"] = load.answered

        assert store.stop() is not None  # SIGTERM; it exited
        timeline["stopped_at_s"] = time.monotonic() - began
        answered_at_stop = load.answered
        # the outage lasts until >= 100 requests answered since the stop have been spooled to disk
        _wait_for(lambda: load.answered >= answered_at_stop + 100 and shipper.spooled_rows >= 100, 20,
                  "requests answered and rows spooled while the store is down")
        assert any(spool.iterdir()), "the outage should have left batches in the spool directory"
        timeline["spooled_rows_at_restart"] = shipper.spooled_rows

        store.start()  # same port, same DuckDB file, load still running
        timeline["restarted_at_s"] = time.monotonic() - began
        answered_at_restart = load.answered
        _wait_for(lambda: load.answered >= answered_at_restart + 50, 15, "load continuing after the restart")
        load.stop()
        assert not load.errors, load.errors
        answered = load.answered

        _wait_for(lambda: store.rows_via_api() == answered, 25,
                  f"the store holding all {answered} answered requests")
        timeline["all_rows_at_s"] = time.monotonic() - began
        dropped = _dropped_by_reason(sidecar.url)
    finally:
        load.stop()
        sidecar.stop()
        upstream.stop()
        shipper.close()
        store.stop()
    with duckdb.connect(str(db), read_only=True) as con:
        total, distinct, tenants, instances = con.execute(
            "SELECT count(*), count(DISTINCT request_id), count(DISTINCT tenant), min(instance) "
            "FROM requests").fetchone()
    print(f"\noutage test: {answered} answered, timeline {timeline}, spooled {shipper.spooled_rows}, "
          f"replayed {shipper.replayed_rows}, total {time.monotonic() - began:.1f} s")
    assert load.statuses == [200] * answered, "the sidecar must keep answering while the store is down"
    assert dropped == dict.fromkeys(DROP_REASONS, 0.0) | {"<written>": float(answered)}
    assert shipper.spooled_rows >= 100 and shipper.replayed_rows == shipper.spooled_rows
    assert (total, distinct, tenants, instances) == (answered, answered, 3, "edge-1")
    assert list(spool.iterdir()) == []
