"""The review's planning numbers: demand over time per replica class, replicas needed, the trend.

Pure over the aggregates of collector.report.collect (POSIX seconds). A request is in flight
from admission to completion; its active tokens are its prompt until the first token, then the
prompt plus what it has generated so far (the sidecar's `headroom_active_tokens`), rising evenly to
prompt + completion at completion. The load of a set of replicas is sampled on a regular grid
(`dt`, 1 s or finer for short spans) from those intervals, exactly as the sum over requests: the
store sums the events per sample (LoadSeries.from_histograms), their running sums are the load.

    sampling_grid(...)             where one replica class's load is sampled (Grid)
    profile(series, start, end)    the load of one replica class: per-bin fleet and per-replica
                                   load, throughput, replicas serving, the busiest minute, day peaks
    plan(peak, estimate, ...)      replicas needed at the peak, per caliber, which caliber binds,
                                   and at the trend next week (docs/domain.md §14: ceil(demand / pool))
    littles_law_windows(sums, ..)  Little's law per window long enough for it to hold

Example: 20 clients in a closed loop on one replica whose published pool is 6 requests ->
peak 20 requests, needed ceil(20 / 6) = 4 replicas (ran 1), binding caliber requests.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

import numpy as np

from collector.capacity import CapacityEstimate
from collector.report.figures import littles_law

__all__ = [
    "STEPS",
    "MAX_BINS",
    "DEMAND_WINDOW_S",
    "LITTLE_SPAN",
    "TREND_HORIZON_DAYS",
    "bin_step",
    "Grid",
    "sampling_grid",
    "LoadSeries",
    "profile",
    "plan",
    "pool_per_replica",
    "LittleWindowSums",
    "little_window_s",
    "littles_law_windows",
]

# Plot and table bins: the smallest of these (seconds) that cuts the traffic's span into at most
# MAX_BINS, so one hour reads in 15 s bins and a week in hours.
STEPS = (1, 2, 5, 10, 15, 30, 60, 300, 900, 3600, 4 * 3600, 86400)
MAX_BINS = 240
# Demand is the busiest minute's mean load: what a replica count must carry for longer than a
# burst (the rules' fleet load averages 5 minutes; an instant's peak would over-count).
DEMAND_WINDOW_S = 60.0
TREND_HORIZON_DAYS = 7
LITTLE_SPAN = 20  # a Little's-law window is at least this many p95 e2e durations long
_MAX_SAMPLES = 1_500_000
# the parts of a replica class's sums (LoadSeries.from_sums)
ADMITTED, COMPLETED, FIRST_TOKEN, SPAN = range(4)
_CALIBERS = ("requests", "tokens")


def bin_step(span_s: float) -> int:
    """Bin length in seconds for a span: bin_step(3600) -> 15, bin_step(7 * 86400) -> 3600."""
    return next((s for s in STEPS if span_s / s <= MAX_BINS), STEPS[-1])


@dataclass(frozen=True)
class Grid:
    """Where a replica class's load is sampled: every `dt` seconds from `times[0]`, POSIX seconds
    less `origin` (a whole number of `step`s: the float precision of t x slope), `step` the bins'
    length."""

    step: int
    dt: float
    origin: float
    times: np.ndarray

    @property
    def samples(self) -> int:
        return int(self.times.size)


def sampling_grid(
    first_admitted: float,
    last_completed: float,
    now_first_admitted: float | None,
    now_last_completed: float | None,
    start: float,
    end: float,
    before: float | None = None,
) -> Grid | None:
    """The grid for the requests of one replica class (admitted from `first_admitted`, completed
    by `last_completed`; those of [start, end) from `now_first_admitted` to `now_last_completed`),
    or None when nothing of [start, end) is in flight: bins sized to the current window's traffic,
    samples 1 s apart or finer for short spans, at most _MAX_SAMPLES, from `before` (the previous
    window, for the day peaks) or `start` to `end`."""
    first = max(first_admitted, before if before is not None else start)
    last = min(last_completed, end)
    if now_first_admitted is None or now_last_completed is None or last <= first:
        return None
    span_now = min(now_last_completed, end) - now_first_admitted
    step = bin_step(max(span_now, 1.0))
    dt = max(min(1.0, step / 10), (last - first) / _MAX_SAMPLES)
    origin = math.floor(first / step) * step
    times = np.arange(first - origin + dt / 2, last - origin, dt)
    return Grid(step, dt, origin, times) if times.size else None


@dataclass
class LoadSeries:
    """A replica class's load on its grid, with what its bins need.

    requests, tokens: in flight at each sample time (exactly the sum over the requests' intervals)
    span_replica, span_lo, span_hi: per replica (a number), the first and last bin (floor(t /
    step) of the shifted times) of each of its requests, deduplicated: the replicas serving per bin
    produced_bin, produced_tokens: prompt + completion tokens of requests completed in a bin (the
    spans' last bins, so one bin may come more than once)
    """

    grid: Grid
    requests: np.ndarray
    tokens: np.ndarray
    span_replica: np.ndarray
    span_lo: np.ndarray
    span_hi: np.ndarray
    produced_bin: np.ndarray
    produced_tokens: np.ndarray

    @classmethod
    def from_sums(cls, grid: Grid, sums: dict[str, np.ndarray]) -> LoadSeries:
        """The load from the store's sums on the grid (collector.report.collect), one row per
        `part` and `b`: ADMITTED, COMPLETED and FIRST_TOKEN events per sample `b` (the first
        sample at or after them: `n` events, prompt tokens `wp`, slope `s`, slope x first token
        `sf`), and a SPAN per replica (`code`), first bin `b` and last bin `hi` with the
        `tokens` (prompt + completion) of its requests.

        A request adds its prompt from admission to completion, plus slope x (t - first token)
        from its first token to its completion (slope = completion tokens / generating time).
        Example: admitted at 0, first token at 1, done at 3, prompt 10, completion 20: at 0.5 it is
        1 request and 10 tokens, at 2 one request and 20 tokens, at 3.5 nothing.
        """
        n, t = grid.samples, grid.times
        part, b = sums["part"], np.asarray(sums["b"], dtype=np.int64)

        def running(kind: int, column: str) -> np.ndarray:
            mask = (part == kind) & (b < n)
            values = np.asarray(sums[column][mask], dtype=np.float64)
            return np.cumsum(np.bincount(b[mask], weights=values, minlength=n))

        requests = running(ADMITTED, "n") - running(COMPLETED, "n")
        tokens = running(ADMITTED, "wp") - running(COMPLETED, "wp")
        tokens += running(FIRST_TOKEN, "s") * t - running(FIRST_TOKEN, "sf")
        tokens -= running(COMPLETED, "s") * t - running(COMPLETED, "sf")
        spans = part == SPAN
        return cls(
            grid,
            requests,
            np.clip(tokens, 0.0, None),
            np.asarray(sums["code"][spans], dtype=np.int64),
            b[spans],
            np.asarray(sums["hi"][spans], dtype=np.int64),
            np.asarray(sums["hi"][spans], dtype=np.int64),
            np.asarray(sums["tokens"][spans], dtype=np.float64),
        )


def _moving_peak(values: np.ndarray, times: np.ndarray, width: int) -> tuple[float, float]:
    """(highest mean over `width` consecutive samples, the time its window starts)."""
    width = max(1, min(width, values.size))
    sums = np.concatenate([[0.0], np.cumsum(values)])
    means = (sums[width:] - sums[:-width]) / width
    best = int(np.argmax(means))
    return float(means[best]), float(times[best])


def _iso(seconds: float) -> str:
    return datetime.fromtimestamp(seconds, UTC).replace(microsecond=0).isoformat()


def profile(series: LoadSeries | None, start: float, end: float) -> dict[str, Any]:
    """The load of one replica class over [start, end), and its day peaks over its whole grid
    (which starts at the previous window when it had traffic).

    Returns {"step", "dt", "bins": [{"t", "requests", "tokens", "replicas", "tokens_per_s",
    "requests_per_replica", "tokens_per_replica", "tokens_per_s_per_replica"}], "peak": {"requests",
    "tokens", "requests_at", "tokens_at"}, "days": [{"day", "requests", "tokens"}]}.
    """
    if series is None:
        return {"step": None, "dt": None, "bins": [], "peak": None, "days": []}
    grid = series.grid
    times, origin = grid.times, grid.origin
    result: dict[str, Any] = {"step": grid.step, "dt": grid.dt}
    current = (times + origin >= start) & (times + origin < end)
    result["bins"] = _bins(series, times[current], series.requests[current], series.tokens[current])
    width = round(DEMAND_WINDOW_S / grid.dt)
    peak: dict[str, Any] = {}
    for caliber, values in zip(_CALIBERS, (series.requests, series.tokens)):
        if not current.any():
            peak[caliber], peak[f"{caliber}_at"] = 0.0, _iso(start)
            continue
        value, at = _moving_peak(values[current], times[current], width)
        peak[caliber], peak[f"{caliber}_at"] = round(value, 3), _iso(at + origin)
    result["peak"] = peak
    result["days"] = _days(times + origin, series.requests, series.tokens, width)
    return result


def _bins(
    series: LoadSeries, times: np.ndarray, requests: np.ndarray, tokens: np.ndarray
) -> list[dict[str, Any]]:
    """Per bin: mean load over the whole bin, replicas serving in it, tokens/s of its completions."""
    if times.size == 0:
        return []
    step, dt, origin = series.grid.step, series.grid.dt, series.grid.origin
    index = np.floor(times / step).astype(np.int64)
    first, count = int(index.min()), int(index.max() - index.min() + 1)
    per_bin = step / dt  # samples in a whole bin: idle parts of a bin count as zero load
    load_r = np.bincount(index - first, weights=requests, minlength=count) / per_bin
    load_t = np.bincount(index - first, weights=tokens, minlength=count) / per_bin
    # replicas serving: instances with a request in flight at some time of the bin
    lo, hi = series.span_lo - first, series.span_hi - first
    keep = (hi >= 0) & (lo < count)
    lo, hi = np.clip(lo[keep], 0, count - 1), np.clip(hi[keep], 0, count - 1)
    _, codes = np.unique(series.span_replica[keep], return_inverse=True)
    spans = hi - lo + 1
    bins = np.repeat(lo, spans) + (np.arange(spans.sum()) - np.repeat(np.cumsum(spans) - spans, spans))
    pairs = np.unique(np.repeat(codes, spans) * count + bins)
    replicas = np.bincount(pairs % count, minlength=count)
    done = series.produced_bin - first
    inside = (done >= 0) & (done < count)
    produced = np.bincount(done[inside], weights=series.produced_tokens[inside], minlength=count) / step
    result = []
    for b in range(count):
        if not replicas[b]:
            continue
        n = int(replicas[b])
        result.append(
            {
                "t": float(origin + (first + b) * step),
                "requests": round(float(load_r[b]), 3),
                "tokens": round(float(load_t[b]), 1),
                "replicas": n,
                "tokens_per_s": round(float(produced[b]), 3),
                "requests_per_replica": round(float(load_r[b]) / n, 3),
                "tokens_per_replica": round(float(load_t[b]) / n, 1),
                "tokens_per_s_per_replica": round(float(produced[b]) / n, 3),
            }
        )
    return result


def _days(times: np.ndarray, requests: np.ndarray, tokens: np.ndarray, width: int) -> list[dict[str, Any]]:
    """The busiest minute of each UTC day with traffic, both calibers."""
    days = np.floor(times / 86400).astype(np.int64)
    found = []
    for day in np.unique(days):
        mask = days == day
        if not requests[mask].any():
            continue
        peak_r, _ = _moving_peak(requests[mask], times[mask], width)
        peak_t, _ = _moving_peak(tokens[mask], times[mask], width)
        found.append({"day": float(day * 86400), "requests": round(peak_r, 3), "tokens": round(peak_t, 1)})
    return found


def pool_per_replica(estimate: CapacityEstimate | None, pool_tokens: float | None) -> dict[str, float | None]:
    """A replica's pool per caliber, for comparing the week's peak with: the published
    recommended pool in requests, and in tokens `pool_tokens`, the estimate's
    `recommended_pool_tokens` (the p99.9 of the active-token sum with the pool in flight and the
    traffic's mix; None when the review withholds the token caliber). A peak is compared with it,
    never with a pool scaled from `knee_tokens` (the time-weighted mean: the divisor for 5-minute
    averages, which a peak runs above by the spread of the active-token sum).

    Example: pool 8 requests, 1,600 tokens -> {"requests": 8.0, "tokens": 1600.0}.
    """
    if estimate is None:
        return {"requests": None, "tokens": None}
    pool = estimate.recommended_pool
    requests = float(pool) if pool else None
    tokens = float(pool_tokens) if pool_tokens and pool else None
    return {"requests": requests, "tokens": tokens}


def _needed(load: float | None, pool: float | None) -> int | None:
    # a hair under an integer is that integer: 20 / 5 must not become 5 through rounding
    return None if load is None or not pool else max(0, math.ceil(load / pool - 1e-9))


def _trend(days: list[dict[str, Any]], until: float) -> dict[str, Any]:
    """Least squares over the day peaks; next week's peak is the line's higher end over the next
    TREND_HORIZON_DAYS (a falling trend's peak is at the week's start). Needs two days."""
    if len(days) < 2:
        return {"days": len(days), "reason": f"traffic on {len(days)} day(s); a trend needs 2"}
    x = np.array([d["day"] for d in days]) / 86400.0
    result: dict[str, Any] = {"days": len(days), "reason": None, "per_day": {}, "next_week_peak": {}}
    for caliber in _CALIBERS:
        y = np.array([d[caliber] for d in days], dtype=np.float64)
        slope, intercept = np.polyfit(x, y, 1)
        ahead = [slope * (until / 86400.0 + k) + intercept for k in (0, TREND_HORIZON_DAYS)]
        result["per_day"][caliber] = round(float(slope), 3)
        result["next_week_peak"][caliber] = round(max(0.0, float(max(ahead))), 3)
    return result


def plan(
    load: dict[str, Any],
    estimate: CapacityEstimate | None,
    pool_tokens: float | None,
    replicas_run: int,
    until: float,
) -> dict[str, Any]:
    """Replicas needed at the window's peak and at the trend next week, per caliber, with each
    caliber's pool per replica (pool_per_replica: in tokens `pool_tokens`, None when the
    token capacity is withheld, and then that caliber never binds). `replicas_needed` is the
    count that would have held the SLO at the peak: the binding caliber's, the one needing more
    replicas (ties: the higher peak over pool)."""
    peak = load.get("peak") or {}
    pool = pool_per_replica(estimate, pool_tokens)
    needed = {c: _needed(peak.get(c), pool[c]) for c in _CALIBERS}
    ratios = {c: peak[c] / pool[c] for c in _CALIBERS if peak.get(c) is not None and pool[c]}
    binding = max(ratios, key=lambda c: (needed[c] or 0, ratios[c])) if ratios else None
    trend = _trend(load.get("days") or [], until)
    if trend["reason"] is None:
        ahead = {c: _needed(trend["next_week_peak"][c], pool[c]) for c in _CALIBERS}
        trend["needed"] = ahead
        known = [n for n in ahead.values() if n is not None]
        trend["replicas_needed"] = max(known) if known else None
    return {
        "peak": peak,
        "pool_per_replica": pool,
        "needed": needed,
        "binding_caliber": binding,
        "replicas_needed": needed[binding] if binding else None,
        "replicas_run": replicas_run,
        "trend": trend,
    }


@dataclass
class LittleWindowSums:
    """One model's sums per Little's-law window of `window_s` seconds (collector.report.collect):
    (window index k, busy request-seconds inside it, completions in it, those with an e2e, their
    e2e summed); window k is [k x window_s, (k + 1) x window_s]."""

    window_s: int
    windows: list[tuple[int, float, int, int, float]]


def little_window_s(admitted_span_s: float, e2e_p95_s: float) -> int:
    """The length of a model's Little's-law windows: at least a minute, the plot's bins and
    LITTLE_SPAN p95 durations, rounded up to one of STEPS."""
    step = bin_step(admitted_span_s or 1.0)
    longest = LITTLE_SPAN * e2e_p95_s
    return next((s for s in STEPS if s >= max(step, longest, 60)), STEPS[-1])


def littles_law_windows(
    sums: LittleWindowSums | None, first_admitted: float | None, end: float, tolerance: float
) -> dict[str, Any]:
    """Little's law per window with completions: time-weighted mean in flight against completion
    rate x mean e2e (collector.report.figures.littles_law). A window is at least a minute and
    LITTLE_SPAN p95 durations long, or requests crossing its edges while the load ramps or drains
    would break the law without anything being wrong; over a whole
    week the law holds trivially (a near-idle mean equals a near-idle product), so it is checked
    where it can fail: windows about as long as the plot's bins.

    Returns {"window_s", "windows": [{"t", "measured_inflight", "predicted_inflight", "ratio",
    "consistent"}], "checked", "inconsistent", "worst"}.
    """
    if sums is None or first_admitted is None:
        return {"window_s": None, "windows": [], "checked": 0, "inconsistent": 0, "worst": None}
    window = sums.window_s
    first = math.floor(first_admitted / window)
    found = []
    for k, busy, completions, done, e2e in sums.windows:
        left = float(k * window)
        if k < first or left >= end or not completions:
            continue
        window_law: dict[str, Any] = {"t": left, **littles_law(busy, done, e2e, window, tolerance)}
        found.append(window_law)
    off = [w for w in found if not w["consistent"]]
    worst = max(found, key=lambda w: abs((w["ratio"] or 0.0) - 1.0)) if found else None
    return {
        "window_s": window,
        "windows": found,
        "checked": len(found),
        "inconsistent": len(off),
        "worst": worst,
    }
