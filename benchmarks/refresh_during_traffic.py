"""Does the capacity refresh disturb the proxy? Paced streams through a sidecar whose in-process
store holds 1 M rows, TTFT compared between quiet phases and phases with a refresh running.

The sidecar runs in this process, and the refresh runs as `headroom run` schedules it: from a
background thread of the proxy's own process, which copies the window's rows out and leaves the
curves to a child process at nice 19 (collector.analysis.refresh_worker).
`--in-process` runs the curves in that thread instead (the previous design), for comparison.
The upstream and the load generator are separate processes. Phases alternate (quiet, refresh,
quiet, refresh ...) in the same run; each request's TTFT is attributed to the phase it was
admitted in.

    python benchmarks/refresh_during_traffic.py --rows 1000000 --streams 64 --phase-seconds 20

`--pin` gives the proxy a core of its own (CPU 0) and puts the upstream and the load generator on
CPU 1, as on a serving host where the sidecar is not fighting its own load generator for a core;
the refresh's copy thread and child inherit the proxy's CPU 0, so they compete with the proxy
for exactly its core (the harder case). Without it, all processes share both cores.

Steal time. On a virtual machine the host may take the vCPUs away: /proc/stat's `steal`
column counts it. On the project's 2-vCPU microVM it comes in bursts of 10-30 s at 10-30 % of
the CPU, and every burst lifts the TTFT p99 of whichever phase it falls in by 50-100 ms, refresh
or not. The script samples steal once a second and also reports the statistics over *clean*
requests only: those whose admission-to-first-token interval touches no second with more than
`--max-steal` percent steal. Quiet and refresh phases lose their stolen seconds alike, so the
difference that remains is the refresh's.

Prints one JSON object: TTFT p50/p99 per phase kind (all requests and clean ones), the
difference, steal per phase, and refresh durations.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import subprocess
import sys
import threading
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path

import aiohttp

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import BODY, PYTHON, ROOT, StealSampler, free_port, start  # noqa: E402

sys.path.insert(0, str(ROOT / "tests"))  # support.synthetic: the suite's synthetic rows

from support.synthetic import synthetic_rows  # noqa: E402

from collector.analysis.refresh import refresh_estimates, refresh_estimates_isolated  # noqa: E402
from collector.serving import serve_in_thread  # noqa: E402
from collector.sidecar.config import SidecarConfig  # noqa: E402
from collector.sidecar.wiring import build_sidecar, sidecar_state  # noqa: E402
from collector.store.db import RequestStore  # noqa: E402


def fill(path: Path, rows: int) -> None:
    """A request log of `rows` traffic rows over the last 23 hours (batches of 100k)."""
    store = RequestStore(path)
    start_at = datetime.now(UTC) - timedelta(hours=23)
    step = timedelta(hours=23) / max(rows // 100_000, 1)
    for batch in range(max(rows // 100_000, 1)):
        store.insert_rows(
            synthetic_rows(min(100_000, rows), start_at + step * batch, span=step, prefix=f"b{batch}")
        )
    store.close()


async def client(url: str, streams: int, seconds: float, chunks: int, pace_ms: int) -> list:
    """Paced closed-loop streams for `seconds`; returns [(admitted wall time, TTFT s), ...]."""
    results: list[tuple[float, float]] = []
    headers = {"x-chunks": str(chunks), "x-pace-ms": str(pace_ms)}
    stop = time.monotonic() + seconds
    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=streams)) as session:

        async def worker() -> None:
            while time.monotonic() < stop:
                admitted, began = time.time(), time.perf_counter()
                async with session.post(url, json=BODY, headers=headers) as response:
                    first = None
                    async for data in response.content.iter_any():
                        if first is None and b'"content":"' in data:
                            first = time.perf_counter() - began
                results.append((admitted, first if first is not None else float("nan")))

        await asyncio.gather(*(worker() for _ in range(streams)))
    return results


def _pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return round(ordered[min(int(len(ordered) * q), len(ordered) - 1)] * 1000, 2)


_BURN = (
    "import os\n"
    "os.sched_setaffinity(0, {0, 1})\n"
    "os.sched_setscheduler(0, os.SCHED_IDLE, os.sched_param(0))\n"
    "while True:\n    pass\n"
)


# the refresh child's memory traffic without its computing: 600 MiB faulted in and freed, again
# and again, at SCHED_IDLE on the proxy's CPUs (what the child does to the kernel and the host)
_BURN_MEMORY = (
    "import os\n"
    "os.sched_setscheduler(0, os.SCHED_IDLE, os.sched_param(0))\n"
    "while True:\n    block = b'x' * (600 << 20)\n    del block\n"
)


_MIN_CLEAN = 1_000  # clean requests per phase kind for a p99 worth comparing


def _on_cpus(cpus: set[int] | None, refresh, *args, **kwargs) -> None:
    """Run `refresh` in this thread, first moved to `cpus` (its copy thread and child follow)."""
    if cpus:
        os.sched_setaffinity(0, cpus)
    refresh(*args, **kwargs)


def _watch_refresh_steps() -> list[tuple[str, float]]:
    """[(step, wall time)]: when each refresh's copy and child began and ended (subprocess.run
    and RequestStore.copy_out wrapped; only the refresh calls them in this process)."""
    events: list[tuple[str, float]] = []
    run, copy_out = subprocess.run, RequestStore.copy_out

    def timed_run(*args, **kwargs):
        events.append(("child started", time.time()))
        try:
            return run(*args, **kwargs)
        finally:
            events.append(("child ended", time.time()))

    def timed_copy(self, *args, **kwargs):
        events.append(("copy started", time.time()))
        try:
            return copy_out(self, *args, **kwargs)
        finally:
            events.append(("copy ended", time.time()))

    subprocess.run = timed_run  # type: ignore[assignment]
    RequestStore.copy_out = timed_copy  # type: ignore[method-assign]
    return events


def _bursts(samples: list, events: list[tuple[str, float]], *, over_s: float = 0.08) -> list[dict]:
    """Moments when 5 or more requests admitted within 50 ms all waited over `over_s` for their
    first token (one stall seen by many streams), with how long after each refresh step's last
    occurrence each came."""
    slow = sorted(a for a, ttft in samples if ttft == ttft and ttft > over_s)
    found, i = [], 0
    while i < len(slow):
        j = i
        while j + 1 < len(slow) and slow[j + 1] - slow[i] < 0.05:
            j += 1
        if j - i + 1 >= 5:
            at, latest = slow[i], {}
            for step, when in events:  # the last time each step happened before the burst
                if when <= at:
                    latest[step] = round(at - when, 3)
            found.append({"requests": j - i + 1, "seconds_after": latest})
        i = j + 1
    return found


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=1_000_000)
    parser.add_argument("--streams", type=int, default=64)
    parser.add_argument("--phase-seconds", type=float, default=20.0)
    parser.add_argument("--phases", type=int, default=4, help="quiet/refresh pairs x 2")
    parser.add_argument("--db", default="/tmp/headroom-refresh-bench.duckdb")
    parser.add_argument(
        "--in-process", action="store_true", help="the curves in the proxy's process (the old design)"
    )
    parser.add_argument(
        "--placebo",
        action="store_true",
        help="no refresh in the 'refresh' phases: what quiet differs from quiet by (the noise floor)",
    )
    parser.add_argument(
        "--pin",
        action="store_true",
        help="proxy (and the refresh) on CPU 0, upstream and load generator on CPU 1: less noise",
    )
    parser.add_argument(
        "--burn",
        action="store_true",
        help="with --placebo: a pure CPU loop at SCHED_IDLE on either core in the 'refresh' phases "
        "(does any idle-priority work beside the proxy delay it?)",
    )
    parser.add_argument(
        "--burn-memory",
        action="store_true",
        help="with --placebo: a SCHED_IDLE loop that faults in and frees 600 MiB again and again, "
        "on the proxy's CPUs, in the 'refresh' phases (is it the child's memory, not its CPU?)",
    )
    parser.add_argument(
        "--refresh-anywhere",
        action="store_true",
        help="with --pin: the refresh's thread and child may use either core (as on a serving "
        "host, where the child lands on whichever core is idle); the proxy's own threads stay on CPU 0",
    )
    parser.add_argument(
        "--max-steal",
        type=float,
        default=2.0,
        help="a request is clean when no second between its admission and first token had more "
        "steal time than this percent (default 2)",
    )
    parser.add_argument(
        "--client", nargs=4, metavar=("URL", "STREAMS", "SECONDS", "OUT"), help=argparse.SUPPRESS
    )
    args = parser.parse_args()
    if args.client:  # the load generator's own process
        url, streams, seconds, out = args.client
        result = asyncio.run(client(url, int(streams), float(seconds), 100, 20))  # 50 tok/s
        Path(out).write_text(json.dumps(result))
        return
    db = Path(args.db)
    if not db.exists():
        fill(db, args.rows)
    proxy_cpus, load_cpus = ({0}, {1}) if args.pin else (None, None)
    refresh_cpus = {0, 1} if args.pin and args.refresh_anywhere else None
    if proxy_cpus:  # before the sidecar starts a thread: threads inherit the creating thread's set
        os.sched_setaffinity(0, proxy_cpus)
    port = free_port()
    upstream = start(
        [PYTHON, "benchmarks/stream_upstream.py", str(port)], f"http://127.0.0.1:{port}/", cpus=load_cpus
    )
    app = build_sidecar(
        SidecarConfig(upstream=f"http://127.0.0.1:{port}", db_path=str(db), engine="none", jobs=False)
    )
    sidecar = serve_in_thread(app)
    store = sidecar_state(app).batch_sink
    out = Path("/tmp/headroom-refresh-bench-client.json")
    total = args.phase_seconds * args.phases
    load = subprocess.Popen(
        [
            PYTHON,
            __file__,
            "--client",
            sidecar.url + "/v1/chat/completions",
            str(args.streams),
            str(total + 2),
            str(out),
        ],
        cwd=ROOT,
        preexec_fn=(lambda: os.sched_setaffinity(0, load_cpus)) if load_cpus else None,
    )
    ticks: list[tuple[float, float]] = []  # (wall time, gap s): how long this interpreter stalled
    ticking = threading.Event()

    def ticker() -> None:  # a thread of the proxy's process asking for the GIL every millisecond
        last = time.perf_counter()
        while not ticking.is_set():
            time.sleep(0.001)
            now = time.perf_counter()
            ticks.append((time.time(), now - last))
            last = now

    threading.Thread(target=ticker, daemon=True).start()
    events = _watch_refresh_steps()
    steal = StealSampler()
    phases, durations = [], []
    time.sleep(2.0)  # let the streams ramp up before the first phase
    for index in range(args.phases):
        kind, began = ("refresh" if index % 2 else "quiet"), time.time()
        end = began + args.phase_seconds
        if kind == "refresh" and not args.placebo:
            while time.time() < end:  # the refresh back to back, as a slow job would run
                t0 = time.perf_counter()
                worker = threading.Thread(
                    target=_on_cpus,
                    args=(
                        refresh_cpus,
                        refresh_estimates if args.in_process else refresh_estimates_isolated,
                        store,
                        sidecar_state(app).capacity,
                        datetime.now(UTC),
                    ),
                    kwargs={"window": timedelta(hours=24)},
                )
                worker.start()
                worker.join()
                durations.append(time.perf_counter() - t0)
        elif kind == "refresh" and (args.burn or args.burn_memory):
            # Popen from this thread: the memory burner inherits the proxy's CPUs (--pin)
            burner = subprocess.Popen([PYTHON, "-c", _BURN_MEMORY if args.burn_memory else _BURN])
            time.sleep(args.phase_seconds)
            burner.kill()
            burner.wait()
        else:
            time.sleep(args.phase_seconds)
        phases.append((kind, began, time.time()))
    load.wait()
    ticking.set()
    steal.stop()
    sidecar.stop()
    upstream.terminate()
    samples = json.loads(out.read_text())
    by_kind: dict[str, list[float]] = {"quiet": [], "refresh": []}
    clean: dict[str, list[float]] = {"quiet": [], "refresh": []}
    by_phase: list[list[float]] = [[] for _ in phases]
    for admitted, ttft in samples:
        for index, (kind, began, ended) in enumerate(phases):
            if began <= admitted < ended and ttft == ttft:
                by_kind[kind].append(ttft)
                by_phase[index].append(ttft)
                if steal.worst(admitted, admitted + ttft) <= args.max_steal:
                    clean[kind].append(ttft)
    summary = {
        kind: {"requests": len(v), "ttft_p50_ms": _pct(v, 0.5), "ttft_p99_ms": _pct(v, 0.99)}
        for kind, v in by_kind.items()
    }
    summary["p99_added_by_refresh_ms"] = round(
        summary["refresh"]["ttft_p99_ms"] - summary["quiet"]["ttft_p99_ms"], 2
    )
    # the same over the requests no stolen second touched (the host's bursts left out, alike)
    summary["clean"] = {
        kind: {"requests": len(v), "ttft_p50_ms": _pct(v, 0.5), "ttft_p99_ms": _pct(v, 0.99)}
        for kind, v in clean.items()
        if v
    }
    if len(summary["clean"]) == 2:
        summary["clean_p99_added_by_refresh_ms"] = round(
            summary["clean"]["refresh"]["ttft_p99_ms"] - summary["clean"]["quiet"]["ttft_p99_ms"], 2
        )
    # a p99 needs a tail: at least 10 requests above it in each kind, else the run says so
    summary["clean_enough"] = min(len(v) for v in clean.values()) >= _MIN_CLEAN
    summary["steal_percent_per_phase"] = {
        kind: [
            round(statistics.fmean(steal.by_second.get(s, 0.0) for s in range(int(b), int(e))), 1)
            for k, b, e in phases
            if k == kind
        ]
        for kind in by_kind
    }
    summary["steal_max_percent"] = round(max(steal.by_second.values(), default=0.0), 1)
    # one burst in one phase moves the pooled p99; the median of the phases' own p99s does not
    phase_p99 = {
        kind: [_pct(v, 0.99) for (k, _, _), v in zip(phases, by_phase) if k == kind and v] for kind in by_kind
    }
    summary["ttft_p99_ms_per_phase"] = phase_p99
    summary["median_phase_p99_added_ms"] = round(
        statistics.median(phase_p99["refresh"]) - statistics.median(phase_p99["quiet"]), 2
    )
    # the interpreter itself: a 1 ms ticker in the proxy's process, late by how long the GIL
    # was held elsewhere (the client's TTFT adds the load generator's and upstream's noise)
    gaps: dict[str, list[float]] = {"quiet": [], "refresh": []}
    for at, gap in ticks:
        for kind, began, ended in phases:
            if began <= at < ended:
                gaps[kind].append(gap)
    summary["interpreter_stall_ms"] = {
        kind: {
            "p99": _pct(v, 0.99),
            "p99.9": _pct(v, 0.999),
            "max": round(max(v) * 1000, 2) if v else None,
            "over_10ms": sum(1 for g in v if g > 0.011),
        }
        for kind, v in gaps.items()
        if v
    }
    summary["refresh_s"] = {
        "runs": len(durations),
        "median": round(statistics.median(durations), 2) if durations else None,
    }
    summary["bursts"] = _bursts(samples, events)
    summary["max_steal_percent"] = args.max_steal
    summary["rows"] = args.rows
    summary["pinned"] = (
        "no"
        if not args.pin
        else "proxy CPU 0, refresh either core, upstream+load CPU 1"
        if args.refresh_anywhere
        else "proxy+refresh CPU 0, upstream+load CPU 1"
    )
    summary["curves_computed"] = (
        "none (placebo; a SCHED_IDLE loop faulting in 600 MiB instead)"
        if args.placebo and args.burn_memory
        else "none (placebo; a SCHED_IDLE CPU loop instead)"
        if args.placebo and args.burn
        else "none (placebo)"
        if args.placebo
        else "in the proxy's process"
        if args.in_process
        else "child process (headroom run's)"
    )
    print(json.dumps(summary, indent=2))


if __name__ == "__main__":
    main()
