"""`headroom report`, and the two entry points the store uses: on-demand and weekly reports."""

from __future__ import annotations

import os
import sys
from datetime import datetime
from pathlib import Path

import click

__all__ = ["report", "render_report", "render_report_from_store", "write_report_files", "FORMATS"]

FORMATS = ("md", "html", "json")


def render_report(report: dict, fmt: str) -> str:
    """One of md | html | json from a build_report dict."""
    if fmt == "md":
        from collector.report.render_md import render_md
        return render_md(report)
    if fmt == "html":
        from collector.report.render_html import render_html
        return render_html(report)
    if fmt == "json":
        from collector.report.render_json import render_json
        return render_json(report)
    raise ValueError(f"format {fmt!r} is not one of {FORMATS}")


def build_from_store(store, since: str, now: datetime | None = None, slo_ttft_p95_s: float | None = None) -> dict:
    """The report dict for the window `since` (e.g. '7d') back from `now`."""
    from collector.report.build import build_report
    from collector.report.collect import collect_inputs
    from collector.service.timewin import parse_duration, utc_now

    now = now or utc_now()
    return build_report(collect_inputs(store, now - parse_duration(since), now, slo_ttft_p95_s=slo_ttft_p95_s))


def render_report_from_store(store, since: str, fmt: str, now: datetime | None = None,
                             slo_ttft_p95_s: float | None = None) -> str:
    """Build and render in one call (the store's /v1/report)."""
    return render_report(build_from_store(store, since, now, slo_ttft_p95_s), fmt)


def write_report_files(store, report_dir: Path, since: str, now: datetime,
                       slo_ttft_p95_s: float | None = None) -> list[Path]:
    """The weekly job: capacity-review-<date>.{md,html,json} plus latest.html, written atomically."""
    report = build_from_store(store, since, now, slo_ttft_p95_s)
    report_dir.mkdir(parents=True, exist_ok=True)
    written = []
    for fmt in FORMATS:
        path = report_dir / f"capacity-review-{now:%Y-%m-%d}.{fmt}"
        _write_atomic(path, render_report(report, fmt))
        written.append(path)
    latest = report_dir / "latest.html"
    _write_atomic(latest, written[1].read_text())
    return written + [latest]


def _write_atomic(path: Path, text: str) -> None:
    temporary = path.with_name(path.name + ".tmp")
    temporary.write_text(text)
    os.replace(temporary, path)


def _from_store_url(url: str, token: str | None, since: str, fmt: str, slo: float | None) -> str:
    import httpx

    params = {"since": since, "format": fmt} | ({"slo_ttft_p95_s": slo} if slo is not None else {})
    try:
        response = httpx.get(url.rstrip("/") + "/v1/report", params=params, timeout=300,
                             headers={"Authorization": f"Bearer {token or ''}"})
    except httpx.HTTPError as exc:
        raise click.ClickException(f"cannot reach the store at {url} ({exc}); check --store-url (e.g. "
                                   "http://127.0.0.1:9200) and that `headroom store` is running") from None
    if response.status_code == 401:
        raise click.ClickException("the store refused the token: pass --token or set HEADROOM_TOKEN")
    if response.status_code != 200:
        raise click.ClickException(f"store answered HTTP {response.status_code}: {response.text[:300]}")
    return response.text


def _from_db(db: str, since: str, fmt: str, slo: float | None) -> str:
    from rich.console import Console

    from collector.store.db import RequestStore

    if not Path(db).exists():
        raise click.ClickException(f"database {db} does not exist; pass the sidecar's or store's --db file")
    try:
        store = RequestStore(db, read_only=True)
    except Exception as exc:
        first = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
        hint = ("while a store or sidecar owns it, use --store-url instead" if "lock" in first.lower()
                else "pass the request log a sidecar or store wrote")
        raise click.ClickException(f"cannot open {db} ({first}); {hint}") from None
    try:
        with Console(stderr=True).status(f"building the {since} review from {db}"):
            return render_report_from_store(store, since, fmt, slo_ttft_p95_s=slo)
    finally:
        store.close()


@click.command("report", context_settings={"help_option_names": ["-h", "--help"]})
@click.option("--since", default="7d", show_default=True, help="Window back from now: 7d, 24h, 2w.")
@click.option("--format", "fmt", type=click.Choice(FORMATS), default="md", show_default=True)
@click.option("--db", type=click.Path(dir_okay=False), default=None,
              help="Read this DuckDB file (not while it is served).")
@click.option("--store-url", default=None, help="Ask a running `headroom store` for the report.")
@click.option("--token", envvar="HEADROOM_TOKEN", default=None, help="Store token (default: $HEADROOM_TOKEN).")
@click.option("--slo-ttft-p95", type=float, default=None, help="p95 TTFT SLO in seconds to judge against.")
@click.option("--out", type=click.Path(dir_okay=False), default=None, help="Write here instead of stdout.")
def report(since: str, fmt: str, db: str | None, store_url: str | None, token: str | None,
           slo_ttft_p95: float | None, out: str | None) -> None:
    """The weekly capacity review: per model, traffic, latency vs SLO and vs the previous period,
    peak concurrency vs the knee in both calibers, failures, top tenants, the passive capacity
    curve, Little's law, and recommended actions with their reasons.

    \b
    Examples:
      headroom report --db headroom.duckdb --since 7d --format md
      headroom report --store-url http://127.0.0.1:9200 --token "$(cat fleet.duckdb.token)" \\
                      --format html --out review.html
    """
    from collector.service.timewin import parse_duration

    try:
        parse_duration(since)
    except ValueError as exc:
        raise click.BadParameter(str(exc), param_hint="--since") from None
    if (db is None) == (store_url is None):
        raise click.UsageError("give exactly one of --db PATH or --store-url URL")
    text = (_from_store_url(store_url, token, since, fmt, slo_ttft_p95) if store_url
            else _from_db(db, since, fmt, slo_ttft_p95))
    if out:
        try:
            Path(out).write_text(text)
        except OSError as exc:
            raise click.ClickException(f"cannot write --out {out} ({exc.strerror}); pass a path in an existing, "
                                       "writable directory") from None
        click.echo(f"wrote {out}", err=True)
    else:
        sys.stdout.write(text)
