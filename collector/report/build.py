"""build_report: the capacity review's figures per model, pure over ReportInputs.

Example output (one model, abridged):
  {"window": {...}, "models": [{"model": "m", "traffic": {"requests": 1200, ...},
   "latency": {"ttft_s": {"p50": .., "p95": .., "p99": .., "previous": {...}, "change_p95": 0.5}},
   "concurrency": {"peak_requests": 16, "knee_requests": 12, "headroom_requests": -0.33, ...},
   "outcomes": {...}, "top_tenants": [...], "curve": [...], "littles_law": {...},
   "estimate": {...}, "actions": [{"action": .., "reason": ..}]}]}
"""

from __future__ import annotations

from typing import Any

import numpy as np

from collector.report.actions import recommend_actions
from collector.report.collect import ReportInputs
from collector.report.figures import change, littles_law, nearest_power_of_two, percentiles, ratio

__all__ = ["build_report", "TOP_TENANTS", "LITTLES_LAW_TOLERANCE"]

TOP_TENANTS = 5
LITTLES_LAW_TOLERANCE = 0.15  # as collector.analysis.littles_law.DEFAULT_TOLERANCE
_ERRORS = ("upstream_error", "timeout")
_LATENCIES = ("ttft_s", "tpot_s", "e2e_s")


def _subset(columns: dict[str, np.ndarray], mask: np.ndarray) -> dict[str, np.ndarray]:
    return {name: values[mask] for name, values in columns.items()}


def _traffic(rows: dict[str, np.ndarray], previous: dict[str, np.ndarray], span_s: float) -> dict[str, Any]:
    n, prompt, completion = len(rows["model"]), rows["prompt_tokens"].sum(), rows["completion_tokens"].sum()
    return {
        "requests": n,
        "requests_per_s": ratio(n, span_s),
        "prompt_tokens": int(prompt),
        "completion_tokens": int(completion),
        "cached_prompt_tokens": int(rows["cached_prompt_tokens"].sum()),
        "prompt_share": ratio(prompt, prompt + completion),
        "mean_prompt_tokens": ratio(prompt, n),
        "mean_completion_tokens": ratio(completion, n),
        "previous_requests": len(previous["model"]),
        "requests_change": change(n, len(previous["model"]) or None),
    }


def _latency(rows: dict[str, np.ndarray], previous: dict[str, np.ndarray]) -> dict[str, Any]:
    result = {}
    for metric in _LATENCIES:
        now, before = percentiles(rows[metric]), percentiles(previous[metric])
        result[metric] = now | {"previous": before, "change_p95": change(now["p95"], before["p95"])}
    return result


def _outcomes(rows: dict[str, np.ndarray]) -> dict[str, Any]:
    names, counts = np.unique(rows["outcome"].astype(str), return_counts=True)
    by_outcome = {str(name): int(count) for name, count in zip(names, counts)}
    total = len(rows["outcome"])
    return {
        "counts": by_outcome,
        "rate_limited_ratio": ratio(by_outcome.get("rate_limited", 0), total),
        "error_ratio": ratio(sum(by_outcome.get(name, 0) for name in _ERRORS), total),
    }


def _top_tenants(rows: dict[str, np.ndarray]) -> list[dict[str, Any]]:
    tokens = rows["prompt_tokens"] + rows["completion_tokens"]
    total = tokens.sum()
    tenants = rows["tenant"].astype(str)
    names = np.unique(tenants)
    ranked = sorted(
        ((float(tokens[tenants == name].sum()), int((tenants == name).sum()), str(name)) for name in names),
        key=lambda item: (-item[0], item[2]),
    )
    return [
        {"tenant": name, "tokens": int(used), "requests": count, "share": ratio(used, total)}
        for used, count, name in ranked[:TOP_TENANTS]
    ]


def _curve(rows: dict[str, np.ndarray], column: str) -> list[dict[str, Any]]:
    values = rows[column]
    known = ~np.isnan(values) & (values > 0)
    buckets = nearest_power_of_two(values[known])
    subset = _subset(rows, known)
    curve = []
    for bucket in np.unique(buckets):
        mask = buckets == bucket
        errors = np.isin(subset["outcome"][mask].astype(str), _ERRORS).sum()
        curve.append(
            {
                "bucket": int(bucket),
                "n": int(mask.sum()),
                "ttft_p95_s": percentiles(subset["ttft_s"][mask])["p95"],
                "tpot_p95_s": percentiles(subset["tpot_s"][mask])["p95"],
                "error_ratio": ratio(errors, mask.sum()),
            }
        )
    return curve


def _peak(values: np.ndarray) -> float | None:
    known = values[~np.isnan(values)]
    return float(known.max()) if known.size else None


def _concurrency(rows: dict[str, np.ndarray], estimate: dict[str, Any]) -> dict[str, Any]:
    result: dict[str, Any] = {}
    for caliber, column in (("requests", "inflight"), ("tokens", "active_tokens")):
        peak, knee = _peak(rows[column]), estimate.get(f"knee_{caliber}")
        result[f"peak_{caliber}"] = peak
        result[f"knee_{caliber}"] = knee
        result[f"headroom_{caliber}"] = (1.0 - peak / knee) if peak is not None and knee else None
    return result


def _estimate_summary(estimate: dict[str, Any], previous: dict[str, Any]) -> dict[str, Any]:
    keys = (
        "created_at",
        "source",
        "confidence",
        "knee_requests",
        "knee_tokens",
        "slo_max",
        "recommended_pool",
        "profile",
    )
    summary = {key: estimate.get(key) for key in keys}
    summary["previous"] = {key: previous.get(key) for key in keys} if previous else None
    return summary


def _model_report(model: str, inputs: ReportInputs, current: dict, previous: dict) -> dict[str, Any]:
    start, end = inputs.since.timestamp(), inputs.until.timestamp()
    estimate = inputs.estimates.get(model, {})
    slo = inputs.slo_ttft_p95_s or (estimate.get("slo") or {}).get("ttft_p95_s")
    report = {
        "model": model,
        "traffic": _traffic(current, previous, end - start),
        "latency": _latency(current, previous),
        "outcomes": _outcomes(current),
        "concurrency": _concurrency(current, estimate),
        "top_tenants": _top_tenants(current),
        "curve": _curve(current, "inflight"),
        "curve_tokens": _curve(current, "active_tokens"),
        "littles_law": littles_law(
            current["admitted"], current["completed"], current["e2e_s"], start, end, LITTLES_LAW_TOLERANCE
        ),
        "estimate": _estimate_summary(estimate, inputs.previous_estimates.get(model, {}))
        if estimate
        else None,
        "capacity_by_class": inputs.classes.get(model, []),
    }
    p95 = report["latency"]["ttft_s"]["p95"]
    report["slo"] = {"ttft_p95_s": slo, "met": None if slo is None or p95 is None else p95 <= slo}
    report["actions"] = recommend_actions(report)
    return report


def build_report(inputs: ReportInputs) -> dict[str, Any]:
    """Figures per model (models seen in either window), in model order."""
    models = sorted(set(inputs.current["model"].astype(str)) | set(inputs.previous["model"].astype(str)))
    reports = []
    for model in models:
        current = _subset(inputs.current, inputs.current["model"] == model)
        previous = _subset(inputs.previous, inputs.previous["model"] == model)
        reports.append(_model_report(model, inputs, current, previous))
    return {
        "window": {
            "since": inputs.since.isoformat(),
            "until": inputs.until.isoformat(),
            "previous_since": inputs.previous_since.isoformat(),
        },
        "slo_ttft_p95_s": inputs.slo_ttft_p95_s,
        "models": reports,
    }
