"""LoRA adapters end to end: the simulator with 4 adapter slots behind a real sidecar.

The sidecar learns each adapter's base model from the engine's /v1/models (`parent`) and the slots
from its /metrics (vLLM's lora_requests_info max_lora); each request naming an adapter is logged
under its base model with the adapter, and /metrics shows the distinct adapters in flight against
the slots. 2 adapters in the mix stay within the slots (the thrash alert's condition never
holds); 8 adapters pass them at most scrapes and TTFT rises as the simulator's model says
(support.offline run on the same settings and the same mix, each request's adapter drawn
from Mix.adapter, docs/simulator.md "LoRA adapters").
"""

from __future__ import annotations

import asyncio
import random
import statistics

import httpx
import pytest
from support.offline import Mix, closed_loop_rows
from support.waiting import patient, wait_until_async

from collector.record import MemorySink
from collector.serving import serve_in_thread
from collector.sidecar.config import SidecarConfig
from collector.sidecar.wiring import build_sidecar
from collector.sim.app import create_sim_app
from collector.sim.config import SimConfig
from collector.sources import build_engine_source
from collector.sources.base import parse_exposition

# the simulator at wall speed beside real HTTP: its TTFTs are this machine's time to give
pytestmark = pytest.mark.serial

NAMES = tuple(f"lora-{i}" for i in range(8))
# Simulated time runs at wall speed: at 4x, a step was a few wall milliseconds, as long as the HTTP
# hop on a busy host, and the clients' re-sends lagging behind it thinned the engine's queue (CI
# measured a thrash median of 0.45x the model's; 4 runs beside 3 CPU hogs 0.62-1.16x). At 1x, the
# same 4 runs gave 0.94-0.96x.
SLOTS, CLIENTS, PER_CLIENT, OUTPUT, SPEED = 4, 16, 5, 64, 1.0
TOLERANCE = 0.25  # of the model's thrash median: 80 requests' draws, the HTTP hop, a busy host
CALM_TOLERANCE = 0.4  # the calm median's bounds: the arrivals set it (see the test)
PROMPT = "x" * 148  # 37 + 3 template tokens: the offline Mix's 40
CONFIG = SimConfig(model="base", max_num_seqs=16, lora_adapters=NAMES, max_loras=SLOTS, speed=SPEED)


def _mix(adapters: int) -> Mix:
    """The offline model's mix; both runs draw each request's adapter from it (Mix.adapter)."""
    return Mix(prompt_tokens=40, output_tokens=OUTPUT, adapters=NAMES[:adapters])


async def _client(client: httpx.AsyncClient, url: str, mix: Mix, draw: random.Random) -> None:
    for _ in range(PER_CLIENT):
        body = {
            "model": mix.adapter(draw),
            "messages": [{"role": "user", "content": PROMPT}],
            "max_tokens": OUTPUT,
            "ignore_eos": True,
            "stream": True,
        }
        async with client.stream("POST", f"{url}/v1/chat/completions", json=body) as response:
            async for _ in response.aiter_bytes():
                pass


async def _run(adapters: int) -> tuple[list[float], list[tuple[float, float]], MemorySink]:
    """(TTFTs, [(distinct adapters in flight, slots)] per scrape during the load, the rows)."""
    engine = create_sim_app(CONFIG)
    engine_handle = serve_in_thread(engine)
    sink = MemorySink()
    metrics_url = f"{engine_handle.url}/metrics"
    source = build_engine_source(
        "vllm",
        metrics_url,
        0.1,
        timeout_s=2.0,  # a busy host still answers
        models_list_url=f"{engine_handle.url}/v1/models",
        learn_adapters=True,
    )
    config = SidecarConfig(
        upstream=engine_handle.url, db_path=None, instance="t", engine="vllm", engine_metrics_url=metrics_url
    )
    sidecar = serve_in_thread(build_sidecar(config, sinks=[sink], engine=source))
    scrapes: list[tuple[float, float]] = []
    try:
        async with httpx.AsyncClient(timeout=patient(30)) as client:

            async def learned() -> bool:
                return bool(source.adapter_parents) and source.latest.adapter_slots == SLOTS

            await wait_until_async(learned, 10, what="the adapters' parents and slots")
            mix, draw = _mix(adapters), random.Random(0)  # one draw per request, as offline
            load = asyncio.gather(*(_client(client, sidecar.url, mix, draw) for _ in range(CLIENTS)))
            task = asyncio.ensure_future(load)
            while not task.done():
                samples = parse_exposition((await client.get(f"{sidecar.url}/metrics")).text)
                distinct = samples.get("headroom_adapters_inflight", [])
                slots = samples.get("headroom_adapter_slots", [])
                if distinct and slots:
                    assert [labels for labels, _ in distinct] == [{"model": "base"}]
                    scrapes.append((distinct[0][1], slots[0][1]))
                await asyncio.sleep(0.02)
            await task
            state = (await client.get(f"{engine_handle.url}/sim/state")).json()
    finally:
        sidecar.stop(timeout_s=patient(15))
        engine_handle.stop(timeout_s=patient(15))
    assert state["adapter_loads_total"] >= adapters
    ttfts = [row.ttft_s for row in sink.rows if row.ttft_s is not None]
    return ttfts, scrapes, sink


