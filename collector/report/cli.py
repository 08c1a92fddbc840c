"""`headroom report`: the weekly capacity review on the command line, from a DuckDB file or a store.

The review itself is collector.report.review; this module only reads the options, opens the
database (or asks a running `headroom store`) and writes the text.
"""

from __future__ import annotations

import sys
from pathlib import Path

import click
import httpx
from rich.console import Console

from collector.report.review import FORMATS, render_report_from_store
from collector.store.db import RequestStore
from collector.timewin import parse_duration

__all__ = ["report"]


def _from_store_url(url: str, token: str | None, since: str, fmt: str, slo: float | None) -> str:
    params = {"since": since, "format": fmt} | ({"slo_ttft_p95_s": slo} if slo is not None else {})
    try:
        response = httpx.get(
            url.rstrip("/") + "/v1/report",
            params=params,
            timeout=300,
            headers={"Authorization": f"Bearer {token or ''}"},
        )
    except httpx.HTTPError as exc:
        raise click.ClickException(
            f"cannot reach the store at {url} ({exc}); check --store-url (e.g. "
            "http://127.0.0.1:9200) and that `headroom store` is running"
        ) from None
    if response.status_code == 401:
        raise click.ClickException("the store refused the token: pass --token or set HEADROOM_TOKEN")
    if response.status_code != 200:
        raise click.ClickException(f"store answered HTTP {response.status_code}: {response.text[:300]}")
    return response.text


def _from_db(db: str, since: str, fmt: str, slo: float | None) -> str:
    if not Path(db).exists():
        raise click.ClickException(f"database {db} does not exist; pass the sidecar's or store's --db file")
    try:
        store = RequestStore(db, read_only=True)
    except Exception as exc:
        first = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
        hint = (
            "while a store or sidecar owns it, use --store-url instead"
            if "lock" in first.lower()
            else "pass the request log a sidecar or store wrote"
        )
        raise click.ClickException(f"cannot open {db} ({first}); {hint}") from None
    try:
        with Console(stderr=True).status(f"building the {since} review from {db}"):
            return render_report_from_store(store, since, fmt, slo_ttft_p95_s=slo)
    finally:
        store.close()


@click.command("report", context_settings={"help_option_names": ["-h", "--help"]})
@click.option("--since", default="7d", show_default=True, help="Window back from now: 7d, 24h, 2w.")
@click.option("--format", "fmt", type=click.Choice(FORMATS), default="md", show_default=True)
@click.option(
    "--db",
    type=click.Path(dir_okay=False),
    default=None,
    help="Read this DuckDB file (not while it is served).",
)
@click.option("--store-url", default=None, help="Ask a running `headroom store` for the report.")
@click.option(
    "--token", envvar="HEADROOM_TOKEN", default=None, help="Store token (default: $HEADROOM_TOKEN)."
)
@click.option("--slo-ttft-p95", type=float, default=None, help="p95 TTFT SLO in seconds to judge against.")
@click.option("--out", type=click.Path(dir_okay=False), default=None, help="Write here instead of stdout.")
def report(
    since: str,
    fmt: str,
    db: str | None,
    store_url: str | None,
    token: str | None,
    slo_ttft_p95: float | None,
    out: str | None,
) -> None:
    """The weekly capacity review: per model, traffic, latency vs SLO and vs the previous period,
    peak concurrency vs the knee in both calibers, failures, top tenants, the passive capacity
    curve, Little's law, and recommended actions with their reasons.

    \b
    Examples:
      headroom report --db headroom.duckdb --since 7d --format md
      headroom report --store-url http://127.0.0.1:9200 --token "$(cat fleet.duckdb.token)" \\
                      --format html --out review.html
    """
    try:
        parse_duration(since)
    except ValueError as exc:
        raise click.BadParameter(str(exc), param_hint="--since") from None
    if (db is None) == (store_url is None):
        raise click.UsageError("give exactly one of --db PATH or --store-url URL")
    text = (
        _from_store_url(store_url, token, since, fmt, slo_ttft_p95)
        if store_url
        else _from_db(db, since, fmt, slo_ttft_p95)
    )
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
