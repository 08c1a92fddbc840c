"""End to end: engine sources inside a running sidecar, against the simulator and a broken engine.

- each `headroom sim --flavor` behind a sidecar: headroom_engine_* track the simulator's own
  state (GET /sim/state) under load and after it drains;
- request rows carry engine_waiting_at_admit / kv_usage_at_admit with a source on, NULL with it off;
- an engine /metrics that hangs (for the issue's full minute: a slow test), returns garbage or
  answers HTTP 500 (a few seconds each) never delays proxied requests, judged against a
  baseline of the same requests measured in the same run.
"""

from __future__ import annotations

import asyncio
import os
import statistics
import time

import httpx
import pytest
from support.waiting import PATIENCE, patient, wait_until_async

from collector.record import MemorySink
from collector.serving import serve_in_thread
from collector.sidecar.config import SidecarConfig
from collector.sidecar.wiring import build_sidecar
from collector.sim.app import create_sim_app
from collector.sim.config import SimConfig
from collector.sources import build_engine_source
from collector.sources.base import parse_exposition

# How long the engine stays broken. The issue asks for a minute of hanging: the slow test holds
# it that long (HEADROOM_TEST_HANG_ENGINE_S shortens it for a quick local run); garbage and HTTP 500
# run a few seconds each in the regular test (HEADROOM_TEST_BROKEN_ENGINE_S).
HANG_FOR_S = float(os.environ.get("HEADROOM_TEST_HANG_ENGINE_S", "60"))
BROKEN_FOR_S = float(os.environ.get("HEADROOM_TEST_BROKEN_ENGINE_S", "3"))
PROMPT = "measure the knee of this deployment " * 50  # ~450 prompt tokens: visible KV use
SLOTS = 4
# the test's client keeps its connections across waits longer than uvicorn's 5 s default: a
# server closing one as the client reuses it answers "Server disconnected"
KEEP_ALIVE_S = 300


class Stack:
    """A sidecar (with an engine source) in front of an upstream, both on loopback threads."""

    def __init__(
        self,
        upstream_url: str,
        engine: str,
        metrics_url: str,
        *,
        poll_interval_s: float = 0.1,
        timeout_s: float | None = None,
    ) -> None:
        sink = MemorySink()
        self.rows = sink.rows
        self.source = build_engine_source(engine, metrics_url, poll_interval_s, timeout_s=timeout_s)
        config = SidecarConfig(
            upstream=upstream_url,
            db_path=None,
            instance="test",
            engine=engine,
            engine_metrics_url=metrics_url,
            engine_poll_interval_s=poll_interval_s,
        )
        self.handle = serve_in_thread(
            build_sidecar(config, sinks=[sink], engine=self.source), timeout_keep_alive=KEEP_ALIVE_S
        )
        self.url = self.handle.url

    async def exported(self, client: httpx.AsyncClient) -> dict[str, float]:
        """The sidecar's headroom_engine_* values (summed over labels) from its /metrics."""
        samples = parse_exposition((await client.get(f"{self.url}/metrics")).text)
        return {
            name: sum(value for _, value in rows)
            for name, rows in samples.items()
            if name.startswith("headroom_engine_")
        }

    def stop(self) -> None:
        self.handle.stop(timeout_s=15)


async def chat(client: httpx.AsyncClient, url: str, max_tokens: int) -> int:
    """One streamed chat completion through the sidecar, read to the end; returns the status."""
    body = {
        "model": "headroom-sim",
        "stream": True,
        "max_tokens": max_tokens,
        "ignore_eos": True,
        "messages": [{"role": "user", "content": PROMPT}],
    }
    async with client.stream("POST", f"{url}/v1/chat/completions", json=body) as response:
        async for _ in response.aiter_bytes():
            pass
        return response.status_code


