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
Nothing when no row of the model names an adapter.

    >>> rows = {"adapter": np.array([None, "sql", "sql"], dtype=object),
    ...         "ttft_s": np.array([0.1, 0.2, 0.4]), "e2e_s": np.array([1.0, 2.0, 1.0]),
    ...         "completion_tokens": np.array([10.0, 18.0, 12.0])}
    >>> [(e["adapter"], e["requests"], e["capacity_share"]) for e in adapter_usage(rows)]
    [('sql', 2, 0.75), (None, 1, 0.25)]
"""

from __future__ import annotations

from typing import Any

import numpy as np

from collector.report.figures import percentiles, ratio

__all__ = ["adapter_usage", "adapter_table"]

BASE = "(base model)"  # how the table names the base model's own requests


def _seconds(values: np.ndarray) -> float:
    known = values[~np.isnan(values)]
    return float(known.sum())


def _entry(
    rows: dict[str, np.ndarray], mask: np.ndarray, adapter: str | None, total_s: float
) -> dict[str, Any]:
    ttft, e2e = rows["ttft_s"][mask].astype(float), rows["e2e_s"][mask].astype(float)
    tokens = rows["completion_tokens"][mask].astype(float)
    timed = ~np.isnan(ttft) & ~np.isnan(e2e) & (e2e > ttft)
    ttfts = percentiles(ttft)
    return {
        "adapter": adapter,
        "requests": int(mask.sum()),
        "ttft_p50_s": ttfts["p50"],
        "ttft_p95_s": ttfts["p95"],
        "output_tokens_per_s": ratio(float(tokens[timed].sum()), float((e2e - ttft)[timed].sum())),
        "capacity_share": ratio(_seconds(e2e), total_s),
    }


def adapter_usage(rows: dict[str, np.ndarray]) -> list[dict[str, Any]]:
    """One model's rows -> per adapter (largest capacity share first), then the base model's own
    requests; [] when none names an adapter."""
    if "adapter" not in rows:
        return []
    adapters = np.array([None if a is None else str(a) for a in rows["adapter"]], dtype=object)
    named = sorted({a for a in adapters if a is not None})
    if not named:
        return []
    total_s = _seconds(rows["e2e_s"].astype(float))
    found = [_entry(rows, adapters == name, name, total_s) for name in named]
    found.sort(key=lambda e: (-(e["capacity_share"] or 0.0), e["adapter"]))
    own = np.array([a is None for a in adapters], dtype=bool)
    if own.any():
        found.append(_entry(rows, own, None, total_s))
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
