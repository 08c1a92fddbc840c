"""The review as one self-contained HTML page: inline CSS, plots embedded as base64 PNG, no links out."""

from __future__ import annotations

import base64
from html import escape
from typing import Any

from collector.report.plots import curve_png, throughput_png, week_png
from collector.report.render_md import LATENCY_NAMES, binding_line, fmt, pct, versus_knee, when

__all__ = ["render_html", "curve_png"]

_CSS = (
    "body{font-family:system-ui,sans-serif;margin:2em;max-width:80em}table{border-collapse:collapse;"
    "margin:.5em 0 1em}td,th{border:1px solid #ccc;padding:.25em .6em;text-align:right}"
    "th{background:#f3f3f3}td:first-child,th:first-child{text-align:left}li{margin:.3em 0}"
    "img{width:100%;max-width:1200px;height:auto;display:block;margin:.5em 0 1.5em}"
)


def _image(png: bytes, alt: str) -> str:
    return f'<img alt="{escape(alt)}" src="data:image/png;base64,{base64.b64encode(png).decode()}">'


def _table(header: list[str], rows: list[list[str]]) -> str:
    head = "".join(f"<th>{escape(h)}</th>" for h in header)
    body = "".join("<tr>" + "".join(f"<td>{escape(c)}</td>" for c in row) + "</tr>" for row in rows)
    return f"<table><tr>{head}</tr>{body}</table>"


def _model(m: dict[str, Any]) -> str:
    t, c, o, law = m["traffic"], m["concurrency"], m["outcomes"], m["littles_law"]
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
    return "".join(
        [
            f"<h2>{escape(m['model'])}</h2><h3>Recommended actions</h3><ul>{actions}</ul>",
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
            _table(
                ["caliber", "peak", "knee", "peak vs knee"],
                [
                    [
                        cal,
                        fmt(c[f"peak_{cal}"]),
                        fmt(c[f"knee_{cal}"]),
                        versus_knee(c[f"peak_over_knee_{cal}"]),
                    ]
                    for cal in ("requests", "tokens")
                ],
            ),
            f"<p>{escape(binding_line(c))}</p>",
            "<h3>Peak concurrency over the window, against the knee</h3>",
            _image(
                week_png(m),
                f"hourly peak in-flight requests and active tokens against the knee for {m['model']}",
            ),
            f"<p>Little's law: measured in-flight {fmt(law['measured_inflight'])}, rate × e2e "
            f"{fmt(law['predicted_inflight'])}, consistent: {fmt(law['consistent'])}</p>",
            _table(
                ["top tenant", "tokens", "requests", "share"],
                [
                    [x["tenant"], fmt(x["tokens"]), fmt(x["requests"]), fmt(x["share"])]
                    for x in m["top_tenants"]
                ],
            ),
            "<h3>Passive capacity curve</h3>",
            _image(curve_png(m), f"p95 TTFT by concurrency bucket for {m['model']}"),
            "<h3>Throughput against concurrency</h3>",
            _image(throughput_png(m), f"tokens per second against mean in-flight requests for {m['model']}"),
        ]
    )


def render_html(report: dict[str, Any]) -> str:
    """The whole review as a standalone HTML document."""
    w = report["window"]
    models = "".join(_model(m) for m in report["models"]) or "<p>No traffic in either window.</p>"
    return (
        f"<!doctype html><html><head><meta charset='utf-8'><title>Capacity review</title>"
        f"<style>{_CSS}</style></head><body><h1>Capacity review</h1>"
        f"<p>Window {escape(when(w['since']))} → {escape(when(w['until']))}, compared with "
        f"{escape(when(w['previous_since']))} → {escape(when(w['since']))}.</p>{models}</body></html>\n"
    )
