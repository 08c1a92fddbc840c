"""The benchmarks' load generator: closed-loop streams for a fixed time, chunks and TTFT counted.

aiohttp is the cheapest client here (benchmarks/client_choice.py), which matters: on a 2-core
machine the load generator shares the CPU with the upstream and the proxy under test.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from dataclasses import dataclass, field

import aiohttp
import orjson

_TOKEN = b'" token"'  # one per token chunk in benchmarks/sse_upstream.py's streams
KEY = "sk-headroom-bench-0123456789abcdef0123456789abcdef"  # what LiteLLM wants; sent to every target
BODY = orjson.dumps(
    {
        "model": "bench",
        "stream": True,
        "max_tokens": 64,
        "messages": [{"role": "user", "content": "benchmark prompt words " * 12}],
    }
)


@dataclass
class RoundResult:
    """What one time-boxed round saw at the client."""

    seconds: float
    token_chunks: int = 0
    completed: int = 0
    failed: int = 0
    reads: int = 0  # the client's reads of answer bytes: fewer, larger reads cost it less per chunk
    ttft_s: list[float] = field(default_factory=list)
    ttft_at: list[float] = field(default_factory=list)  # wall time each of those requests was sent

    @property
    def chunks_per_s(self) -> float:
        return self.token_chunks / self.seconds


async def drive_for(
    url: str,
    streams: int,
    seconds: float,
    headers: dict[str, str],
    at_deadline: Callable[[], None] = lambda: None,
    drain_s: float = 30.0,
) -> RoundResult:
    """`streams` workers each send a request, read its stream to the end, and start again, until
    `seconds` have passed; then `at_deadline()` runs (say, to read the target's CPU time), and
    each worker finishes the stream it is reading (uncounted; at most `drain_s`) instead of
    abandoning it. Counts token chunks received within the window and the time to the first
    token of each request that got one in it.

    Abandoning 256 streams mid-answer at each round's end left the next round with 1-4 s
    first-token tails through every proxy, the bare pass-through too (BENCHMARKS.md §2).
    """
    result = RoundResult(seconds)
    connector = aiohttp.TCPConnector(limit=streams, limit_per_host=0, force_close=False)
    timeout = aiohttp.ClientTimeout(total=None, sock_read=120)
    headers = {"content-type": "application/json", "authorization": f"Bearer {KEY}", **headers}
    async with aiohttp.ClientSession(connector=connector, timeout=timeout, auto_decompress=False) as session:
        stopping = False

        async def worker() -> None:
            while not stopping:
                began, sent_at, first = time.perf_counter(), time.time(), True
                try:
                    async with session.post(url, data=BODY, headers=headers) as response:
                        async for data in response.content.iter_any():
                            tokens = data.count(_TOKEN)
                            if tokens and first:
                                result.ttft_s.append(time.perf_counter() - began)
                                result.ttft_at.append(sent_at)
                                first = False
                            result.token_chunks += tokens
                            result.reads += 1
                    result.completed += 1
                except (TimeoutError, aiohttp.ClientError):
                    result.failed += 1

        tasks = [asyncio.create_task(worker()) for _ in range(streams)]
        await asyncio.sleep(seconds)
        at_deadline()
        frozen = RoundResult(
            seconds,
            result.token_chunks,
            result.completed,
            result.failed,
            result.reads,
            list(result.ttft_s),
            list(result.ttft_at),
        )
        stopping = True  # each worker ends after its current stream
        _, late = await asyncio.wait(tasks, timeout=drain_s)
        for task in late:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
    return frozen


def percentile_ms(values: list[float], q: float) -> float:
    """The q-quantile (nearest rank) in milliseconds; NaN for no values."""
    if not values:
        return float("nan")
    ordered = sorted(values)
    return round(ordered[min(len(ordered) - 1, int(len(ordered) * q))] * 1000, 2)
