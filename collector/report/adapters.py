"""The weekly review's LoRA adapters: per base model, what each adapter asked of it.

A request naming an adapter is logged under its base model with the adapter in its row
(collector.sidecar.adapters), so one model's rows are the base model's own requests and each
adapter's. Per adapter, from the rows of the window (traffic only, never any text):

    requests                  rows naming it
    ttft_p50_s, ttft_p95_s    its time to first token
    output_tokens_per_s       its completion tokens over its requests' generation time (e2e - TTFT,
                              summed): the decode speed its requests saw
    capacity_share            its share of the base model's request-seconds (e2e summed over the
                              model's rows, its own requests included): how much of the replicas'
                              occupancy it took

The base model's own requests are one more entry (`adapter` None), so the shares add up to 1.
Nothing when no row of the model names an adapter. The sums per adapter are the store's
(collector.report.collect: `tokens` and `generating_s` over the requests timed from their first
token, `e2e_total_s` their e2e).

    >>> sums = [{"adapter": "sql", "requests": 2, "ttft_p50_s": 0.3, "ttft_p95_s": 0.39,
    ...          "tokens": 30.0, "generating_s": 2.4, "e2e_total_s": 3.0},
    ...         {"adapter": None, "requests": 1, "ttft_p50_s": 0.1, "ttft_p95_s": 0.1,
    ...          "tokens": 10.0, "generating_s": 0.9, "e2e_total_s": 1.0}]
    >>> [(e["adapter"], e["requests"], e["capacity_share"]) for e in adapter_usage(sums)]
    [('sql', 2, 0.75), (None, 1, 0.25)]
"""

from __future__ import annotations

from typing import Any

from collector.report.figures import ratio

__all__ = ["adapter_usage", "adapter_table"]

BASE = "(base model)"  # how the table names the base model's own requests


def adapter_usage(sums: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """One model's sums per adapter -> per adapter (largest capacity share first), then the base
    model's own requests; [] when none names an adapter."""
    if not any(entry["adapter"] is not None for entry in sums):
        return []
    total_s = sum(entry["e2e_total_s"] for entry in sums)
    found = [
        {
            "adapter": entry["adapter"],
            "requests": entry["requests"],
            "ttft_p50_s": entry["ttft_p50_s"],
            "ttft_p95_s": entry["ttft_p95_s"],
            "output_tokens_per_s": ratio(entry["tokens"], entry["generating_s"]),
            "capacity_share": ratio(entry["e2e_total_s"], total_s),
        }
        for entry in sums
    ]
    found.sort(key=lambda e: (e["adapter"] is None, -(e["capacity_share"] or 0.0), e["adapter"] or ""))
    return found


def adapter_table(entries: list[dict[str, Any]]) -> tuple[list[str], list[list[str]]]:
    """Header and rows of the review's "LoRA adapters" table (text cells)."""
    from collector.report.render_md import fmt  # render_md imports this module

    header = [
        "LoRA adapter",
        "requests",
        "p50 TTFT (s)",
        "p95 TTFT (s)",
        "output tokens/s",
        "share of capacity",
    ]
    rows = [
        [
            e["adapter"] or BASE,
            fmt(e["requests"]),
            fmt(e["ttft_p50_s"]),
            fmt(e["ttft_p95_s"]),
            fmt(e["output_tokens_per_s"], 1),
            "–" if e["capacity_share"] is None else f"{e['capacity_share'] * 100:.1f} %",
        ]
        for e in entries
    ]
    return header, rows
