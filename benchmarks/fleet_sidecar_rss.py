"""Resident memory of a fleet sidecar (`headroom run --lake`) under load, beside a one-box one (--db).

    python benchmarks/fleet_sidecar_rss.py [--headroom PATH] [--requests 5000] [--concurrency 64]
        [--mode lake|db]

Starts benchmarks/sse_upstream.py and the `headroom` at PATH (default: this interpreter's; point it
at a slim venv's to measure that install) with --lake DIR (or --db FILE) on loopback, reads VmRSS
once ready, drives --requests closed-loop streams of 64 chunks at --concurrency, sampling VmRSS every
0.1 s, then stops the sidecar (the spool rolls) and counts the rows it staged. It also says whether
the process mapped DuckDB's library (/proc/PID/maps): a --lake sidecar never should.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import tempfile
import threading
from pathlib import Path

import pyarrow.parquet as pq
from _common import PYTHON, ROOT, drive, free_port, rss_mib, start, stop_all


class PeakRss:
    """The largest VmRSS of `pid` seen by a thread sampling every `every_s` until `stop()`."""

    def __init__(self, pid: int, every_s: float = 0.1) -> None:
        self.pid, self.every_s, self.peak = pid, every_s, 0.0
        self._done = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._done.wait(self.every_s):  # a sampling period, not a synchronisation
            self.peak = max(self.peak, rss_mib(self.pid))

    def stop(self) -> float:
        self._done.set()
        self._thread.join()
        return round(self.peak, 1)


def _maps_duckdb(pid: int) -> bool:
    return "duckdb" in Path(f"/proc/{pid}/maps").read_text()


def _staged_rows(lake: Path) -> int:
    return sum(pq.read_metadata(path).num_rows for path in lake.glob("staged/*/*.parquet"))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--headroom", default=str(Path(PYTHON).parent / "headroom"))
    parser.add_argument("--requests", type=int, default=5000)
    parser.add_argument("--concurrency", type=int, default=64)
    parser.add_argument("--mode", choices=("lake", "db"), default="lake")
    args = parser.parse_args()
    work = Path(tempfile.mkdtemp(prefix="fleet-rss-"))
    up_port, port = free_port(), free_port()
    upstream = start(
        [PYTHON, str(ROOT / "benchmarks/sse_upstream.py"), str(up_port)], f"http://127.0.0.1:{up_port}/"
    )
    log = ["--lake", str(work / "lake"), "--spool-dir", str(work / "spool")]
    if args.mode == "db":
        log = ["--db", str(work / "log.duckdb")]
    command = [args.headroom, "run", "--upstream", f"http://127.0.0.1:{up_port}", "--engine", "none"]
    sidecar = start([*command, "--listen", f"127.0.0.1:{port}", *log], f"http://127.0.0.1:{port}/readyz")
    try:
        idle = round(rss_mib(sidecar.pid), 1)
        peak = PeakRss(sidecar.pid)
        load = asyncio.run(
            drive(f"http://127.0.0.1:{port}/v1/chat/completions", args.requests, args.concurrency, 64)
        )
        result = {"mode": args.mode, "rss_idle_mib": idle, "rss_peak_mib": peak.stop()}
        result |= {"rss_after_mib": round(rss_mib(sidecar.pid), 1), "maps_duckdb": _maps_duckdb(sidecar.pid)}
    finally:
        stop_all([sidecar, upstream])
    result |= {"requests": args.requests, "concurrency": args.concurrency, **load}
    if args.mode == "lake":
        result["staged_rows"] = _staged_rows(work / "lake")
    json.dump(result, sys.stdout, indent=1)
    print()


if __name__ == "__main__":
    main()
