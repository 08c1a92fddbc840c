"""The review as one self-contained HTML page: inline CSS, plots embedded as base64 PNG, no links out."""

from __future__ import annotations

import base64
import io
from html import escape
from typing import Any

from collector.report.render_md import LATENCY_NAMES, fmt, pct

__all__ = ["render_html", "curve_png"]

_CSS = (
    "body{font-family:system-ui,sans-serif;margin:2em;max-width:70em}table{border-collapse:collapse;"
    "margin:.5em 0 1em}td,th{border:1px solid #ccc;padding:.25em .6em;text-align:right}"
    "th{background:#f3f3f3}td:first-child,th:first-child{text-align:left}li{margin:.3em 0}"
)


def curve_png(model: dict[str, Any]) -> bytes:
    """PNG of the passive capacity curve (p95 TTFT by concurrency bucket), both calibers side by side."""
    # lazy: matplotlib loads only when an HTML review is drawn
    import matplotlib

    matplotlib.use("Agg")
    from matplotlib.figure import Figure  # no pyplot: no global state, safe in threads

    figure = Figure(figsize=(9, 3.2), dpi=90)
    slo = model["slo"]["ttft_p95_s"]
    for axis, (key, caliber, label) in zip(
        figure.subplots(1, 2),
        (("curve", "requests", "in-flight requests"), ("curve_tokens", "tokens", "active tokens")),
    ):
        points = [(b["bucket"], b["ttft_p95_s"]) for b in model[key] if b["ttft_p95_s"] is not None]
        if points:
            axis.plot(*zip(*points), marker="o")
            axis.set_xscale("log", base=2)
        knee = model["concurrency"][f"knee_{caliber}"]
        if knee:
            axis.axvline(knee, color="tab:red", linestyle="--", label=f"knee {knee:g}")
        if slo:
            axis.axhline(slo, color="tab:orange", linestyle=":", label=f"SLO {slo:g} s")
        axis.set_xlabel(f"{label} at admission (bucket)")
        axis.set_ylabel("p95 TTFT (s)")
        if knee or slo:
            axis.legend(fontsize="small")
    figure.tight_layout()
    buffer = io.BytesIO()
    figure.savefig(buffer, format="png")
    return buffer.getvalue()


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
    image = base64.b64encode(curve_png(m)).decode()
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
                ["caliber", "peak", "knee", "headroom"],
                [
                    [cal, fmt(c[f"peak_{cal}"]), fmt(c[f"knee_{cal}"]), pct(c[f"headroom_{cal}"])]
                    for cal in ("requests", "tokens")
                ],
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
            f'<h3>Passive capacity curve</h3><img alt="p95 TTFT by concurrency bucket for {escape(m["model"])}" '
            f'src="data:image/png;base64,{image}">',
        ]
    )


def render_html(report: dict[str, Any]) -> str:
    """The whole review as a standalone HTML document."""
    w = report["window"]
    models = "".join(_model(m) for m in report["models"]) or "<p>No traffic in either window.</p>"
    return (
        f"<!doctype html><html><head><meta charset='utf-8'><title>Capacity review</title>"
        f"<style>{_CSS}</style></head><body><h1>Capacity review</h1>"
        f"<p>Window {escape(w['since'])} → {escape(w['until'])}, compared with "
        f"{escape(w['previous_since'])} → {escape(w['since'])}.</p>{models}</body></html>\n"
    )
