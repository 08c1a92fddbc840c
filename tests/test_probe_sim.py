"""The probe against the real simulator (`headroom sim` in its own process, so the two event
loops do not share a GIL): knee 8 for --max-num-seqs 8 and 16 for 16, a KV-bound configuration
at the level the simulator's own model predicts, a sweep of seeded configurations where the
detected knee must equal the ground-truth ladder level, and the early stop on a saturated sim.

Ground truth is collector.sim.cost.predicted_knee (the simulator's documented model) for the
prompt and output lengths the probe actually sent; the ladder level is the largest probe level
not above it. Output is short (16 tokens at --speed 1, ~0.2 s per request) so a queue past the
knee adds a wait well above the rule's 50 ms noise floor while the sweep stays quick.
"""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest
from support.processes import sim_process

from collector.analysis.knee import detect_knee
from collector.analysis.probe import ProbeSettings, run_probe
from collector.capacity import Slo
from collector.sim.cost import predicted_knee

# a real-time simulator: its knees are this machine's time to give (make test runs these alone)
pytestmark = [pytest.mark.subprocess, pytest.mark.serial]

LEVELS = (1, 2, 4, 8, 16, 32)
OUTPUT_TOKENS = 16
BLOCK = 16


def medium_prompts(path: Path) -> str:
    """Eight ~200-token prompts: long enough that the KV cache, not max_num_seqs, can bind."""
    words = "capacity queue token batch latency memory budget engine request stream".split()
    lines = [" ".join(words[(i + j) % len(words)] for j in range(130))[:780] for i in range(8)]
    path.write_text("\n".join(lines) + "\n")
    return str(path)


def ladder_level(knee: int, levels=LEVELS) -> int:
    """Largest probe level not above the predicted knee: 6 -> 4, 8 -> 8, 12 -> 8."""
    return max(level for level in levels if level <= knee)


async def probe_sim(url: str, prompts: str = "short", levels=LEVELS, **overrides):
    settings = ProbeSettings(
        url=url,
        levels=levels,
        max_tokens=OUTPUT_TOKENS,
        prompts=prompts,
        warmup_per_worker=1,
        min_samples=2,
        drift_window=2,
        max_samples=48,
        max_level_s=8.0,
        saturation_ttft_factor=5.0,
        **overrides,
    )
    return await run_probe(settings)


# name, sim flags, prompt set: max_num_seqs-bound with short prompts, KV-bound with ~200 tokens
SWEEP = [
    ("seqs8", dict(max_num_seqs=8, seed=1), "short"),
    ("seqs16", dict(max_num_seqs=16, seed=2), "short"),
    ("seqs2", dict(max_num_seqs=2, seed=3), "short"),
    ("seqs4", dict(max_num_seqs=4, seed=4), "short"),
    ("seqs5", dict(max_num_seqs=5, seed=5), "short"),
    ("seqs12", dict(max_num_seqs=12, seed=6), "short"),
    ("seqs3-sglang", dict(max_num_seqs=3, seed=7, flavor="sglang"), "short"),
    ("kv6", dict(max_num_seqs=16, kv_cache_tokens=84 * BLOCK, seed=8), "medium"),
    ("kv3", dict(max_num_seqs=16, kv_cache_tokens=42 * BLOCK, seed=9), "medium"),
    ("kv10", dict(max_num_seqs=16, kv_cache_tokens=140 * BLOCK, seed=10), "medium"),
    # the compute-bound profile: TTFT and TPOT grow with the batch before anything waits
    ("cpu-seqs2", dict(max_num_seqs=2, seed=21, cost_profile="cpu"), "short"),
    ("cpu-seqs3", dict(max_num_seqs=3, seed=22, cost_profile="cpu"), "short"),
    ("cpu-seqs4", dict(max_num_seqs=4, seed=23, cost_profile="cpu"), "short"),
    ("cpu-seqs6-llamacpp", dict(max_num_seqs=6, seed=24, cost_profile="cpu", flavor="llamacpp"), "short"),
    ("cpu-seqs8", dict(max_num_seqs=8, seed=25, cost_profile="cpu"), "short"),
    ("cpu-kv3", dict(max_num_seqs=8, kv_cache_tokens=42 * BLOCK, seed=26, cost_profile="cpu"), "medium"),
]


@pytest.mark.slow
@pytest.mark.parametrize("name, flags, prompts", SWEEP, ids=[case[0] for case in SWEEP])
def test_knee_matches_the_simulators_model(name, flags, prompts, tmp_path):
    prompt_spec = medium_prompts(tmp_path / "medium.txt") if prompts == "medium" else prompts
    with sim_process(speed=1, **flags) as url:
        result = asyncio.run(probe_sim(url, prompt_spec))
    rows = [row for level in result.levels for row in level.rows]
    prompt_tokens = max(row["prompt_tokens"] for row in rows)
    predicted = predicted_knee(
        flags["max_num_seqs"], flags.get("kv_cache_tokens", 65536), BLOCK, prompt_tokens, OUTPUT_TOKENS
    )
    knee = detect_knee([level.stats for level in result.levels])
    table = [
        (lv.concurrency, round(lv.stats.total_tokens_per_s), lv.stats.ttft_p95_s) for lv in result.levels
    ]
    assert knee.requests == ladder_level(predicted), (name, predicted, knee, table)
    assert knee.reached
    if name == "seqs8":
        assert knee.requests == 8
    if name == "seqs16":
        assert knee.requests == 16
    if name == "kv6":  # KV-bound: max_num_seqs 16 would allow 16, the cache holds 6
        assert (predicted, knee.requests) == (6, 4)


@pytest.mark.slow
def test_saturated_sim_stops_early_and_says_why():
    # 4 running and no queue: at 8 half the requests get 429. A lax SLO keeps TTFT from
    # stopping the probe first, so the 429 path is the one exercised.
    with sim_process(speed=1, max_num_seqs=4, max_waiting=0, seed=12) as url:
        result = asyncio.run(probe_sim(url, levels=(1, 2, 4, 8, 16, 32, 64), slo=Slo(ttft_p95_s=1.0)))
    measured = [level.concurrency for level in result.levels]
    assert measured == [1, 2, 4, 8], result.stopped_early
    assert "saturated" in result.stopped_early and "capacity errors" in result.stopped_early
    last = result.levels[-1]
    assert last.stats.rate_limited_ratio > 0.25
    assert len(last.rows) < 200  # gave up on the level instead of hammering it
