"""The simulator's analytic open-loop capacity μ (collector.sim.cost.predicted_rate) against the
simulator itself: Poisson arrivals above μ in simulated time (support.offline) keep the
batch full, and the completion rate they reach is the saturation rate the model predicts, in both
cost regimes and for several seeded configurations."""

from __future__ import annotations

import pytest
from support.offline import Mix, poisson_rows

from collector.sim.config import SimConfig
from collector.sim.cost import COST_PROFILES, predicted_rate

# (cost profile, max_num_seqs, prompt tokens, output tokens, seed)
CONFIGS = [
    ("gpu", 2, 40, 64, 1),
    ("gpu", 4, 120, 32, 2),
    ("gpu", 8, 40, 64, 3),
    ("gpu", 12, 300, 48, 4),
    ("gpu", 16, 80, 128, 5),
    ("cpu", 2, 40, 32, 6),
    ("cpu", 3, 100, 24, 7),
    ("cpu", 4, 40, 64, 8),
    ("cpu", 6, 200, 16, 9),
    ("cpu", 8, 40, 32, 10),
]


def achieved_rate(rows: list[dict], start_s: float, end_s: float) -> float:
    """Completions of answered requests per simulated second in [start_s, end_s)."""
    first = min(row["admitted_at"] for row in rows)
    done = [
        row
        for row in rows
        if row["outcome"] == "ok" and start_s <= (row["completed_at"] - first).total_seconds() < end_s
    ]
    return len(done) / (end_s - start_s)


@pytest.mark.parametrize(("profile", "seqs", "prompt", "output", "seed"), CONFIGS)
def test_overload_completes_at_the_predicted_rate(profile, seqs, prompt, output, seed):
    config = SimConfig(max_num_seqs=seqs, cost_profile=profile, seed=seed, max_waiting=10_000)
    mu = config.predicted_rate(prompt, output)
    duration = 300 / mu.requests_per_s  # ~300 requests' worth of service
    mix = Mix(prompt_tokens=prompt, output_tokens=output)
    rows = poisson_rows(config, lambda t: 1.3 * mu.requests_per_s, duration, mix, seed=seed)
    measured = achieved_rate(rows, 0.2 * duration, duration)
    assert measured == pytest.approx(mu.requests_per_s, rel=0.03), (measured, mu)
    # below μ nothing waits for long: the completion rate follows the offered rate
    light = poisson_rows(config, lambda t: 0.5 * mu.requests_per_s, duration, mix, seed=seed)
    assert achieved_rate(light, 0.2 * duration, duration) < 0.7 * mu.requests_per_s


@pytest.mark.parametrize(
    ("why", "settings"),
    [
        (
            "KV cache binds at 4",
            {
                "max_num_batched_tokens": 2048,
                "kv_cache_tokens": 4400,
                "prompt_tokens": 1000,
                "output_tokens": 64,
            },
        ),
        (
            "chunked prefill",
            {
                "max_num_batched_tokens": 512,
                "kv_cache_tokens": 65536,
                "prompt_tokens": 1000,
                "output_tokens": 4,
            },
        ),
        (
            "positive",
            {"max_num_batched_tokens": 512, "kv_cache_tokens": 65536, "prompt_tokens": 0, "output_tokens": 4},
        ),
    ],
)
def test_rate_model_refuses_what_it_does_not_model(why, settings):
    with pytest.raises(ValueError, match=why):
        predicted_rate(COST_PROFILES["gpu"], max_num_seqs=8, block_size=16, **settings)


def test_speed_scales_the_rate():
    base = dict(max_num_seqs=4, max_num_batched_tokens=2048, kv_cache_tokens=65536, block_size=16)
    slow = predicted_rate(COST_PROFILES["cpu"], prompt_tokens=40, output_tokens=16, **base)
    fast = predicted_rate(COST_PROFILES["cpu"], prompt_tokens=40, output_tokens=16, speed=4, **base)
    assert fast.requests_per_s == pytest.approx(4 * slow.requests_per_s)
    assert fast.prefill_tokens_per_s == pytest.approx(40 * fast.requests_per_s)
