"""The passive μ (collector.analysis.passive_rate) against the simulator's truth.

Seeded simulator traffic in simulated time (support.offline), both cost regimes: Poisson
arrivals whose rate ramps from 0.3 to 1.3 x the analytic μ (collector.sim.cost.predicted_rate),
fixed-length requests. Without a latency SLO the passive μ must be within 10 % of the analytic
one, with or without the engine's queue in the log; with a p95 TTFT SLO that binds below
saturation, within 10 % of the open-loop ladder's μ_slo on the same simulated engine. Traffic
that is too short, or never came near capacity, gives no μ and says why. Through the traffic
refresh (collector.analysis.refresh) the μ rides on the traffic estimate and the one decision
publishes it as headroom_capacity_rate_requests_per_second with source="traffic"; traffic that
crossed the knee but never saturated the engine publishes the knee and no rate.
"""

from __future__ import annotations

from datetime import timedelta

import pytest
from prometheus_client import CollectorRegistry, generate_latest
from support.offline import START, Mix, poisson_rows

from collector.analysis.estimate import _passive_rates
from collector.analysis.openloop import rate_level, rate_result
from collector.analysis.passive_rate import PassiveRate, passive_rate
from collector.analysis.refresh import refresh_estimates
from collector.analysis.stats import seconds
from collector.capacity import Slo
from collector.sim.config import SimConfig
from collector.store.capacity_gauges import CapacityGauges
from collector.store.db import RequestStore

# (cost profile, max_num_seqs, prompt tokens, output tokens, seed, simulated seconds of traffic)
CONFIGS = [
    ("cpu", 2, 40, 32, 3, 3600),
    ("cpu", 4, 40, 32, 1, 3600),
    ("cpu", 8, 100, 24, 5, 3600),
    ("gpu", 4, 120, 32, 6, 1200),
    ("gpu", 8, 40, 64, 2, 1200),
]
TOLERANCE = 0.10


def _engine(profile: str, seqs: int, prompt: int, output: int, seed: int) -> tuple[SimConfig, Mix, float]:
    config = SimConfig(max_num_seqs=seqs, cost_profile=profile, seed=seed, max_waiting=10_000)
    mu = config.predicted_rate(prompt, output)
    return config, Mix(prompt_tokens=prompt, output_tokens=output), mu.requests_per_s


def _ramp(config: SimConfig, mix: Mix, mu: float, low: float, high: float, duration_s: float, seed: int):
    return poisson_rows(
        config, lambda t: mu * (low + (high - low) * t / duration_s), duration_s, mix, seed=seed
    )


@pytest.mark.parametrize(
    ("profile", "seqs", "prompt", "output", "seed", "duration_s"),
    CONFIGS,
    ids=[f"{c[0]}-{c[1]}" for c in CONFIGS],
)
def test_passive_mu_of_a_ramp_past_capacity_is_the_analytic_rate(
    profile, seqs, prompt, output, seed, duration_s
):
    config, mix, mu = _engine(profile, seqs, prompt, output, seed)
    rows = _ramp(config, mix, mu, 0.3, 1.3, duration_s, seed)
    found = passive_rate(rows)
    assert found.mu_per_s == pytest.approx(mu, rel=TOLERANCE), found.reason
    assert found.confidence in ("medium", "high"), found.reason
    assert "saturated" in found.reason  # no SLO: the saturation throughput binds
    assert found.prefill_tokens_per_s == pytest.approx(found.mu_per_s * prompt, rel=0.01)
    blind = [row | {"engine_waiting_at_admit": None} for row in rows]  # no engine queue in the log
    without = passive_rate(blind)
    assert without.mu_per_s == pytest.approx(mu, rel=TOLERANCE), without.reason


