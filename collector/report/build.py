"""build_report: the capacity review's figures per model and replica class, pure over ReportInputs
(the store's aggregates, collector.report.collect).

Example output (one model, one replica class, abridged):
  {"window": {...}, "models": [{"model": "/models/gemma-3-270m.gguf", "heading": "gemma-3-270m",
   "traffic": {"requests": 1200, ...},
   "latency": {"ttft_s": {"p50": .., "p95": .., "p99": .., "previous": {...}, "change_p95": 0.5}},
   "classes": [{"replica_class": "slots8", "instances": ["a", "b"], "replicas_run": 2,
                "estimate": {"source": "probe", "confidence": "high", "age_h": 2.0,
                             "published_because": "probe run r (2.0 h old)", ...},
                "concurrency": {"peak_requests": 11, "knee_requests": 8, "peak_tokens": 1900,
                                "knee_tokens": 1710, "knee_tokens_p95": 2050, ...},   # per replica
                "load": {"step": 15, "bins": [...], "peak": {"requests": 19.9, ...}, "days": [...]},
                "plan": {"needed": {"requests": 4, "tokens": 2}, "binding_caliber": "requests",
                         "replicas_needed": 4, "replicas_run": 2, "trend": {...}}}],
   "outcomes": {...}, "top_tenants": [...], "adapters": [...], "curve": [...],
   "littles_law": {"window_s": 60, "windows": [...], "checked": 40, "inconsistent": 0, ...},
   "engine_split": [{"replica_class": "slots8", "engines": ["llamacpp"], "no_timings": None,
                     "prefill": {"prefill_tokens_per_s": 2818.2, "cache_hit_rate": 0.22, ...},
                     "split": {"requests": 1100, "hop": {"mean_s": .., "p50_s": .., "p95_s": ..}, ...},
                     "goodput": {"met_per_s": 0.0017, "attainment": 0.975, "verdicts": {...}, ...},
                     "published": {"prefill_tokens_per_s": 3100.0, "source": "probe", ...}}],
   "actions": [{"action": .., "reason": ..}]}]}
"""

from __future__ import annotations

import re
from datetime import datetime
from typing import Any

from collector.capacity import CapacityEstimate
from collector.report.actions import recommend_actions
from collector.report.adapters import adapter_usage
from collector.report.collect import ERRORS, LATENCIES, ClassFigures, ModelFigures, ReportInputs
from collector.report.figures import change, ratio
from collector.report.longest import longest_running
from collector.report.plan import littles_law_windows, plan, profile
from collector.report.ttft_split import engine_entries
from collector.store.decision import Published

__all__ = ["build_report", "heading", "token_knee_withheld", "TOP_TENANTS", "LITTLES_LAW_TOLERANCE"]

TOP_TENANTS = 5
LITTLES_LAW_TOLERANCE = 0.15  # as collector.analysis.littles_law.DEFAULT_TOLERANCE


def _traffic(figures: ModelFigures, span_s: float) -> dict[str, Any]:
    now, before = figures.current, figures.previous
    n, prompt, completion = now.requests, now.prompt_tokens, now.completion_tokens
    return {
        "requests": n,
        "requests_per_s": ratio(n, span_s),
        "prompt_tokens": int(prompt),
        "completion_tokens": int(completion),
        "cached_prompt_tokens": int(now.cached_prompt_tokens),
        "prompt_share": ratio(prompt, prompt + completion),
        "mean_prompt_tokens": ratio(prompt, n),
        "mean_completion_tokens": ratio(completion, n),
        "previous_requests": before.requests,
        "requests_change": change(n, before.requests or None),
    }


def _latency(figures: ModelFigures) -> dict[str, Any]:
    result: dict[str, Any] = {}
    for metric in LATENCIES:
        now, before = dict(figures.current.latency[metric]), dict(figures.previous.latency[metric])
        result[metric] = now | {"previous": before, "change_p95": change(now["p95"], before["p95"])}
    return result


def _outcomes(figures: ModelFigures) -> dict[str, Any]:
    by_outcome = dict(sorted(figures.outcomes.items()))
    total = figures.current.requests
    return {
        "counts": by_outcome,
        "rate_limited_ratio": ratio(by_outcome.get("rate_limited", 0), total),
        "error_ratio": ratio(sum(by_outcome.get(name, 0) for name in ERRORS), total),
    }


