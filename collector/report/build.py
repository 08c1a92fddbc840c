"""build_report: the capacity review's figures per model and replica class, pure over ReportInputs.

Example output (one model, one replica class, abridged):
  {"window": {...}, "models": [{"model": "/models/gemma-3-270m.gguf", "heading": "gemma-3-270m",
   "traffic": {"requests": 1200, ...},
   "latency": {"ttft_s": {"p50": .., "p95": .., "p99": .., "previous": {...}, "change_p95": 0.5}},
   "classes": [{"replica_class": "slots8", "instances": ["a", "b"], "replicas_run": 2,
                "estimate": {"source": "probe", "confidence": "measured", "age_h": 2.0,
                             "published_because": "probe run r (2.0 h old)", ...},
                "concurrency": {"peak_requests": 11, "knee_requests": 8, ...},   # per replica
                "load": {"step": 15, "bins": [...], "peak": {"requests": 19.9, ...}, "days": [...]},
                "plan": {"needed": {"requests": 4, "tokens": 2}, "binding_caliber": "requests",
                         "replicas_needed": 4, "replicas_run": 2, "trend": {...}}}],
   "outcomes": {...}, "top_tenants": [...], "adapters": [...], "curve": [...],
   "littles_law": {"window_s": 60, "windows": [...], "checked": 40, "inconsistent": 0, ...},
   "actions": [{"action": .., "reason": ..}]}]}
"""

from __future__ import annotations

import re
from datetime import datetime
from typing import Any

import numpy as np

from collector.capacity import DEFAULT_REPLICA_CLASS
from collector.report.actions import recommend_actions
from collector.report.adapters import adapter_usage
from collector.report.collect import ReportInputs
from collector.report.figures import change, nearest_power_of_two, percentiles, ratio
from collector.report.longest import longest_running
from collector.report.plan import bin_step, littles_law_windows, plan, profile

__all__ = ["build_report", "heading", "token_knee_withheld", "TOP_TENANTS", "LITTLES_LAW_TOLERANCE"]

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


_PROVENANCE = (
    "created_at",
    "source",
    "run_id",
    "confidence",
    "confidence_reason",
    "published_because",
    "knee_requests",
    "knee_tokens",
    "token_knee_withheld",
    "slo_max",
    "recommended_pool",
    "profile",
    "replica_class",
)
# the open-loop probe's rates (collector.analysis.openloop: the estimate's `rates` section),
# shown when an estimate carries them: μ_slo requests/s and V_P prefill tokens/s
OPEN_LOOP_KEYS = {"mu_slo": "mu_slo_requests_per_s", "v_p": "prefill_tokens_per_s"}
_MODEL_FILES = (".gguf", ".ggml", ".bin", ".safetensors")


def _estimate_summary(estimate: dict[str, Any], previous: dict[str, Any], until: datetime) -> dict[str, Any]:
    """Where the knee came from: source, run, confidence, age at the window's end, and why it is
    the one published (collector.store.decision)."""
    summary = {key: estimate.get(key) for key in _PROVENANCE}
    rates = estimate.get("rates") or {}
    summary |= {key: rates[name] for key, name in OPEN_LOOP_KEYS.items() if rates.get(name) is not None}
    created = estimate.get("created_at")
    summary["age_h"] = (
        round((until - datetime.fromisoformat(created)).total_seconds() / 3600, 1) if created else None
    )
    summary["previous"] = {key: previous.get(key) for key in _PROVENANCE} if previous else None
    return summary


def heading(model: str) -> str:
    """The served model name for a heading; a file path (llama.cpp serves the GGUF path as the
    model's name) shortens to its file stem. A hub name keeps its slash.

    heading('/models/gemma-3-270m-Q8_0.gguf') -> 'gemma-3-270m-Q8_0'
    heading('meta-llama/Llama-3.1-8B-Instruct') -> 'meta-llama/Llama-3.1-8B-Instruct'
    """
    lowered = model.lower()
    is_path = model.startswith(("/", "./", "../", "~")) or re.match(r"^[A-Za-z]:[\\/]", model)
    extension = next((e for e in _MODEL_FILES if lowered.endswith(e)), None)
    if not is_path and extension is None:
        return model
    name = re.split(r"[\\/]", model.rstrip("/\\"))[-1]
    return (name[: -len(extension)] if extension else name) or model


