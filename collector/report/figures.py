"""Pure numeric helpers over column arrays: exact percentiles, ratios, buckets, Little's law.

Percentiles use linear interpolation between order statistics, the same definition as DuckDB's
`quantile_cont`, so a report figure equals the SQL a reader would write on the same rows.
"""

from __future__ import annotations

import math

import numpy as np

__all__ = ["QUANTILES", "percentiles", "ratio", "change", "nearest_power_of_two", "littles_law"]

QUANTILES = (0.5, 0.95, 0.99)


def percentiles(values: np.ndarray) -> dict[str, float | None]:
    """{'p50', 'p95', 'p99'} of the non-null values (quantile_cont), None when there are none.

    Example: percentiles(np.array([1.0, 2.0, 3.0, nan])) -> {'p50': 2.0, 'p95': 2.9, 'p99': 2.98}
    """
    finite = values[~np.isnan(values)] if values.size else values
    if finite.size == 0:
        return {"p50": None, "p95": None, "p99": None}
    found = np.quantile(finite, QUANTILES, method="linear")
    return {"p50": float(found[0]), "p95": float(found[1]), "p99": float(found[2])}


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


def nearest_power_of_two(values: np.ndarray) -> np.ndarray:
    """Concurrency buckets as collector.analysis.stats.power_of_two_bucket: 3 -> 4, 6 -> 8, 12 -> 16; 0 for <= 0."""
    safe = np.where(values > 0, values, 1.0)
    buckets = np.power(2.0, np.round(np.log2(safe)))
    buckets = np.where(values < 1.5, 1.0, buckets)
    return np.where(values > 0, buckets, 0.0).astype(np.int64)


def littles_law(
    admitted: np.ndarray, completed: np.ndarray, e2e: np.ndarray, start: float, end: float, tolerance: float
) -> dict[str, float | bool | None]:
    """Time-weighted mean in-flight over [start, end] vs completion rate x mean e2e (docs/domain.md §1),
    as collector.analysis.littles_law defines it, on arrays of POSIX seconds."""
    span = end - start
    known = ~np.isnan(admitted) & ~np.isnan(completed)
    busy = np.clip(np.minimum(completed[known], end) - np.maximum(admitted[known], start), 0, None).sum()
    measured = float(busy / span) if span > 0 else 0.0
    done = known & (completed >= start) & (completed <= end) & ~np.isnan(e2e)
    predicted = float(done.sum() / span * e2e[done].mean()) if span > 0 and done.any() else 0.0
    value = measured / predicted if predicted > 0 else None
    return {
        "measured_inflight": round(measured, 4),
        "predicted_inflight": round(predicted, 4),
        "ratio": None if value is None else round(value, 4),
        "consistent": value is not None and not math.isnan(value) and abs(value - 1.0) <= tolerance,
    }
