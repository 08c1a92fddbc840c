"""Per-level summary of a concurrency gradient: one LevelStats per concurrency level.

Throughput comes from a time window (completions inside it / its length), never from single
requests; latency percentiles and error ratios come from the requests admitted inside it. A probe
passes its own measurement window (after warm-up); without one, the window runs from the first to
the last admission among the rows, which in a closed loop spans whole waves of requests.

`ttft_p95_persistent_s` is the lower of the p95 TTFTs of the first and the second half of the
level's requests (in admission order). Queueing past the knee raises both halves; one scheduling
stall on a busy host raises one half only. The knee rule reads this value so that a blip of a
few requests is not taken for a knee.

Failures are kept as they happened: `outcomes` is the level's outcome mix ("ok", "http 400",
"http 429", "timeout", "upstream_error" ...; an answer with an HTTP status is named by it) and
`first_error` the first failure's text (the probe passes the upstream's error message, truncated
and with any prompt text removed; a stored row only has our own short reason, e.g. "HTTP 400").
`non_capacity_error_ratio` is the share of requests that failed for a reason other than capacity:
429, 503 and timeouts are the engine running out of room (the knee's evidence); a 400, a reset or
a malformed answer says the measurement itself is broken, and an estimate with more than a few
of them is not published (collector.analysis.estimate).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, TypedDict

from collector.analysis.littles_law import littles_law_check
from collector.analysis.stats import mean, percentile, percentiles, seconds
from collector.capacity import LevelStats

__all__ = [
    "summarize_level",
    "default_window",
    "persistent_p95",
    "is_capacity_error",
    "outcome_key",
    "outcome_mix",
    "latency_fields",
    "CAPACITY_STATUSES",
]

CAPACITY_STATUSES = (429, 503)  # the engine (or a gateway) refusing work it has no room for

Row = Mapping[str, Any]


def default_window(rows: Sequence[Row]) -> tuple[float, float]:
    """[first admission, last admission], or to the last completion when that span is empty."""
    admitted = [t for r in rows if (t := seconds(r.get("admitted_at"))) is not None]
    completed = [t for r in rows if (t := seconds(r.get("completed_at"))) is not None]
    if not admitted:
        raise ValueError("no row has admitted_at; cannot place the level in time")
    start, end = min(admitted), max(admitted)
    if end - start <= 0 or not any(start < t <= end for t in completed):
        end = max(completed, default=start)
    return start, end


def persistent_p95(values_in_order: Sequence[float | None]) -> float | None:
    """min(p95 of the first half, p95 of the second half); None below 4 values.

    Examples: [0.1] * 19 + [0.9] -> 0.1 (one stall, in the second half only);
    [0.5] * 20 -> 0.5 (a queue lifts both halves).
    """
    data = [v for v in values_in_order if v is not None]
    if len(data) < 4:
        return None
    middle = len(data) // 2
    halves = (percentile(data[:middle], 0.95), percentile(data[middle:], 0.95))
    return min(h for h in halves if h is not None)


def is_capacity_error(row: Row) -> bool:
    """A 429 or 503 answer, or a timeout: the service ran out of room, not a broken connection."""
    return (
        row.get("outcome") in ("rate_limited", "overloaded", "timeout")
        or row.get("status_code") in CAPACITY_STATUSES
    )


def outcome_key(row: Row) -> str:
    """The row's entry in an outcome mix: 'ok', 'http <status>' for an HTTP error, else the outcome.

    Examples: a 400 -> 'http 400'; a 429 -> 'http 429'; a timeout -> 'timeout'; a reset or a
    malformed stream (status 200) -> 'upstream_error'.
    """
    outcome = row.get("outcome") or "unknown"
    if outcome == "ok":
        return "ok"
    status = row.get("status_code")
    if status is not None and status != 200:
        return f"http {status}"
    return str(outcome)


def outcome_mix(rows: Sequence[Row]) -> dict[str, int]:
    """{outcome key: count}, the most frequent first; e.g. {'ok': 30, 'http 400': 10}."""
    counts: dict[str, int] = {}
    for row in rows:
        key = outcome_key(row)
        counts[key] = counts.get(key, 0) + 1
    return dict(sorted(counts.items(), key=lambda item: (-item[1], item[0])))


def _first_error(rows: Sequence[Row]) -> str | None:
    """Our short reason for the earliest failed row (stored rows keep no upstream text)."""
    failed = [r for r in rows if r.get("outcome") not in ("ok", None)]
    if not failed:
        return None
    first = min(failed, key=lambda r: seconds(r.get("admitted_at")) or 0.0)
    return str(first.get("error") or first.get("outcome"))


def _waiting_mean(rows: Sequence[Row]) -> float | None:
    """Mean engine queue length the rows saw at admission; None when it was never known."""
    return mean(r.get("engine_waiting_at_admit") for r in rows)


def _ratio(rows: Sequence[Row], *outcomes: str) -> float:
    if not rows:
        return 0.0
    return sum(1 for r in rows if r.get("outcome") in outcomes) / len(rows)


class LatencyFields(TypedDict):
    """LevelStats' nine latency fields, by name (seconds; None where there were no samples)."""

    ttft_p50_s: float | None
    ttft_p95_s: float | None
    ttft_p99_s: float | None
    tpot_p50_s: float | None
    tpot_p95_s: float | None
    tpot_p99_s: float | None
    e2e_p50_s: float | None
    e2e_p95_s: float | None
    e2e_p99_s: float | None


