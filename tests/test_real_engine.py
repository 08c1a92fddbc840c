"""Capacity truth on a real engine: llama.cpp's llama-server (Gemma 3 270M on the CPU) at two
`--parallel` values. `headroom probe` straight at the engine and through `headroom run` must find
the knee that a plain client measures, fail no request, and the sidecar must answer no 502 of
its own (llama-server closes a keep-alive connection after each streamed answer).

The plain client is independent of the probe: httpx instead of aiohttp, a new connection per
request, its own SSE reading and its own look at the engine's `llamacpp:requests_deferred`.
It measures output tokens/s per level and whether requests waited for a slot; the knee it
reports is the highest level at which none did. On this engine throughput is nearly flat from
one request on (compute-bound: every request batched slows the others), so the knee is where the
engine starts queueing, and tokens/s past it must not rise meaningfully.
"""

from __future__ import annotations

import asyncio
import json
import statistics
import time
from dataclasses import dataclass

import httpx
import pytest

from collector.analysis.knee import detect_knee
from collector.analysis.probe import ProbeSettings, run_probe
from conftest import headroom_process
from real_engine import llama_server

pytestmark = [pytest.mark.real_engine, pytest.mark.slow]

MAX_TOKENS = 32
PROMPT = "Write a short story about a robot who learns to paint."


@dataclass
class PlainLevel:
    concurrency: int
    output_tokens_per_s: float
    ttft_p50_s: float
    deferred_mean: float  # the engine's requests_deferred, sampled every 100 ms


async def _one(client: httpx.AsyncClient, url: str) -> tuple[float, float, float, int]:
    """(admitted, first token, completed, completion tokens) of one streamed request."""
    body = {"model": "gemma", "messages": [{"role": "user", "content": PROMPT}],
            "max_tokens": MAX_TOKENS, "ignore_eos": True, "temperature": 0, "stream": True,
            "stream_options": {"include_usage": True}}
    admitted, first, tokens = time.monotonic(), None, 0
    async with client.stream("POST", url + "/v1/chat/completions", json=body,
                             headers={"Connection": "close"}) as response:
        assert response.status_code == 200
        async for line in response.aiter_lines():
            if not line.startswith("data: {"):
                continue
            chunk = json.loads(line[6:])
            if chunk.get("usage"):
                tokens = chunk["usage"]["completion_tokens"]
            elif first is None and chunk["choices"] and chunk["choices"][0]["delta"].get("content"):
                first = time.monotonic()
    return admitted, first or time.monotonic(), time.monotonic(), tokens


async def _deferred(client: httpx.AsyncClient, url: str, stop: asyncio.Event) -> list[float]:
    samples = []
    while not stop.is_set():
        text = (await client.get(url + "/metrics")).text
        samples += [float(line.split()[-1]) for line in text.splitlines()
                    if line.startswith("llamacpp:requests_deferred")]
        await asyncio.sleep(0.1)
    return samples


async def plain_level(url: str, concurrency: int, per_worker: int) -> PlainLevel:
    """A closed loop of `concurrency` workers, `per_worker` requests each, staggered starts."""
    async with httpx.AsyncClient(timeout=120, limits=httpx.Limits(max_keepalive_connections=0)) as client:
        results: list[tuple[float, float, float, int]] = []

        async def worker(index: int) -> None:
            await asyncio.sleep(index * 0.2)
            for _ in range(per_worker):
                results.append(await _one(client, url))

        stop = asyncio.Event()
        sampler = asyncio.create_task(_deferred(client, url, stop))
        await asyncio.gather(*(worker(i) for i in range(concurrency)))
        stop.set()
        deferred = await sampler
    # steady window: from the last worker's first admission to the first worker's last
    # completion; each request's tokens are spread over the time it was generating them (from
    # its first token: a request waiting for a slot generates nothing)
    start = sorted(r[0] for r in results)[concurrency - 1]
    end = sorted(r[2] for r in results)[-concurrency]
    tokens = sum(n * max(0.0, min(done, end) - max(first, start)) / max(done - first, 1e-9)
                 for _, first, done, n in results)
    return PlainLevel(concurrency, tokens / (end - start),
                      statistics.median(first - admitted for admitted, first, _, _ in results),
                      statistics.fmean(deferred) if deferred else 0.0)