@pytest.mark.parametrize("flavor", ["vllm", "sglang", "llamacpp"])
async def test_engine_gauges_track_the_simulator_under_load(flavor):
    # The engine is busy (all slots running, 3 queued) until its first requests end: 1.4 s at
    # speed 2 on a quiet machine. A busy host takes that long to poll, compare and admit the late
    # request, so the simulator runs slower by the same stretch as the tests' deadlines.
    speed = 2.0 / PATIENCE
    sim = serve_in_thread(
        create_sim_app(
            SimConfig(flavor=flavor, max_num_seqs=SLOTS, kv_cache_tokens=8192, max_waiting=64, speed=speed)
        ),
        timeout_keep_alive=KEEP_ALIVE_S,
    )
    # the simulator (a thread of this process) answers its /metrics in time on a busy host too: a
    # poll cut off at the default 0.5 s would leave the gauges down through the busy window
    stack = Stack(sim.url, flavor, f"{sim.url}/metrics", timeout_s=patient(2.0))
    try:
        async with httpx.AsyncClient(timeout=60) as client:

            async def truth():
                return (await client.get(f"{sim.url}/sim/state")).json()

            async def tracking(expect_busy: bool):
                """Sidecar and simulator agree on running/waiting (and KV within 0.03)."""
                got, state = await stack.exported(client), await truth()
                # busy: all slots running and 3 queued (a poll between one request's end and
                # the next admission sees 3 running and 4 queued; wait for the steady state)
                if expect_busy and (state["running"], state["waiting"]) != (SLOTS, 3):
                    return None
                same = (
                    got.get("headroom_engine_requests_running") == state["running"]
                    and got.get("headroom_engine_requests_waiting") == state["waiting"]
                    and abs(got.get("headroom_engine_kv_cache_usage_ratio", -1) - state["kv_usage_ratio"])
                    < 0.03
                )
                return (got, state) if same else None

            # every row carries the engine's view at admission: the source answers before any load
            await wait_until_async(lambda: _up(stack, client), what=f"{flavor} engine up")
            load = [asyncio.create_task(chat(client, stack.url, 200)) for _ in range(SLOTS + 3)]
            got, state = await wait_until_async(lambda: tracking(True), what=f"{flavor} busy tracking")
            assert got["headroom_engine_up"] == 1.0
            assert got["headroom_engine_kv_cache_usage_ratio"] > 0.1  # ~4 x 450 tokens of 8192
            assert got["headroom_engine_kv_cache_capacity_tokens"] == pytest.approx(
                state["kv_capacity_tokens"], rel=0.01
            )
            # admitted while the engine queue holds 3: the row carries the last poll's view
            late = asyncio.create_task(chat(client, stack.url, 5))
            assert all(status == 200 for status in await asyncio.gather(*load, late))
            await wait_until_async(lambda: tracking(False), what=f"{flavor} idle tracking")
            await wait_until_async(lambda: _async(len(stack.rows) == SLOTS + 4), what="all rows")
        assert all(row.engine_waiting_at_admit is not None for row in stack.rows)
        assert all(row.kv_usage_at_admit is not None for row in stack.rows)
        late_row = max(stack.rows, key=lambda row: row.admitted_at)
        assert late_row.engine_waiting_at_admit >= 1
        assert late_row.kv_usage_at_admit > 0.1
    finally:
        stack.stop()
        sim.stop(timeout_s=15)


async def _async(value):
    return value


async def test_rows_carry_null_engine_fields_when_the_source_is_off(fake_engine):
    _, url = fake_engine
    sink = MemorySink()
    rows = sink.rows
    config = SidecarConfig(upstream=url, db_path=None, instance="test", engine="none")
    handle = serve_in_thread(build_sidecar(config, sinks=[sink]))
    try:
        async with httpx.AsyncClient(timeout=30) as client:
            response = await client.post(
                f"{handle.url}/v1/chat/completions",
                json={"model": "fake", "messages": [{"role": "user", "content": "hi"}]},
            )
            assert response.status_code == 200
            await wait_until_async(lambda: _async(len(rows) == 1), what="the row")
            assert "headroom_engine_up" not in (await client.get(f"{handle.url}/metrics")).text
    finally:
        handle.stop(timeout_s=15)
    assert rows[0].engine_waiting_at_admit is None and rows[0].kv_usage_at_admit is None


async def _latencies(client: httpx.AsyncClient, url: str, count: int, for_s: float = 0.0) -> list[float]:
    """Sequential proxied requests: at least `count`, and for at least `for_s` seconds."""
    body = {"model": "fake", "messages": [{"role": "user", "content": "hi"}]}
    took: list[float] = []
    deadline = time.monotonic() + for_s
    while len(took) < count or (time.monotonic() < deadline and len(took) < 100_000):
        began = time.perf_counter()
        response = await client.post(f"{url}/v1/chat/completions", json=body)
        took.append(time.perf_counter() - began)
        assert response.status_code == 200
    return took


