"""The fleet's table at 100 M rows: a documented generator, the weekly review and a day's compaction.

    generate  ROWS synthetic rows over DAYS UTC days ending at END (exclusive), as WRITERS sidecars
              would stage them: per writer and day, files of FILE_ROWS rows in time order, each
              one UTC day sorted by admitted_at, named staged/<writer>/<writer>-<seq>.parquet and
              written with the sidecar's Parquet options (collector.lake.stage); then the product's
              committer (collector.lake.table.commit_staged, what `headroom lake commit` runs)
              registers them. Rows are built as columns with numpy and pyarrow, FILE_ROWS at a
              time (memory stays flat), seeded: the same parameters give the same rows. Values
              follow tests/support/synthetic.py's traffic: TTFT grows with the in-flight count,
              a fifth of requests fail or are rate-limited, tenants skewed, models weighted.
    review    `headroom report` over [END - 7 days, END) through --catalog/--lake, timed as a
              process (what a user runs), REPEAT times; with --parts, once in this process with
              each of the review's DuckDB aggregates (collector.report.collect) timed apart.
    readers   the reader this change replaced (pyiceberg's scan into Arrow, streamed into one
              temporary Parquet file under DuckDB) against the product's (collector.lake.read:
              pyiceberg plans, DuckDB reads the data files in place), interleaved REPEAT times
              over the same table: the time to open the log and to answer a per-model count and
              exact p50/p95/p99 TTFT, and that both answer the same.
    scan      what the review reads, alone: the product's reader over the review's window, a per-model
              count and exact p50/p95/p99 TTFT, then every column the review selects evaluated
              over the week in DuckDB (aggregated there rather than fetched into Python).
    maintain  `headroom lake maintain` (sealed days compacted, nothing expired or dropped), timed
              as a process; data files and rows per day before and after.

Usage (the figures in BENCHMARKS.md §9 name their parameters; `nice` on a shared host):
    nice -n 5 .venv/bin/python benchmarks/lake_100m.py generate --lake /tmp/lake100m --rows 100000000 --part 1/4
    (then --part 2/4, 3/4, 4/4: the same rows in steps; each step commits what it staged)
    nice -n 5 .venv/bin/python benchmarks/lake_100m.py review --lake /tmp/lake100m
    nice -n 5 .venv/bin/python benchmarks/lake_100m.py readers --lake /tmp/lake10m
    nice -n 5 .venv/bin/python benchmarks/lake_100m.py generate --lake /tmp/day100m --rows 100000000 --days 1
    nice -n 5 .venv/bin/python benchmarks/lake_100m.py maintain --lake /tmp/day100m
The catalog defaults to sqlite:///<lake>/catalog.db.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ProcessPoolExecutor
from datetime import UTC, date, datetime, timedelta
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

HEADROOM = Path(sys.executable).parent / "headroom"
MODELS = ("llama-3.1-8b", "llama-3.1-70b", "qwen2.5-32b", "mistral-7b")
MODEL_WEIGHTS = (0.45, 0.25, 0.2, 0.1)
MODEL_TTFT_SCALE = (1.0, 2.5, 1.8, 0.8)
TENANTS = ("team-a", "team-b", "team-c", "team-d", "team-e", "batch")
TENANT_WEIGHTS = (0.4, 0.25, 0.15, 0.1, 0.05, 0.05)
INFLIGHT = np.array([1, 2, 3, 4, 6, 8, 12, 16])
US_PER_DAY = 86_400_000_000
SUMMARY = (
    "SELECT model, count(*), count(DISTINCT request_id), quantile_cont(ttft_s, [0.5, 0.95, 0.99]) "
    "FROM requests GROUP BY model ORDER BY model"
)


def _catalog(args: argparse.Namespace) -> str:
    return str(args.catalog or f"sqlite:///{Path(args.lake).resolve() / 'catalog.db'}")


def _end(args: argparse.Namespace) -> datetime:
    day = date.fromisoformat(args.end) if args.end else datetime.now(UTC).date()
    return datetime(day.year, day.month, day.day, tzinfo=UTC)


def _strings(values: tuple[str, ...], index: np.ndarray) -> pa.Array:
    return pa.array(values, pa.string()).take(pa.array(index))


def rows(writer: str, seq: int, n: int, start_us: int, end_us: int, seed: int) -> pa.Table:
    """`n` rows of one writer's file `seq`, admitted in [start_us, end_us) (µs since the epoch), as columns."""
    from collector.store.db import ARROW_SCHEMA

    rng = np.random.default_rng([seed, seq, abs(hash(writer)) % 2**31])
    admitted = np.sort(rng.integers(start_us, end_us, n))
    model = rng.choice(len(MODELS), n, p=MODEL_WEIGHTS)
    inflight = INFLIGHT[rng.integers(0, len(INFLIGHT), n)]
    prompt = rng.integers(20, 2001, n)
    completion = rng.integers(2, 401, n)
    ttft = np.asarray(MODEL_TTFT_SCALE)[model] * (0.05 + 0.02 * inflight) * (0.5 + rng.random(n))
    tpot = 0.01 + 0.002 * inflight * rng.random(n)
    e2e = ttft + tpot * (completion - 1)
    fate = rng.integers(0, 10, n)  # 0-7 ok, 8 rate limited, 9 upstream error
    ok = fate < 8
    failed = ~ok
    outcome_index = np.where(ok, 0, fate - 7)
    us = pa.timestamp("us", tz="UTC")

    def at(seconds: np.ndarray, mask: np.ndarray | None = None) -> pa.Array:
        return pa.array(admitted + (seconds * 1e6).astype(np.int64), us, mask=mask)

    ids = pc.cast(pa.array(np.arange(n)), pa.string())
    columns: dict[str, Any] = {
        "request_id": pc.binary_join_element_wise(f"{writer}-{seq:06d}-", ids, ""),
        "source": pa.array(np.full(n, "traffic")),
        "instance": pa.array(np.full(n, writer)),
        "model": _strings(MODELS, model),
        "tenant": _strings(TENANTS, rng.choice(len(TENANTS), n, p=TENANT_WEIGHTS)),
        "endpoint": pa.array(np.full(n, "/v1/chat/completions")),
        "stream": pa.array(np.ones(n, bool)),
        "admitted_at": pa.array(admitted, us),
        "first_byte_at": at(ttft * 0.9),
        "first_token_at": at(ttft, failed),
        "completed_at": at(np.where(ok, e2e, ttft)),
        "status_code": pa.array(np.array([200, 429, 502])[outcome_index], pa.int32()),
        "outcome": _strings(("ok", "rate_limited", "upstream_error"), outcome_index),
        "error": pc.if_else(
            pa.array(ok),
            pa.scalar(None, pa.string()),
            _strings(("", "rate_limited", "upstream_error"), outcome_index),
        ),
        "prompt_tokens": pa.array(prompt, pa.int32()),
        "cached_prompt_tokens": pa.array(prompt // 4, pa.int32()),
        "completion_tokens": pa.array(np.where(ok, completion, 0), pa.int32()),
        "max_tokens": pa.array(np.full(n, 512), pa.int32()),
        "usage_source": pa.array(np.full(n, "upstream")),
        "ttft_s": pa.array(ttft, mask=failed),
        "tpot_s": pa.array(tpot, mask=failed),
        "e2e_s": pa.array(np.where(ok, e2e, ttft)),
        "inflight_at_admit": pa.array(inflight, pa.int32()),
        "active_tokens_at_admit": pa.array(inflight * (prompt + completion // 2), pa.int64()),
        "engine_waiting_at_admit": pa.array(np.maximum(0, inflight - 8), pa.int32()),
        "kv_usage_at_admit": pa.array(np.minimum(1.0, inflight / 16)),
    }
    return pa.Table.from_arrays(
        [columns.get(f.name, pa.nulls(n, f.type)) for f in ARROW_SCHEMA], schema=ARROW_SCHEMA
    )


def _write_writer_day(task: tuple[str, str, int, int, int, int, int, int]) -> tuple[int, int]:
    """Stage one writer's files of one day (as its sidecar would); returns (files, rows)."""
    from collector.lake.layout import Lake, staged_name
    from collector.lake.stage import PARQUET_OPTIONS

    lake_uri, writer, first_seq, total, file_rows, start_us, span_us, seed = task
    lake = Lake.parse(lake_uri)
    files = max(1, -(-total // file_rows))
    edges = np.linspace(start_us, start_us + span_us, files + 1).astype(np.int64)
    written = 0
    for k in range(files):
        n = total // files + (1 if k < total % files else 0)
        path = staged_name(lake, writer, first_seq + k)
        Path(path).parent.mkdir(parents=True, exist_ok=True)
        pq.write_table(
            rows(writer, first_seq + k, n, int(edges[k]), int(edges[k + 1]), seed),
            path + ".tmp",
            **PARQUET_OPTIONS,
        )
        os.replace(path + ".tmp", path)
        written += n
    return files, written


def generate(args: argparse.Namespace) -> None:
    from collector.lake import table as lake_table
    from collector.lake.layout import Lake

    end = _end(args)
    first_day = end - timedelta(days=args.days)
    per_day = args.rows // args.days
    writers = [f"sidecar-{w:02d}" for w in range(args.writers)]
    files_per_writer_day = max(1, -(-(per_day // args.writers) // args.file_rows))
    print(
        f"generate: {args.rows:,} rows, {args.days} UTC days [{first_day:%Y-%m-%d}, {end:%Y-%m-%d}), "
        f"{args.writers} writers, files of <= {args.file_rows:,} rows (~{files_per_writer_day} per writer "
        f"and day), seed {args.seed}, part {args.part}, {args.jobs} processes, lake {args.lake}, "
        f"catalog {_catalog(args)}",
        flush=True,
    )
    tasks = []
    for d in range(args.days):
        day_rows = per_day + (args.rows - per_day * args.days if d == args.days - 1 else 0)
        for w, writer in enumerate(writers):
            total = day_rows // args.writers + (1 if w < day_rows % args.writers else 0)
            start_us = int((first_day + timedelta(days=d)).timestamp() * 1e6)
            tasks.append(
                (args.lake, writer, d * 10_000, total, args.file_rows, start_us, US_PER_DAY, args.seed)
            )
    part, parts = (int(x) for x in args.part.split("/"))
    tasks = tasks[part - 1 :: parts]  # this step's share of the (day, writer) files
    began = time.monotonic()
    files = written = 0
    with ProcessPoolExecutor(args.jobs) as pool:
        for done, (f, n) in enumerate(pool.map(_write_writer_day, tasks), 1):
            files, written = files + f, written + n
            if done % 8 == 0 or done == len(tasks):
                elapsed = time.monotonic() - began
                print(
                    f"  staged {files} files, {written:,} rows, {elapsed:.0f} s ({written / elapsed:,.0f} rows/s)",
                    flush=True,
                )
    staged_s = time.monotonic() - began
    lake = Lake.parse(args.lake)
    size = sum(os.path.getsize(name.path) for name in lake.staged())
    began = time.monotonic()
    result = lake_table.commit_staged(lake_table.open_catalog(_catalog(args), lake), lake)
    commit_s = time.monotonic() - began
    print(
        f"staged {files} files, {written:,} rows, {size / 2**30:.2f} GiB in {staged_s:.1f} s "
        f"({written / staged_s:,.0f} rows/s); committed {result.files} files, {result.rows:,} rows "
        f"in {result.commits} commits, {commit_s:.1f} s",
        flush=True,
    )


def _timed(command: list[str]) -> tuple[float, subprocess.CompletedProcess[str]]:
    began = time.monotonic()
    done = subprocess.run(command, capture_output=True, text=True, timeout=3600)
    return time.monotonic() - began, done


def review(args: argparse.Namespace) -> None:
    end = _end(args)
    since = end - timedelta(days=7)
    command = [
        str(HEADROOM), "report", "--since", since.isoformat(), "--until", end.isoformat(),
        "--catalog", _catalog(args), "--lake", args.lake,
    ]  # fmt: skip
    print("review:", " ".join(command), flush=True)
    for attempt in range(args.repeat):
        seconds, done = _timed(command)
        if done.returncode != 0:
            sys.exit(f"headroom report failed: {done.stderr[-2000:]}")
        requests = [line for line in done.stdout.splitlines() if "requests" in line.lower()][:2]
        print(
            f"  run {attempt + 1}: {seconds:.1f} s, {len(done.stdout):,} characters; {requests}", flush=True
        )


def review_parts(args: argparse.Namespace) -> None:
    """The review in this process, each aggregate query of collector.report.collect timed."""
    from collector.lake.read import open_lake_log
    from collector.report import collect
    from collector.report.build import build_report

    names = {id(value): name for name, value in vars(collect).items() if isinstance(value, str)}
    timed: list[tuple[str, float]] = []

    def timing(method: Any) -> Any:
        def run(self: Any, sql: str, **extra: Any) -> Any:
            began = time.monotonic()
            try:
                return method(self, sql, **extra)
            finally:
                timed.append((names.get(id(sql), "?"), time.monotonic() - began))

        return run

    collect._Reader.rows = timing(collect._Reader.rows)  # type: ignore[method-assign]
    collect._Reader.columns = timing(collect._Reader.columns)  # type: ignore[method-assign]
    end = _end(args)
    since = end - timedelta(days=7)
    began = time.monotonic()
    with open_lake_log(_catalog(args), args.lake, since=since - (end - since), until=end) as store:
        opened = time.monotonic()
        inputs = collect.collect_inputs(store, since, end)
        collected = time.monotonic()
        report = build_report(inputs)
        built = time.monotonic()
    for name, seconds in timed:
        print(f"  {name:12s} {seconds:6.1f} s", flush=True)
    rows = sum(model["traffic"]["requests"] for model in report["models"])
    print(
        f"open {opened - began:.1f} s, aggregates {collected - opened:.1f} s "
        f"(the queries above {sum(t for _, t in timed):.1f} s), build {built - collected:.1f} s; {rows:,} requests"
    )


def _old_reader(catalog: str, lake: str, since: datetime, until: datetime, directory: Path) -> Any:
    """The reader this change replaced, kept here as the comparison: pyiceberg's scan into Arrow,
    streamed into one Parquet file that DuckDB then reads."""
    from collector.lake.layout import Lake
    from collector.lake.stage import conform
    from collector.lake.table import open_catalog, open_table
    from collector.store.db import ARROW_SCHEMA, RequestStore

    iceberg = open_table(open_catalog(catalog, Lake.parse(lake)), create=False)
    scan = iceberg.scan(
        row_filter=f"admitted_at >= '{since.isoformat()}' AND admitted_at < '{until.isoformat()}'"
    )
    path = directory / "requests.parquet"
    with pq.ParquetWriter(str(path), ARROW_SCHEMA, compression="zstd") as writer:
        for batch in scan.to_arrow_batch_reader():
            writer.write_table(conform(pa.Table.from_batches([batch])))
    return RequestStore.over_parquet(path)


def readers(args: argparse.Namespace) -> None:
    from collector.lake.read import open_lake_log

    end = _end(args)
    since = end - timedelta(days=15)  # what the weekly review reads: its week and the one before
    catalog = _catalog(args)
    times: dict[str, list[tuple[float, float]]] = {"old": [], "new": []}
    answers: dict[str, Any] = {}
    print(
        f"readers: {args.repeat} interleaved rounds over {args.lake}, rows admitted since {since:%Y-%m-%d}",
        flush=True,
    )
    for attempt in range(args.repeat):
        for arm in ("old", "new") if attempt % 2 == 0 else ("new", "old"):
            with tempfile.TemporaryDirectory(prefix="lake-old-", dir=args.tmp) as directory:
                began = time.monotonic()
                if arm == "old":
                    store = _old_reader(catalog, args.lake, since, end, Path(directory))
                    opened = time.monotonic()
                    answers[arm] = store.query(SUMMARY)
                    store.close()
                    done = time.monotonic()
                else:
                    with open_lake_log(catalog, args.lake, since=since, until=end) as store:
                        opened = time.monotonic()
                        answers[arm] = store.query(SUMMARY)
                        done = time.monotonic()
            times[arm].append((opened - began, done - began))
            rows_read = sum(int(row[1]) for row in answers[arm])
            print(
                f"  {arm}: open {opened - began:.2f} s, open + summary {done - began:.2f} s, "
                f"{rows_read:,} rows ({rows_read / (done - began):,.0f} rows/s)",
                flush=True,
            )
    assert answers["old"] == answers["new"], "the two readers disagree"
    old, new = (statistics.median(t for _, t in times[arm]) for arm in ("old", "new"))
    ratios = sorted(o / n for (_, o), (_, n) in zip(times["old"], times["new"]))
    print(
        f"median open + summary: old {old:.2f} s, new {new:.2f} s; old/new per round {[round(r, 1) for r in ratios]}"
    )
    print("the two readers answered the same:", answers["new"][:1], "...")


def scan(args: argparse.Namespace) -> None:
    """The review's reading alone, at sizes where its Python side cannot run: the product's reader
    over what the review reads, then DuckDB evaluating every column the review selects
    (collector.report.collect) over the week, aggregated in DuckDB instead of fetched."""
    from collector.lake.read import open_lake_log
    from collector.report.collect import _SELECT, _TEXT, COLUMNS

    end = _end(args)
    since = end - timedelta(days=7)
    every = ", ".join(f"count({name})" if name in _TEXT else f"sum({name})" for name in COLUMNS)
    review_sql = (
        f"SELECT count(*), {every} FROM (SELECT {_SELECT} FROM requests "
        "WHERE source = 'traffic' AND admitted_at >= ? AND admitted_at < ?)"
    )
    for attempt in range(args.repeat):
        began = time.monotonic()
        with open_lake_log(_catalog(args), args.lake, since=since - timedelta(days=8), until=end) as store:
            opened = time.monotonic()
            summary = store.query(SUMMARY)
            summarised = time.monotonic()
            rows_read = int(store.query(review_sql, [since, end])[0][0])
            done = time.monotonic()
        print(
            f"  run {attempt + 1}: open {opened - began:.2f} s; per-model count, distinct ids and exact "
            f"p50/p95/p99 TTFT {summarised - opened:.1f} s; the review's {len(COLUMNS)} columns over "
            f"{rows_read:,} rows {done - summarised:.1f} s ({rows_read / (done - summarised):,.0f} rows/s)",
            flush=True,
        )
    print("  per model (rows, distinct request_id):", [(m, n, d) for m, n, d, _ in summary])


def _per_day(catalog: str, lake: str) -> dict[date, tuple[int, int]]:
    from collector.lake.layout import Lake
    from collector.lake.table import open_catalog, open_table

    files = open_table(open_catalog(catalog, Lake.parse(lake)), create=False).inspect.files()
    out: dict[date, tuple[int, int]] = {}
    epoch = date(1970, 1, 1)
    for partition, count in zip(files["partition"].to_pylist(), files["record_count"].to_pylist()):
        value = partition["day"]
        day = value if isinstance(value, date) else epoch + timedelta(days=int(value))
        n_files, n_rows = out.get(day, (0, 0))
        out[day] = (n_files + 1, n_rows + int(count))
    return out


def maintain(args: argparse.Namespace) -> None:
    catalog = _catalog(args)
    before = _per_day(catalog, args.lake)
    command = [
        str(HEADROOM), "lake", "maintain", "--catalog", catalog, "--lake", args.lake,
        "--snapshot-age", "100000",
    ]  # fmt: skip
    print("maintain:", " ".join(command), flush=True)
    seconds, done = _timed(command)
    print(done.stderr[-3000:], flush=True)
    if done.returncode != 0:
        sys.exit("headroom lake maintain failed")
    after = _per_day(catalog, args.lake)
    for day in sorted(before):
        print(
            f"  {day}: files {before[day][0]} -> {after.get(day, (0, 0))[0]}, rows {before[day][1]:,} -> {after.get(day, (0, 0))[1]:,}"
        )
    total = sum(n for _, n in before.values())
    print(f"maintain: {seconds:.1f} s for {total:,} rows ({total / seconds:,.0f} rows/s)")


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    sub = parser.add_subparsers(dest="command", required=True)
    for name in ("generate", "review", "readers", "scan", "maintain"):
        p = sub.add_parser(name)
        p.add_argument("--lake", required=True, help="the lake directory")
        p.add_argument("--catalog", default=None, help="default: sqlite:///<lake>/catalog.db")
        p.add_argument(
            "--end",
            default=None,
            help="the generated days end here (YYYY-MM-DD, exclusive; default today UTC)",
        )
        if name == "generate":
            p.add_argument("--rows", type=int, default=100_000_000)
            p.add_argument("--days", type=int, default=7)
            p.add_argument("--writers", type=int, default=16)
            p.add_argument("--file-rows", type=int, default=250_000, help="rows per staged file at most")
            p.add_argument("--seed", type=int, default=1)
            p.add_argument("--jobs", type=int, default=2, help="writer processes")
            p.add_argument(
                "--part",
                default="1/1",
                help="K/N: stage and commit every Nth (day, writer) from the Kth (steps)",
            )
        if name in ("review", "readers", "scan"):
            p.add_argument("--repeat", type=int, default=3)
        if name == "review":
            p.add_argument("--parts", action="store_true", help="time each aggregate, in this process")
        if name == "readers":
            p.add_argument("--tmp", default=None, help="where the old reader's copy goes")
    args = parser.parse_args()
    commands = {
        "generate": generate,
        "review": review,
        "readers": readers,
        "scan": scan,
        "maintain": maintain,
    }
    if args.command == "review" and args.parts:
        review_parts(args)
        return
    commands[args.command](args)


if __name__ == "__main__":
    main()
