"""The review as Markdown: one section per model, tables a reviewer can paste into a doc."""

from __future__ import annotations

from typing import Any

__all__ = [
    "render_md",
    "fmt",
    "pct",
    "capacity_line",
    "binding_line",
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
    """Which caliber binds: 'Binding caliber: requests (token knee withheld: ...)'."""
    binding = concurrency.get("binding_caliber") or "unknown (no knee to compare with)"
    withheld = concurrency.get("token_knee_withheld")
    return f"Binding caliber: {binding}" + (f" (token knee withheld: {withheld})" if withheld else "")


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


def _model(m: dict[str, Any]) -> list[str]:
    t, c, o, law, slo = m["traffic"], m["concurrency"], m["outcomes"], m["littles_law"], m["slo"]
    lines = [f"## {m['model']}", "", "**Recommended actions**", ""]
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
    lines += _table(
        ["caliber", "peak", "knee", "peak vs knee"],
        [
            [cal, fmt(c[f"peak_{cal}"]), fmt(c[f"knee_{cal}"]), versus_knee(c[f"peak_over_knee_{cal}"])]
            for cal in ("requests", "tokens")
        ],
    )
    lines += ["", binding_line(c)]
    lines += [""] + [f"- {capacity_line(item)}" for item in m.get("capacity_by_class", [])]
    lines += [
        "",
        f"Little's law: measured in-flight {fmt(law['measured_inflight'])}, rate × e2e "
        f"{fmt(law['predicted_inflight'])}, ratio {fmt(law['ratio'])}, "
        f"consistent: {fmt(law['consistent'])}",
        "",
    ]
    lines += _table(
        ["top tenant", "tokens", "requests", "share"],
        [[x["tenant"], fmt(x["tokens"]), fmt(x["requests"]), fmt(x["share"])] for x in m["top_tenants"]],
    ) + [""]
    lines += _table(
        ["in-flight bucket", "n", "p95 TTFT (s)", "p95 TPOT (s)", "error ratio"],
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


def capacity_line(item: dict[str, Any]) -> str:
    """'all: engine ceiling 46, measured knee 16, SLO max 12, pool 11 (probe run x, 2.0 h old)'."""
    if item.get("knee_requests") is None:
        return f"{item['task_class']}: {item['reason']}"
    ceiling = item.get("engine_max_concurrency")
    parts = ([f"engine ceiling {fmt(ceiling)}"] if ceiling is not None else []) + [
        f"measured knee {fmt(item['knee_requests'])}",
        f"SLO max {fmt(item.get('slo_max'))}",
        f"pool {fmt(item.get('recommended_pool'))}",
    ]
    return f"{item['task_class']}: " + ", ".join(parts) + f" ({item['reason']})"


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
        lines += _model(model)
    return "\n".join(lines).rstrip() + "\n"
