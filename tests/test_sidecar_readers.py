"""The sidecar in a real stack: liveness and readiness, its /metrics conventions, and readers of the
request log it owns (the single-box path: collector.store.owner), all on loopback."""

from __future__ import annotations

import json

import httpx
import pytest
from conftest import free_port
from prometheus_client.parser import text_string_to_metric_families
from support.sidecar import CHAT
from support.upstream import FakeUpstream
from support.waiting import patient

from collector import __version__
from collector.backtest.replay import from_db
from collector.serving import serve_in_thread
from collector.sidecar.config import SidecarConfig
from collector.sidecar.wiring import build_sidecar, sidecar_state
from collector.store.owner import OwnerError, find_owner, open_request_log, owner_file_for


@pytest.fixture
def owned(tmp_path, monkeypatch):
    """A fake engine and a sidecar that owns tmp/log.duckdb, listening where its config says."""
    monkeypatch.delenv("HEADROOM_TOKEN", raising=False)
    upstream = FakeUpstream()
    port = free_port()
    db = tmp_path / "log.duckdb"
    app = build_sidecar(
        SidecarConfig(
            upstream=upstream.url,
            engine="none",
            db_path=str(db),
            instance="box",
            jobs=False,
            listen_port=port,
        )
    )
    sidecar = serve_in_thread(app, port=port, timeout_graceful_shutdown=5)
    try:
        yield sidecar, db, app
    finally:
        sidecar.stop()
        upstream.stop()


def _samples(text: str) -> dict:
    return {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
    }


def test_metrics_carry_build_info_no_created_series_and_zero_gauges_before_any_request(owned):
    sidecar, _, _ = owned
    text = httpx.get(sidecar.url + "/metrics").text
    samples = _samples(text)
    assert samples[("headroom_build_info", (("version", __version__),))] == 1.0
    assert samples[("headroom_inflight_requests", (("model", ""), ("tenant", "")))] == 0.0
    assert samples[("headroom_active_tokens", (("model", ""), ("tenant", "")))] == 0.0
    httpx.post(sidecar.url + "/v1/chat/completions", json=CHAT, timeout=patient(10)).raise_for_status()
    text = httpx.get(sidecar.url + "/metrics").text
    assert "_created" not in text, "counters and histograms export _created series"
    assert 'headroom_inflight_requests{model="m1"' in text
    assert 'headroom_inflight_requests{model="",tenant=""}' not in text, (
        "the placeholder outlives real series"
    )


def test_readyz_follows_the_upstream_while_healthz_stays_live(tmp_path):
    upstream = FakeUpstream()
    app = build_sidecar(
        SidecarConfig(upstream=upstream.url, engine="none", db_path=None, instance="r", jobs=False)
    )
    sidecar = serve_in_thread(app, timeout_graceful_shutdown=2)
    try:
        ready = httpx.get(sidecar.url + "/readyz")
        assert ready.status_code == 200 and ready.json()["status"] == "ready"
        upstream.stop()
        down = httpx.get(sidecar.url + "/readyz", timeout=patient(10))
        assert down.status_code == 503 and "unreachable" in down.json()["reason"]
        assert httpx.get(sidecar.url + "/healthz").status_code == 200, "liveness must not follow the engine"
    finally:
        sidecar.stop()


def test_a_reader_of_the_owned_log_goes_through_the_sidecar(owned):
    sidecar, db, app = owned
    for _ in range(3):
        httpx.post(sidecar.url + "/v1/chat/completions", json=CHAT, timeout=patient(10)).raise_for_status()
    assert sidecar_state(app).writer.flush(patient(30))
    record = json.loads(owner_file_for(db).read_text())
    assert record["url"] == sidecar.url + "/headroom" and record["token"] == "file"
    owner = find_owner(db)
    assert httpx.get(owner.url + "/v1/snapshot").status_code == 401, "the snapshot needs the token"
    with open_request_log(db) as store:  # the file is locked: this is the owner's snapshot
        assert store.count() == 3
        assert {row[0] for row in store.query("SELECT model FROM requests")} == {"m1"}
    curve = httpx.get(owner.url + "/v1/query/outcomes", headers={"Authorization": f"Bearer {owner.token}"})
    assert curve.json()["rows"] == [{"outcome": "ok", "n": 3}], (
        "the store's query routes are served under /headroom"
    )


def test_the_backtest_replays_the_owned_log_through_the_sidecar(owned):
    """`headroom alerts backtest --db` while the sidecar runs: no "Could not set lock on file"."""
    sidecar, db, app = owned
    for _ in range(3):
        httpx.post(sidecar.url + "/v1/chat/completions", json=CHAT, timeout=patient(10)).raise_for_status()
    assert sidecar_state(app).writer.flush(patient(30))
    log = from_db(str(db))
    assert len(log.records) == 3 and {r.model for r in log.records} == {"m1"}


def test_owner_file_goes_with_the_sidecar_and_a_missing_owner_is_explained(owned, tmp_path):
    sidecar, db, _ = owned
    sidecar.stop()
    assert not owner_file_for(db).exists()
    with open_request_log(db) as store:  # nobody holds it now: read directly
        assert store.count() == 0
    with pytest.raises(OwnerError, match="left no readable"):
        find_owner(tmp_path / "other.duckdb")


def test_a_started_sidecar_keeps_its_start_up_objects_out_of_the_collector():
    """A full garbage collection walking start-up's ~100k objects holds the interpreter for tens
    of milliseconds (a TTFT spike for every stream); once serving, they are frozen out of it."""
    import gc

    upstream = FakeUpstream()
    app = build_sidecar(
        SidecarConfig(upstream=upstream.url, engine="none", db_path=None, instance="gc", jobs=False)
    )
    sidecar = serve_in_thread(app, timeout_graceful_shutdown=2)
    try:
        assert gc.get_freeze_count() > 10_000
        assert httpx.get(sidecar.url + "/healthz").status_code == 200
    finally:
        sidecar.stop()
        upstream.stop()
