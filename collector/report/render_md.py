"""The review as Markdown: one section per model, tables a reviewer can paste into a doc."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

from collector.report.adapters import adapter_table
from collector.report.longest import longest_table
from collector.report.ttft_split import goodput_table, prefill_lines, split_table

__all__ = [
    "render_md",
    "fmt",
    "pct",
    "capacity_line",
    "binding_line",
    "plan_line",
    "provenance_line",
    "littles_line",
    "class_table",
    "period",
    "LATENCY_NAMES",
    "versus_knee",
    "when",
]

LATENCY_NAMES = {"ttft_s": "TTFT", "tpot_s": "TPOT", "e2e_s": "e2e"}


def fmt(value: Any, digits: int = 3) -> str:
    """Numbers for tables: None -> '–', floats rounded, ints with thousands separators."""
    if value is None:
        return "–"
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, float) and not value.is_integer():
        return f"{value:,.{digits}f}"
    if isinstance(value, (int, float)):
        return f"{int(value):,}"
    return str(value)


def pct(value: float | None) -> str:
    """0.1234 -> '+12.3 %' for changes and shares; None -> '–'."""
    return "–" if value is None else f"{value * 100:+.1f} %"


def binding_line(concurrency: dict[str, Any]) -> str:
    """Which caliber binds: 'Binding caliber: requests (token capacity withheld: ...)'."""
    binding = concurrency.get("binding_caliber") or "unknown (no knee to compare with)"
    withheld = concurrency.get("token_knee_withheld")
    return f"Binding caliber: {binding}" + (f" (token capacity withheld: {withheld})" if withheld else "")


def _token_capacity(concurrency: dict[str, Any]) -> str:
    """The token capacity as every rendering shows it, both figures labelled:
    '1,710 (time-weighted mean) / p95 2,050'; '–' when withheld or not published."""
    mean, p95 = concurrency.get("knee_tokens"), concurrency.get("knee_tokens_p95")
    if mean is None and p95 is None:
        return "–"
    return f"{fmt(mean)} (time-weighted mean) / p95 {fmt(p95)}"


def period(window: dict[str, Any]) -> str:
    """'week' for a 7-day window, else 'window': the planning line speaks of the review's period."""

    days = (datetime.fromisoformat(window["until"]) - datetime.fromisoformat(window["since"])).days
    return "week" if days == 7 else "window"


def plan_line(entry: dict[str, Any], word: str = "week") -> str:
    """The planning number of one replica class, e.g. 'At this week's peak you needed 4 replicas of
    class slots8 (you ran 1); the requests caliber binds. At the trend, 5 next week.'"""
    p, name = entry["plan"], entry["replica_class"]
    needed, ran, binding = p["replicas_needed"], p["replicas_run"], p["binding_caliber"]
    if needed is None:
        why = "no pool is published for it" if entry.get("estimate") is None else "no peak to plan for"
        return f"Replicas needed for class {name}: unknown ({why}); you ran {ran}."
    pool = p["pool_per_replica"][binding]
    line = (
        f"At this {word}'s peak you needed {needed} replica{'s' if needed != 1 else ''} of class {name} "
        f"(you ran {ran}); the {binding} caliber binds (busiest minute {fmt(p['peak'][binding], 1)} "
        f"{binding} over a pool of {fmt(pool, 1)} per replica"
        + (", the p99.9 of the active tokens with the pool in flight" if binding == "tokens" else "")
        + ")."
    )
    trend = p["trend"]
    if trend.get("reason"):
        return line + f" No trend yet: {trend['reason']}."
    ahead = trend.get("replicas_needed")
    return line + f" At the trend, {fmt(ahead)} next {word}."


