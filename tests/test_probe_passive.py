"""Acceptance: the passive curve from live traffic through the real sidecar agrees with the
probe's knee within one ladder level.

One simulator process (--max-num-seqs 8) serves both runs. First the probe measures it directly;
then a traffic run that crosses the knee goes through `headroom run` (its own process, its own
DuckDB file): users with random think times, their number stepping 2 -> 32, so the in-flight
count wanders between ladder levels as real traffic does. The sidecar's rows (source='traffic')
are then analysed by passive_curve.
"""

from __future__ import annotations

import asyncio
import math
import random
import time
from datetime import UTC, datetime

import aiohttp
import pytest
from support.processes import headroom_process, sim_process
from support.waiting import patient
from test_probe_sim import OUTPUT_TOKENS, probe_sim

from collector.analysis.knee import detect_knee
from collector.analysis.passive import passive_curve
from collector.store.db import RequestStore

pytestmark = [pytest.mark.subprocess, pytest.mark.serial]  # a real-time simulator's knees

STAGES = (2, 4, 8, 16, 32)
STAGE_S = 2.5


def sidecar_process(upstream: str, db_path):
    """`headroom run` in front of `upstream`, writing rows to db_path; stopped with SIGTERM."""
    return headroom_process(
        "run",
        "--upstream",
        upstream,
        "--db",
        str(db_path),
        "--engine",
        "none",
        "--no-jobs",
        "--instance",
        "test",
        health="/healthz",
    )


async def _user(session, url, stop_at, rng):
    body = {
        "model": "headroom-sim",
        "max_tokens": OUTPUT_TOKENS,
        "ignore_eos": True,
        "stream": True,
        "messages": [{"role": "user", "content": "Count from one to five."}],
    }
    while time.monotonic() < stop_at:
        async with session.post(f"{url}/v1/chat/completions", json=body) as response:
            await response.read()
        await asyncio.sleep(rng.uniform(0.0, 0.1))  # think time


async def drive_traffic(url: str, seed: int = 0) -> None:
    """Users join stage by stage (2, 4, ... 32), all stop at the end: bounded in time."""
    rng = random.Random(seed)
    stop_at = time.monotonic() + STAGE_S * len(STAGES)
    timeout = aiohttp.ClientTimeout(total=patient(30))
    async with aiohttp.ClientSession(timeout=timeout, connector=aiohttp.TCPConnector(limit=0)) as session:
        users, running = [], 0
        for users_wanted in STAGES:
            while running < users_wanted:
                users.append(asyncio.create_task(_user(session, url, stop_at, rng)))
                running += 1
            await asyncio.sleep(STAGE_S)
        await asyncio.gather(*users)


@pytest.mark.slow
def test_passive_knee_from_sidecar_traffic_agrees_with_the_probe(tmp_path):
    db = tmp_path / "traffic.duckdb"
    with sim_process(speed=1, max_num_seqs=8, seed=21) as sim_url:
        probe_knee = detect_knee([lv.stats for lv in asyncio.run(probe_sim(sim_url)).levels])
        with sidecar_process(sim_url, db) as sidecar_url:
            since = datetime.now(UTC)
            asyncio.run(drive_traffic(sidecar_url))
            until = datetime.now(UTC)
    store = RequestStore(db, read_only=True)
    try:
        assert store.query("SELECT count(*) FROM requests WHERE source = 'traffic'")[0][0] > 100
        curve = passive_curve(store, "requests", since, until)
        tokens = passive_curve(store, "tokens", since, until)
    finally:
        store.close()
    assert probe_knee.requests == 8
    knee = curve.knee
    table = [
        (
            b.concurrency,
            b.samples,
            curve.windows_per_bucket.get(b.concurrency),
            round(b.total_tokens_per_s),
            b.ttft_p95_s,
        )
        for b in curve.buckets
    ]
    assert knee is not None and knee.reached, table
    assert abs(math.log2(knee.requests) - math.log2(probe_knee.requests)) <= 1, (knee, table)
    assert curve.confidence in ("low", "medium", "high") and curve.confidence_reason
    assert all(b.samples > 0 for b in curve.buckets)
    assert tokens.buckets and all(b.concurrency & (b.concurrency - 1) == 0 for b in tokens.buckets)
