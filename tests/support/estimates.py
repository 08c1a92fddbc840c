"""Capacity estimates for tests: a CapacityEstimate with only the numbers a test cares about."""

from __future__ import annotations

import time
from datetime import UTC, datetime

from collector.capacity import CapacityEstimate, KneeResult, Slo


def capacity_estimate(
    model: str | None = "m",
    *,
    source: str = "probe",
    run_id: str | None = None,
    knee_requests: int | None = None,
    knee_tokens: int | None = None,
    knee_tokens_p95: int | None = None,
    pool_tokens: int | None = None,
    max_request_tokens: int | None = None,
    reached: bool | None = None,
    slo_max_requests: int | None = None,
    slo_max_tokens: int | None = None,
    recommended_pool: int | None = None,
    confidence: str = "medium",
    confidence_reason: str | None = None,
    task_class: str = "all",
    replica_class: str = "default",
    created_at: datetime | None = None,
    estimated_at: float | None = None,
    rate_requests_per_s: float | None = None,
    prefill_tokens_per_s: float | None = None,
    error_ratio: float = 0.0,
) -> CapacityEstimate:
    """An estimate whose knee is `knee_requests` (reached unless `reached=False` or no knee given)
    and token capacity `knee_tokens` (withheld when None; its p95 defaults to 1.25 x it, the pool
    in tokens to 1.5 x it at the pool's share of the knee); the recommended pool defaults to the
    knee."""
    reached = knee_requests is not None if reached is None else reached
    when = created_at or datetime.fromtimestamp(
        estimated_at if estimated_at is not None else time.time(), UTC
    )
    return CapacityEstimate(
        model,
        source,
        run_id,
        "interactive",
        [],
        KneeResult(knee_requests or 16, knee_tokens or 0, reached, "test", None, None, True, ""),
        Slo(),
        slo_max_requests,
        slo_max_tokens,
        recommended_pool if recommended_pool is not None else (knee_requests or 1),
        confidence,
        when,
        task_class=task_class,
        replica_class=replica_class,
        error_ratio=error_ratio,
        token_knee_withheld=None if knee_tokens is not None else "not measured",
        rate_requests_per_s=rate_requests_per_s,
        prefill_tokens_per_s=prefill_tokens_per_s,
        confidence_reason=confidence_reason,
        token_capacity=None
        if knee_tokens is None
        else {
            "mean": knee_tokens,
            "p95": knee_tokens_p95 if knee_tokens_p95 is not None else round(1.25 * knee_tokens),
            # the pool's p99.9: by default 1.5 x the mean at the pool's share of the knee
            "pool_tokens": pool_tokens
            if pool_tokens is not None
            else round(1.5 * knee_tokens * (recommended_pool or knee_requests or 1) / (knee_requests or 16)),
            "max_request_tokens": max_request_tokens,
        },
    )
