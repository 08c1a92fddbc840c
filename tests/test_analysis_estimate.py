"""CapacityEstimate: the JSON schema, the capacity_estimates table, re-analysis from the store,
and export to the sidecar's headroom_capacity_* gauges."""

from __future__ import annotations

import dataclasses
import json
from dataclasses import replace
from datetime import timedelta

import pytest
from prometheus_client import CollectorRegistry
from support.synthetic import closed_loop_rows
from test_analysis_knee import ladder

from collector.analysis.estimate import build_estimate, estimate_capacity, probe_levels
from collector.analysis.token_knee import Held, token_capacity, token_mix_of
from collector.capacity import CapacityEstimate, Slo
from collector.store.db import RequestStore
from collector.store.decision import published_estimates
from collector.store.estimates import save_estimate

REQUIRED_KEYS = {"run_id", "levels", "knee", "slo_max", "recommended_pool", "profile"}


def _estimate(model="m", knee_at=8, slo_ttft=None, profile="interactive"):
    throughputs = [100 * min(2**i, knee_at) for i in range(6)]
    ttfts = [0.1 if 2**i <= knee_at else 1.0 for i in range(6)]
    # the traffic's mix: requests holding 150 tokens each, time-weighted 150 per in flight
    mix = token_mix_of([Held(1.0, 150, 0)] * 60)
    return build_estimate(
        ladder(throughputs, ttfts),
        slo=Slo(ttft_p95_s=slo_ttft),
        profile=profile,
        model=model,
        run_id="probe-1",
        tokens=lambda measured: token_capacity(measured.knee.requests, mix),
    )


def test_an_estimate_is_one_frozen_value():
    """Built in one call with its token figures; changing it makes a new value, never edits it."""
    estimate = _estimate(slo_ttft=0.5)
    assert estimate.knee_tokens == 8 * 150 and estimate.slo_max_tokens == 8 * 150
    with pytest.raises(dataclasses.FrozenInstanceError):
        estimate.replica_class = "h100"  # type: ignore[misc]
    moved = dataclasses.replace(estimate, replica_class="h100")
    assert (moved.replica_class, estimate.replica_class) == ("h100", "default")
    assert moved.to_dict() == estimate.to_dict() | {"replica_class": "h100"}


def test_json_schema_has_the_documented_keys_and_types():
    data = json.loads(json.dumps(_estimate(slo_ttft=0.5).to_dict()))
    assert REQUIRED_KEYS <= data.keys()
    assert data["knee"]["requests"] == 8 and isinstance(data["knee"]["tokens"], int)
    assert data["slo_max"] == 8 and data["recommended_pool"] == 5 and data["profile"] == "interactive"
    assert [lv["concurrency"] for lv in data["levels"]] == [1, 2, 4, 8, 16, 32]
    assert {
        "ttft_p95_s",
        "tpot_p95_s",
        "e2e_p99_s",
        "total_tokens_per_s",
        "error_ratio",
        "rate_limited_ratio",
        "littles_law",
    } <= data["levels"][0].keys()
    assert data["schema_version"] == 1


def test_no_slo_means_null_slo_max():
    assert _estimate().to_dict()["slo_max"] is None


def test_save_and_publish_per_model_round_trip(tmp_path):
    store = RequestStore(tmp_path / "e.duckdb")
    assert published_estimates(store) == []
    old = _estimate("a", knee_at=4)
    # three probe runs (one estimate per run: collector.store.estimates)
    new = replace(
        _estimate("a", knee_at=8), run_id="probe-2", created_at=old.created_at + timedelta(minutes=5)
    )
    for estimate in (old, new, replace(_estimate("b", knee_at=16), run_id="probe-3")):
        save_estimate(store, estimate)
    latest = {p.estimate.model: p.estimate for p in published_estimates(store)}
    assert latest["a"].knee.requests == 8 and latest["b"].knee.requests == 16
    assert latest["a"] == new  # read back as the same type, nothing lost on the way
    store.close()
    reopened = RequestStore(tmp_path / "e.duckdb")
    assert len(published_estimates(reopened)) == 2
    reopened.close()


def test_estimate_capacity_prefers_the_latest_probe_run(tmp_path):
    store = RequestStore(tmp_path / "p.duckdb")
    store.insert_rows(
        closed_loop_rows(
            slots=4, levels=(1, 2, 4, 8, 16), seconds_per_level=20, source="probe", run_id="probe-a"
        )
    )
    levels = probe_levels(store.query_dicts("SELECT * FROM requests WHERE run_id = ?", ["probe-a"]))
    assert [lv.concurrency for lv in levels] == [1, 2, 4, 8, 16]
    estimate = estimate_capacity(store, slo_ttft_p95_s=0.5, profile="semi")
    assert (estimate.source, estimate.run_id, estimate.knee.requests) == ("probe", "probe-a", 4)
    assert estimate.slo_max == 4 and estimate.recommended_pool == 3
    store.close()


def test_estimate_capacity_falls_back_to_traffic(tmp_path):
    store = RequestStore(tmp_path / "t.duckdb")
    rows = closed_loop_rows(slots=8, levels=(1, 2, 4, 8, 16, 32), seconds_per_level=40)
    store.insert_rows(rows)
    estimate = estimate_capacity(store, model="synthetic")
    data = estimate.to_dict()
    assert data["source"] == "traffic" and data["knee"]["requests"] == 8
    assert data["confidence"] in ("medium", "high") and data["token_curve"]["knee"]["reached"]
    assert data["knee_requests"] == 8 and data["knee_tokens"] > 0
    with pytest.raises(ValueError, match="run headroom probe"):
        estimate_capacity(store, source="probe")
    store.close()


def test_publish_estimates_sets_capacity_gauges_in_both_calibers():
    from collector.store.capacity_gauges import CapacityGauges

    gauges, registry = CapacityGauges(), CollectorRegistry()
    registry.register(gauges)
    gauges.replace([_estimate("llama", slo_ttft=0.5)])
    value = registry.get_sample_value
    labels = {"model": "llama", "task_class": "all", "replica_class": "default", "source": "probe"}
    labels["confidence"] = "high"
    assert value("headroom_capacity_knee_requests", labels) == 8
    assert value("headroom_capacity_slo_max_requests", labels) == 8
    assert value("headroom_capacity_knee_tokens", labels) == 8 * 150
    assert value("headroom_capacity_recommended_pool_requests", labels) == 5
    assert value("headroom_capacity_estimate_timestamp_seconds", labels) > 1.7e9


def test_an_unreached_knee_is_not_exported_as_a_knee():
    estimate = build_estimate(ladder([100, 200, 400]), model="m")
    assert not estimate.knee.reached and estimate.to_dict()["knee_requests"] is None
    assert CapacityEstimate.from_dict(estimate.to_dict()).knee.requests == 4
