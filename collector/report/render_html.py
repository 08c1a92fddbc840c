"""The review as one self-contained HTML page: inline CSS, plots embedded as base64 PNG, no links out."""

from __future__ import annotations

import base64
from html import escape
from typing import Any

from collector.report.adapters import adapter_table
from collector.report.plots import curve_png, littles_png, load_png, throughput_png
from collector.report.render_md import (
    LATENCY_NAMES,
    binding_line,
    capacity_line,
    class_table,
    fmt,
    littles_line,
    pct,
    period,
    plan_line,
    provenance_line,
    when,
)
from collector.report.ttft_split import goodput_table, prefill_lines, split_table

__all__ = ["render_html"]

_CSS = (
    "body{font-family:system-ui,sans-serif;margin:2em;max-width:80em}table{border-collapse:collapse;"
    "margin:.5em 0 1em}td,th{border:1px solid #ccc;padding:.25em .6em;text-align:right}"
    "th{background:#f3f3f3}td:first-child,th:first-child{text-align:left}li{margin:.3em 0}"
    "img{width:100%;max-width:1200px;height:auto;display:block;margin:.5em 0 1.5em}"
    ".plan{font-size:1.15em;background:#eef5ff;border-left:4px solid #2a6fd6;padding:.5em .8em;margin:.5em 0}"
    ".provenance{color:#333;margin:.3em 0 .8em}.served{color:#666;margin-top:-.5em}"
)


def _image(png: bytes, alt: str) -> str:
    return f'<img alt="{escape(alt)}" src="data:image/png;base64,{base64.b64encode(png).decode()}">'


def _table(header: list[str], rows: list[list[str]]) -> str:
    head = "".join(f"<th>{escape(h)}</th>" for h in header)
    body = "".join("<tr>" + "".join(f"<td>{escape(c)}</td>" for c in row) + "</tr>" for row in rows)
    return f"<table><tr>{head}</tr>{body}</table>"


def _class(entry: dict[str, Any], word: str) -> str:
    instances = ", ".join(entry["instances"][:10]) + (" …" if len(entry["instances"]) > 10 else "")
    header, rows = class_table(entry)
    return "".join(
        [
            f"<h3>Replica class {escape(entry['replica_class'])}: {entry['replicas_run']} run "
            f"({escape(instances)})</h3>",
            f"<p class='plan'><b>{escape(plan_line(entry, word))}</b></p>",
            f"<p class='provenance'>{escape(provenance_line(entry))}</p>",
            _table(header, rows),
            f"<p>{escape(binding_line(entry['concurrency']))}</p>",
        ]
    )


def _engine(entries: list[dict[str, Any]]) -> str:
    """The sections "Where TTFT went" and "Goodput" (collector.report.ttft_split); none without traffic."""
    if not entries:
        return ""
    header, rows = split_table(entries)
    return "".join(
        [
            "<h3>Where TTFT went</h3>",
            _table(header, rows) if rows else "",
            "".join(f"<p>{escape(line)}</p>" for line in prefill_lines(entries)),
            "<h3>Goodput</h3>",
            _table(*goodput_table(entries)),
        ]
    )


def _model(m: dict[str, Any], word: str) -> str:
    t, o = m["traffic"], m["outcomes"]
    actions = "".join(f"<li><b>{escape(a['action'])}</b> — {escape(a['reason'])}</li>" for a in m["actions"])
    latency = [
        [
            name,
            fmt(m["latency"][k]["p50"]),
            fmt(m["latency"][k]["p95"]),
            fmt(m["latency"][k]["p99"]),
            fmt(m["latency"][k]["previous"]["p95"]),
            pct(m["latency"][k]["change_p95"]),
        ]
        for k, name in LATENCY_NAMES.items()
    ]
    served = (
        f"<p class='served'>served as <code>{escape(m['model'])}</code></p>"
        if m["heading"] != m["model"]
        else ""
    )
    published = (
        _table(
            ["published per task class", "replica class", "capacity"],
            [
                [item["task_class"], item.get("replica_class") or "default", capacity_line(item)]
                for item in m["capacity_by_class"]
            ],
        )
        if m.get("capacity_by_class")
        else ""
    )
    return "".join(
        [
            f"<h2>{escape(m['heading'])}</h2>{served}",
            "".join(_class(entry, word) for entry in m["classes"]),
            "<h3>Load per replica over the window, against the knee and the pool</h3>",
            _image(load_png(m), f"load per replica over time against the knee for {m['heading']}"),
            f"<h3>Recommended actions</h3><ul>{actions}</ul>",
            _table(
                ["traffic", "value"],
                [
                    ["requests (vs previous)", f"{fmt(t['requests'])} ({pct(t['requests_change'])})"],
                    [
                        "prompt / completion tokens",
                        f"{fmt(t['prompt_tokens'])} / {fmt(t['completion_tokens'])}",
                    ],
                    ["prompt share of tokens", fmt(t["prompt_share"])],
                    [
                        "429 ratio / error ratio",
                        f"{fmt(o['rate_limited_ratio'], 4)} / {fmt(o['error_ratio'], 4)}",
                    ],
                ],
            ),
            _table(["latency (s)", "p50", "p95", "p99", "previous p95", "p95 change"], latency),
            f"<p>SLO p95 TTFT: {escape(fmt(m['slo']['ttft_p95_s']))} s — met: {escape(fmt(m['slo']['met']))}</p>",
            published,
            _engine(m.get("engine_split") or []),
            "<h3>Throughput against concurrency, per replica</h3>",
            _image(
                throughput_png(m),
                f"tokens per second per replica against requests in flight for {m['heading']}",
            ),
            "<h3>Passive capacity curve</h3>",
            _image(curve_png(m), f"p95 TTFT by concurrency bucket for {m['heading']}"),
            f"<h3>Little's law per window</h3><p>{escape(littles_line(m['littles_law']))}</p>",
            _image(littles_png(m), f"Little's law per window for {m['heading']}"),
            _table(*adapter_table(m["adapters"])) if m.get("adapters") else "",
            _table(
                ["top tenant", "tokens", "requests", "share"],
                [
                    [x["tenant"], fmt(x["tokens"]), fmt(x["requests"]), fmt(x["share"])]
                    for x in m["top_tenants"]
                ],
            ),
        ]
    )


def render_html(report: dict[str, Any]) -> str:
    """The whole review as a standalone HTML document."""
    w = report["window"]
    models = "".join(_model(m, period(w)) for m in report["models"]) or "<p>No traffic in either window.</p>"
    return (
        f"<!doctype html><html><head><meta charset='utf-8'><title>Capacity review</title>"
        f"<style>{_CSS}</style></head><body><h1>Capacity review</h1>"
        f"<p>Window {escape(when(w['since']))} → {escape(when(w['until']))}, compared with "
        f"{escape(when(w['previous_since']))} → {escape(when(w['since']))}.</p>{models}</body></html>\n"
    )
