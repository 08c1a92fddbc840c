"""Which async HTTP client should the proxy use upstream? aiohttp vs httpx, same load, one run.

    python benchmarks/client_choice.py [--requests 1000 --concurrency 64 --chunks 100]

Each client streams the same responses from benchmarks/stream_upstream.py (a separate process)
at the same concurrency, reading every chunk as the proxy does. Reports wall time, this process's
CPU seconds per chunk (what the proxy would pay), and the ratio httpx/aiohttp.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import time

import aiohttp
import httpx
from _common import BODY, PYTHON, free_port, start


async def _aiohttp(url: str, requests: int, concurrency: int, chunks: int) -> int:
    connector = aiohttp.TCPConnector(limit=concurrency)
    seen = 0
    async with aiohttp.ClientSession(connector=connector, auto_decompress=False) as session:
        todo = iter(range(requests))

        async def worker():
            nonlocal seen
            for _ in todo:
                async with session.post(url, json=BODY, headers={"x-chunks": str(chunks)}) as resp:
                    async for _data in resp.content.iter_any():
                        seen += 1

        await asyncio.gather(*(worker() for _ in range(concurrency)))
    return seen


async def _httpx(url: str, requests: int, concurrency: int, chunks: int) -> int:
    limits = httpx.Limits(max_connections=concurrency, max_keepalive_connections=concurrency)
    seen = 0
    async with httpx.AsyncClient(limits=limits, timeout=60) as client:
        todo = iter(range(requests))

        async def worker():
            nonlocal seen
            for _ in todo:
                async with client.stream("POST", url, json=BODY, headers={"x-chunks": str(chunks)}) as resp:
                    async for _data in resp.aiter_raw():
                        seen += 1

        await asyncio.gather(*(worker() for _ in range(concurrency)))
    return seen


def _measure(fn, url, args) -> dict:
    cpu0, wall0 = time.process_time(), time.perf_counter()
    reads = asyncio.run(fn(url, args.requests, args.concurrency, args.chunks))
    cpu, wall = time.process_time() - cpu0, time.perf_counter() - wall0
    chunks = args.requests * (args.chunks + 2)
    return {
        "wall_s": round(wall, 3),
        "cpu_s": round(cpu, 3),
        "reads": reads,
        "cpu_us_per_chunk": round(cpu / chunks * 1e6, 2),
    }


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--requests", type=int, default=1000)
    parser.add_argument("--concurrency", type=int, default=64)
    parser.add_argument("--chunks", type=int, default=100)
    args = parser.parse_args()
    port = free_port()
    upstream = start([PYTHON, "benchmarks/stream_upstream.py", str(port)], f"http://127.0.0.1:{port}/")
    url = f"http://127.0.0.1:{port}/v1/chat/completions"
    try:
        _measure(_aiohttp, url, args)  # warm-up
        results = {"aiohttp": _measure(_aiohttp, url, args), "httpx": _measure(_httpx, url, args)}
        results["httpx_over_aiohttp_cpu"] = round(results["httpx"]["cpu_s"] / results["aiohttp"]["cpu_s"], 2)
        print(json.dumps(results, indent=2))
    finally:
        upstream.terminate()
        upstream.wait(30)


if __name__ == "__main__":
    main()