def _never_delayed(mode: str, baseline: list[float], broken: list[float], poll_timeout_s: float) -> None:
    """Every proxied request while the engine is broken is fast relative to the baseline.

    A proxy that waited on the poller (or an event loop blocked by it) would show delays up to
    the poll timeout, so the limit stays below half of it; above that it scales with what this
    machine measured just before (20x the baseline median, twice its slowest request), so a loaded
    machine slows both sides alike instead of failing the test.
    """
    base_median = statistics.median(baseline)
    limit = min(max(20 * base_median, 2 * max(baseline), 0.5), poll_timeout_s / 2)
    slowest = max(broken)
    assert slowest < limit, (
        f"{mode}: a request took {slowest:.3f} s (limit {limit:.3f} s; baseline "
        f"median {base_median * 1000:.1f} ms, max {max(baseline) * 1000:.1f} ms)"
    )
    assert statistics.median(broken) < 3 * base_median + 0.05, (mode, statistics.median(broken), base_median)


async def _broken_for(
    engine, stack: Stack, client: httpx.AsyncClient, mode: str, for_s: float, baseline: list[float]
) -> dict:
    """Break the engine in `mode` for `for_s` seconds of sequential proxied requests; check them.

    The requests start the moment the engine breaks, so the window includes the polls in flight
    while the source has not yet noticed (where a proxy waiting on the poller would stall first).
    """
    engine.mode = mode
    hits = engine.metrics_hits
    broken = await _latencies(client, stack.url, 30, for_s)
    polls = engine.metrics_hits - hits
    assert not await _up(stack, client), f"{mode}: headroom_engine_up must be 0 while the engine is broken"
    engine.mode = "ok"
    await wait_until_async(lambda: _up(stack, client), what=f"engine back up after {mode}")
    _never_delayed(mode, baseline, broken, stack.source.timeout_s)
    return {
        "mode": mode,
        "requests": len(broken),
        "polls": polls,
        "median_ms": round(statistics.median(broken) * 1000, 2),
        "p99_ms": round(statistics.quantiles(broken, n=100)[98] * 1000, 2),
        "max_ms": round(max(broken) * 1000, 2),
    }


async def _baseline(stack: Stack, client: httpx.AsyncClient) -> list[float]:
    """Latencies of the same proxied requests with a healthy engine (after a warm-up)."""
    await wait_until_async(lambda: _up(stack, client), what="engine up")
    await _latencies(client, stack.url, 20)  # warm-up: connections, first-call paths
    baseline = await _latencies(client, stack.url, 100, 1.0)
    print(
        f"\nbaseline: {len(baseline)} requests, median {statistics.median(baseline) * 1000:.2f} ms, "
        f"max {max(baseline) * 1000:.2f} ms"
    )
    return baseline


async def _up(stack: Stack, client: httpx.AsyncClient) -> bool:
    return (await stack.exported(client)).get("headroom_engine_up") == 1.0


@pytest.mark.serial  # latencies against a baseline: other tests' load would be the proxy's delay
async def test_garbage_or_failing_engine_metrics_never_delay_proxied_requests(fake_engine):
    engine, url = fake_engine
    # the limit is capped at half the poll timeout: beside CPU hogs the baseline itself stalled 3.4 s,
    # so a 2 s timeout's 1 s cap failed requests the host delayed; quiet, the limit is ~0.5 s as before
    stack = Stack(url, "vllm", f"{url}/metrics", poll_interval_s=0.05, timeout_s=patient(2.0))
    try:
        async with httpx.AsyncClient(timeout=30) as client:
            baseline = await _baseline(stack, client)
            for mode in ("garbage", "error"):
                report = await _broken_for(engine, stack, client, mode, BROKEN_FOR_S, baseline)
                print(report)
                # garbage is ~80 kB a poll, parsed off the event loop; 500s answer at once
                assert report["polls"] >= BROKEN_FOR_S / 0.5, f"{mode}: the poller must keep polling"
    finally:
        engine.release.set()
        stack.stop()


@pytest.mark.slow
@pytest.mark.serial
async def test_engine_metrics_hanging_for_a_minute_never_delay_proxied_requests(fake_engine):
    engine, url = fake_engine
    # Each hung poll holds until its 5 s timeout: a proxy that waited on it would show seconds.
    poll_timeout_s = min(5.0, HANG_FOR_S / 3)  # a shortened local run still sees the engine go down
    stack = Stack(url, "vllm", f"{url}/metrics", poll_interval_s=0.05, timeout_s=poll_timeout_s)
    try:
        async with httpx.AsyncClient(timeout=30) as client:
            baseline = await _baseline(stack, client)
            report = await _broken_for(engine, stack, client, "hang", HANG_FOR_S, baseline)
            print(report)
            # one poll per timeout, all minute long (less one for the poll in flight at the switch)
            assert report["polls"] >= HANG_FOR_S // (poll_timeout_s + 0.05) - 1, "the poller gave up"
    finally:
        engine.release.set()
        stack.stop()
