"""Proxy overhead: the same streaming load sent directly to an upstream and through the sidecar.

    python benchmarks/proxy_overhead.py [--requests 2000 --concurrency 64 --chunks 100]

Upstream, sidecar and load generator are three processes on loopback. Two scenarios, each side
by side in one run:

* flood: the upstream streams as fast as it can, so the proxy is the bottleneck. Reports
  requests/s direct, through the sidecar's pass-through path (unaccounted) and its accounted path,
  their ratios, the sidecar's CPU time per streamed chunk and its resident memory.
* paced: one token every --pace-ms per stream (20 ms = 50 tokens/s, a real engine's pace):
  the latency a user would notice, time to first token and end to end, direct vs sidecar.

Results go in BENCHMARKS.md.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import tempfile

from _common import PYTHON, cpu_seconds, drive, free_port, rss_mib, start


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--requests", type=int, default=2000)
    parser.add_argument("--concurrency", type=int, default=64)
    parser.add_argument("--chunks", type=int, default=100)
    parser.add_argument("--pace-ms", type=int, default=20, help="gap between tokens in the paced run")
    args = parser.parse_args()
    up_port, side_port = free_port(), free_port()
    upstream = start([PYTHON, "benchmarks/stream_upstream.py", str(up_port)], f"http://127.0.0.1:{up_port}/")
    db = tempfile.mkdtemp() + "/bench.duckdb"
    sidecar = start(
        [
            PYTHON,
            "-m",
            "collector.cli",
            "run",
            "--upstream",
            f"http://127.0.0.1:{up_port}",
            "--listen",
            f"127.0.0.1:{side_port}",
            "--db",
            db,
            "--engine",
            "none",
            "--log-level",
            "error",
        ],
        f"http://127.0.0.1:{side_port}/healthz",
    )
    try:

        def run(port: int, path: str, pace_ms: int = 0, requests: int = args.requests) -> dict:
            return asyncio.run(
                drive(f"http://127.0.0.1:{port}{path}", requests, args.concurrency, args.chunks, pace_ms)
            )

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
            "requests": args.requests,
            "concurrency": args.concurrency,
            "chunks_per_request": args.chunks,
            "direct": direct,
            "sidecar_passthrough": passthrough,
            "sidecar_accounted": proxied,
            "throughput_ratio_accounted_over_direct": round(
                proxied["requests_per_s"] / direct["requests_per_s"], 3
            ),
            "throughput_ratio_accounted_over_passthrough": round(
                proxied["requests_per_s"] / passthrough["requests_per_s"], 3
            ),
            "p50_added_ms": round(proxied["p50_ms"] - direct["p50_ms"], 2),
            "p95_added_ms": round(proxied["p95_ms"] - direct["p95_ms"], 2),
            "sidecar_cpu_us_per_chunk": round(sidecar_cpu / chunks_total * 1e6, 2),
            "sidecar_rss_mib": round(rss_mib(sidecar.pid), 1),
            "same_bytes_as_direct": proxied["bytes"] == direct["bytes"],
        }
        # Paced like a real engine (one token every --pace-ms per stream): what a user notices.
        paced_requests = args.concurrency * 4
        paced_direct = run(up_port, accounted, args.pace_ms, paced_requests)
        paced_sidecar = run(side_port, accounted, args.pace_ms, paced_requests)
        result["paced"] = {
            "pace_ms": args.pace_ms,
            "requests": paced_requests,
            "direct": paced_direct,
            "sidecar_accounted": paced_sidecar,
            "ttft_p50_added_ms": round(paced_sidecar["ttft_p50_ms"] - paced_direct["ttft_p50_ms"], 2),
            "ttft_p95_added_ms": round(paced_sidecar["ttft_p95_ms"] - paced_direct["ttft_p95_ms"], 2),
            "e2e_p50_added_ms": round(paced_sidecar["p50_ms"] - paced_direct["p50_ms"], 2),
        }
        print(json.dumps(result, indent=2))
    finally:
        sidecar.terminate()
        upstream.terminate()
        sidecar.wait(30)
        upstream.wait(30)


if __name__ == "__main__":
    main()
