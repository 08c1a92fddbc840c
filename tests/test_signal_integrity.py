"""Signal integrity (#39 item 3): each case sets headroom_signal_valid and its reason.

Inputs are the recorded /metrics pages of tests/fixtures (vLLM before and after its KV rename,
SGLang, llama.cpp's real captures) parsed by the real parsers, a clock the test moves, and the
sidecar's traffic as (in flight, finished). The live case runs a real sidecar in front of the
simulator whose /metrics freezes (its `freeze` fault) while requests flow.
"""

from __future__ import annotations

import asyncio
import json
import time

import httpx
import pytest
from conftest import FIXTURES
from prometheus_client import CollectorRegistry, generate_latest
from support.waiting import patient, wait_until_async

from collector.serving import serve_in_thread
from collector.sidecar.config import SidecarConfig
from collector.sidecar.wiring import build_sidecar
from collector.sim.app import create_sim_app
from collector.sim.config import SimConfig
from collector.sources import build_engine_source
from collector.sources.base import EngineSnapshot, parse_exposition
from collector.sources.health import SourceHealth
from collector.sources.integrity import SignalIntegrity
from collector.sources.llamacpp import parse_llamacpp
from collector.sources.renames import KNOWN_RENAMES, names
from collector.sources.sglang import parse_sglang
from collector.sources.vllm import RULES, parse_vllm

V11 = (FIXTURES / "vllm" / "metrics_v0_11.txt").read_text()
V06 = (FIXTURES / "vllm" / "metrics_v0_6.txt").read_text()
SGLANG = (FIXTURES / "sglang" / "metrics_v0_5.txt").read_text()
LLAMA_IDLE = (FIXTURES / "llamacpp" / "metrics_idle_after_load.txt").read_text()
LLAMA_BUSY = (FIXTURES / "llamacpp" / "metrics_busy.txt").read_text()
SLOTS_BUSY = json.loads((FIXTURES / "llamacpp" / "slots_busy.json").read_text())


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


class Traffic:
    def __init__(self, inflight: int = 0, finished: int = 0) -> None:
        self.inflight, self.finished = inflight, finished

    def __call__(self) -> tuple[int, int]:
        return self.inflight, self.finished


def _integrity(traffic: Traffic | None = None, clock: Clock | None = None) -> SignalIntegrity:
    return SignalIntegrity(traffic, clock=clock or Clock())


def _valid(integrity: SignalIntegrity) -> dict[str, tuple[str, float]]:
    return {signal: (reason, value) for signal, reason, value in integrity.valid()}


def test_the_current_name_is_ok_and_a_known_older_name_is_renamed_and_valid():
    current, older = _integrity(Traffic(3)), _integrity(Traffic(3))
    current.observe(parse_vllm(V11))
    older.observe(parse_vllm(V06))
    assert _valid(current)["kv_usage"] == ("ok", 1.0)
    assert _valid(older)["kv_usage"] == ("renamed", 1.0)  # vllm:gpu_cache_usage_perc, followed
    assert _valid(older)["running"] == ("ok", 1.0)


def test_the_known_renames_are_data_the_parser_reads():
    (rename,) = [r for r in KNOWN_RENAMES if r.engine == "vllm"]
    assert (rename.old, rename.new) == ("vllm:gpu_cache_usage_perc", "vllm:kv_cache_usage_perc")
    assert RULES["kv_usage"].names == names(rename.new) == (rename.new, rename.old)


def test_a_rename_the_sidecar_does_not_know_is_missing_and_invalid():
    page = V11.replace("vllm:kv_cache_usage_perc", "vllm:kv_cache_usage_fraction")  # a future rename
    integrity = _integrity(Traffic(3))
    integrity.observe(parse_vllm(page))
    assert _valid(integrity)["kv_usage"] == ("missing", 0.0)
    assert _valid(integrity)["running"] == ("ok", 1.0)


def test_a_signal_seen_earlier_in_the_run_and_gone_now_is_missing():
    integrity = _integrity(Traffic(2))
    integrity.observe(parse_llamacpp(LLAMA_BUSY, SLOTS_BUSY))  # KV usage from /slots
    assert _valid(integrity)["kv_usage"] == ("ok", 1.0)
    integrity.observe(parse_llamacpp(LLAMA_BUSY, None))  # /slots switched off
    assert _valid(integrity)["kv_usage"] == ("missing", 0.0)
    # llama.cpp does not always export KV usage: a run that never saw it does not call it missing
    fresh = _integrity(Traffic(2))
    fresh.observe(parse_llamacpp(LLAMA_BUSY, None))
    assert "kv_usage" not in _valid(fresh)


