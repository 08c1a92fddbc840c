"""Small statistics helpers shared by the analysis modules: percentiles, means, time stamps.

Percentiles interpolate linearly between order statistics, the same definition as DuckDB's
`quantile_cont`, so a number printed by the probe equals the one a SQL query over the request log
returns.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from datetime import datetime

__all__ = ["percentile", "percentiles", "mean", "seconds", "finite", "power_of_two_bucket"]


def finite(values: Iterable[float | None]) -> list[float]:
    """The values that are real numbers: drops None and NaN. [1, None, nan, 2] -> [1, 2]."""
    return [float(v) for v in values if v is not None and not math.isnan(float(v))]


def percentile(values: Sequence[float | None], q: float) -> float | None:
    """Linear-interpolated q-quantile (0 <= q <= 1) like quantile_cont; None for no data.

    Example: percentile([1, 2, 3, 4], 0.5) -> 2.5.
    """
    if not 0.0 <= q <= 1.0:
        raise ValueError(f"quantile {q!r} is outside 0..1; pass 0.95 for p95")
    data = sorted(finite(values))
    if not data:
        return None
    position = q * (len(data) - 1)
    low = math.floor(position)
    high = min(low + 1, len(data) - 1)
    return data[low] + (data[high] - data[low]) * (position - low)


def percentiles(
    values: Sequence[float | None], qs: Sequence[float] = (0.5, 0.95, 0.99)
) -> tuple[float | None, ...]:
    """Several quantiles of the same values in one call; None for each when there is no data."""
    data = finite(values)
    return tuple(percentile(data, q) for q in qs)


def mean(values: Iterable[float | None]) -> float | None:
    """Arithmetic mean of the finite values; None for no data."""
    data = finite(values)
    return sum(data) / len(data) if data else None


def seconds(moment: datetime | float | None) -> float | None:
    """A time stamp as POSIX seconds (float passes through); None stays None."""
    if moment is None:
        return None
    if isinstance(moment, datetime):
        return moment.timestamp()
    return float(moment)


def power_of_two_bucket(value: float | None) -> int | None:
    """The power of two nearest to `value` on a log scale (1 for anything below 1.5).

    Buckets are centred on the probe's ladder so a closed loop at concurrency 8 whose measured
    mean dips to 7.6 still lands in bucket 8: 1 -> 1, 3 -> 4, 5 -> 4, 6 -> 8, 11 -> 8, 12 -> 16.
    """
    if value is None or value <= 0:
        return None
    if value < 1.5:
        return 1
    return int(2 ** round(math.log2(value)))
