"""Resident memory with many streams in flight: the sidecar next to the bare pass-through.

    python benchmarks/inflight_rss.py [--streams 1000]

The upstream (benchmarks/sse_upstream.py) paces each answer at 50 tokens/s for 2,000 tokens, so
every stream stays open for 40 s. The load generator opens --streams of them through each target
in turn (`headroom run` with its DuckDB log, then benchmarks/passthrough_proxy.py), waits until
every stream has had its first token (and, through the sidecar, /healthz counts them all in
flight), reads each process's VmRSS, then closes the streams.
"""

from __future__ import annotations

import argparse
import asyncio
import tempfile
import time

import aiohttp
import httpx
from _common import PYTHON, free_port, rss_mib, start, stop_all
from _load import BODY

_HEADERS = {"content-type": "application/json", "x-chunks": "2000", "x-pace-ms": "20"}


async def hold_streams(
    url: str, streams: int, ready, pid: int, timeout_s: float = 120.0
) -> tuple[float, float]:
    """Open `streams` streams, wait until `ready(first_tokens)`; (seconds that took, RSS of `pid` then)."""
    connector = aiohttp.TCPConnector(limit=0)
    first_tokens = 0

    async def one(session: aiohttp.ClientSession) -> None:
        nonlocal first_tokens
        async with session.post(url, data=BODY, headers=_HEADERS) as response:
            counted = False
            async for data in response.content.iter_any():
                if not counted and b'" token"' in data:
                    first_tokens += 1
                    counted = True

    began = time.perf_counter()
    async with aiohttp.ClientSession(
        connector=connector, timeout=aiohttp.ClientTimeout(total=None)
    ) as session:
        tasks = [asyncio.create_task(one(session)) for _ in range(streams)]
        while not await ready(first_tokens):
            if time.perf_counter() - began > timeout_s:
                raise RuntimeError(f"only {first_tokens} of {streams} streams started within {timeout_s} s")
            await asyncio.sleep(0.2)
        seconds, rss = time.perf_counter() - began, rss_mib(pid)
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
    return seconds, rss


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--streams", type=int, default=1000)
    args = parser.parse_args()
    up_port, side_port, pass_port = free_port(), free_port(), free_port()
    upstream = f"http://127.0.0.1:{up_port}"
    processes = [start([PYTHON, "benchmarks/sse_upstream.py", str(up_port)], upstream + "/")]
    try:
        sidecar = start(
            [
                PYTHON,
                "-m",
                "collector.cli",
                "run",
                "--upstream",
                upstream,
                "--listen",
                f"127.0.0.1:{side_port}",
                "--db",
                tempfile.mkdtemp() + "/rss.duckdb",
                "--engine",
                "none",
                "--log-level",
                "error",
            ],
            f"http://127.0.0.1:{side_port}/healthz",
        )
        processes.append(sidecar)
        passthrough = start(
            [PYTHON, "benchmarks/passthrough_proxy.py", str(pass_port), upstream],
            f"http://127.0.0.1:{pass_port}/",
        )
        processes.append(passthrough)
        idle = {"headroom": rss_mib(sidecar.pid), "passthrough": rss_mib(passthrough.pid)}

        async def sidecar_ready(first: int) -> bool:
            async with httpx.AsyncClient() as client:
                health = (await client.get(f"http://127.0.0.1:{side_port}/healthz")).json()
            return health["inflight_requests"] >= args.streams and first >= args.streams

        async def all_started(first: int) -> bool:
            return first >= args.streams

        for name, port, process, ready in (
            ("headroom", side_port, sidecar, sidecar_ready),
            ("passthrough", pass_port, passthrough, all_started),
        ):
            seconds, rss = asyncio.run(
                hold_streams(f"http://127.0.0.1:{port}/v1/chat/completions", args.streams, ready, process.pid)
            )
            print(
                f"{name:<12} {args.streams} streams in flight (after {seconds:.1f} s): RSS {rss:6.1f} MiB "
                f"(idle {idle[name]:.1f} MiB)"
            )
    finally:
        stop_all(processes)


if __name__ == "__main__":
    main()
