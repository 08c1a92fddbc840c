"""A mixed run of 2,000 requests of every kind at concurrency 64: no leak, no loss, no duplicate."""

from __future__ import annotations

import asyncio
import gc
import logging
import random

import httpx
import pytest
from support.sidecar import CHAT, gauge_values, sidecar_rig, wait_until
from support.waiting import patient

from collector.sidecar.exchange import Exchange
from collector.sidecar.wiring import sidecar_state

TOTAL, CONCURRENCY = 2000, 64
# (mode, x-fake-tokens, stream, client cancels after N bytes or None)
KINDS = [
    ("ok", "20", True, None),
    ("ok", "40", False, None),
    ("usage-null", "10", True, None),
    ("429", "5", True, None),
    ("500", "5", False, None),
    ("reset", "5", True, None),
    ("malformed", "5", True, None),
    ("ok", "200", True, 300),
    ("stall", "5", True, None),
    ("hang", "5", True, 0),
]


async def _one(client: httpx.AsyncClient, rig, i: int, rng: random.Random) -> None:
    url = rig.url + "/v1/chat/completions"
    mode, tokens, stream, cancel_after = rng.choice(KINDS)
    body = {**CHAT, "stream": stream, "messages": [{"role": "user", "content": "x " * rng.randint(1, 400)}]}
    headers = {"x-fake": mode, "x-fake-tokens": tokens, "X-Tenant-ID": f"t{i % 7}"}
    try:
        if cancel_after is None:
            await client.post(url, json=body, headers=headers)
            return
        if cancel_after == 0:  # give up once the upstream has it, before its first byte
            arrived = rig.fake.expect(f"r{i}")
            task = asyncio.ensure_future(
                client.post(url, json=body, headers={**headers, "x-test-id": f"r{i}"})
            )
            await asyncio.get_running_loop().run_in_executor(None, arrived.wait, patient(10))
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)
            return
        async with client.stream("POST", url, json=body, headers=headers) as response:
            seen = 0
            async for chunk in response.aiter_raw():
                seen += len(chunk)
                if seen >= cancel_after:
                    break
    except (TimeoutError, httpx.HTTPError):
        pass  # resets, timeouts and our own cancellations are part of the mix


async def _drive(rig) -> None:
    rng = random.Random(42)
    limits = httpx.Limits(max_connections=CONCURRENCY, max_keepalive_connections=CONCURRENCY)
    async with httpx.AsyncClient(timeout=patient(10), limits=limits) as client:
        queue = iter(range(TOTAL))

        async def worker() -> None:
            for i in queue:
                await _one(client, rig, i, rng)

        await asyncio.gather(*(worker() for _ in range(CONCURRENCY)))


@pytest.mark.slow
def test_mixed_run_ends_at_zero_with_one_row_per_request(tmp_path, caplog):
    with caplog.at_level(logging.ERROR, logger="collector"):
        with sidecar_rig(tmp_path, read_timeout_s=0.3) as rig:
            asyncio.run(_drive(rig))
            wait_until(lambda: not sidecar_state(rig.app).tracker.live, timeout_s=30)
            metrics = rig.metrics()
            rows = rig.rows("SELECT request_id, outcome FROM requests")
    inflight = gauge_values(metrics, "headroom_inflight_requests")
    active = gauge_values(metrics, "headroom_active_tokens")
    assert len(inflight) == 7 and set(inflight) == {0.0}  # 7 tenants x 1 model, all back to 0
    assert set(active) == {0.0}
    counted = sum(v for (name, _), v in metrics.items() if name == "headroom_requests_total")
    # first: every request the sidecar counted has its one row (a lost or doubled row fails here);
    # then: every request the clients sent reached it (a client that gave up before sending fails)
    assert len(rows) == counted and len({r["request_id"] for r in rows}) == len(rows)
    assert counted == TOTAL
    outcomes = {r["outcome"] for r in rows}
    assert {"ok", "rate_limited", "upstream_error", "client_cancelled", "timeout"} <= outcomes
    assert not [r for r in caplog.records if r.name.startswith("collector")], caplog.text


def test_answers_served_over_a_kept_alive_upstream_connection_are_not_kept_alive_by_it(tmp_path):
    # the sidecar hangs a "connection lost" callback on each upstream answer's pooled
    # connection; left there, every answer stayed in memory until the connection closed
    # (about 7 KB per request: 340 MiB over 48,000 requests)
    def answers_alive() -> int:
        gc.collect()
        return sum(isinstance(o, Exchange) for o in gc.get_objects())

    with sidecar_rig(tmp_path) as rig, httpx.Client(base_url=rig.url, timeout=patient(10)) as client:
        for stream in (True, False):  # warm the pool, both relays
            assert client.post("/v1/chat/completions", json={**CHAT, "stream": stream}).status_code == 200
        before = answers_alive()
        for i in range(120):
            body = {**CHAT, "stream": i % 2 == 0}
            assert (
                client.post("/v1/chat/completions", json=body, headers={"x-fake-tokens": "5"}).status_code
                == 200
            )
        assert answers_alive() <= before + 2, "upstream answers are being kept alive after they ended"