def test_kv_usage_unchanged_while_requests_finish_is_stale():
    clock, traffic = Clock(), Traffic(inflight=4, finished=100)
    integrity = _integrity(traffic, clock)
    snapshot = parse_vllm(V11)
    integrity.observe(snapshot)
    clock.now += 59
    traffic.finished += 10
    integrity.observe(snapshot)
    assert _valid(integrity)["kv_usage"] == ("ok", 1.0)  # not yet a minute
    clock.now += 2
    integrity.observe(snapshot)
    assert _valid(integrity)["kv_usage"] == ("stale", 0.0)
    assert _valid(integrity)["running"] == ("ok", 1.0)  # a full batch may hold its count
    moved = parse_vllm(V11.replace("} 0.6375", "} 0.64"))
    integrity.observe(moved)
    assert _valid(integrity)["kv_usage"] == ("ok", 1.0)


def test_kv_usage_unchanged_with_nothing_finishing_is_not_stale():
    clock, traffic = Clock(), Traffic(inflight=0, finished=100)
    integrity = _integrity(traffic, clock)
    snapshot = parse_vllm(V11)
    for _ in range(5):
        integrity.observe(snapshot)
        clock.now += 60
    assert _valid(integrity)["kv_usage"] == ("idle", 1.0)  # prefix cache kept after the last request


def _polls(integrity: SignalIntegrity, clock: Clock, traffic: Traffic, snapshot, inflight: list[int]) -> None:
    """One poll of `snapshot` per in-flight value, 10 s apart, 3 requests finishing between."""
    for count in inflight:
        traffic.inflight = count
        integrity.observe(snapshot)
        clock.now += 10
        traffic.finished += 3


def test_running_and_waiting_frozen_while_the_load_moves_across_them_are_stale():
    """llama.cpp exports no KV usage without /slots: the request counts are its only stale check."""
    clock, traffic = Clock(), Traffic(finished=50)
    integrity = _integrity(traffic, clock)
    frozen = parse_llamacpp(LLAMA_BUSY, None)  # requests_processing 4, requests_deferred 2
    assert (frozen.running, frozen.waiting, frozen.kv_usage_ratio) == (4, 2, None)
    _polls(integrity, clock, traffic, frozen, [9, 3, 10, 2, 8, 4])  # 50 s: not yet a minute
    assert _valid(integrity) == {"running": ("ok", 1.0), "waiting": ("ok", 1.0)}
    _polls(integrity, clock, traffic, frozen, [9, 3])
    assert _valid(integrity) == {"running": ("stale", 0.0), "waiting": ("stale", 0.0)}
    moved = parse_llamacpp(LLAMA_BUSY.replace("requests_deferred 2", "requests_deferred 1"), None)
    _polls(integrity, clock, traffic, moved, [9])
    assert _valid(integrity) == {"running": ("ok", 1.0), "waiting": ("ok", 1.0)}


@pytest.mark.parametrize(
    ("case", "inflight", "finishing"),
    [
        # queued at a limit the engine does not count (llama-server's HTTP threads): always above
        ("behind a limit", [8, 14, 9, 12, 8, 13, 10, 9], 3),
        # a closed loop of six clients: in flight at or one below the engine's six
        ("closed loop", [6, 5, 6, 6, 5, 6, 5, 6], 3),
        # the load moved across the counts but nothing finished: a stalled engine holds its counts
        ("nothing finishing", [9, 3, 10, 2, 8, 4, 9, 3], 0),
    ],
)
def test_request_counts_that_may_legitimately_hold_are_not_stale(case, inflight, finishing):
    clock, traffic = Clock(), Traffic(finished=50)
    integrity = _integrity(traffic, clock)
    held = parse_llamacpp(LLAMA_BUSY, None)  # 4 running, 2 waiting, every poll
    for count in inflight:
        traffic.inflight = count
        integrity.observe(held)
        clock.now += 10
        traffic.finished += finishing
    assert _valid(integrity) == {"running": ("ok", 1.0), "waiting": ("ok", 1.0)}, case


def test_a_full_batch_holds_running_while_its_queue_moves_and_is_not_stale():
    clock, traffic = Clock(), Traffic(finished=50)
    integrity = _integrity(traffic, clock)
    line = 'vllm:num_requests_waiting{engine="0",model_name="meta-llama/Llama-3.1-8B-Instruct"} '
    for waiting, count in [(3, 12), (5, 4), (2, 13), (3, 5), (6, 12), (1, 4), (3, 12), (4, 5)]:
        traffic.inflight = count
        page = V11.replace(line + "3.0", f"{line}{waiting}.0")
        assert parse_vllm(page).waiting == waiting
        integrity.observe(parse_vllm(page))  # running stays at 7
        clock.now += 10
        traffic.finished += 3
    assert _valid(integrity)["running"] == ("ok", 1.0)
    assert _valid(integrity)["waiting"] == ("ok", 1.0)


