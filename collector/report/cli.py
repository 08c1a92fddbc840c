"""`headroom report`: the weekly capacity review on the command line, from a DuckDB file or the
fleet's table.

The review itself is collector.report.review; this module only reads the options, opens the
database (through its owner while a sidecar serves it: collector.store.owner) or the Iceberg
table (collector.lake.source), and writes the text.
"""

from __future__ import annotations

import sys
from datetime import timedelta
from pathlib import Path

import click
import duckdb
from rich.console import Console

from collector.lake.source import open_log, reader_options
from collector.report.review import FORMATS, render_report_from_store
from collector.store.owner import OwnerError
from collector.timewin import parse_duration, utc_now

__all__ = ["report"]


def _from_db(
    db: str | None,
    since: str,
    fmt: str,
    slo: float | None,
    lake: tuple[str | None, str | None, str] = (None, None, ""),
) -> str:
    catalog_uri, lake_uri, table = lake
    # the review compares the window with the one before it: read both (the table is pruned by day)
    first = utc_now() - 2 * parse_duration(since) - timedelta(days=1)
    where = f"{table} in {lake_uri}" if lake_uri else db
    try:
        with (
            open_log(db, catalog_uri, lake_uri, table=table, since=first) as store,
            Console(stderr=True).status(f"building the {since} review from {where}"),
        ):
            return render_report_from_store(store, since, fmt, slo_ttft_p95_s=slo)
    except ValueError as exc:
        raise click.UsageError(str(exc)) from None
    except (FileNotFoundError, OwnerError) as exc:
        raise click.ClickException(f"{'--lake' if lake_uri else '--db'} {lake_uri or db}: {exc}") from None
    except duckdb.Error as exc:
        first = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
        raise click.ClickException(
            f"cannot open {db} ({first}); pass the request log a sidecar wrote"
        ) from None


@click.command("report", context_settings={"help_option_names": ["-h", "--help"]})
@click.option("--since", default="7d", show_default=True, help="Window back from now: 7d, 24h, 2w.")
@click.option("--format", "fmt", type=click.Choice(FORMATS), default="md", show_default=True)
@click.option(
    "--db",
    type=click.Path(dir_okay=False),
    default=None,
    help="Read this DuckDB file (while a sidecar serves it, through the sidecar).",
)
@reader_options
@click.option("--slo-ttft-p95", type=float, default=None, help="p95 TTFT SLO in seconds to judge against.")
@click.option("--out", type=click.Path(dir_okay=False), default=None, help="Write here instead of stdout.")
def report(
    since: str,
    fmt: str,
    db: str | None,
    slo_ttft_p95: float | None,
    out: str | None,
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
      headroom report --catalog sqlite:///lake/catalog.db --lake /data/lake --since 7d   # the fleet's table
    """
    try:
        parse_duration(since)
    except ValueError as exc:
        raise click.BadParameter(str(exc), param_hint="--since") from None
    if (db is None) == (lake_uri is None):
        raise click.UsageError("give --db PATH or --lake URI (with --catalog), one of them")
    text = _from_db(db, since, fmt, slo_ttft_p95, (catalog_uri, lake_uri, lake_table))
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
