"""A connection the engine closed is not a failure: the sidecar and the probe retry once on a new
connection when a reused pooled connection fails before any response byte, count the retry, and
retry nothing else (a new connection that fails, a 429)."""

from __future__ import annotations

import asyncio

import httpx
import pytest
from support.sidecar import CHAT
from support.upstream import FakeUpstream
from support.waiting import patient

from collector.analysis.probe import ProbeSettings, run_probe
from collector.serving import serve_in_thread
from collector.sidecar.config import SidecarConfig
from collector.sidecar.wiring import build_sidecar, sidecar_state

REQUESTS = 8


@pytest.fixture
def sidecar(tmp_path):
    started = []

    def start(upstream: FakeUpstream):
        app = build_sidecar(
            SidecarConfig(
                upstream=upstream.url,
                engine="none",
                db_path=str(tmp_path / "log.duckdb"),
                instance="test",
                read_timeout_s=5,
            )
        )
        handle = serve_in_thread(app, timeout_graceful_shutdown=2)
        started.append(handle)
        return app, handle

    yield start
    for handle in started:
        handle.stop()


def _rows(app) -> list[dict]:
    assert sidecar_state(app).writer.flush(patient(30))
    return sidecar_state(app).batch_sink.query_dicts("SELECT * FROM requests ORDER BY admitted_at")


def _retries(url: str) -> float:
    text = httpx.get(url + "/metrics").text
    return sum(
        float(line.rsplit(" ", 1)[1])
        for line in text.splitlines()
        if line.startswith("headroom_upstream_retries_total{")
    )


def test_sidecar_turns_a_stale_pooled_connection_into_a_retry_not_a_502(sidecar):
    upstream = FakeUpstream(one_request_per_connection=True)
    app, handle = sidecar(upstream)
    try:
        with httpx.Client(timeout=patient(10)) as client:
            answers = [client.post(handle.url + "/v1/chat/completions", json=CHAT) for _ in range(REQUESTS)]
        assert [a.status_code for a in answers] == [200] * REQUESTS
        assert all(a.text.rstrip().endswith("data: [DONE]") for a in answers)
        assert upstream.requests_read == REQUESTS  # each reached the engine exactly once
        rows = _rows(app)
        assert [r["outcome"] for r in rows] == ["ok"] * REQUESTS
        retried = sum(r["upstream_retries"] for r in rows)
        assert retried >= REQUESTS // 2 - 1  # every other request found the pooled socket dead
        assert _retries(handle.url) == retried
    finally:
        upstream.stop()


def test_a_failure_on_a_new_connection_is_not_retried(sidecar):
    upstream = FakeUpstream(drop_fresh=True)  # reads each request, then hangs up
    app, handle = sidecar(upstream)
    try:
        answers = [
            httpx.post(handle.url + "/v1/chat/completions", json=CHAT, timeout=patient(10)) for _ in range(3)
        ]
        assert [a.status_code for a in answers] == [502] * 3
        assert upstream.requests_read == 3  # never sent twice: the engine may have seen it
        rows = _rows(app)
        assert [(r["outcome"], r["upstream_retries"]) for r in rows] == [("upstream_error", 0)] * 3
        assert _retries(handle.url) == 0
    finally:
        upstream.stop()


def test_a_429_is_never_retried(sidecar):
    upstream = FakeUpstream(one_request_per_connection=True, status=429)
    app, handle = sidecar(upstream)
    try:
        with httpx.Client(timeout=patient(10)) as client:
            answers = [client.post(handle.url + "/v1/chat/completions", json=CHAT) for _ in range(4)]
        assert [a.status_code for a in answers] == [429] * 4
        assert upstream.requests_read == 4
        assert {r["outcome"] for r in _rows(app)} == {"rate_limited"}
    finally:
        upstream.stop()


def test_probe_straight_at_a_one_shot_engine_fails_no_request():
    upstream = FakeUpstream(one_request_per_connection=True)
    try:
        settings = ProbeSettings(
            url=upstream.url,
            levels=(1, 2),
            max_tokens=3,
            min_samples=6,
            max_samples=6,
            warmup_per_worker=0,
            engine_metrics="none",
        )
        written: list[dict] = []
        result = asyncio.run(run_probe(settings, write_rows=written.extend))
        assert [r["outcome"] for r in written] == ["ok"] * len(written)
        assert upstream.requests_read == len(written)
        assert sum(r["upstream_retries"] for r in written) >= 2
        assert all(lv.stats.error_ratio == 0 for lv in result.levels)
    finally:
        upstream.stop()
