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

`--probe DIR` starts the sidecar under benchmarks/_probed_sidecar.py, which at every sample
appends what holds the memory to DIR/probe.jsonl (objects by type, the sidecar's per-request
maps, malloc's free-but-held bytes, Python's arenas, DuckDB's memory), with `--tracemalloc N` a
tracemalloc snapshot too, and at the end the same after gc and malloc_trim(0); the figures then
split the RSS into DuckDB's memory and the rest, each with its second-half slope.
`--env NAME=VALUE` sets the sidecar's environment (e.g. MALLOC_ARENA_MAX=2), `--sidecar-arg`
adds to its command line (e.g. --sidecar-arg=--checkpoint-mb=1).

The first audit saw RSS 297-407 MB after upstream fuzzing where it started at 222 MB: allocator
retention or a leak. Levelling off means the second half's slope is near 0.
"""

from __future__ import annotations

import argparse
import collections
import itertools
import json
import math
import os
import signal
import sys
import tempfile
import threading
import time
from pathlib import Path

import duckdb
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


def _client(
    url: str,
    modes: itertools.cycle,
    stop: threading.Event,
    sent: list[int],
    lock: threading.Lock,
    statuses: collections.Counter[str],
) -> None:
    with httpx.Client(timeout=10) as client:
        for index in itertools.count():
            if stop.is_set():
                return
            mode = next(modes)
            body = CHAT | {"stream": index % 4 != 0}
            headers = {"x-fake": mode, "x-fake-size": str(2 * 2**20), "x-fake-tokens": "20"}
            try:
                answer = client.post(url + "/v1/chat/completions", json=body, headers=headers)
                status = str(answer.status_code)
            except httpx.HTTPError as exc:
                status = type(exc).__name__  # a broken answer is what this run is made of
            with lock:
                sent[0] += 1
                statuses[status] += 1


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


def _slope_ci(samples: list[tuple[float, float]]) -> float:
    """The slope's 95 % confidence half-width (MiB per 10 minutes; normal residuals, ~t 2.0)."""
    n = len(samples)
    if n < 3:
        return float("nan")
    slope = _slope_mib_per_10min(samples) / 600
    mean_t = sum(t for t, _ in samples) / n
    mean_r = sum(r for _, r in samples) / n
    intercept = mean_r - slope * mean_t
    residual = sum((r - intercept - slope * t) ** 2 for t, r in samples) / (n - 2)
    den = sum((t - mean_t) ** 2 for t, _ in samples) or 1.0
    return 2.0 * math.sqrt(residual / den) * 600


def _parts(probe: Path) -> dict:
    """The RSS apart, from the probe's lines: DuckDB's own memory (duckdb_memory()) and the rest
    (the proxy's objects, the libraries, what malloc holds freed), each with its second-half
    slope; and, from the last line (after gc and malloc_trim), what malloc only held."""
    lines = [json.loads(line) for line in probe.read_text().splitlines()]
    trimmed = [line for line in lines if "malloc_trim" in line]
    lines = [line for line in lines if "malloc_trim" not in line]
    if len(lines) < 3:
        return {}
    began = lines[0]["t"]

    def duck(line: dict) -> float:
        return sum(v for v in line["duckdb_mib"].values() if isinstance(v, float))

    series = {
        "duckdb": [(line["t"] - began, duck(line)) for line in lines],
        "rss_less_duckdb": [(line["t"] - began, line["rss_mib"] - duck(line)) for line in lines],
    }
    span = lines[-1]["t"] - began
    parts: dict = {}
    for name, points in series.items():
        tail = [point for point in points if point[0] >= span / 2]
        parts[name] = {
            "slope_mib_per_10min_second_half": round(_slope_mib_per_10min(tail), 2),
            "ci95_half_width": round(_slope_ci(tail), 2),
            "last_mib": round(points[-1][1], 1),
        }
    if trimmed:
        end = trimmed[-1]
        parts["at_end_after_gc_and_malloc_trim"] = {
            "rss_before_mib": round(end["rss_before_trim_mib"], 1),
            "rss_after_mib": round(end["rss_mib"], 1),
            "malloc_in_use_mib": round(end["malloc"]["in_use_mib"], 1),
            "of_which_duckdb_mib": round(duck(end), 1),
            "gc_objects": end["objects"],
        }
    return {"parts_second_half": parts, "parts": series}


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--minutes", type=float, default=30.0)
    parser.add_argument("--clients", type=int, default=8)
    parser.add_argument("--sample-s", type=float, default=30.0)
    parser.add_argument("--out", default=None, help="write the figures as JSON here")
    parser.add_argument("--probe", default=None, metavar="DIR", help="probe the memory (see above)")
    parser.add_argument("--tracemalloc", type=int, default=0, metavar="FRAMES")
    parser.add_argument("--env", action="append", default=[], metavar="NAME=VALUE")
    parser.add_argument(
        "--sidecar-arg",
        action="append",
        default=[],
        metavar="ARG",
        help="e.g. --sidecar-arg=--checkpoint-mb=1",
    )
    args = parser.parse_args()

    upstream = FakeUpstream()
    work = Path(tempfile.mkdtemp(prefix="soak-"))
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    launcher = (
        [
            sys.executable,
            str(ROOT / "benchmarks" / "_probed_sidecar.py"),
            args.probe,
            str(args.tracemalloc),
            "--",
        ]
        if args.probe
        else [str(ROOT / ".venv" / "bin" / "headroom")]
    )
    sidecar = start(
        [
            *launcher,
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
            *args.sidecar_arg,
        ],
        url + "/healthz",
        env=dict(os.environ, **dict(pair.split("=", 1) for pair in args.env)),
    )
    stop, sent, lock = threading.Event(), [0], threading.Lock()
    statuses: collections.Counter[str] = collections.Counter()
    modes = itertools.cycle(MODES)
    clients = [
        threading.Thread(target=_client, args=(url, modes, stop, sent, lock, statuses), daemon=True)
        for _ in range(args.clients)
    ]
    samples: list[tuple[float, float]] = []
    began = time.monotonic()
    try:
        for thread in clients:
            thread.start()
        while (elapsed := time.monotonic() - began) < args.minutes * 60:
            samples.append((elapsed, rss_mib(sidecar.pid)))
            if args.probe:
                sidecar.send_signal(signal.SIGUSR1)
            print(f"{elapsed / 60:6.1f} min  RSS {samples[-1][1]:7.1f} MiB  requests {sent[0]}", flush=True)
            time.sleep(args.sample_s)
        stop.set()
        for thread in clients:
            thread.join(30)
        samples.append((time.monotonic() - began, rss_mib(sidecar.pid)))
        health = httpx.get(url + "/healthz", timeout=5).json()
        if args.probe:  # the same probe after gc and malloc_trim: what the allocator only held
            sidecar.send_signal(signal.SIGUSR2)
            time.sleep(5 + 5 * args.tracemalloc)
    finally:
        stop.set()
        stop_all([sidecar])
        upstream.stop()
    with duckdb.connect(str(work / "soak.duckdb"), read_only=True) as db:
        rows, distinct = db.execute("SELECT count(*), count(DISTINCT request_id) FROM requests").fetchone()
    second_half = [s for s in samples if s[0] >= samples[-1][0] / 2]
    figures = {
        "minutes": round(samples[-1][0] / 60, 1),
        "clients": args.clients,
        "requests": sent[0],
        "rows": rows,
        "distinct_request_ids": distinct,
        "answers": dict(sorted(statuses.items())),  # HTTP status, or the client's error
        "sidecar_500s": statuses["500"],
        "rss_mib_first": samples[0][1],
        "rss_mib_max": max(r for _, r in samples),
        "rss_mib_last": samples[-1][1],
        "slope_mib_per_10min_second_half": round(_slope_mib_per_10min(second_half), 2),
        "slope_ci95_half_width": round(_slope_ci(second_half), 2),
        "env": args.env,
        "sidecar_args": args.sidecar_arg,
        "inflight_at_end": health.get("inflight_requests"),
        "samples": samples,
    }
    if args.probe:
        figures |= _parts(Path(args.probe) / "probe.jsonl")
    print(json.dumps({k: v for k, v in figures.items() if k not in ("samples", "parts")}, indent=2))
    if args.out:
        Path(args.out).write_text(json.dumps(figures, indent=2))


if __name__ == "__main__":
    main()
