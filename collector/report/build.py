"""build_report: the capacity review's figures per model, pure over ReportInputs.

Example output (one model, abridged):
  {"window": {...}, "models": [{"model": "m", "traffic": {"requests": 1200, ...},
   "latency": {"ttft_s": {"p50": .., "p95": .., "p99": .., "previous": {...}, "change_p95": 0.5}},
   "concurrency": {"peak_requests": 16, "knee_requests": 12, "headroom_requests": -0.33,
                   "peak_over_knee_requests": 1.33, ...},
   "hourly": [{"hour": 1796000400.0, "peak_requests": 14, "peak_tokens": 9000, "mean_requests": 6.1,
               "tokens_per_s": 410.2}, ...],
   "outcomes": {...}, "top_tenants": [...], "curve": [...], "littles_law": {...},
   "estimate": {...}, "actions": [{"action": .., "reason": ..}]}]}
"""

from __future__ import annotations

from datetime import datetime
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
    result: dict[str, Any] = {}
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


def token_knee_withheld(estimate: dict[str, Any]) -> str | None:
    """Why the estimate's token knee must not be judged against, or None when it may.

    The estimate says so itself (`token_knee_withheld`, collector.analysis.token_knee); a probe
    estimate saved before that check existed carries no `token_check` and its token knee measured
    the probe's own prompts (docs/domain.md §12), so it is not trusted either.
    """
    if estimate.get("token_knee_withheld"):
        return str(estimate["token_knee_withheld"])
    if estimate.get("source") == "probe" and estimate.get("knee_tokens") and "token_check" not in estimate:
        return "a probe estimate from before the token check: its knee in tokens measured the probe's own prompts"
    return None


def _concurrency(rows: dict[str, np.ndarray], estimate: dict[str, Any]) -> dict[str, Any]:
    """Peak against the knee per caliber, and which caliber binds (the higher peak/knee).

    A withheld token knee is left out (knee None) with the reason, so the review never judges
    traffic against a token knee that measured something else.
    """
    result: dict[str, Any] = {}
    withheld = token_knee_withheld(estimate)
    for caliber, column in (("requests", "inflight"), ("tokens", "active_tokens")):
        peak, knee = _peak(rows[column]), estimate.get(f"knee_{caliber}")
        if caliber == "tokens" and withheld:
            knee = None
        result[f"peak_{caliber}"] = peak
        result[f"knee_{caliber}"] = knee
        result[f"headroom_{caliber}"] = (1.0 - peak / knee) if peak is not None and knee else None
        result[f"peak_over_knee_{caliber}"] = round(peak / knee, 4) if peak is not None and knee else None
    result["token_knee_withheld"] = withheld
    ratios = {
        caliber: result[f"peak_over_knee_{caliber}"]
        for caliber in ("requests", "tokens")
        if result[f"peak_over_knee_{caliber}"] is not None
    }
    result["binding_caliber"] = max(ratios, key=lambda c: ratios[c]) if ratios else None
    return result


def _hourly(rows: dict[str, np.ndarray], start: float, end: float) -> list[dict[str, Any]]:
    """Per hour of the window: peak and mean concurrency at admission (both calibers) and tokens/s.

    Example: 3 requests admitted 09:10-09:40 at in-flight 1, 2, 3 -> {"hour": <09:00>, "peak_requests": 3,
    "mean_requests": 2.0, ...}; hours without traffic are left out.
    """
    admitted = rows["admitted"]
    known = ~np.isnan(admitted)
    if not known.any():
        return []
    first = np.floor(start / 3600) * 3600
    hours = np.floor((admitted[known] - first) / 3600).astype(np.int64)
    tokens = (rows["prompt_tokens"] + rows["completion_tokens"])[known]
    inflight, active = rows["inflight"][known], rows["active_tokens"][known]
    result = []
    for hour in np.unique(hours):
        mask = hours == hour
        result.append(
            {
                "hour": float(first + hour * 3600),
                "requests": int(mask.sum()),
                "peak_requests": _peak(inflight[mask]),
                "peak_tokens": _peak(active[mask]),
                "mean_requests": _mean(inflight[mask]),
                "tokens_per_s": round(float(tokens[mask].sum()) / 3600.0, 3),
            }
        )
    return result


def _mean(values: np.ndarray) -> float | None:
    known = values[~np.isnan(values)]
    return round(float(known.mean()), 3) if known.size else None


def _estimate_summary(estimate: dict[str, Any], previous: dict[str, Any]) -> dict[str, Any]:
    keys = (
        "created_at",
        "source",
        "confidence",
        "knee_requests",
        "knee_tokens",
        "token_knee_withheld",
        "slo_max",
        "recommended_pool",
        "profile",
    )
    summary = {key: estimate.get(key) for key in keys}
    summary["previous"] = {key: previous.get(key) for key in keys} if previous else None
    return summary


def _model_report(
    model: str, inputs: ReportInputs, current: dict[str, np.ndarray], previous: dict[str, np.ndarray]
) -> dict[str, Any]:
    start, end = inputs.since.timestamp(), inputs.until.timestamp()
    estimate = inputs.estimates.get(model, {})
    slo = inputs.slo_ttft_p95_s or (estimate.get("slo") or {}).get("ttft_p95_s")
    latency = _latency(current, previous)
    report: dict[str, Any] = {
        "model": model,
        "traffic": _traffic(current, previous, end - start),
        "latency": latency,
        "outcomes": _outcomes(current),
        "concurrency": _concurrency(current, estimate),
        "top_tenants": _top_tenants(current),
        "curve": _curve(current, "inflight"),
        "curve_tokens": _curve(current, "active_tokens"),
        "hourly": _hourly(current, start, end),
        "littles_law": littles_law(
            current["admitted"], current["completed"], current["e2e_s"], start, end, LITTLES_LAW_TOLERANCE
        ),
        "estimate": _estimate_summary(estimate, inputs.previous_estimates.get(model, {}))
        if estimate
        else None,
        "capacity_by_class": inputs.classes.get(model, []),
    }
    p95 = latency["ttft_s"]["p95"]
    report["slo"] = {"ttft_p95_s": slo, "met": None if slo is None or p95 is None else p95 <= slo}
    report["actions"] = recommend_actions(report)
    return report


def _second(moment: datetime) -> str:
    """ISO-8601 to the second: people read windows, not microseconds."""
    return moment.replace(microsecond=0).isoformat()


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
            "since": _second(inputs.since),
            "until": _second(inputs.until),
            "previous_since": _second(inputs.previous_since),
        },
        "slo_ttft_p95_s": inputs.slo_ttft_p95_s,
        "models": reports,
    }