def provenance_line(entry: dict[str, Any]) -> str:
    """Where the class's knee came from, for the header: source, run, confidence, age, and why it
    is the published one; the open-loop probe's rates when the estimate has them."""
    e = entry.get("estimate")
    if e is None:
        return f"Knee of class {entry['replica_class']}: none published (run headroom probe)."
    knee = f"{fmt(e['knee_requests'])} requests"
    tokens = _token_capacity(entry["concurrency"])  # '–' when withheld (collector.report.build)
    knee += f", token capacity {tokens}" if tokens != "–" else " (no token capacity to judge by)"
    largest = e.get("max_request_tokens")
    parts = [
        f"source {e['source']}" + (f" run {e['run_id']}" if e.get("run_id") else ""),
        f"confidence {e['confidence']}",  # none, low, medium or high (collector.report.build)
        f"{fmt(e['age_h'], 1)} h old at the window's end",
        f"pool {fmt(e['recommended_pool'])}",
    ]
    parts += [f"largest traffic request {fmt(largest)} tokens"] if largest is not None else []
    rates = [f"μ_slo {fmt(e['mu_slo'])} requests/s"] if e.get("mu_slo") is not None else []
    rates += [f"V_P {fmt(e['v_p'])} prefill tokens/s"] if e.get("v_p") is not None else []
    return (
        f"Knee of class {entry['replica_class']}: {knee}; "
        + ", ".join(parts + rates)
        + f"; published because: {e.get('published_because') or '–'}."
    )


def class_table(entry: dict[str, Any]) -> tuple[list[str], list[list[str]]]:
    """Per caliber: the fleet's busiest minute, the pool per replica, replicas needed, and one
    replica's peak against the knee; in tokens the knee is the token capacity, its time-weighted
    mean and its p95, and the peak is judged against the p95 (an instant against an instant)."""
    p, c = entry["plan"], entry["concurrency"]
    header = [
        "caliber",
        "busiest minute (class total)",
        "pool per replica",
        "replicas needed",
        "peak on one replica",
        "knee",
        "peak vs knee",
    ]
    rows = [
        [
            cal,
            fmt((p["peak"] or {}).get(cal), 1),
            fmt(p["pool_per_replica"][cal], 1),
            fmt(p["needed"][cal]),
            fmt(c[f"peak_{cal}"]),
            fmt(c["knee_requests"]) if cal == "requests" else _token_capacity(c),
            versus_knee(c[f"peak_over_knee_{cal}"])
            if cal == "requests"
            else versus_knee(c["peak_over_knee_tokens"]).replace("the knee", "the p95"),
        ]
        for cal in ("requests", "tokens")
    ]
    return header, rows


def littles_line(law: dict[str, Any]) -> str:
    """Little's law per window: 'checked in 40 windows of 60 s: 0 off by more than 15 %; busiest ...'."""
    if not law["checked"]:
        return "Little's law: no window with completed requests to check."
    worst = law["worst"]
    return (
        f"Little's law, per {law['window_s']} s window with traffic: {law['checked']} checked, "
        f"{law['inconsistent']} off by more than 15 %; the furthest: measured in-flight "
        f"{fmt(worst['measured_inflight'])} vs rate × e2e {fmt(worst['predicted_inflight'])} "
        f"(window from {when_s(worst['t'])})."
    )


def when_s(seconds: float) -> str:
    """POSIX seconds -> '2026-11-30 09:00:15 UTC'."""

    return datetime.fromtimestamp(seconds, UTC).strftime("%Y-%m-%d %H:%M:%S UTC")


def versus_knee(ratio: float | None) -> str:
    """Peak against the knee for people: 4.0 -> 'peak is 4.0 × the knee', 0.62 -> 'peak is 62 % of the knee'."""
    if ratio is None:
        return "–"
    return (
        f"peak is {ratio:.1f} × the knee"
        if ratio >= 1
        else f"peak is {ratio:.0%} of the knee".replace("%", " %")
    )


def when(iso: str) -> str:
    """'2026-11-30T09:00:00+00:00' -> '2026-11-30 09:00 UTC'."""
    return iso[:16].replace("T", " ") + " UTC"


def _table(header: list[str], rows: list[list[str]]) -> list[str]:
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    return lines + ["| " + " | ".join(row) + " |" for row in rows]


def _class(entry: dict[str, Any], word: str) -> list[str]:
    instances = ", ".join(entry["instances"][:10]) + (" …" if len(entry["instances"]) > 10 else "")
    lines = [f"### Replica class {entry['replica_class']}: {entry['replicas_run']} run ({instances})", ""]
    lines += [f"**{plan_line(entry, word)}**", "", provenance_line(entry), ""]
    header, rows = class_table(entry)
    lines += _table(header, rows)
    return lines + ["", binding_line(entry["concurrency"]), ""]


