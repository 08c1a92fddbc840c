"""The traffic refresh in a process of its own, so that it never competes with a proxy for the
interpreter: what `headroom run` (a sidecar with its own store) schedules.

    estimates = traffic_estimates_isolated(store, now, window=timedelta(hours=24))

The passive curves of a day of traffic are seconds of DuckDB and Python work. Run inside the
sidecar, that work holds the GIL between DuckDB calls and shares the cores with the proxy: the
paced TTFT p99 grew by 90 ms during refreshes over 1 M rows (BENCHMARKS.md §8). Here the sidecar
only copies the window's rows, in the columns the curves use, into a Parquet file in a private
temporary directory (DuckDB's own `COPY ... TO`, one statement on one thread, which takes the
interpreter lock back only between its steps: no Arrow or Python object per row in the proxy's
process), and a child
process (`python -m collector.analysis.refresh_worker`, born at nice 19 and kept there, DuckDB
on one thread) reads them through a view over the file
(`RequestStore.over_parquet`), computes the same estimates as the in-process
`traffic_estimates` and writes them as JSON into a file beside the rows. The parent saves and
publishes them as before.

A child that fails or runs past `timeout_s` costs this refresh its traffic estimates (logged with
the child's last words) and nothing else: the estimates already saved stay published.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import logging
import os
import subprocess
import sys
import tempfile
import threading
from collections.abc import Callable
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any, TypeVar

from collector.analysis.estimate import estimate_capacity
from collector.capacity import CapacityEstimate
from collector.store.db import RequestStore

__all__ = ["traffic_estimates", "traffic_estimates_isolated", "TRAFFIC_COLUMNS", "MIN_CLASS_ROWS"]

log = logging.getLogger(__name__)
T = TypeVar("T")
MIN_CLASS_ROWS = 200  # a task class needs this many requests in the window for its own curve
# what the passive curves read (collector.analysis.passive); request_id is the table's key
TRAFFIC_COLUMNS = (
    "request_id",
    "source",
    "model",
    "task_class",
    "admitted_at",
    "first_token_at",
    "completed_at",
    "inflight_at_admit",
    "active_tokens_at_admit",
    "engine_waiting_at_admit",
    "prompt_tokens",
    "cached_prompt_tokens",
    "completion_tokens",
    "ttft_s",
    "tpot_s",
    "e2e_s",
    "outcome",
    "status_code",
)
_WINDOW_ROWS = (
    f"SELECT {', '.join(TRAFFIC_COLUMNS)} FROM requests "
    "WHERE source = 'traffic' AND admitted_at >= ? AND admitted_at < ?"
)


def _models(store: RequestStore, since: datetime, until: datetime) -> list[str]:
    rows = store.query(
        "SELECT DISTINCT model FROM requests WHERE source = 'traffic' "
        "AND admitted_at >= ? AND admitted_at < ? AND model IS NOT NULL "
        "ORDER BY model",
        [since, until],
    )
    return [row[0] for row in rows]


def _classes(store: RequestStore, model: str, since: datetime, until: datetime) -> list[str | None]:
    """None (every request) and each task class with enough traffic for a curve of its own."""
    rows = store.query(
        "SELECT task_class FROM requests WHERE source = 'traffic' AND model = ? "
        "AND admitted_at >= ? AND admitted_at < ? AND task_class IS NOT NULL "
        "GROUP BY task_class HAVING count(*) >= ? ORDER BY task_class",
        [model, since, until, MIN_CLASS_ROWS],
    )
    classes = [row[0] for row in rows]
    return [None, *classes] if len(classes) > 1 else [None]  # one class alone is "all"


def traffic_estimates(
    store: RequestStore,
    now: datetime,
    *,
    window: timedelta,
    slo_ttft_p95_s: float | None = None,
    profile: str = "interactive",
) -> list[CapacityEstimate]:
    """The passive estimate of every model active in [now - window, now), and of each of its
    task classes with enough traffic; a model or class with too little traffic is left out."""
    since, found = now - window, []
    for model in _models(store, since, now):
        for task_class in _classes(store, model, since, now):
            try:
                found.append(
                    estimate_capacity(
                        store,
                        model=model,
                        since=since,
                        until=now,
                        slo_ttft_p95_s=slo_ttft_p95_s,
                        profile=profile,
                        source="traffic",
                        task_class=task_class,
                    )
                )
            except ValueError as exc:  # too little traffic for a curve: keep what was there
                log.info("no new traffic estimate for %s/%s: %s", model, task_class or "all", exc)
    return found


def traffic_estimates_isolated(
    store: RequestStore,
    now: datetime,
    *,
    window: timedelta,
    slo_ttft_p95_s: float | None = None,
    profile: str = "interactive",
    timeout_s: float = 600.0,
) -> list[CapacityEstimate]:
    """traffic_estimates(), computed by a child process on a copy of the window's rows."""
    command = [
        "--now",
        now.isoformat(),
        "--window-s",
        repr(window.total_seconds()),
        "--profile",
        profile,
    ]
    if slo_ttft_p95_s is not None:
        command += ["--slo-ttft-p95-s", repr(slo_ttft_p95_s)]
    with tempfile.TemporaryDirectory(prefix="headroom-refresh-") as directory:  # mode 0700
        rows, estimates = Path(directory) / "rows.parquet", Path(directory) / "estimates.json"
        command += ["--out", str(estimates)]  # a file, not stdout: nothing else can land in it

        def copy_and_compute() -> subprocess.CompletedProcess[str] | None:
            if not store.copy_out(_WINDOW_ROWS, [now - window, now], rows, threads=1):
                return None
            worker = [sys.executable, "-m", "collector.analysis.refresh_worker", str(rows), *command]
            return subprocess.run(worker, capture_output=True, text=True, timeout=timeout_s, check=False)

        try:
            done = in_background(copy_and_compute)
        except subprocess.TimeoutExpired:
            log.error(
                "the traffic refresh ran past %.0f s and was stopped; no new traffic estimate", timeout_s
            )
            return []
        if done is None:  # no traffic in the window: no child
            return []
        if done.returncode != 0:
            log.error(
                "the traffic refresh failed (exit %s); no new traffic estimate: %s",
                done.returncode,
                done.stderr.strip()[-2000:],
            )
            return []
        return [CapacityEstimate.from_dict(item) for item in json.loads(estimates.read_bytes())]


