"""`headroom report`: the weekly capacity review on the command line, from a DuckDB file or the
fleet's table.

The review itself is collector.report.review; this module only reads the options, opens the
database (through its owner while a sidecar serves it: collector.store.owner) or the Iceberg
table (collector.lake.source), and writes the text.
"""

from __future__ import annotations

import sys
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

import click
import duckdb
from rich.console import Console

from collector.lake.source import open_log, reader_options, reader_window
from collector.report.build import build_report
from collector.report.collect import collect_inputs
from collector.report.review import render_report
from collector.store.owner import OwnerError
from collector.terminal import JSON_HELP, write_json
from collector.timewin import WHEN, WHEN_HELP

__all__ = ["report", "TEXT_FORMATS"]

TEXT_FORMATS = ("md", "html")  # JSON is --json PATH, as in every command


def _from_db(
    db: str | None,
    window: tuple[datetime, datetime],
    slo: float | None,
    lake: tuple[str | None, str | None, str] = (None, None, ""),
) -> dict[str, Any]:
    catalog_uri, lake_uri, table = lake
    since, until = window
    # the review compares the window with the one before it: read both (the table is pruned by day)
    first = since - (until - since) - timedelta(days=1)
    where = f"{table} in {lake_uri}" if lake_uri else db
    try:
        with (
            open_log(db, catalog_uri, lake_uri, table=table, since=first) as store,
            Console(stderr=True).status(f"building the review of {_span(since, until)} from {where}"),
        ):
            return build_report(collect_inputs(store, since, until, slo_ttft_p95_s=slo))
    except ValueError as exc:
        raise click.UsageError(str(exc)) from None
    except (FileNotFoundError, OwnerError) as exc:
        raise click.ClickException(f"{'--lake' if lake_uri else '--db'} {lake_uri or db}: {exc}") from None
    except duckdb.OutOfMemoryException as exc:
        raise click.ClickException(
            f"DuckDB ran out of memory building the review ({str(exc).splitlines()[0]}); "
            "give the process more memory or a shorter --since"
        ) from None
    except duckdb.Error as exc:
        reason = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
        raise click.ClickException(
            f"cannot open {db} ({reason}); pass the request log a sidecar wrote"
        ) from None


def _span(since: datetime, until: datetime) -> str:
    return f"{since:%Y-%m-%d %H:%M} to {until:%Y-%m-%d %H:%M} UTC"


@click.command("report", context_settings={"help_option_names": ["-h", "--help"]})
@click.option("--since", type=WHEN, default="7d", show_default=True, help=f"Window start: {WHEN_HELP}.")
@click.option("--until", type=WHEN, default=None, help="Window end (exclusive), as --since [default: now].")
@click.option(
    "--format",
    "fmt",
    type=click.Choice(TEXT_FORMATS),
    default="md",
    show_default=True,
    help="The review for people: Markdown or a self-contained HTML page.",
)
@click.option(
    "--db",
    type=click.Path(dir_okay=False),
    default=None,
    help="Read this DuckDB file (while a sidecar serves it, through the sidecar).",
)
@reader_options
@click.option("--slo-ttft-p95", type=float, default=None, help="p95 TTFT SLO in seconds to judge against.")
@click.option(
    "--out",
    type=click.Path(dir_okay=False),
    default=None,
    help="Write the --format text to this file instead of stdout.",
)
@click.option("--json", "json_path", default=None, metavar="PATH", help=JSON_HELP)
def report(
    since: datetime,
    until: datetime | None,
    fmt: str,
    db: str | None,
    slo_ttft_p95: float | None,
    out: str | None,
    json_path: str | None,
    lake_uri: str | None = None,
    catalog_uri: str | None = None,
    lake_table: str = "headroom.requests",
) -> None:
    """The weekly capacity review: per model, traffic, latency vs SLO and vs the previous period,
    peak concurrency vs the knee in both calibers, failures, top tenants, the passive capacity
    curve, Little's law, and recommended actions with their reasons.

    \b
    Examples:
      headroom report --db headroom.duckdb --since 7d --format md
      headroom report --db headroom.duckdb --format html --out review.html
      headroom report --db headroom.duckdb --since 2026-11-23 --until 2026-11-30 --json review.json
      headroom report --db headroom.duckdb --json - | jq '.models[].plan'
      headroom report --catalog sqlite:///lake/catalog.db --lake /data/lake --since 7d   # the fleet's table
    """
    until = reader_window(db, lake_uri, since, until)
    data = _from_db(db, (since, until), slo_ttft_p95, (catalog_uri, lake_uri, lake_table))
    if json_path:
        write_json(json_path, data)
        if json_path == "-":
            return
    text = render_report(data, fmt)
    if out:
        try:
            Path(out).write_text(text)
        except OSError as exc:
            raise click.ClickException(
                f"cannot write --out {out} ({exc.strerror}); pass a path in an existing, writable directory"
            ) from None
        click.echo(f"wrote {out}", err=True)
    else:
        sys.stdout.write(text)
