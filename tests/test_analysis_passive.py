"""Passive curves from traffic rows: buckets, window throughput, knee with confidence, from a
list or from a RequestStore, in both calibers."""

from __future__ import annotations

from datetime import timedelta

import pytest
from support.synthetic import closed_loop_rows

from collector.analysis.passive import passive_curve
from collector.store.db import RequestStore


@pytest.fixture(scope="module")
def traffic():
    return closed_loop_rows(slots=8, levels=(1, 2, 4, 8, 16, 32), seconds_per_level=40)


def test_request_caliber_buckets_and_knee(traffic):
    curve = passive_curve(traffic, "requests")
    assert [b.concurrency for b in curve.buckets] == [1, 2, 4, 8, 16, 32]
    by = {b.concurrency: b for b in curve.buckets}
    assert sum(b.samples for b in curve.buckets) == len(traffic)
    # throughput from windows doubles below the knee and is flat after it
    assert by[8].total_tokens_per_s == pytest.approx(4 * by[2].total_tokens_per_s, rel=0.1)
    assert by[32].total_tokens_per_s == pytest.approx(by[8].total_tokens_per_s, rel=0.1)
    # queueing shows in TTFT past the knee only
    assert by[4].ttft_p95_s < 0.1 < by[16].ttft_p95_s
    assert curve.knee.requests == 8 and curve.knee.reached
    assert curve.confidence in ("medium", "high")
    assert all(curve.windows_per_bucket[b] >= 2 for b in (8, 16))


def test_token_caliber_buckets_are_powers_of_two_of_active_tokens(traffic):
    curve = passive_curve(traffic, "tokens")
    assert all(b.concurrency & (b.concurrency - 1) == 0 for b in curve.buckets)
    assert curve.knee.reached
    # 8 requests of 100 prompt + up to 50 generated tokens: the knee bucket is 1024 tokens
    assert curve.knee.requests == 1024


def test_traffic_that_never_crosses_the_knee_has_low_confidence():
    rows = closed_loop_rows(slots=32, levels=(1, 2, 4, 8), seconds_per_level=30)
    curve = passive_curve(rows, "requests")
    assert not curve.knee.reached and curve.confidence == "low"
    assert "never crossed" in curve.confidence_reason


def test_thin_data_has_low_confidence():
    rows = closed_loop_rows(slots=2, levels=(1, 2, 4), seconds_per_level=8)
    curve = passive_curve(rows, "requests")
    assert curve.confidence == "low"


def test_from_store_with_window_model_and_source_filters(tmp_path, traffic):
    store = RequestStore(tmp_path / "log.duckdb")
    other = closed_loop_rows(slots=2, levels=(4,), seconds_per_level=40, model="other", seed=1)
    probe = closed_loop_rows(
        slots=2, levels=(4,), seconds_per_level=40, source="probe", run_id="probe-x", seed=2
    )
    store.insert_rows(traffic + other + probe)
    since = traffic[0]["admitted_at"]
    curve = passive_curve(store, "requests", since, since + timedelta(hours=1), model="synthetic")
    assert curve.rows == len(traffic) and curve.knee.requests == 8
    early = passive_curve(store, "requests", since, since + timedelta(seconds=120), model="synthetic")
    assert max(b.concurrency for b in early.buckets) <= 4
    store.close()


def test_errors_name_the_problem(traffic):
    with pytest.raises(ValueError, match="caliber 'bytes'"):
        passive_curve(traffic, "bytes")
    with pytest.raises(ValueError, match="widen the window"):
        passive_curve(traffic, "requests", model="nope")
