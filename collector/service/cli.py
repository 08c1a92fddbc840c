"""`headroom store`: run the store service (ingest, query API, scheduled jobs) on one DuckDB file."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import click

__all__ = ["store", "parse_listen"]


def parse_listen(value: str) -> tuple[str, int]:
    """'127.0.0.1:9200' -> ('127.0.0.1', 9200); click.BadParameter naming the input otherwise."""
    host, _, port = value.rpartition(":")
    if not host or not port.isdigit() or not 0 < int(port) < 65536:
        raise click.BadParameter(f"{value!r} is not HOST:PORT, e.g. 127.0.0.1:9200", param_hint="--listen")
    return host, int(port)


@click.command("store", context_settings={"help_option_names": ["-h", "--help"]})
@click.option(
    "--db",
    "db_path",
    type=click.Path(dir_okay=False),
    default="headroom-store.duckdb",
    show_default=True,
    help="DuckDB file this process alone owns.",
)
@click.option("--listen", default="127.0.0.1:9200", show_default=True, help="HOST:PORT to serve on.")
@click.option(
    "--token",
    default=None,
    help="Bearer token for /v1 routes. Default: $HEADROOM_TOKEN, else generated into <db>.token (0600).",
)
@click.option(
    "--export-dir",
    type=click.Path(file_okay=False),
    default=None,
    help="Where sealed days go as hive-partitioned Parquet. Default: <db dir>/parquet.",
)
@click.option(
    "--retention-days",
    type=click.IntRange(min=1),
    default=30,
    show_default=True,
    help="Raw rows older than this many days are deleted once exported.",
)
@click.option(
    "--report-dir",
    type=click.Path(file_okay=False),
    default=None,
    help="Where the weekly report is written (latest.html is served). Default: <db dir>/reports.",
)
@click.option(
    "--report-cron",
    default="mon 09:00",
    show_default=True,
    help="When the weekly report runs: '<day> HH:MM' in UTC.",
)
@click.option(
    "--slo-ttft-p95", type=float, default=None, help="p95 TTFT SLO in seconds for estimates and reports."
)
@click.option(
    "--checkpoint-mb",
    type=click.IntRange(min=1),
    default=128,
    show_default=True,
    help="Fold DuckDB's write-ahead log into the file once it holds this many MB. Fewer folds "
    "ingest faster (DuckDB's own default, 16, took a third less at 10 M rows); the rows not yet "
    "folded stay in memory.",
)
@click.option("--no-jobs", is_flag=True, help="Serve only; run no scheduled jobs.")
def store(
    db_path: str,
    listen: str,
    token: str | None,
    export_dir: str | None,
    retention_days: int,
    report_dir: str | None,
    report_cron: str,
    slo_ttft_p95: float | None,
    checkpoint_mb: int,
    no_jobs: bool,
) -> None:
    """The store service: owns the DuckDB file; sidecars ship rows here (headroom run --store-url).

    \b
    Examples:
      headroom store --db /data/headroom.duckdb --listen 0.0.0.0:9200
      HEADROOM_TOKEN=s3cret headroom store --db fleet.duckdb --retention-days 14
      curl -H "Authorization: Bearer $(cat fleet.duckdb.token)" \\
           'http://127.0.0.1:9200/v1/query/percentiles?metric=ttft_s&group_by=model,hour&since=24h'
    """
    # lazy: `headroom store --help` must not load uvicorn, FastAPI, DuckDB and the analysis
    import uvicorn
    from rich.console import Console

    from collector.service.app import create_store_app
    from collector.service.auth import resolve_token
    from collector.store.capacity_gauges import CapacityGauges
    from collector.store.db import RequestStore
    from collector.store.jobs import JobSettings, parse_weekly_cron

    os.umask(0o077)  # the database, its WAL, exports and reports: readable by this user only
    console = Console(stderr=True)
    host, port = parse_listen(listen)
    try:
        parse_weekly_cron(report_cron)
    except ValueError as exc:
        raise click.BadParameter(str(exc), param_hint="--report-cron") from None
    base = Path(db_path).resolve().parent
    try:
        request_store = RequestStore(db_path, checkpoint_mb=checkpoint_mb)
    except Exception as exc:  # duckdb.IOException when another process holds the file, or not a DuckDB file
        first = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
        hint = (
            "only one process may own it; stop the other one or point readers at the store's API"
            if "lock" in first.lower()
            else "pass a DuckDB file headroom wrote, or a new path"
        )
        click.echo(f"Error: cannot open --db {db_path} ({first}); {hint}", err=True)
        sys.exit(1)
    token_value, token_file = resolve_token(token, db_path)
    if token_file is not None:
        console.print(
            f"[bold]store token[/] is in {token_file.resolve()} (mode 0600); "
            "shippers send it as a Bearer token"
        )
    settings = (
        None
        if no_jobs
        else JobSettings(
            export_dir=Path(export_dir) if export_dir else base / "parquet",
            retention_days=retention_days,
            report_dir=Path(report_dir) if report_dir else base / "reports",
            report_cron=report_cron,
            slo_ttft_p95_s=slo_ttft_p95,
        )
    )
    app = create_store_app(
        request_store,
        token_value,
        gauges=CapacityGauges(),
        job_settings=settings,
        report_dir=Path(report_dir) if report_dir else base / "reports",
    )
    console.print(f"headroom store: {db_path} ({request_store.count()} rows) on http://{host}:{port}")
    try:
        uvicorn.run(app, host=host, port=port, log_level="warning", access_log=False)
    finally:
        request_store.close()
