"""The weekly capacity review as a library: build it from a store, render it, write the week's files.

    build_from_store(store, "7d")                 -> the build_report dict for the last 7 days
    render_report_from_store(store, "7d", "md")   -> Markdown text (the store's GET /v1/report)
    write_report_files(store, Path("reports"), "7d", now)
        -> reports/capacity-review-<date>.{md,html,json} and reports/latest.html (the weekly job)

`headroom report` (cli.py) is the command-line shell over the same functions.
"""

from __future__ import annotations

import os
from datetime import datetime
from pathlib import Path
from typing import Any

from collector.report.build import build_report
from collector.report.collect import collect_inputs
from collector.report.render_html import render_html
from collector.report.render_json import render_json
from collector.report.render_md import render_md
from collector.store.db import RequestStore
from collector.timewin import parse_duration, utc_now

__all__ = [
    "FORMATS",
    "render_report",
    "build_from_store",
    "render_report_from_store",
    "write_report_files",
    "LATEST_REPORT_NAME",
]

LATEST_REPORT_NAME = "latest.html"
FORMATS = ("md", "html", "json")


def render_report(report: dict[str, Any], fmt: str) -> str:
    """One of md | html | json from a build_report dict."""
    if fmt == "md":
        return render_md(report)
    if fmt == "html":
        return render_html(report)
    if fmt == "json":
        return render_json(report)
    raise ValueError(f"format {fmt!r} is not one of {FORMATS}")


def build_from_store(
    store: RequestStore, since: str, now: datetime | None = None, slo_ttft_p95_s: float | None = None
) -> dict[str, Any]:
    """The report dict for the window `since` (e.g. '7d') back from `now`."""
    now = now or utc_now()
    return build_report(
        collect_inputs(store, now - parse_duration(since), now, slo_ttft_p95_s=slo_ttft_p95_s)
    )


def render_report_from_store(
    store: RequestStore,
    since: str,
    fmt: str,
    now: datetime | None = None,
    slo_ttft_p95_s: float | None = None,
) -> str:
    """Build and render in one call (the store's /v1/report)."""
    return render_report(build_from_store(store, since, now, slo_ttft_p95_s), fmt)


def write_report_files(
    store: RequestStore, report_dir: Path, since: str, now: datetime, *, slo_ttft_p95_s: float | None = None
) -> list[Path]:
    """The weekly job: capacity-review-<date>.{md,html,json} plus latest.html, written atomically."""
    report = build_from_store(store, since, now, slo_ttft_p95_s)
    report_dir.mkdir(parents=True, exist_ok=True)
    written = []
    for fmt in FORMATS:
        path = report_dir / f"capacity-review-{now:%Y-%m-%d}.{fmt}"
        _write_atomic(path, render_report(report, fmt))
        written.append(path)
    latest = report_dir / LATEST_REPORT_NAME
    _write_atomic(latest, written[1].read_text())
    return written + [latest]


def _write_atomic(path: Path, text: str) -> None:
    temporary = path.with_name(path.name + ".tmp")
    temporary.write_text(text)
    os.replace(temporary, path)