def test_request_counts_frozen_at_zero_are_never_stale_and_stuck_only_when_always_busy():
    """Below zero in flight is impossible, so zeros have no stale evidence; stuck judges them."""
    clock, traffic = Clock(), Traffic(finished=50)
    integrity = _integrity(traffic, clock)
    _polls(integrity, clock, traffic, parse_llamacpp(LLAMA_IDLE, None), [3, 0, 4, 0, 3, 0, 4, 0])
    assert _valid(integrity) == {"running": ("idle", 1.0), "waiting": ("idle", 1.0)}


def test_minus_one_is_stuck():
    page = SGLANG.replace('sglang:token_usage{model_name="meta-llama/Llama-3.1-8B-Instruct"} 0.28', "")
    page += 'sglang:token_usage{model_name="meta-llama/Llama-3.1-8B-Instruct"} -1\n'
    integrity = _integrity(Traffic(2))
    integrity.observe(parse_sglang(SGLANG))
    assert _valid(integrity)["kv_usage"] == ("ok", 1.0)
    integrity.observe(parse_sglang(page))
    assert _valid(integrity)["kv_usage"] == ("stuck", 0.0)


def test_zero_running_while_the_sidecar_has_requests_in_flight_is_stuck():
    clock, traffic = Clock(), Traffic(inflight=3, finished=0)
    integrity = _integrity(traffic, clock)
    idle_page = parse_llamacpp(LLAMA_IDLE, None)  # requests_processing 0
    assert idle_page.running == 0
    integrity.observe(idle_page)
    clock.now += 20
    integrity.observe(idle_page)
    assert _valid(integrity)["running"] == ("ok", 1.0)  # the engine may not have them yet
    clock.now += 11
    integrity.observe(idle_page)
    assert _valid(integrity)["running"] == ("stuck", 0.0)
    assert _valid(integrity)["waiting"] == ("ok", 1.0)  # a queue of 0 is normal
    traffic.inflight = 0  # the requests left: the zero is true again
    integrity.observe(idle_page)
    assert _valid(integrity)["running"] == ("idle", 1.0)


def test_a_failing_scrape_is_told_apart_from_an_idle_engine():
    failing, idle = _integrity(Traffic(0)), _integrity(Traffic(0))
    failing.observe(EngineSnapshot.down("vllm", "http://x/metrics answered HTTP 500"))
    idle.observe(parse_llamacpp(LLAMA_IDLE, None))
    assert _valid(failing) == {s: ("scrape_failing", 0.0) for s in ("kv_usage", "running", "waiting")}
    assert _valid(idle) == {"running": ("idle", 1.0), "waiting": ("idle", 1.0)}


def test_the_sources_collector_exports_headroom_signal_valid():
    source = build_engine_source("vllm", "http://127.0.0.1:9/metrics", 1.0)
    source.integrity.traffic = Traffic(4, 0)
    source.latest = parse_vllm(V06)
    source.integrity.observe(source.latest)
    registry = CollectorRegistry()
    registry.register(SourceHealth([source]))
    samples = parse_exposition(generate_latest(registry).decode())["headroom_signal_valid"]
    assert {(labels["signal"], labels["reason"], value) for labels, value in samples} == {
        ("kv_usage", "renamed", 1.0),
        ("kv_capacity", "ok", 1.0),  # from cache_config_info's labels
        ("running", "ok", 1.0),
        ("waiting", "ok", 1.0),
    }