def _modelled_median_ttft(adapters: int, staggered: bool) -> float:
    """The offline model's median TTFT in wall seconds at SPEED, clients started together (the
    first level: every arrival in lockstep) or staggered over one request (a second level)."""
    levels = [CLIENTS, CLIENTS] if staggered else [CLIENTS]
    rows = closed_loop_rows(CONFIG, levels, 20.0, _mix(adapters))
    rows = [row for row in rows if row["ttft_s"] is not None]
    if staggered:
        rows = [row for row in rows[len(rows) // 2 :] if not row["probe_warmup"]]
    return statistics.median(row["ttft_s"] for row in rows) / SPEED


async def test_two_adapters_stay_within_the_slots_eight_thrash_and_ttft_rises_as_modelled():
    calm_ttfts, calm, calm_sink = await _run(2)
    thrash_ttfts, thrash, thrash_sink = await _run(8)

    # every row: the base model, the adapter the request named, one row per request
    for sink, adapters in ((calm_sink, 2), (thrash_sink, 8)):
        assert len(sink.rows) == CLIENTS * PER_CLIENT
        assert {row.model for row in sink.rows} == {"base"}
        assert {row.adapter for row in sink.rows} == set(NAMES[:adapters])
        assert all(row.outcome == "ok" for row in sink.rows)

    assert calm and thrash
    assert all(slots == SLOTS for _, slots in calm + thrash)
    assert max(distinct for distinct, _ in calm) <= 2  # never past the slots: no thrash warning
    over = sum(1 for distinct, slots in thrash if distinct > slots)
    assert over >= len(thrash) / 2, thrash  # the alert's first condition holds while it runs

    # As the model says (docs/simulator.md, "LoRA adapters"): the thrash median within TOLERANCE. Past the slots the
    # median TTFT is the model's whatever the arrivals (0.24 s simulated, lockstep or staggered).
    # Within them it is one prefill step, which the arrivals set: 16 prompts prefilled together
    # when every client re-sends at once (0.053 s: the model's 4.5x), one at a time when they are
    # spread (0.013 s: 19x). The live clients start together and HTTP spreads them, so the live
    # calm median lies between the two, and the ratio between 4.5x and 19x. (Clients pinned to
    # one adapter each, as this test once sent, are another mix: 41x.)
    thrash_model = _modelled_median_ttft(8, staggered=False)
    assert thrash_model == pytest.approx(_modelled_median_ttft(8, staggered=True), rel=0.05)
    lockstep, spread = (_modelled_median_ttft(2, staggered) for staggered in (False, True))
    calm_median, thrash_median = statistics.median(calm_ttfts), statistics.median(thrash_ttfts)
    assert thrash_median == pytest.approx(thrash_model, rel=TOLERANCE), (thrash_median, thrash_model)
    assert spread / (1 + CALM_TOLERANCE) <= calm_median <= lockstep * (1 + CALM_TOLERANCE), (
        calm_median,
        spread,
        lockstep,
    )
    measured = thrash_median / calm_median
    low, high = thrash_model / lockstep, thrash_model / spread  # ~4.5x and ~19x
    assert low / (1 + CALM_TOLERANCE) <= measured <= high * (1 + CALM_TOLERANCE), (measured, low, high)