def in_background(work: Callable[[], T]) -> T:
    """Run `work` in a thread of its own at nice 19 and return what it returns (or raise what it
    raised); the calling thread waits.

    Linux keeps a nice value per thread, and a process inherits the nice value of the thread
    that starts it. So the window's copy (one DuckDB statement, the interpreter lock released)
    yields the cores to the proxy's threads, and the child is born at nice 19 too: it starts
    (about a second of imports) and computes below the proxy, not beside it. A child started at
    the normal priority by a nice-19 thread is worse than either: in the second after its exec it
    can take the core from the nice-19 thread while that thread holds the interpreter lock, and
    the proxy's event loop then waits for the lock.
    Measured with the proxy pinned to one core: born at nice 0, back-to-back refreshes made the
    proxy's interpreter stall for over 10 ms 20 times in two minutes, against 5 times in the
    quiet phases of the same run; born at nice 19, 7 times against 8 (BENCHMARKS.md §8c).

    The child stays at nice 19. It used to move itself to Linux's SCHED_IDLE, whose weight is 3
    against nice 19's 15 (and nice 0's 1024): on a host whose cores other nice-0 work keeps busy,
    a SCHED_IDLE child got a third of what a nice-19 one gets, too little to finish inside
    `timeout_s` (1,114 s against 310 s beside one CPU hog), so the estimates never refreshed
    there (BENCHMARKS.md §8e).
    """
    result: list[T] = []
    failed: list[BaseException] = []

    def run() -> None:
        try:
            with contextlib.suppress(OSError, AttributeError):
                os.setpriority(os.PRIO_PROCESS, threading.get_native_id(), 19)
            result.append(work())
        except BaseException as exc:  # handed to the caller's thread
            failed.append(exc)

    worker = threading.Thread(target=run, name="headroom-refresh", daemon=True)
    worker.start()
    worker.join()
    if failed:
        raise failed[0]
    return result[0]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m collector.analysis.refresh_worker",
        description="Traffic capacity estimates of a Parquet file of request rows, as JSON "
        "(the child process of the sidecar's and the store's capacity refresh).",
    )
    parser.add_argument("rows", type=Path, help="Parquet file with the columns TRAFFIC_COLUMNS")
    parser.add_argument("--now", type=datetime.fromisoformat, required=True)
    parser.add_argument("--window-s", type=float, required=True)
    parser.add_argument("--profile", default="interactive")
    parser.add_argument("--slo-ttft-p95-s", type=float)
    parser.add_argument("--out", type=Path, help="write the JSON to this file (default: stdout)")
    args = parser.parse_args(argv)
    store = RequestStore.over_parquet(args.rows)  # the curves scan the file: no copy in memory
    try:
        store.execute("SET threads = 1")
        # no progress bar on stdout, where the answer goes without --out: DuckDB draws one for a
        # query that runs past 2 s, as queries do when a busy host leaves this child little CPU
        store.execute("SET enable_progress_bar = false")
        found = traffic_estimates(
            store,
            args.now,
            window=timedelta(seconds=args.window_s),
            slo_ttft_p95_s=args.slo_ttft_p95_s,
            profile=args.profile,
        )
    finally:
        store.close()
    answer = [estimate.to_dict() for estimate in found]
    if args.out is None:
        json.dump(answer, sys.stdout)
    else:
        args.out.write_text(json.dumps(answer))
    return 0


def _entry() -> Any:  # pragma: no cover - the child's entry point
    """The child: at the priority of the thread that started it (in_background: nice 19)."""
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    # The knee's cross-check imports kneed, which loads matplotlib.pyplot for plots nothing here
    # draws: a fifth of the child's CPU time. Not importable here (kneed does without it), so the
    # child needs that much less of a busy core.
    sys.modules.setdefault("matplotlib", None)  # type: ignore[arg-type]  # None: "not importable"
    return main()


if __name__ == "__main__":  # pragma: no cover
    sys.exit(_entry())
