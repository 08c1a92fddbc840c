"""Shared benchmark plumbing: start processes on loopback, wait for them, drive streaming load."""

from __future__ import annotations

import asyncio
import os
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import aiohttp
import httpx

ROOT = Path(__file__).resolve().parent.parent
BODY = {
    "model": "bench",
    "stream": True,
    "max_tokens": 100,
    "messages": [{"role": "user", "content": "benchmark prompt " * 10}],
}


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def start(
    args: list[str],
    url: str,
    timeout_s: float = 30.0,
    env: dict | None = None,
    cpus: set[int] | None = None,
    log: Path | None = None,
) -> subprocess.Popen:
    """Start a process (on `cpus` only, when given) and return once `url` answers (any status);
    its output goes to `log` when given."""
    out = log.open("wb") if log is not None else subprocess.DEVNULL
    proc = subprocess.Popen(
        args,
        cwd=ROOT,
        stdout=out,
        stderr=subprocess.STDOUT if log is not None else subprocess.DEVNULL,
        env=env,
        preexec_fn=(lambda: os.sched_setaffinity(0, cpus)) if cpus else None,
    )
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            httpx.get(url, timeout=1)
            return proc
        except httpx.HTTPError:
            if proc.poll() is not None:
                raise RuntimeError(f"{args} exited with {proc.returncode}") from None
            time.sleep(0.05)
    proc.kill()
    raise RuntimeError(f"{args} did not answer at {url} within {timeout_s} s")


def stop_all(processes: list[subprocess.Popen], timeout_s: float = 30.0) -> None:
    """Terminate every process first, then wait for each: they shut down side by side."""
    for process in processes:
        process.terminate()
    for process in processes:
        process.wait(timeout_s)


def checkout_env(pythonpath: str | None = None) -> dict[str, str]:
    """The environment for a target that must import `collector` from `pythonpath` (another
    checkout) or, without one, from this checkout's install.

    PYTHONSAFEPATH=1 matters: `python -m` puts the working directory, which start() sets to this
    checkout, *before* PYTHONPATH on sys.path, so without it `env PYTHONPATH=/tmp/before python -m
    collector.cli` runs this checkout's code. A/B runs made that way before 2026-12-03 compared a
    build with itself (BENCHMARKS.md §2, "A/B runs that compared a build with itself").
    """
    env = dict(os.environ, PYTHONSAFEPATH="1")
    if pythonpath:
        env["PYTHONPATH"] = pythonpath
    return env


def rss_mib(pid: int) -> float:
    """Resident memory of a process in MiB (Linux /proc)."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return float("nan")


def cpu_ticks() -> tuple[int, int]:
    """(steal, total) jiffies of all CPUs since boot, from /proc/stat's first line."""
    fields = [int(value) for value in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:9]]
    return fields[7], sum(fields)


class StealSampler:
    """Steal time (percent of all CPUs) per wall-clock second, sampled by a thread.

    On a virtual machine the host may take the vCPUs away (/proc/stat's `steal`). On the
    project's 2-vCPU microVM it comes in bursts of 10-30 s at 10-30 %, and a burst lifts the
    TTFT p99 of whatever runs then by 50-100 ms. `worst(began, ended)` tells whether a request's
    interval touched a stolen second, so that tail statistics can be compared over the requests
    the host left alone (BENCHMARKS.md §8c).
    """

    def __init__(self) -> None:
        self.by_second: dict[int, float] = {}
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        second = int(time.time())
        steal, total = cpu_ticks()
        while not self._stop.wait(second + 1 - time.time()):
            now_steal, now_total = cpu_ticks()
            self.by_second[second] = 100.0 * (now_steal - steal) / max(now_total - total, 1)
            second, steal, total = second + 1, now_steal, now_total

    def stop(self) -> None:
        self._stop.set()
        self._thread.join()

    def worst(self, began: float, ended: float) -> float:
        """The most steal (percent) in any second from `began` to `ended` (unknown seconds: 0)."""
        return max(self.by_second.get(second, 0.0) for second in range(int(began), int(ended) + 1))


def cpu_seconds(pid: int) -> float:
    """User + system CPU seconds a process has used (Linux /proc)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


async def drive(url: str, requests: int, concurrency: int, chunks: int, pace_ms: int = 0) -> dict:
    """Closed-loop streaming load (aiohttp: the cheapest client, see client_choice.py).

    Returns wall time, requests/s, p50/p95 of latency and of time to first token, bytes received.
    """
    latencies: list[float] = []
    first_token: list[float] = []
    headers = {"x-chunks": str(chunks), "x-pace-ms": str(pace_ms)}
    received = 0
    connector = aiohttp.TCPConnector(limit=concurrency)
    async with aiohttp.ClientSession(connector=connector, auto_decompress=False) as session:
        todo = iter(range(requests))

        async def worker() -> None:
            nonlocal received
            for _ in todo:
                start_t = time.perf_counter()
                first = None
                async with session.post(url, json=BODY, headers=headers) as resp:
                    async for data in resp.content.iter_any():
                        received += len(data)
                        if first is None and b'"content":"' in data:
                            first = time.perf_counter() - start_t
                first_token.append(first if first is not None else float("nan"))
                latencies.append(time.perf_counter() - start_t)

        started = time.perf_counter()
        await asyncio.gather(*(worker() for _ in range(concurrency)))
        wall = time.perf_counter() - started
    latencies.sort()
    first_token.sort()
    pick = lambda values, q: round(values[int(len(values) * q)] * 1000, 2)  # noqa: E731
    return {
        "wall_s": round(wall, 3),
        "requests_per_s": round(requests / wall, 1),
        "bytes": received,
        "p50_ms": pick(latencies, 0.5),
        "p95_ms": pick(latencies, 0.95),
        "ttft_p50_ms": pick(first_token, 0.5),
        "ttft_p95_ms": pick(first_token, 0.95),
    }


PYTHON = sys.executable