def _top_tenants(figures: ModelFigures) -> list[dict[str, Any]]:
    total = sum(tokens for _, tokens, _ in figures.tenants)
    ranked = sorted(figures.tenants, key=lambda item: (-item[1], item[0]))
    return [
        {"tenant": name, "tokens": int(used), "requests": count, "share": ratio(used, total)}
        for name, used, count in ranked[:TOP_TENANTS]
    ]


def _curve(entries: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [
        {
            "bucket": e["bucket"],
            "n": e["n"],
            "ttft_p95_s": e["ttft_p95_s"],
            "tpot_p95_s": e["tpot_p95_s"],
            "error_ratio": ratio(e["errors"], e["n"]),
        }
        for e in entries
    ]


NO_TOKEN_P95 = "the estimate publishes no p95 of its token capacity, the figure a peak is judged against"


def token_knee_withheld(estimate: CapacityEstimate | None) -> str | None:
    """Why the estimate's token capacity must not be judged against, or None when it may.

    The estimate says so itself (`token_knee_withheld`, collector.analysis.token_knee). An
    estimate saved before the time-weighted token capacity carries no `token_capacity`: its knee in
    tokens was the mean of the active tokens at admission, neither the time-weighted mean nor a p95
    (docs/domain.md §12), so reading it back withholds it (collector.capacity.LEGACY_TOKEN_KNEE).
    One that publishes a mean without its p95 is withheld too: a peak is only judged against the p95.
    """
    if estimate is None:
        return None
    if estimate.token_knee_withheld:
        return estimate.token_knee_withheld
    if estimate.knee_tokens and estimate.knee_tokens_p95 is None:
        return NO_TOKEN_P95
    return None


def _concurrency(figures: ClassFigures, estimate: CapacityEstimate | None) -> dict[str, Any]:
    """One replica's peak against its limit per caliber, and which caliber binds.

    The peaks are instantaneous (the sidecar's counts at admission), so the token caliber's limit
    is `knee_tokens_p95`, the p95 of the active tokens at the request knee; `knee_tokens`, the
    time-weighted mean (the divisor for 5-minute averages), is reported beside it. A caliber binds
    where its limit is published: a withheld token capacity is left out (both None) with the
    reason, so the review never judges traffic against a token knee that measured something else.
    The binding caliber is the higher peak over limit among the published calibers.
    """
    withheld = token_knee_withheld(estimate)
    limits = {
        "requests": estimate.knee_requests if estimate else None,
        "tokens": None if withheld or estimate is None else estimate.knee_tokens_p95,
    }
    result: dict[str, Any] = {}
    for caliber, peak in (("requests", figures.peak_requests), ("tokens", figures.peak_tokens)):
        knee = limits[caliber]
        result[f"peak_{caliber}"] = peak
        if caliber == "requests":
            result["knee_requests"] = knee
        else:
            result["knee_tokens"] = None if withheld or estimate is None else estimate.knee_tokens
            result["knee_tokens_p95"] = knee
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


# the open-loop probe's rates (collector.analysis.openloop: the estimate's `rates` section),
# shown when an estimate carries them: μ_slo requests/s and V_P prefill tokens/s
OPEN_LOOP_KEYS = {"mu_slo": "mu_slo_requests_per_s", "v_p": "prefill_tokens_per_s"}
_MODEL_FILES = (".gguf", ".ggml", ".bin", ".safetensors")


def _confidence(value: str) -> str:
    """One vocabulary (none, low, medium, high): a probe estimate's legacy "measured" is "high"."""
    return "high" if value == "measured" else value


def _provenance(published: Published) -> dict[str, Any]:
    """The published estimate's provenance as the review shows it (the keys of its JSON, and
    `published_because`): the confidence in the one vocabulary, and the token figures as
    _concurrency judges by them (None, with the reason, when withheld; a legacy estimate's
    admission average is never shown as a token capacity)."""
    estimate = published.estimate
    withheld = token_knee_withheld(estimate)
    return {
        "created_at": estimate.created_at.isoformat(),
        "source": estimate.source,
        "run_id": estimate.run_id,
        "confidence": _confidence(estimate.confidence),
        "confidence_reason": estimate.confidence_reason,
        "published_because": published.because,
        "knee_requests": estimate.knee_requests,
        "knee_tokens": None if withheld else estimate.knee_tokens,
        "knee_tokens_p95": None if withheld else estimate.knee_tokens_p95,
        "recommended_pool_tokens": None if withheld else estimate.recommended_pool_tokens,
        "max_request_tokens": estimate.max_request_tokens,
        "token_knee_withheld": withheld,
        "slo_max": estimate.slo_max,
        "recommended_pool": estimate.recommended_pool,
        "profile": estimate.profile,
        "replica_class": estimate.replica_class,
    }


def _estimate_summary(published: Published, previous: Published | None, until: datetime) -> dict[str, Any]:
    """Where the knee came from: source, run, confidence, age at the window's end, and why it is
    the one published (collector.store.decision); the token capacity's evidence
    (`token_capacity`: mean, p50, p95, max, ...) when the estimate has it."""
    estimate = published.estimate
    summary = _provenance(published)
    summary["token_capacity"] = estimate.token_capacity
    rates = estimate.rates or {}
    summary |= {key: rates[name] for key, name in OPEN_LOOP_KEYS.items() if rates.get(name) is not None}
    summary["age_h"] = round((until - estimate.created_at).total_seconds() / 3600, 1)
    summary["previous"] = _provenance(previous) if previous else None
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


def _class_reports(model: str, inputs: ReportInputs, figures: ModelFigures) -> list[dict[str, Any]]:
    """One entry per replica class with traffic in either window: per-replica peaks against its
    knee, the fleet's load over time, and the planning numbers."""
    start, end = inputs.since.timestamp(), inputs.until.timestamp()
    found = []
    for replica in figures.classes:
        published = inputs.estimates.get((model, replica.replica_class))
        estimate = published.estimate if published else None
        concurrency = _concurrency(replica, estimate)
        load = profile(replica.load, start, end)
        found.append(
            {
                "replica_class": replica.replica_class,
                "instances": replica.instances,
                "replicas_run": len(replica.instances),
                "estimate": _estimate_summary(
                    published, inputs.previous_estimates.get((model, replica.replica_class)), inputs.until
                )
                if published
                else None,
                "concurrency": concurrency,
                "load": load,
                # the token pool for the week's peak is the pool's own peak-aware figure, never
                # one scaled from the mean (collector.analysis.token_knee)
                "plan": plan(
                    load,
                    estimate,
                    None
                    if concurrency["token_knee_withheld"] or estimate is None
                    else estimate.recommended_pool_tokens,
                    len(replica.instances),
                    end,
                ),
            }
        )
    return found


def _model_report(model: str, inputs: ReportInputs, figures: ModelFigures) -> dict[str, Any]:
    start, end = inputs.since.timestamp(), inputs.until.timestamp()
    classes = _class_reports(model, inputs, figures)
    published = [inputs.estimates.get((model, c["replica_class"])) for c in classes]
    targets = [p.estimate.slo.ttft_p95_s for p in published if p is not None]
    slo = inputs.slo_ttft_p95_s or next((target for target in targets if target), None)
    latency = _latency(figures)
    report: dict[str, Any] = {
        "model": model,
        "heading": heading(model),
        "traffic": _traffic(figures, end - start),
        "latency": latency,
        "outcomes": _outcomes(figures),
        "classes": classes,
        "top_tenants": _top_tenants(figures),
        "longest_running": longest_running(figures.longest),
        "adapters": adapter_usage(figures.adapters),
        "curve": _curve(figures.curve),
        "curve_tokens": _curve(figures.curve_tokens),
        "littles_law": littles_law_windows(
            figures.little, figures.first_admitted, end, LITTLES_LAW_TOLERANCE
        ),
        "capacity_by_class": inputs.classes.get(model, []),
        # where TTFT went and goodput, per replica class its rows name (collector.report.ttft_split)
        "engine_split": engine_entries(
            [g for (m, _), g in inputs.engine.items() if m == model],
            {c: p for (m, c), p in inputs.estimates.items() if m == model},
        ),
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
    return {
        "window": {
            "since": _second(inputs.since),
            "until": _second(inputs.until),
            "previous_since": _second(inputs.previous_since),
        },
        "slo_ttft_p95_s": inputs.slo_ttft_p95_s,
        "models": [_model_report(model, inputs, inputs.models[model]) for model in sorted(inputs.models)],
    }