def _class_of(model: str, instance: str, inputs: ReportInputs, published: list[str]) -> str:
    """An instance's replica class: the one its rows name where that class has a published
    estimate; else its probe runs'; else the model's only published class, as the rules fall back
    to it (a sidecar whose class has no knee is judged against the model's default one); else the
    class its rows name, or the default class."""
    served = inputs.served_classes.get((model, instance))
    if served is not None and served in published:
        return served
    probed = inputs.instance_classes.get((model, instance))
    if probed:
        return probed
    if len(published) == 1:
        return published[0]
    return served or DEFAULT_REPLICA_CLASS


def _concat(a: dict[str, np.ndarray], b: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    return {name: np.concatenate([a[name], b[name]]) for name in a}


def _class_reports(
    model: str, inputs: ReportInputs, current: dict[str, np.ndarray], previous: dict[str, np.ndarray]
) -> list[dict[str, Any]]:
    """One entry per replica class with traffic in either window: per-replica peaks against its
    knee, the fleet's load over time, and the planning numbers."""
    start, end = inputs.since.timestamp(), inputs.until.timestamp()
    published = sorted(c for m, c in inputs.estimates if m == model)

    def classes_of(rows: dict[str, np.ndarray]) -> np.ndarray:
        names = rows["instance"].astype(str)
        lookup = {i: _class_of(model, i, inputs, published) for i in set(names)}
        return np.array([lookup[i] for i in names], dtype=object)

    now_class, before_class = classes_of(current), classes_of(previous)
    found = []
    for replica_class in sorted(set(now_class) | set(before_class)):
        rows = _subset(current, now_class == replica_class)
        both = _concat(rows, _subset(previous, before_class == replica_class))
        estimate = inputs.estimates.get((model, replica_class), {})
        instances = sorted(set(rows["instance"].astype(str)))
        concurrency = _concurrency(rows, estimate)
        load = profile(both, start, end, before=inputs.previous_since.timestamp())
        found.append(
            {
                "replica_class": replica_class,
                "instances": instances,
                "replicas_run": len(instances),
                "estimate": _estimate_summary(
                    estimate, inputs.previous_estimates.get((model, replica_class), {}), inputs.until
                )
                if estimate
                else None,
                "concurrency": concurrency,
                "load": load,
                "plan": plan(load, estimate or None, concurrency["knee_tokens"], len(instances), end),
            }
        )
    return found


def _model_report(
    model: str, inputs: ReportInputs, current: dict[str, np.ndarray], previous: dict[str, np.ndarray]
) -> dict[str, Any]:
    start, end = inputs.since.timestamp(), inputs.until.timestamp()
    classes = _class_reports(model, inputs, current, previous)
    slos = [(inputs.estimates.get((model, c["replica_class"])) or {}).get("slo") or {} for c in classes]
    slo = inputs.slo_ttft_p95_s or next((s["ttft_p95_s"] for s in slos if s.get("ttft_p95_s")), None)
    latency = _latency(current, previous)
    admitted = current["admitted"][~np.isnan(current["admitted"])]
    step = bin_step(float(np.ptp(admitted)) or 1.0) if admitted.size else None
    report: dict[str, Any] = {
        "model": model,
        "heading": heading(model),
        "traffic": _traffic(current, previous, end - start),
        "latency": latency,
        "outcomes": _outcomes(current),
        "classes": classes,
        "top_tenants": _top_tenants(current),
        "longest_running": longest_running(current),
        "adapters": adapter_usage(current),
        "curve": _curve(current, "inflight"),
        "curve_tokens": _curve(current, "active_tokens"),
        "littles_law": littles_law_windows(current, start, end, step, LITTLES_LAW_TOLERANCE),
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
