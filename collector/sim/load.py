"""A small closed-loop load generator: `concurrency` workers, each sending its next request as soon
as the previous one ends, for a fixed time. Used by the simulator tests and `headroom demo`.

Per level it records each request's status, TTFT (first chunk with non-empty content), end time and
completion tokens (from the streamed `usage`). `summarize()` turns one level into throughput over
the measurement window and latency percentiles: output tokens are spread evenly over each request's
[first token, end] span and counted where that span overlaps the window, so a level's tokens/s does
not depend on where request boundaries fall.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, TypedDict

import aiohttp
import orjson

from collector.analysis.stats import percentile

__all__ = ["RequestResult", "LevelResult", "LevelSummary", "Payload", "run_level", "summarize"]

Payload = Callable[[int, int], dict[str, Any]]  # (worker index, request index of that worker) -> JSON body


@dataclass(frozen=True)
class RequestResult:
    """One request as the client saw it; times are time.monotonic() seconds."""

    status: int
    started: float
    first_token: float | None
    finished: float
    completion_tokens: int


@dataclass(frozen=True)
class LevelResult:
    """All requests of one level and its measurement window."""

    concurrency: int
    results: list[RequestResult]
    window: tuple[float, float]


async def _one(session: aiohttp.ClientSession, url: str, body: dict[str, Any]) -> RequestResult:
    started = time.monotonic()
    first, tokens = None, 0
    async with session.post(
        url, data=orjson.dumps(body), headers={"Content-Type": "application/json"}
    ) as response:
        if response.status != 200:
            await response.read()
            return RequestResult(response.status, started, None, time.monotonic(), 0)
        async for line in response.content:
            if not line.startswith(b"data: {"):
                continue
            event = orjson.loads(line[6:])
            if event.get("usage"):
                tokens = event["usage"].get("completion_tokens") or 0
            choices = event.get("choices") or ()
            if first is None and any(_content(c) for c in choices):
                first = time.monotonic()
    return RequestResult(200, started, first, time.monotonic(), tokens)


def _content(choice: dict[str, Any]) -> bool:
    delta = choice.get("delta")
    return bool(delta.get("content")) if delta is not None else bool(choice.get("text"))


async def _worker(
    session: aiohttp.ClientSession,
    url: str,
    payload: Payload,
    worker: int,
    stop_at: float,
    results: list[RequestResult],
    backoff_s: float,
) -> None:
    index = 0
    while time.monotonic() < stop_at:
        body = payload(worker, index) | {"stream": True, "stream_options": {"include_usage": True}}
        try:
            result = await _one(session, url, body)
        except aiohttp.ClientError:
            result = RequestResult(0, time.monotonic(), None, time.monotonic(), 0)
        results.append(result)
        index += 1
        if result.status != 200:
            await asyncio.sleep(backoff_s)  # 429 or error: do not spin


async def run_level(
    base_url: str,
    concurrency: int,
    duration_s: float,
    payload: Payload,
    *,
    warmup_s: float = 0.0,
    path: str = "/v1/chat/completions",
    backoff_s: float = 0.05,
) -> LevelResult:
    """Run `concurrency` closed-loop workers for warmup_s + duration_s; measure the last duration_s.

    Workers stop sending at the end of the window and in-flight requests complete (bounded by the
    engine's queue), so every request's completion tokens are known.
    """
    if concurrency < 1 or duration_s <= 0:
        raise ValueError(f"concurrency={concurrency} and duration_s={duration_s} must be positive")
    results: list[RequestResult] = []
    start = time.monotonic()
    window = (start + warmup_s, start + warmup_s + duration_s)
    connector = aiohttp.TCPConnector(limit=0)
    timeout = aiohttp.ClientTimeout(total=None, sock_read=120)
    async with aiohttp.ClientSession(connector=connector, timeout=timeout) as session:
        await asyncio.gather(
            *(
                _worker(session, base_url.rstrip("/") + path, payload, w, window[1], results, backoff_s)
                for w in range(concurrency)
            )
        )
    return LevelResult(concurrency, results, window)


def _tokens_in_window(result: RequestResult, start: float, end: float) -> float:
    begin = result.first_token if result.first_token is not None else result.finished
    if result.finished <= begin:
        return float(result.completion_tokens) if start <= result.finished <= end else 0.0
    overlap = max(0.0, min(end, result.finished) - max(start, begin))
    return result.completion_tokens * overlap / (result.finished - begin)


class LevelSummary(TypedDict):
    """summarize(): one level's throughput over its window and TTFT percentiles."""

    concurrency: int
    requests: int
    rate_limited: int
    output_tokens_per_s: float
    ttft_p50_s: float | None
    ttft_p95_s: float | None


def summarize(level: LevelResult) -> LevelSummary:
    """Throughput over the window and p50/p95/p99 TTFT of requests started inside it."""
    start, end = level.window
    inside = [r for r in level.results if start <= r.started <= end]
    ok = [r for r in inside if r.status == 200]
    ttfts = [r.first_token - r.started for r in ok if r.first_token is not None]
    tokens = sum(_tokens_in_window(r, start, end) for r in level.results if r.status == 200)
    return {
        "concurrency": level.concurrency,
        "requests": len(inside),
        "rate_limited": sum(1 for r in inside if r.status == 429),
        "output_tokens_per_s": tokens / (end - start),
        "ttft_p50_s": percentile(ttfts, 0.5),
        "ttft_p95_s": percentile(ttfts, 0.95),
    }
