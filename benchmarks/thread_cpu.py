"""Where `headroom run` spends its CPU, thread by thread, at a fixed load; another checkout beside it.

    python benchmarks/thread_cpu.py                                  # 64 streams, 50 tokens/s each
    python benchmarks/thread_cpu.py --streams 256 --pace-ms 0        # a flood
    git worktree add /tmp/before 97cf110
    python benchmarks/thread_cpu.py --against /tmp/before --rounds 3 # that checkout's code, alternated
    python benchmarks/thread_cpu.py --against /tmp/before --rounds 8 --pace-ms 0 --seconds 5

With --against, the last line is this build's CPU per chunk over the other's, round by round:
the median with its 95 % interval (benchmarks/_verdict.py), "met" for <= 1.0 when this build is
cheaper in the whole interval. Each round starts both builds afresh, so the interval also holds
what differs from one process to the next (memory layout, hash seeds), which a run that keeps
one process per build for all its rounds cannot see.

At a paced load the work is fixed (streams x tokens/s chunks, one per upstream read), so CPU per
chunk compares two builds more steadily than a flood's chunk rate, which moves with the host's
steal time by 10 % and more. Each round starts the upstream (benchmarks/sse_upstream.py) and
`headroom run` (this checkout, then the --against one, through PYTHONPATH), drives it for
--seconds after a short warm-up, and reads every thread's CPU time from /proc. Reported per round
and build: the chunk rate and, per thread, CPU microseconds per chunk and per request. The
threads are unnamed at the OS level; the busiest is the event loop's, the request-log writer's
is usually the second.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys
import tempfile
from pathlib import Path

from _common import checkout_env, free_port, start
from _load import drive_for
from _verdict import describe

ROOT = Path(__file__).resolve().parent.parent
PYTHON = sys.executable


def thread_cpu_s(pid: int) -> dict[int, float]:
    """Each thread's user + system CPU seconds (/proc/PID/task/TID/stat fields 14 and 15)."""
    ticks = os.sysconf("SC_CLK_TCK")
    out = {}
    for tid in os.listdir(f"/proc/{pid}/task"):
        try:
            fields = Path(f"/proc/{pid}/task/{tid}/stat").read_text().rsplit(")", 1)[1].split()
        except OSError:  # the thread ended
            continue
        out[int(tid)] = (int(fields[11]) + int(fields[12])) / ticks
    return out


def one_round(pythonpath: str | None, streams: int, pace_ms: int, seconds: float) -> dict:
    """One build under load: chunk rate and the CPU of each of its busy threads."""
    upstream_port, port = free_port(), free_port()
    upstream = start(
        [PYTHON, "benchmarks/sse_upstream.py", str(upstream_port)], f"http://127.0.0.1:{upstream_port}/"
    )
    env = checkout_env(pythonpath)
    db = Path(tempfile.mkdtemp()) / "bench.duckdb"
    sidecar = start(
        [
            *(PYTHON, "-m", "collector.cli", "run", "--upstream", f"http://127.0.0.1:{upstream_port}"),
            *("--listen", f"127.0.0.1:{port}", "--db", str(db), "--engine", "none", "--log-level", "error"),
        ],
        f"http://127.0.0.1:{port}/healthz",
        env=env,
    )
    try:
        url, headers = f"http://127.0.0.1:{port}/v1/chat/completions", {"x-pace-ms": str(pace_ms)}
        asyncio.run(drive_for(url, streams, 2.0, headers))  # warm-up: connections, caches
        before = thread_cpu_s(sidecar.pid)
        result = asyncio.run(drive_for(url, streams, seconds, headers))
        after = thread_cpu_s(sidecar.pid)
    finally:
        sidecar.terminate()
        upstream.terminate()
        sidecar.wait(30)
        upstream.wait(30)
    chunks, requests = max(result.token_chunks, 1), max(result.completed, 1)
    busy = sorted(((after[t] - before.get(t, 0.0), t) for t in after), reverse=True)
    return {
        "chunks_per_s": round(result.chunks_per_s),
        "requests": result.completed,
        "threads": [
            {
                "cpu_s": round(cpu, 2),
                "us_per_chunk": round(cpu / chunks * 1e6, 2),
                "us_per_request": round(cpu / requests * 1e6, 1),
            }
            for cpu, _ in busy
            if cpu > 0
        ],
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--streams", type=int, default=64)
    parser.add_argument(
        "--pace-ms", type=int, default=20, help="gap between chunks (20: 50 tokens/s; 0: flood)"
    )
    parser.add_argument("--seconds", type=float, default=6.0, help="measured seconds per round")
    parser.add_argument("--rounds", type=int, default=1)
    parser.add_argument(
        "--against", metavar="CHECKOUT", help="another checkout of this repository, run alternately"
    )
    args = parser.parse_args()
    os.chdir(ROOT)
    builds = {"this": None, **({"against": str(Path(args.against).resolve())} if args.against else {})}
    runs: dict[str, list[dict]] = {name: [] for name in builds}
    for number in range(args.rounds):
        for name, path in builds.items():
            run = one_round(path, args.streams, args.pace_ms, args.seconds)
            runs[name].append(run)
            main_thread = run["threads"][0] if run["threads"] else {}
            print(
                f"round {number + 1} {name}: {run['chunks_per_s']} chunks/s, busiest thread "
                f"{main_thread.get('us_per_chunk')} µs/chunk",
                file=sys.stderr,
            )
    print(json.dumps({"streams": args.streams, "pace_ms": args.pace_ms, "runs": runs}, indent=2))
    if args.against:  # each round's two builds, started afresh seconds apart: their ratio
        ratios = [_us_per_chunk(a) / _us_per_chunk(b) for a, b in zip(runs["this"], runs["against"])]
        print(
            f"this / against, CPU per chunk (all threads): {describe(ratios, at_most=1.0)}", file=sys.stderr
        )


def _us_per_chunk(run: dict) -> float:
    return sum(thread["us_per_chunk"] for thread in run["threads"])


if __name__ == "__main__":
    main()
