"""One published capacity per model and task class, gated by evidence: a fresh probe beats
traffic, traffic publishes only with enough confidence, a knee not reached never publishes, and
the gauges say where the number came from."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest
from prometheus_client import CollectorRegistry
from support.estimates import capacity_estimate

from collector.store.capacity_gauges import CapacityGauges
from collector.store.db import RequestStore
from collector.store.decision import PublishPolicy, decide, publish
from collector.store.estimates import import_estimates, save_estimate

NOW = datetime(2026, 12, 1, 12, 0, tzinfo=UTC)


def estimate(source, knee=8, age_h=1.0, confidence="measured", model="m", run_id=None, task_class="all"):
    return capacity_estimate(
        model,
        source=source,
        run_id=run_id,
        knee_requests=knee,
        knee_tokens=1000 if knee is not None else None,
        recommended_pool=5,
        confidence=confidence,
        task_class=task_class,
        created_at=NOW - timedelta(hours=age_h),
    )


@pytest.mark.parametrize(
    "saved, knee, reason",
    [
        (
            [estimate("probe", 8, run_id="probe-1"), estimate("traffic", 16, confidence="high")],
            8,
            "probe run probe-1",
        ),
        (
            [estimate("probe", 8, age_h=24 * 8), estimate("traffic", 16, confidence="high")],
            16,
            "traffic (high confidence",
        ),
        (
            [estimate("probe", 8, age_h=24 * 8), estimate("traffic", 16, confidence="low")],
            None,
            "traffic confidence low is below medium",
        ),
        ([estimate("traffic", 16, confidence="medium")], 16, "traffic (medium"),
        ([estimate("traffic", None, confidence="low")], None, "traffic never crossed the knee"),
        ([estimate("probe", None)], None, "its knee was not reached"),
        # the newest of each source counts: an older confident traffic estimate does not come back
        (
            [
                estimate("traffic", 16, age_h=5, confidence="high"),
                estimate("traffic", None, age_h=1, confidence="low"),
            ],
            None,
            "never crossed",
        ),
    ],
)
def test_decision_table(saved, knee, reason):
    decision = decide(saved, NOW)
    assert decision.knee_requests == knee
    assert reason in decision.reason


def test_probe_age_and_traffic_bar_are_policy():
    saved = [estimate("probe", 8, age_h=30), estimate("traffic", 16, confidence="low")]
    assert decide(saved, NOW).knee_requests == 8
    strict = PublishPolicy(probe_max_age=timedelta(hours=24), traffic_confidence="low")
    assert decide(saved, NOW, strict).knee_requests == 16
    with pytest.raises(ValueError, match="traffic confidence 'sure'"):
        PublishPolicy(traffic_confidence="sure")


def test_publish_sets_the_gauges_with_source_and_confidence_and_clears_what_lost(tmp_path):
    store = RequestStore(tmp_path / "log.duckdb")
    gauges, registry = CapacityGauges(), CollectorRegistry()
    registry.register(gauges)
    save_estimate(store, estimate("probe", 8, run_id="probe-1"))
    save_estimate(store, estimate("traffic", 4, confidence="low", model="other"))
    decisions = publish(store, gauges, NOW)
    assert [(d.model, d.knee_requests) for d in decisions] == [("m", 8), ("other", None)]
    labels = {"model": "m", "task_class": "all", "replica_class": "default", "source": "probe"}
    labels["confidence"] = "high"
    assert registry.get_sample_value("headroom_capacity_knee_requests", labels) == 8
    assert (
        registry.get_sample_value("headroom_capacity_estimate_timestamp_seconds", labels)
        == (NOW - timedelta(hours=1)).timestamp()
    )
    assert gauges.get("other") is None  # nothing published where nothing clears the bar
    later = publish(store, gauges, NOW + timedelta(days=8))  # the probe grew old
    assert later[0].estimate is None and gauges.get("m") is None
    store.close()


def test_estimates_of_another_file_are_imported_once(tmp_path):
    theirs = RequestStore(tmp_path / "probe.duckdb")
    save_estimate(theirs, estimate("probe", 8, run_id="probe-2"))
    theirs.close()
    ours = RequestStore(tmp_path / "sidecar.duckdb")
    assert import_estimates(ours, tmp_path / "probe.duckdb") == 1
    assert import_estimates(ours, tmp_path / "probe.duckdb") == 0
    assert import_estimates(ours, tmp_path / "missing.duckdb") == 0
    assert publish(ours, None, NOW)[0].knee_requests == 8
    ours.close()