@pytest.mark.asyncio
async def test_a_sidecar_in_front_of_a_simulator_whose_metrics_froze_marks_kv_usage_stale():
    sim_app = create_sim_app(SimConfig(flavor="vllm", max_num_seqs=4, speed=20.0))
    sim = serve_in_thread(sim_app)
    source = build_engine_source("vllm", f"{sim.url}/metrics", 0.1, timeout_s=2.0)  # a busy host answers
    source.integrity.stale_after_s, source.integrity.stale_min_requests = 1.0, 3
    config = SidecarConfig(upstream=sim.url, db_path=None, instance="test", engine="vllm", jobs=False)
    sidecar = serve_in_thread(build_sidecar(config, engine=source))

    async def reasons(client: httpx.AsyncClient) -> dict[str, str]:
        page = parse_exposition((await client.get(f"{sidecar.url}/metrics")).text)
        return {labels["signal"]: labels["reason"] for labels, _ in page.get("headroom_signal_valid", ())}

    async def load(client: httpx.AsyncClient, count: int) -> None:
        body = {
            "model": "headroom-sim",
            "messages": [{"role": "user", "content": "hi " * 200}],
            "max_tokens": 32,
        }
        answers = await asyncio.gather(
            *(client.post(f"{sidecar.url}/v1/chat/completions", json=body) for _ in range(count))
        )
        assert all(answer.status_code == 200 for answer in answers)

    try:
        async with httpx.AsyncClient(timeout=patient(30)) as client:
            await wait_until_async(lambda: _has(reasons(client), "kv_usage"), what="kv_usage judged")
            await load(client, 6)
            assert (await reasons(client))["kv_usage"] in ("ok", "idle")
            sim_app.state.metrics.fault = "freeze"  # the engine's exporter wedges
            await load(client, 8)

            async def stale() -> bool:
                await load(client, 2)
                return (await reasons(client)).get("kv_usage") == "stale"

            await wait_until_async(stale, timeout_s=20, what="kv_usage stale while requests flow")
            sim_app.state.metrics.fault = None

            async def valid_again() -> bool:  # once the engine's figure moves again
                await load(client, 2)
                return (await reasons(client)).get("kv_usage") in ("ok", "idle")

            await wait_until_async(valid_again, timeout_s=20, what="kv_usage valid again")
    finally:
        sidecar.stop(timeout_s=patient(15))
        sim.stop(timeout_s=patient(15))


async def _has(reasons, signal: str) -> bool:
    return signal in await reasons


@pytest.mark.asyncio
async def test_a_sidecar_in_front_of_a_llamacpp_simulator_whose_metrics_froze_marks_the_counts_stale():
    """llama.cpp's running and waiting, frozen with six requests in; the sidecar then carries
    bursts of ten and gaps of none: both are stale while KV usage (from the live /slots) is not."""
    sim_app = create_sim_app(SimConfig(flavor="llamacpp", max_num_seqs=4))
    sim = serve_in_thread(sim_app)
    source = build_engine_source("llamacpp", f"{sim.url}/metrics", 0.1, timeout_s=2.0)
    source.integrity.stale_after_s, source.integrity.stale_min_requests = 1.0, 3
    config = SidecarConfig(upstream=sim.url, db_path=None, instance="test", engine="llamacpp", jobs=False)
    sidecar = serve_in_thread(build_sidecar(config, engine=source))

    async def reasons(client: httpx.AsyncClient) -> dict[str, str]:
        page = parse_exposition((await client.get(f"{sidecar.url}/metrics")).text)
        return {labels["signal"]: labels["reason"] for labels, _ in page.get("headroom_signal_valid", ())}

    async def load(client: httpx.AsyncClient, count: int, max_tokens: int) -> None:
        body = {
            "model": "headroom-sim",
            "messages": [{"role": "user", "content": "hi"}],
            "max_tokens": max_tokens,
        }
        answers = await asyncio.gather(
            *(client.post(f"{sidecar.url}/v1/chat/completions", json=body) for _ in range(count))
        )
        assert all(answer.status_code == 200 for answer in answers)

    async def polled_after(at: float) -> bool:  # the poller read the engine after `at`
        return source.latest.polled_at > at

    async def engine_counts(client: httpx.AsyncClient) -> tuple[int, int]:
        page = parse_llamacpp((await client.get(f"{sim.url}/metrics")).text, None)
        return page.running or 0, page.waiting or 0

    async def burst_and_gap(client: httpx.AsyncClient) -> None:
        await load(client, 10, 48)  # ten in flight: above the frozen six
        ended = time.time()
        await wait_until_async(lambda: polled_after(ended), what="a poll with nothing in flight")

    try:
        async with httpx.AsyncClient(timeout=patient(60)) as client:
            held = asyncio.create_task(load(client, 6, 400))
            await wait_until_async(lambda: _is(engine_counts(client), (4, 2)), what="4 running, 2 waiting")
            sim_app.state.metrics.fault = "freeze"  # the exporter wedges at (4, 2)
            await held
            for _ in range(10):
                await burst_and_gap(client)
                judged = await reasons(client)
                if judged.get("running") == "stale":
                    break
            assert judged["running"] == judged["waiting"] == "stale", judged
            assert judged["kv_usage"] in ("ok", "idle"), judged  # /slots still answers live
            sim_app.state.metrics.fault = None

            async def valid_again() -> bool:
                await load(client, 2, 8)
                return (await reasons(client)).get("running") in ("ok", "idle")

            await wait_until_async(valid_again, timeout_s=20, what="running valid again")
    finally:
        sidecar.stop(timeout_s=patient(15))
        sim.stop(timeout_s=patient(15))


async def _is(value, expected) -> bool:
    return await value == expected
