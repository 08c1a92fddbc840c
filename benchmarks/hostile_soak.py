"""Memory under a long run of hostile upstream answers: does the sidecar's RSS level off?

    python benchmarks/hostile_soak.py [--minutes 30] [--clients 8] [--out soak.json]

A real `headroom run` (its own DuckDB log, a 2 s read timeout) in front of the suite's raw-socket
fake upstream (tests/support/upstream.py), which answers each request as its `x-fake` header
says. The clients cycle through well-formed streams and JSON answers and every hostile mode the
fault tests use (broken chunk framing, an unparseable head, an event past the size limit, a
malformed event, an error event, a stream that stalls past the read timeout, a non-SSE answer to
a stream, a request the upstream never answers), bounded in count per minute and in time. Every
30 s the sidecar's VmRSS is read from /proc. At the end: the RSS series, its growth over the
second half of the run (MiB per 10 minutes, least squares), the requests sent and the rows the
sidecar wrote (one per request), and whether the live gauges are back at 0.

The first audit saw RSS 297-407 MB after upstream fuzzing where it started at 222 MB: allocator
retention or a leak. Levelling off means the second half's slope is near 0.
"""

from __future__ import annotations

import argparse
import itertools
import json
import sys
import tempfile
import threading
import time
from pathlib import Path

import httpx
from _common import ROOT, free_port, rss_mib, start, stop_all

sys.path.insert(0, str(ROOT / "tests"))
from support.upstream import FakeUpstream  # noqa: E402  (the suite's hostile upstream)

MODES = (
    "ok",
    "ok",
    "ok",
    "broken-framing",
    "garbage-head",
    "huge-event",
    "malformed",
    "error-event",
    "stall",
    "non-sse",
    "usage-null",
    "hang",
)
CHAT = {"model": "soak", "max_tokens": 16, "messages": [{"role": "user", "content": "hello"}]}


def _client(url: str, modes: itertools.cycle, stop: threading.Event, sent: list[int]) -> None:
    with httpx.Client(timeout=10) as client:
        for index in itertools.count():
            if stop.is_set():
                return
            mode = next(modes)
            body = CHAT | {"stream": index % 4 != 0}
            headers = {"x-fake": mode, "x-fake-size": str(2 * 2**20), "x-fake-tokens": "20"}
            try:
                client.post(url + "/v1/chat/completions", json=body, headers=headers)
            except httpx.HTTPError:
                pass  # a broken answer is what this run is made of; the row counts it
            sent[0] += 1


def _slope_mib_per_10min(samples: list[tuple[float, float]]) -> float:
    """Least-squares slope of RSS against time, in MiB per 10 minutes."""
    n = len(samples)
    if n < 2:
        return 0.0
    mean_t = sum(t for t, _ in samples) / n
    mean_r = sum(r for _, r in samples) / n
    num = sum((t - mean_t) * (r - mean_r) for t, r in samples)
    den = sum((t - mean_t) ** 2 for t, _ in samples) or 1.0
    return num / den * 600


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--minutes", type=float, default=30.0)
    parser.add_argument("--clients", type=int, default=8)
    parser.add_argument("--sample-s", type=float, default=30.0)
    parser.add_argument("--out", default=None, help="write the figures as JSON here")
    args = parser.parse_args()

    upstream = FakeUpstream()
    work = Path(tempfile.mkdtemp(prefix="soak-"))
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    sidecar = start(
        [
            str(ROOT / ".venv" / "bin" / "headroom"),
            "run",
            "--upstream",
            upstream.url,
            "--listen",
            f"127.0.0.1:{port}",
            "--db",
            str(work / "soak.duckdb"),
            "--read-timeout",
            "2",
            "--no-jobs",
        ],
        url + "/healthz",
    )
    stop, sent = threading.Event(), [0]
    modes = itertools.cycle(MODES)
    clients = [
        threading.Thread(target=_client, args=(url, modes, stop, sent), daemon=True)
        for _ in range(args.clients)
    ]
    samples: list[tuple[float, float]] = []
    began = time.monotonic()
    try:
        for thread in clients:
            thread.start()
        while (elapsed := time.monotonic() - began) < args.minutes * 60:
            samples.append((elapsed, rss_mib(sidecar.pid)))
            print(f"{elapsed / 60:6.1f} min  RSS {samples[-1][1]:7.1f} MiB  requests {sent[0]}", flush=True)
            time.sleep(args.sample_s)
        stop.set()
        for thread in clients:
            thread.join(30)
        samples.append((time.monotonic() - began, rss_mib(sidecar.pid)))
        health = httpx.get(url + "/healthz", timeout=5).json()
    finally:
        stop.set()
        stop_all([sidecar])
        upstream.stop()
    second_half = [s for s in samples if s[0] >= samples[-1][0] / 2]
    figures = {
        "minutes": round(samples[-1][0] / 60, 1),
        "clients": args.clients,
        "requests": sent[0],
        "rss_mib_first": samples[0][1],
        "rss_mib_max": max(r for _, r in samples),
        "rss_mib_last": samples[-1][1],
        "slope_mib_per_10min_second_half": round(_slope_mib_per_10min(second_half), 2),
        "inflight_at_end": health.get("inflight_requests"),
        "samples": samples,
    }
    print(json.dumps({k: v for k, v in figures.items() if k != "samples"}, indent=2))
    if args.out:
        Path(args.out).write_text(json.dumps(figures, indent=2))


if __name__ == "__main__":
    main()
