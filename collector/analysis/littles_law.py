"""Little's law as a consistency check on the request log: L = lambda * W (docs/domain.md §1).

Measured L is the time-weighted mean number of requests in flight over a window, from each row's
admitted_at/completed_at (or from a live counter such as the probe's). Predicted L is the
completion rate in the window times the mean `e2e_s` of those completions. A ratio far from 1
reveals lost rows, clock errors or counting bugs; near 1 says the log is self-consistent.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from collector.analysis.stats import mean, seconds
from collector.capacity import LittlesLaw

__all__ = ["littles_law_check", "time_weighted_inflight", "DEFAULT_TOLERANCE"]

DEFAULT_TOLERANCE = 0.15  # relative; edge effects of a short window stay well inside this


def time_weighted_inflight(rows: Sequence[Mapping[str, Any]], start: float, end: float) -> float:
    """Mean requests in flight over [start, end] (POSIX seconds) from admit/complete stamps.

    Example: one request in flight for 5 s of a 10 s window -> 0.5.
    """
    if end <= start:
        raise ValueError(f"window end {end} is not after start {start}")
    busy = 0.0
    for row in rows:
        admitted, completed = seconds(row.get("admitted_at")), seconds(row.get("completed_at"))
        if admitted is None or completed is None:
            continue
        busy += max(0.0, min(completed, end) - max(admitted, start))
    return busy / (end - start)


def littles_law_check(
    rows: Sequence[Mapping[str, Any]],
    start: float,
    end: float,
    *,
    measured_inflight: float | None = None,
    tolerance: float = DEFAULT_TOLERANCE,
) -> LittlesLaw:
    """Compare mean in-flight with completion rate x mean e2e over [start, end]."""
    measured = time_weighted_inflight(rows, start, end) if measured_inflight is None else measured_inflight
    done = [r for r in rows if (t := seconds(r.get("completed_at"))) is not None and start <= t <= end]
    rate = len(done) / (end - start)
    mean_e2e = mean(r.get("e2e_s") for r in done) or 0.0
    predicted = rate * mean_e2e
    ratio = measured / predicted if predicted > 0 else None
    consistent = ratio is not None and abs(ratio - 1.0) <= tolerance
    return LittlesLaw(
        round(measured, 4), round(predicted, 4), None if ratio is None else round(ratio, 4), consistent
    )
