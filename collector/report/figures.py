"""Pure numeric helpers: exact percentiles, ratios, buckets, Little's law.

Percentiles use linear interpolation between order statistics, the same definition as DuckDB's
`quantile_cont`, so a report figure equals the SQL a reader would write on the same rows.
"""

from __future__ import annotations

import math

__all__ = ["QUANTILES", "ratio", "change", "littles_law"]

QUANTILES = (0.5, 0.95, 0.99)


def ratio(part: float, whole: float) -> float | None:
    """part / whole, None when whole is 0."""
    return float(part) / float(whole) if whole else None


def change(current: float | None, previous: float | None) -> float | None:
    """Relative change: (current - previous) / previous; None when either is missing or previous is 0.

    Example: change(1.5, 1.0) -> 0.5
    """
    if current is None or previous is None or previous == 0:
        return None
    return (current - previous) / previous


def littles_law(
    busy_s: float, done: int, e2e_sum_s: float, span_s: float, tolerance: float
) -> dict[str, float | bool | None]:
    """Time-weighted mean in flight over a window of `span_s` seconds (the request-seconds inside
    it, `busy_s`, over its length) against completion rate x mean e2e (`done` completions with an
    e2e, `e2e_sum_s` their sum) (docs/domain.md §1), as collector.analysis.littles_law defines it.

    Example: 30 request-seconds in 10 s against 5 completions of 6 s each: 3.0 vs 3.0, ratio 1.
    """
    measured = float(busy_s / span_s) if span_s > 0 else 0.0
    predicted = float(e2e_sum_s / span_s) if span_s > 0 and done else 0.0
    value = measured / predicted if predicted > 0 else None
    return {
        "measured_inflight": round(measured, 4),
        "predicted_inflight": round(predicted, 4),
        "ratio": None if value is None else round(value, 4),
        "consistent": value is not None and not math.isnan(value) and abs(value - 1.0) <= tolerance,
    }
