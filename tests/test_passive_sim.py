"""The passive curve is right: on seeded simulator traffic (Poisson arrivals whose rate ramps past
capacity, mixed prompt lengths, several tenants) in both cost regimes, the knee read off the
traffic is within one ladder level of the probe's, with enough confidence to be published; a
window in which traffic never crossed the knee publishes nothing.

Both run in simulated time (support.offline), so an hour of traffic takes seconds; ground
truth is the probe's gradient on the same simulated engine, whose knee is also checked against the
simulator's own model (collector.sim.cost.predicted_knee).
"""

from __future__ import annotations

import math
from datetime import UTC, datetime

import pytest
from support.offline import Mix, closed_loop_rows, poisson_rows

from collector.analysis.estimate import estimate_capacity, probe_levels
from collector.analysis.knee import detect_knee
from collector.analysis.passive import passive_curve
from collector.sim.config import SimConfig
from collector.sim.cost import predicted_knee
from collector.store.db import RequestStore
from collector.store.decision import decisions
from collector.store.estimates import save_estimate

LEVELS = (1, 2, 4, 8, 16, 32)
OUTPUT = 64

# name, cost profile and scheduler settings, share of 400-token prompts
MIXES = [
    ("gpu-8-slots", dict(max_num_seqs=8), 0.1),
    ("gpu-16-slots-long-prompts", dict(max_num_seqs=16), 0.2),
    ("gpu-16-slots-small-kv", dict(max_num_seqs=16, kv_cache_tokens=6400), 0.3),
    ("cpu-4-slots", dict(max_num_seqs=4, cost_profile="cpu"), 0.1),
    ("cpu-8-slots", dict(max_num_seqs=8, cost_profile="cpu"), 0.1),
    ("cpu-2-slots", dict(max_num_seqs=2, cost_profile="cpu"), 0.0),
]


def _probe(config: SimConfig, mix: Mix, seed: int):
    levels = probe_levels(closed_loop_rows(config, LEVELS, 30.0, mix, seed=seed))
    return levels, detect_knee(levels)


def _ramp(
    config: SimConfig,
    mix: Mix,
    seed: int,
    capacity_rps: float,
    low: float,
    high: float,
    duration_s: float = 3600.0,
) -> list[dict]:
    """Traffic whose arrival rate ramps from low to high x the probe's throughput at its knee."""
    return poisson_rows(
        config, lambda t: capacity_rps * (low + (high - low) * t / duration_s), duration_s, mix, seed=seed
    )


@pytest.mark.parametrize("name, flags, long_share", MIXES, ids=[m[0] for m in MIXES])
def test_passive_knee_is_within_one_ladder_level_of_the_probe(name, flags, long_share):
    seed = MIXES.index((name, flags, long_share))
    config = SimConfig(**flags)
    mix = Mix(output_tokens=OUTPUT, long_share=long_share, long_prompt_tokens=400, tenants=3)
    levels, probe = _probe(config, mix, seed)
    if long_share == 0.0:  # short prompts only: the probe must find the simulator's own knee
        assert probe.requests == predicted_knee(
            config.max_num_seqs, config.kv_cache_tokens, config.block_size, mix.prompt_tokens, OUTPUT
        )
    capacity = next(level for level in levels if level.concurrency == probe.requests).requests_per_s
    rows = _ramp(config, mix, seed, capacity, 0.3, 1.3)
    assert len({row["tenant"] for row in rows}) == 3
    curve = passive_curve(rows, "requests")
    table = [
        (
            b.concurrency,
            b.samples,
            curve.windows_per_bucket.get(b.concurrency),
            round(b.total_tokens_per_s),
            b.engine_waiting_mean,
        )
        for b in curve.buckets
    ]
    assert curve.knee is not None and curve.knee.reached, table
    assert abs(math.log2(curve.knee.requests) - math.log2(probe.requests)) <= 1, (
        probe.requests,
        curve.knee.rule_reason,
        table,
    )
    assert curve.confidence in ("medium", "high"), (curve.confidence_reason, table)


def test_traffic_that_never_crossed_the_knee_publishes_nothing(tmp_path):
    config = SimConfig(max_num_seqs=8)
    mix = Mix(output_tokens=OUTPUT, tenants=3)
    levels, probe = _probe(config, mix, 0)
    capacity = next(level for level in levels if level.concurrency == probe.requests).requests_per_s
    store = RequestStore(tmp_path / "log.duckdb")
    store.insert_rows(_ramp(config, mix, 0, capacity, 0.1, 0.6, duration_s=1800))
    estimate = estimate_capacity(store, model=mix.model, source="traffic")
    assert not estimate.knee.reached and estimate.confidence == "low"
    save_estimate(store, estimate)
    [decision] = decisions(store, datetime.now(UTC))
    assert decision.estimate is None and "never crossed the knee" in decision.reason
    store.close()