def test_a_ttft_slo_that_binds_below_saturation_gives_the_ladders_mu_slo():
    config, mix, mu = _engine("cpu", 4, 40, 32, 1)
    slo = Slo(ttft_p95_s=2.0)
    levels = []
    for n, multiple in enumerate((0.6, 0.65, 0.7, 0.75, 0.8, 0.85, 0.9)):
        rate = round(mu * multiple, 3)
        rows = poisson_rows(config, lambda t, rate=rate: rate, 400 / mu, mix, seed=100 + n)
        admitted = sorted(seconds(row["admitted_at"]) or 0.0 for row in rows)
        window = (admitted[len(admitted) // 6], admitted[-1])  # the first sixth warms up
        measured = [row for row in rows if (seconds(row["admitted_at"]) or 0.0) >= window[0]]
        levels.append(rate_level(measured, rate, window, slo=slo, all_rows=rows))
    ladder = rate_result(levels).mu_slo_per_s
    assert ladder is not None and ladder < 0.85 * mu  # the premise: the SLO binds first
    found = passive_rate(_ramp(config, mix, mu, 0.3, 1.3, 3600, 1), slo=slo)
    assert found.mu_per_s == pytest.approx(ladder, rel=TOLERANCE), (found.reason, ladder)
    assert "within the SLO" in found.reason and found.confidence in ("medium", "high"), found.reason


def test_too_little_traffic_or_traffic_far_below_capacity_gives_no_mu_and_says_why():
    config, mix, mu = _engine("cpu", 4, 40, 32, 1)
    short = passive_rate(poisson_rows(config, lambda t: 0.5 * mu, 60, mix, seed=1))
    assert short.mu_per_s is None and short.confidence == "none"
    assert short.reason.startswith("too little traffic for a rate: 5 windows"), short.reason
    calm = passive_rate(_ramp(config, mix, mu, 0.2, 0.6, 3600, 1))
    assert calm.mu_per_s is None and calm.confidence == "none"
    assert "the engine never saturated" in calm.reason and "a lower bound" in calm.reason, calm.reason


def _refreshed(tmp_path, rows: list[dict]) -> tuple[dict, dict[str, float]]:
    """The traffic refresh over `rows` (as a sidecar's job runs it): the saved traffic estimate
    and the rate gauges it published, by name."""
    store = RequestStore(str(tmp_path / "h.duckdb"))
    try:
        store.insert_rows(rows)
        gauges = CapacityGauges()
        (saved,) = refresh_estimates(
            store, gauges, START + timedelta(hours=1, minutes=5), window=timedelta(hours=2)
        )
    finally:
        store.close()
    registry = CollectorRegistry()
    registry.register(gauges)
    published = {}
    for line in generate_latest(registry).decode().splitlines():
        if line.startswith(
            ("headroom_capacity_rate_", "headroom_capacity_prefill_", "headroom_capacity_knee_requests")
        ):
            name, value = line.rsplit(" ", 1)
            assert 'source="traffic"' in name, name
            published[name.split("{")[0]] = float(value)
    return saved, published


def test_the_traffic_refresh_publishes_the_passive_mu_with_the_traffic_knee(tmp_path):
    config, mix, mu = _engine("cpu", 4, 40, 32, 1)
    saved, published = _refreshed(tmp_path, _ramp(config, mix, mu, 0.3, 1.3, 3600, 1))
    assert saved["source"] == "traffic" and saved["rates"]["method"] == "passive"
    assert published["headroom_capacity_knee_requests"] == 4
    assert published["headroom_capacity_rate_requests_per_second"] == pytest.approx(mu, rel=TOLERANCE)
    assert published["headroom_capacity_rate_requests_per_second"] == saved["rate_requests_per_s"]
    assert published["headroom_capacity_prefill_tokens_per_second"] == pytest.approx(
        saved["rate_requests_per_s"] * 40
    )


def test_traffic_that_never_saturated_publishes_its_knee_and_no_rate_and_says_why(tmp_path):
    config, mix, mu = _engine("cpu", 4, 40, 32, 1)
    saved, published = _refreshed(tmp_path, _ramp(config, mix, mu, 0.3, 0.6, 3600, 1))
    assert published["headroom_capacity_knee_requests"] == 4  # the knee is crossed by bursts
    assert "headroom_capacity_rate_requests_per_second" not in published
    assert saved["rate_requests_per_s"] is None and saved["rates"]["mu_slo_requests_per_s"] is None
    assert "the engine never saturated" in saved["rates"]["reason"]


@pytest.mark.parametrize(("confidence", "published"), [("low", None), ("medium", 1.5), ("high", 1.5)])
def test_the_traffic_estimate_carries_mu_from_medium_confidence_up(confidence, published):
    """Below the traffic knee's bar the μ is withheld: off the estimate, off its `rates` (the
    review reads them), with the reason."""
    rates = _passive_rates(PassiveRate(1.5, 60.0, 1.5, confidence, "why", 10.0))
    assert rates.section is not None
    assert rates.requests_per_s == rates.section["mu_slo_requests_per_s"] == published
    assert rates.prefill_tokens_per_s == (None if published is None else 60.0)
    assert ("withheld" in rates.section) == (published is None)