def plain_knee(levels: list[PlainLevel]) -> int:
    """The highest level at which no request waited for a slot."""
    return max(level.concurrency for level in levels if level.deferred_mean < 0.5)


def _settings(url: str, levels: tuple[int, ...]) -> ProbeSettings:
    return ProbeSettings(url=url, levels=levels, max_tokens=MAX_TOKENS, warmup_per_worker=1,
                         min_samples=8, max_samples=20, drift_window=4, max_level_s=25.0)


def _sidecar_upstream_errors(metrics: str) -> float:
    return sum(float(line.rsplit(" ", 1)[1]) for line in metrics.splitlines()
               if line.startswith("headroom_requests_total{") and 'outcome="ok"' not in line)


@pytest.mark.parametrize("parallel, levels", [(2, (1, 2, 4)), (4, (1, 2, 4, 8))],
                         ids=["parallel2", "parallel4"])
def test_probe_finds_the_knee_a_plain_client_measures(parallel, levels, tmp_path):
    with llama_server(parallel) as engine:
        plain = [asyncio.run(plain_level(engine, c, max(2, 8 // c))) for c in levels]
        direct = asyncio.run(run_probe(_settings(engine, levels)))
        with headroom_process("run", "--upstream", engine, "--engine", "auto", "--no-jobs",
                              "--db", str(tmp_path / "sidecar.duckdb"), health="/healthz") as sidecar:
            through = asyncio.run(run_probe(_settings(sidecar, levels)))
            sidecar_metrics = httpx.get(sidecar + "/metrics").text
    table = {p.concurrency: (round(p.output_tokens_per_s, 1), round(p.ttft_p50_s, 3),
                             round(p.deferred_mean, 2)) for p in plain}
    print(f"\nplain client, --parallel {parallel}: {{concurrency: (output tok/s, TTFT p50, "
          f"deferred)}} = {table}")
    found = {}
    for name, result in (("direct", direct), ("through the sidecar", through)):
        rows = [row for level in result.levels for row in level.rows]
        found[name] = detect_knee([level.stats for level in result.levels])
        summary = [(lv.concurrency, round(lv.stats.output_tokens_per_s, 1),
                    round(lv.stats.ttft_p50_s or 0, 3), lv.stats.engine_waiting_mean)
                   for lv in result.levels]
        print(f"probe {name}: knee {found[name].requests} ({found[name].rule_reason}); "
              f"levels {summary}; retries {sum(row['upstream_retries'] for row in rows)}")
    # the plain measurement itself: nobody waits up to the slot count, requests wait past it,
    # and throughput past it does not rise meaningfully (it may creep: the queue keeps the batch full)
    knee = plain_knee(plain)
    assert knee == parallel, table
    by_level = {p.concurrency: p for p in plain}
    assert by_level[2 * parallel].output_tokens_per_s < 1.25 * by_level[parallel].output_tokens_per_s, table
    for name, result in (("direct", direct), ("through the sidecar", through)):
        rows = [row for level in result.levels for row in level.rows]
        summary = [(lv.concurrency, round(lv.stats.output_tokens_per_s, 1)) for lv in result.levels]
        assert [row["outcome"] for row in rows] == ["ok"] * len(rows), name
        assert found[name].requests == knee and found[name].reached, (name, found[name], table)
        at_knee = next(lv.stats for lv in result.levels if lv.concurrency == knee)
        assert at_knee.output_tokens_per_s == pytest.approx(by_level[knee].output_tokens_per_s,
                                                            rel=0.35), (name, summary, table)
    assert _sidecar_upstream_errors(sidecar_metrics) == 0  # no 502 of the sidecar's own making
    retried = sum(float(line.rsplit(" ", 1)[1]) for line in sidecar_metrics.splitlines()
                  if line.startswith("headroom_upstream_retries_total{"))
    print(f"sidecar: {retried:g} requests re-sent after a stale pooled connection, 0 errors")