def _model(m: dict[str, Any], word: str) -> list[str]:
    t, o, slo = m["traffic"], m["outcomes"], m["slo"]
    lines = [f"## {m['heading']}", ""]
    if m["heading"] != m["model"]:
        lines += [f"Served as `{m['model']}`.", ""]
    for entry in m["classes"]:
        lines += _class(entry, word)
    lines += ["**Recommended actions**", ""]
    lines += [f"- **{a['action']}** — {a['reason']}" for a in m["actions"]] + [""]
    lines += _table(
        ["traffic", "value"],
        [
            ["requests (vs previous)", f"{fmt(t['requests'])} ({pct(t['requests_change'])})"],
            ["prompt / completion tokens", f"{fmt(t['prompt_tokens'])} / {fmt(t['completion_tokens'])}"],
            ["prompt share of tokens", fmt(t["prompt_share"])],
            ["cached prompt tokens", fmt(t["cached_prompt_tokens"])],
            ["429 ratio / error ratio", f"{fmt(o['rate_limited_ratio'], 4)} / {fmt(o['error_ratio'], 4)}"],
        ],
    ) + [""]
    rows = []
    for key, name in LATENCY_NAMES.items():
        lat = m["latency"][key]
        rows.append(
            [
                name,
                fmt(lat["p50"]),
                fmt(lat["p95"]),
                fmt(lat["p99"]),
                fmt(lat["previous"]["p95"]),
                pct(lat["change_p95"]),
            ]
        )
    lines += _table(["latency (s)", "p50", "p95", "p99", "previous p95", "p95 change"], rows)
    lines += ["", f"SLO p95 TTFT: {fmt(slo['ttft_p95_s'])} s — met: {fmt(slo['met'])}", ""]
    lines += _engine(m.get("engine_split") or [])
    if m.get("capacity_by_class"):
        lines += _table(
            ["published per task class", "replica class", "capacity"],
            [
                [item["task_class"], item.get("replica_class") or "default", capacity_line(item)]
                for item in m["capacity_by_class"]
            ],
        ) + [""]
    lines += [littles_line(m["littles_law"]), ""]
    lines += _table(
        ["top tenant", "tokens", "requests", "share"],
        [[x["tenant"], fmt(x["tokens"]), fmt(x["requests"]), fmt(x["share"])] for x in m["top_tenants"]],
    ) + [""]
    if m.get("adapters"):
        lines += _table(*adapter_table(m["adapters"])) + [""]
    if m.get("longest_running"):
        lines += _table(*longest_table(m["longest_running"])) + [""]
    lines += _table(
        ["in-flight bucket (one replica)", "n", "p95 TTFT (s)", "p95 TPOT (s)", "error ratio"],
        [
            [
                fmt(b["bucket"]),
                fmt(b["n"]),
                fmt(b["ttft_p95_s"]),
                fmt(b["tpot_p95_s"]),
                fmt(b["error_ratio"], 4),
            ]
            for b in m["curve"]
        ],
    ) + [""]
    return lines


def _engine(entries: list[dict[str, Any]]) -> list[str]:
    """The sections "Where TTFT went" and "Goodput" (collector.report.ttft_split); none without traffic."""
    if not entries:
        return []
    lines = ["### Where TTFT went", ""]
    header, rows = split_table(entries)
    lines += (_table(header, rows) + [""]) if rows else []
    lines += [line for text in prefill_lines(entries) for line in (text, "")]
    return lines + ["### Goodput", "", *_table(*goodput_table(entries)), ""]


def capacity_line(item: dict[str, Any]) -> str:
    """'engine ceiling 46, measured knee 16, SLO max 12, pool 11 (probe run x, 2.0 h old)'."""
    if item.get("knee_requests") is None:
        return str(item["reason"])
    ceiling = item.get("engine_max_concurrency")
    parts = ([f"engine ceiling {fmt(ceiling)}"] if ceiling is not None else []) + [
        f"measured knee {fmt(item['knee_requests'])}",
        f"SLO max {fmt(item.get('slo_max'))}",
        f"pool {fmt(item.get('recommended_pool'))}",
    ]
    return ", ".join(parts) + f" ({item['reason']})"


def render_md(report: dict[str, Any]) -> str:
    """The whole review as Markdown text."""
    w = report["window"]
    lines = [
        "# Capacity review",
        "",
        f"Window {when(w['since'])} → {when(w['until'])}, compared with "
        f"{when(w['previous_since'])} → {when(w['since'])}.",
        "",
    ]
    if not report["models"]:
        lines += ["No traffic in either window.", ""]
    for model in report["models"]:
        lines += _model(model, period(w))
    return "\n".join(lines).rstrip() + "\n"
