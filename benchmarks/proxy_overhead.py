"""Proxy overhead: the same streaming load sent directly to an upstream and through the sidecar.

    python benchmarks/proxy_overhead.py [--requests 2000 --concurrency 64 --chunks 100]

Upstream, sidecar and load generator are three processes on loopback. Reports, side by side in
one run: requests/s, p50/p95 latency, the ratio sidecar/direct, the sidecar's CPU time per
streamed chunk and its resident memory after the run. Results go in BENCHMARKS.md.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import tempfile

from _common import PYTHON, cpu_seconds, drive, free_port, rss_mib, start


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--requests", type=int, default=2000)
    parser.add_argument("--concurrency", type=int, default=64)
    parser.add_argument("--chunks", type=int, default=100)
    args = parser.parse_args()
    up_port, side_port = free_port(), free_port()
    upstream = start([PYTHON, "benchmarks/stream_upstream.py", str(up_port)],
                     f"http://127.0.0.1:{up_port}/")
    db = tempfile.mkdtemp() + "/bench.duckdb"
    sidecar = start([PYTHON, "-m", "collector.cli", "run", "--upstream", f"http://127.0.0.1:{up_port}",
                     "--listen", f"127.0.0.1:{side_port}", "--db", db, "--engine", "none",
                     "--log-level", "error"], f"http://127.0.0.1:{side_port}/healthz")
    try:
        def run(port: int, path: str) -> dict:
            return asyncio.run(drive(f"http://127.0.0.1:{port}{path}", args.requests,
                                     args.concurrency, args.chunks))

        accounted, unaccounted = "/v1/chat/completions", "/v1/bench/passthrough"
        run(up_port, accounted)  # warm-up both paths
        run(side_port, accounted)
        direct = run(up_port, accounted)
        passthrough = run(side_port, unaccounted)
        cpu_before = cpu_seconds(sidecar.pid)
        proxied = run(side_port, accounted)
        sidecar_cpu = cpu_seconds(sidecar.pid) - cpu_before
        chunks_total = args.requests * (args.chunks + 2)
        result = {
            "requests": args.requests, "concurrency": args.concurrency,
            "chunks_per_request": args.chunks,
            "direct": direct, "sidecar_passthrough": passthrough, "sidecar_accounted": proxied,
            "throughput_ratio_accounted_over_direct": round(
                proxied["requests_per_s"] / direct["requests_per_s"], 3),
            "throughput_ratio_accounted_over_passthrough": round(
                proxied["requests_per_s"] / passthrough["requests_per_s"], 3),
            "p50_added_ms": round(proxied["p50_ms"] - direct["p50_ms"], 2),
            "p95_added_ms": round(proxied["p95_ms"] - direct["p95_ms"], 2),
            "sidecar_cpu_us_per_chunk": round(sidecar_cpu / chunks_total * 1e6, 2),
            "sidecar_rss_mib": round(rss_mib(sidecar.pid), 1),
            "same_bytes_as_direct": proxied["bytes"] == direct["bytes"],
        }
        print(json.dumps(result, indent=2))
    finally:
        sidecar.terminate()
        upstream.terminate()
        sidecar.wait(30)
        upstream.wait(30)


if __name__ == "__main__":
    main()