def latency_fields(
    ttft: Sequence[float | None], tpot: Sequence[float | None], e2e: Sequence[float | None]
) -> LatencyFields:
    """LevelStats' nine latency fields from (p50, p95, p99) of TTFT, TPOT and e2e.

    Example: latency_fields((0.1, 0.2, 0.3), ...) -> {"ttft_p50_s": 0.1, "ttft_p95_s": 0.2, ...}.
    """
    ttft_p50, ttft_p95, ttft_p99 = ttft
    tpot_p50, tpot_p95, tpot_p99 = tpot
    e2e_p50, e2e_p95, e2e_p99 = e2e
    return LatencyFields(
        ttft_p50_s=ttft_p50,
        ttft_p95_s=ttft_p95,
        ttft_p99_s=ttft_p99,
        tpot_p50_s=tpot_p50,
        tpot_p95_s=tpot_p95,
        tpot_p99_s=tpot_p99,
        e2e_p50_s=e2e_p50,
        e2e_p95_s=e2e_p95,
        e2e_p99_s=e2e_p99,
    )


def summarize_level(
    rows: Sequence[Row],
    concurrency: int,
    *,
    window: tuple[float, float] | None = None,
    mean_inflight: float | None = None,
    first_error: str | None = None,
) -> LevelStats:
    """Summarise the rows of one level: rates, p50/p95/p99 TTFT/TPOT/e2e, error ratios, Little.

    `window` is (start, end) in POSIX seconds; `mean_inflight` a live measurement for Little's
    law (otherwise it is computed from the rows' time stamps); `first_error` the text of the
    level's first failure as the client saw it (otherwise the first failed row's own reason).
    """
    if not rows:
        raise ValueError(f"level {concurrency} has no rows; measure it before summarising")
    start, end = window or default_window(rows)
    span = max(end - start, 1e-9)
    inside = [
        r for r in rows if (t := seconds(r.get("admitted_at"))) is not None and start <= t <= end
    ] or list(rows)
    finished = [r for r in rows if (t := seconds(r.get("completed_at"))) is not None and start < t <= end]
    ok = [r for r in finished if r.get("outcome") == "ok"]
    output_tokens = sum(r.get("completion_tokens") or 0 for r in ok)
    prompt_tokens = sum(r.get("prompt_tokens") or 0 for r in ok)
    ttft = percentiles([r.get("ttft_s") for r in inside if r.get("outcome") == "ok"])
    tpot = percentiles([r.get("tpot_s") for r in inside if r.get("outcome") == "ok"])
    e2e = percentiles([r.get("e2e_s") for r in inside if r.get("outcome") == "ok"])
    littles = (
        littles_law_check(rows, start, end, measured_inflight=mean_inflight)
        if end > start and finished
        else None
    )
    return LevelStats(
        concurrency=int(concurrency),
        samples=len(inside),
        window_s=end - start,
        requests_per_s=len(finished) / span,
        output_tokens_per_s=output_tokens / span,
        total_tokens_per_s=(output_tokens + prompt_tokens) / span,
        **latency_fields(ttft, tpot, e2e),
        rate_limited_ratio=_ratio(inside, "rate_limited"),
        timeout_ratio=_ratio(inside, "timeout"),
        error_ratio=1.0 - _ratio(inside, "ok"),
        mean_active_tokens=mean(r.get("active_tokens_at_admit") for r in inside),
        littles_law=littles,
        ttft_p95_persistent_s=persistent_p95(
            [
                r.get("ttft_s")
                for r in sorted(inside, key=lambda r: seconds(r["admitted_at"]) or 0.0)
                if r.get("outcome") == "ok"
            ]
        ),
        capacity_errors=sum(1 for r in inside if is_capacity_error(r)),
        engine_waiting_mean=_waiting_mean(inside),
        outcomes=outcome_mix(inside),
        first_error=first_error or _first_error(rows),
        non_capacity_error_ratio=sum(
            1 for r in inside if r.get("outcome") != "ok" and not is_capacity_error(r)
        )
        / len(inside),
    )
