"""The fleet's request log on Iceberg: committer throughput from many writers, and freshness.

    throughput  WRITERS processes each stage FILES Parquet files of ROWS rows (LakeWriter, the
                sidecar's own writer: spool, roll, one UTC day per file), then ONE committer
                (`collector.lake.table.commit_staged`, what `headroom lake commit` runs) registers
                all of them; rows/s = rows committed / the committer's wall time. The table is
                read back: rows = distinct request_id = rows written.
    freshness   one writer with the sidecar's defaults (roll 60 s) and a committer loop every
                --every seconds (30); a row is submitted every second, and the table is polled:
                freshness = when a row became visible - when its request ended.

Usage (sizes are parameters; the figures in BENCHMARKS.md name theirs):
    .venv/bin/python benchmarks/lake_commit.py throughput --writers 16 --files 4 --rows 25000
    .venv/bin/python benchmarks/lake_commit.py throughput --catalog postgresql://headroom@127.0.0.1:5432/postgres
    .venv/bin/python benchmarks/lake_commit.py freshness --seconds 150 --every 30
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import tempfile
import threading
import time
from datetime import UTC, datetime
from pathlib import Path

WRITER = r"""
import sys
from datetime import datetime, timedelta
from collector.lake.stage import LakeWriter
from collector.record import RequestRecord
lake, spool, name, files, rows = sys.argv[1:6]
start = datetime(2026, 3, 2, 1, tzinfo=__import__("datetime").timezone.utc)
w = LakeWriter(lake, name, spool, roll_seconds=3600, roll_bytes=1 << 40)
for f in range(int(files)):
    w.write_batch([
        RequestRecord(request_id=f"{name}-{f}-{i}", instance=name, model=("a", "b")[i % 2], outcome="ok",
                      admitted_at=start + timedelta(microseconds=f * 10**7 + i * 100), ttft_s=(i % 997) / 997)
        for i in range(int(rows))
    ])
    assert w.flush(600)
w.close()
"""


def throughput(args: argparse.Namespace) -> None:
    from collector.lake import table as lake_table
    from collector.lake.layout import Lake
    from collector.lake.read import open_lake_log

    tmp = Path(tempfile.mkdtemp(prefix="lake-bench-"))
    lake = tmp / "lake"
    catalog = args.catalog or f"sqlite:///{tmp / 'catalog.db'}"
    began = time.monotonic()
    writers = [
        subprocess.Popen(
            [
                sys.executable,
                "-c",
                WRITER,
                str(lake),
                str(tmp / f"spool{w}"),
                f"w{w}",
                str(args.files),
                str(args.rows),
            ]
        )
        for w in range(args.writers)
    ]
    for process in writers:
        assert process.wait() == 0
    staged = time.monotonic() - began
    location = Lake.parse(lake)
    total = args.writers * args.files * args.rows
    print(
        f"staged {len(location.staged())} files, {total:,} rows by {args.writers} writers in {staged:.1f} s",
        file=sys.stderr,
    )
    catalog_object = lake_table.open_catalog(catalog, location)
    lake_table.open_table(catalog_object)  # created beforehand: the table's creation is not the commit
    began = time.monotonic()
    result = lake_table.commit_staged(catalog_object, location)
    took = time.monotonic() - began
    with open_lake_log(catalog, str(lake)) as store:
        rows, distinct = store.query("SELECT count(*), count(DISTINCT request_id) FROM requests")[0]
    print(
        f"committer: {result.files} files, {result.rows:,} rows in {result.commits} commits, {took:.2f} s: "
        f"{result.rows / took:,.0f} rows/s; table rows {rows:,}, distinct {distinct:,}, written {total:,}"
    )
    assert rows == distinct == total


def freshness(args: argparse.Namespace) -> None:
    from collector.lake import table as lake_table
    from collector.lake.layout import Lake
    from collector.lake.stage import DEFAULT_ROLL_SECONDS, LakeWriter
    from collector.record import RequestRecord

    tmp = Path(tempfile.mkdtemp(prefix="lake-fresh-"))
    lake = tmp / "lake"
    catalog = f"sqlite:///{tmp / 'catalog.db'}"
    location = Lake.parse(lake)
    writer = LakeWriter(lake, "fresh", tmp / "spool")  # the sidecar's defaults
    cat = lake_table.open_catalog(catalog, location)
    table = lake_table.open_table(cat)
    ended: dict[str, float] = {}
    seen: dict[str, float] = {}
    stop = threading.Event()

    def commit_loop() -> None:
        while not stop.wait(args.every):
            lake_table.commit_staged(cat, location)
            ids = table.refresh().scan(selected_fields=("request_id",)).to_arrow()["request_id"].to_pylist()
            now = time.time()
            for rid in ids:
                seen.setdefault(rid, now)

    thread = threading.Thread(target=commit_loop)
    thread.start()
    began = time.time()
    n = 0
    while time.time() - began < args.seconds:
        rid = f"r{n}"
        ended[rid] = time.time()
        stamp = datetime.now(UTC)
        writer.write_batch([RequestRecord(request_id=rid, admitted_at=stamp, completed_at=stamp, model="a")])
        n += 1
        time.sleep(1.0)  # the load: one request per second (a benchmark's pacing, not synchronisation)
    deadline = time.time() + DEFAULT_ROLL_SECONDS + 2 * args.every + 10
    while len(seen) < len(ended) and time.time() < deadline:
        time.sleep(1.0)
    stop.set()
    thread.join()
    writer.close()
    lags = sorted(seen[rid] - ended[rid] for rid in ended if rid in seen)
    print(
        f"freshness over {len(ended)} rows (roll {DEFAULT_ROLL_SECONDS:.0f} s, commit every {args.every:g} s): "
        f"visible {len(lags)}, p50 {lags[len(lags) // 2]:.1f} s, max {lags[-1]:.1f} s"
    )


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    sub = parser.add_subparsers(dest="mode", required=True)
    t = sub.add_parser("throughput")
    t.add_argument("--writers", type=int, default=16)
    t.add_argument("--files", type=int, default=4)
    t.add_argument("--rows", type=int, default=25_000)
    t.add_argument("--catalog", default=None, help="default: sqlite in a temporary directory")
    f = sub.add_parser("freshness")
    f.add_argument("--seconds", type=float, default=150)
    f.add_argument("--every", type=float, default=30)
    args = parser.parse_args()
    throughput(args) if args.mode == "throughput" else freshness(args)


if __name__ == "__main__":
    main()
