"""How much memory does a sidecar's DuckDB keep as its request log grows, with and without a bound?

    python benchmarks/store_memory.py [--rows 500000] [--batch 50] [--bounds none,64,256]

Writes `--rows` synthetic rows into a new RequestStore as a sidecar's does (one DuckDB thread,
DuckDB's 16 MB checkpoint, batches of `--batch` rows from the log writer), once per memory bound
(`none`: DuckDB's default, 80 % of the machine's memory; a number: `memory_mb`, what
`headroom run --store-memory-mb` sets), each in a process of its own. Every 50,000 rows it prints
DuckDB's own memory by tag (duckdb_memory(): IN_MEMORY_TABLE, the rows waiting for a checkpoint;
BASE_TABLE, the cached blocks of the file), the write-ahead log's size and the VmRSS. At the end
each bound's BASE_TABLE growth per row written (least squares) and its most DuckDB memory.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path

from _common import ROOT, rss_mib

sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "tests"))  # support.synthetic: the suite's synthetic rows
from support.synthetic import synthetic_rows  # noqa: E402

from collector.sidecar.wiring import SIDECAR_STORE_THREADS  # noqa: E402
from collector.store.db import RequestStore  # noqa: E402

EVERY = 50_000
TEMPLATE_ROWS = 20_000


def _write(rows: int, batch: int, bound: int | None) -> list[dict]:
    """One bound: write the rows, sampling DuckDB's memory; returns the samples."""
    directory = Path(tempfile.mkdtemp(prefix="store-memory-"))
    store = RequestStore(directory / "log.duckdb", threads=SIDECAR_STORE_THREADS, memory_mb=bound)
    template = synthetic_rows(TEMPLATE_ROWS, datetime(2026, 1, 1, tzinfo=UTC), span=timedelta(hours=1))
    samples, began = [], time.perf_counter()
    for start in range(0, rows, batch):
        lap, offset = divmod(start, TEMPLATE_ROWS)
        chunk = [
            row
            | {
                "request_id": f"{lap}-{row['request_id']}",
                "admitted_at": row["admitted_at"] + timedelta(hours=lap),
            }
            for row in template[offset : offset + batch]
        ]
        store.write_batch(chunk)
        written = start + len(chunk)
        if written % EVERY == 0:
            tags = dict(
                store.query(
                    "SELECT tag, memory_usage_bytes FROM duckdb_memory() WHERE memory_usage_bytes > 0"
                )
            )
            wal = store.query("SELECT wal_size FROM pragma_database_size()")[0][0]
            sample = {
                "rows": written,
                "base_table_mib": round(tags.get("BASE_TABLE", 0) / 2**20, 2),
                "in_memory_table_mib": round(tags.get("IN_MEMORY_TABLE", 0) / 2**20, 2),
                "duckdb_mib": round(sum(tags.values()) / 2**20, 2),
                "wal": wal,
                "rss_mib": round(rss_mib(os.getpid()), 1),
                "seconds": round(time.perf_counter() - began, 1),
            }
            samples.append(sample)
            print(f"  {bound or 'none':>5}  {json.dumps(sample)}", file=sys.stderr, flush=True)
    store.close()
    return samples


def _per_row(samples: list[dict]) -> float:
    """Least-squares BASE_TABLE bytes per row written."""
    xs = [s["rows"] for s in samples]
    ys = [s["base_table_mib"] * 2**20 for s in samples]
    mean_x, mean_y = sum(xs) / len(xs), sum(ys) / len(ys)
    den = sum((x - mean_x) ** 2 for x in xs) or 1.0
    return sum((x - mean_x) * (y - mean_y) for x, y in zip(xs, ys, strict=True)) / den


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--rows", type=int, default=500_000)
    parser.add_argument("--batch", type=int, default=50)
    parser.add_argument("--bounds", default="none,64,256", help="memory bounds in MB, 'none' for DuckDB's")
    parser.add_argument("--one", default=None, help=argparse.SUPPRESS)  # a child: one bound
    args = parser.parse_args()
    if args.one is not None:
        bound = None if args.one == "none" else int(args.one)
        print(json.dumps(_write(args.rows, args.batch, bound)))
        return
    for name in args.bounds.split(","):
        child = [
            sys.executable,
            __file__,
            "--rows",
            str(args.rows),
            "--batch",
            str(args.batch),
            "--one",
            name,
        ]
        samples = json.loads(
            subprocess.run(child, check=True, capture_output=False, stdout=subprocess.PIPE).stdout
        )
        print(
            f"bound {name:>5} MB: BASE_TABLE {_per_row(samples):5.1f} B per row written; "
            f"DuckDB at most {max(s['duckdb_mib'] for s in samples):6.2f} MiB, at the end "
            f"{samples[-1]['duckdb_mib']:6.2f}; RSS at most {max(s['rss_mib'] for s in samples):6.1f} MiB; "
            f"{args.rows / samples[-1]['seconds']:,.0f} rows/s",
            flush=True,
        )


if __name__ == "__main__":
    main()
