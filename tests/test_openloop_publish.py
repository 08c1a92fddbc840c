"""μ_slo and V_P published like the knee: a stored probe run with an open-loop ladder (the
simulator's own rows, in simulated time) is estimated from its rows, saved, decided by the one
decision (collector.store.decision) and exported as headroom_capacity_rate_requests_per_second and
headroom_capacity_prefill_tokens_per_second with the knee's labels, equal to the estimate's
numbers, with source="probe"."""

from __future__ import annotations

import dataclasses
from datetime import UTC, datetime, timedelta

import pytest
from prometheus_client import CollectorRegistry, generate_latest
from support.offline import Mix, closed_loop_rows, poisson_rows

from collector.analysis.estimate import estimate_probe_run
from collector.capacity import CapacityEstimate
from collector.sim.config import SimConfig
from collector.store.capacity_gauges import CapacityGauges
from collector.store.db import RequestStore
from collector.store.decision import publish
from collector.store.estimates import save_estimate

RUN = "probe-20261130T080000Z-ab12"


def shifted(rows: list[dict], by: timedelta) -> list[dict]:
    for row in rows:
        for key in ("admitted_at", "first_byte_at", "first_token_at", "completed_at"):
            if row.get(key) is not None:
                row[key] += by
    return rows


def stored_run(tmp_path) -> tuple[RequestStore, float]:
    config = SimConfig(max_num_seqs=4, cost_profile="cpu", seed=3, max_waiting=10_000)
    mix = Mix(prompt_tokens=60, output_tokens=16)
    truth = config.predicted_rate(60, 16)
    rows = closed_loop_rows(config, [1, 2, 4, 8], 40.0, mix, seed=3, run_id=RUN)
    end = max(r["completed_at"] for r in rows)
    for n, multiple in enumerate((0.6, 0.8, 0.9, 1.3)):
        rate = round(truth.requests_per_s * multiple, 3)
        level = poisson_rows(config, lambda t, rate=rate: rate, 300 / truth.requests_per_s, mix, seed=n)
        first = min(r["admitted_at"] for r in level)
        shifted(level, end - first + timedelta(seconds=1))
        warm_until = end + timedelta(seconds=1 + 40 / truth.requests_per_s)
        for i, row in enumerate(level):
            row.update(
                request_id=f"{RUN}-{n}-{i:06d}",
                source="probe",
                run_id=RUN,
                probe_rate_per_s=rate,
                probe_warmup=row["admitted_at"] < warm_until,
            )
        rows += level
        end = max(r["completed_at"] for r in rows)
    store = RequestStore(str(tmp_path / "h.duckdb"))
    store.insert_rows(rows)
    return store, truth.requests_per_s


def test_the_rate_rides_on_the_published_estimate(tmp_path):
    store, mu = stored_run(tmp_path)
    estimate = estimate_probe_run(store, RUN)
    assert estimate is not None and estimate.knee.requests == 4 and estimate.knee.reached
    assert 0.85 * mu <= estimate.rate_requests_per_s <= 1.02 * mu  # the ladder steps 0.9 then 1.3 μ
    assert estimate.prefill_tokens_per_s == pytest.approx(estimate.rate_requests_per_s * 60, rel=0.10)
    assert estimate.rates is not None and estimate.rates["littles_law"]["consistent"]
    assert [lv["offered_per_s"] for lv in estimate.rates["levels"]][-1] > mu  # the drifting level
    # the JSON round trip keeps the fields
    again = CapacityEstimate.from_dict(estimate.to_dict())
    assert (again.rate_requests_per_s, again.prefill_tokens_per_s) == (
        estimate.rate_requests_per_s,
        estimate.prefill_tokens_per_s,
    )
    estimate = dataclasses.replace(estimate, created_at=datetime.now(UTC) - timedelta(minutes=1))
    save_estimate(store, estimate)
    gauges = CapacityGauges()
    publish(store, gauges)
    registry = CollectorRegistry()
    registry.register(gauges)
    text = generate_latest(registry).decode()
    labels = 'model="headroom-sim",replica_class="default",source="probe",task_class="all"'
    for name, value in (
        ("headroom_capacity_rate_requests_per_second", estimate.rate_requests_per_s),
        ("headroom_capacity_prefill_tokens_per_second", estimate.prefill_tokens_per_s),
    ):
        line = next(line for line in text.splitlines() if line.startswith(name + "{"))
        assert 'source="probe"' in line and 'replica_class="default"' in line and labels.split(",")[0] in line
        assert float(line.rsplit(" ", 1)[1]) == pytest.approx(value)
    store.close()


def test_no_ladder_publishes_no_rate(tmp_path):
    gauges = CapacityGauges()
    store = RequestStore(str(tmp_path / "h.duckdb"))
    config = SimConfig(max_num_seqs=4, cost_profile="cpu", seed=3)
    store.insert_rows(closed_loop_rows(config, [1, 2, 4, 8], 20.0, Mix(60, output_tokens=16), run_id=RUN))
    estimate = estimate_probe_run(store, RUN)
    assert estimate is not None and estimate.rate_requests_per_s is None and estimate.rates is None
    estimate = dataclasses.replace(estimate, created_at=datetime.now(UTC) - timedelta(minutes=1))
    save_estimate(store, estimate)
    publish(store, gauges)
    registry = CollectorRegistry()
    registry.register(gauges)
    text = generate_latest(registry).decode()
    assert "headroom_capacity_knee_requests{" in text
    assert "headroom_capacity_rate_requests_per_second{" not in text
    store.close()
