"""The review's planning numbers: demand over time per replica class, replicas needed, the trend.

Pure over the column arrays of collector.report.collect (POSIX seconds). A request is in flight
from admission to completion; its active tokens are its prompt until the first token, then the
prompt plus what it has generated so far (the sidecar's `headroom_active_tokens`), rising evenly to
prompt + completion at completion. The load of a set of replicas is sampled on a regular grid
(`dt`, 1 s or finer for short spans) from those intervals, exactly as the sum over requests.

    profile(rows, start, end)      the load of one replica class: per-bin fleet and per-replica
                                   load, throughput, replicas serving, the busiest minute, day peaks
    plan(peak, estimate, ...)      replicas needed at the peak, per caliber, which caliber binds,
                                   and at the trend next week (DOMAIN §14: ceil(demand / pool))
    littles_law_windows(rows, ..)  Little's law per window long enough for it to hold

Example: 20 clients in a closed loop on one replica whose published pool is 6 requests ->
peak 20 requests, needed ceil(20 / 6) = 4 replicas (ran 1), binding caliber requests.
"""

from __future__ import annotations

import math
from datetime import UTC, datetime
from typing import Any

import numpy as np

from collector.report.figures import littles_law

__all__ = [
    "STEPS",
    "MAX_BINS",
    "DEMAND_WINDOW_S",
    "LITTLE_SPAN",
    "TREND_HORIZON_DAYS",
    "bin_step",
    "load_at",
    "profile",
    "plan",
    "pool_per_replica",
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
_CALIBERS = ("requests", "tokens")


def bin_step(span_s: float) -> int:
    """Bin length in seconds for a span: bin_step(3600) -> 15, bin_step(7 * 86400) -> 3600."""
    return next((s for s in STEPS if span_s / s <= MAX_BINS), STEPS[-1])


def _intervals(rows: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """Rows with an admission and a completion: (a, f, c, prompt, completion, instance)."""
    a, c = rows["admitted"], rows["completed"]
    known = ~np.isnan(a) & ~np.isnan(c) & (c >= a)
    a, c = a[known], c[known]
    f = rows["first_token"][known]
    f = np.where(np.isnan(f) | (f < a) | (f > c), c, f)
    return {
        "a": a,
        "f": f,
        "c": c,
        "p": rows["prompt_tokens"][known],
        "g": rows["completion_tokens"][known],
        "instance": rows["instance"][known],
    }


def _counted(times: np.ndarray, at: np.ndarray, weights: np.ndarray) -> np.ndarray:
    """Σ weights of the events at or before each time."""
    order = np.argsort(at, kind="stable")
    total = np.concatenate([[0.0], np.cumsum(weights[order])])
    return total[np.searchsorted(at[order], times, side="right")]


def load_at(iv: dict[str, np.ndarray], times: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(requests in flight, active tokens) at each time, over the intervals of `_intervals`.

    Example: one request admitted at 0, first token at 1, done at 3 with prompt 10, completion 20:
    load_at(.., [0.5, 2, 3]) -> ([1, 1, 0], [10, 20, 0]).
    """
    a, f, c, p, g = iv["a"], iv["f"], iv["c"], iv["p"], iv["g"]
    ones = np.ones_like(a)
    requests = _counted(times, a, ones) - _counted(times, c, ones)
    slope = np.where(c > f, g / np.where(c > f, c - f, 1.0), 0.0)
    # prompt from admission to completion, plus slope x (t - f) from the first token to completion
    tokens = _counted(times, a, p) - _counted(times, c, p)
    tokens += _counted(times, f, slope) * times - _counted(times, f, slope * f)
    tokens -= _counted(times, c, slope) * times - _counted(times, c, slope * f)
    return requests, np.clip(tokens, 0.0, None)


def _moving_peak(values: np.ndarray, times: np.ndarray, width: int) -> tuple[float, float]:
    """(highest mean over `width` consecutive samples, the time its window starts)."""
    width = max(1, min(width, values.size))
    sums = np.concatenate([[0.0], np.cumsum(values)])
    means = (sums[width:] - sums[:-width]) / width
    best = int(np.argmax(means))
    return float(means[best]), float(times[best])


def _iso(seconds: float) -> str:
    return datetime.fromtimestamp(seconds, UTC).replace(microsecond=0).isoformat()


def profile(
    rows: dict[str, np.ndarray], start: float, end: float, before: float | None = None
) -> dict[str, Any]:
    """The load of one replica class's rows over [start, end), and its day peaks from `before`.

    rows: the columns of the current and (when `before` is given) the previous window together.
    Returns {"step", "dt", "bins": [{"t", "requests", "tokens", "replicas", "tokens_per_s",
    "requests_per_replica", "tokens_per_replica", "tokens_per_s_per_replica"}], "peak": {"requests",
    "tokens", "requests_at", "tokens_at"}, "days": [{"day", "requests", "tokens"}]}; bins and peak
    cover [start, end) only, days cover [before or start, end).
    """
    iv = _intervals(rows)
    empty: dict[str, Any] = {"step": None, "dt": None, "bins": [], "peak": None, "days": []}
    if iv["a"].size == 0:
        return empty
    first, last = (
        max(float(iv["a"].min()), before if before is not None else start),
        min(float(iv["c"].max()), end),
    )
    now = (iv["a"] >= start) & (iv["a"] < end)
    if not now.any() or last <= first:
        return empty
    span_now = min(float(iv["c"][now].max()), end) - float(iv["a"][now].min())
    step = bin_step(max(span_now, 1.0))
    dt = max(min(1.0, step / 10), (last - first) / _MAX_SAMPLES)
    origin = math.floor(first / step) * step
    # sample relative to the origin (float precision of t x slope)
    shifted = {k: (v - origin if k in ("a", "f", "c") else v) for k, v in iv.items()}
    times = np.arange(first - origin + dt / 2, last - origin, dt)
    requests, tokens = load_at(shifted, times)
    result: dict[str, Any] = {"step": step, "dt": dt}
    current = (times + origin >= start) & (times + origin < end)
    result["bins"] = _bins(shifted, times[current], requests[current], tokens[current], step, dt, origin)
    width = round(DEMAND_WINDOW_S / dt)
    peak: dict[str, Any] = {}
    for caliber, values in zip(_CALIBERS, (requests, tokens)):
        value, at = _moving_peak(values[current], times[current], width)
        peak[caliber], peak[f"{caliber}_at"] = round(value, 3), _iso(at + origin)
    result["peak"] = peak
    result["days"] = _days(times + origin, requests, tokens, width)
    return result


def _bins(
    iv: dict[str, np.ndarray],
    times: np.ndarray,
    requests: np.ndarray,
    tokens: np.ndarray,
    step: int,
    dt: float,
    origin: float,
) -> list[dict[str, Any]]:
    """Per bin: mean load over the whole bin, replicas serving in it, tokens/s of its completions."""
    if times.size == 0:
        return []
    index = np.floor(times / step).astype(np.int64)
    first, count = int(index.min()), int(index.max() - index.min() + 1)
    per_bin = step / dt  # samples in a whole bin: idle parts of a bin count as zero load
    load_r = np.bincount(index - first, weights=requests, minlength=count) / per_bin
    load_t = np.bincount(index - first, weights=tokens, minlength=count) / per_bin
    # replicas serving: instances with a request in flight at some time of the bin
    lo = np.floor(iv["a"] / step).astype(np.int64) - first
    hi = np.floor(iv["c"] / step).astype(np.int64) - first
    keep = (hi >= 0) & (lo < count)
    lo, hi = np.clip(lo[keep], 0, count - 1), np.clip(hi[keep], 0, count - 1)
    _, codes = np.unique(iv["instance"][keep].astype(str), return_inverse=True)
    spans = hi - lo + 1
    bins = np.repeat(lo, spans) + (np.arange(spans.sum()) - np.repeat(np.cumsum(spans) - spans, spans))
    pairs = np.unique(np.repeat(codes, spans) * count + bins)
    replicas = np.bincount(pairs % count, minlength=count)
    done = np.floor(iv["c"] / step).astype(np.int64) - first
    inside = (done >= 0) & (done < count)
    produced = np.bincount(done[inside], weights=(iv["p"] + iv["g"])[inside], minlength=count) / step
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


def pool_per_replica(estimate: dict[str, Any] | None, token_knee: float | None) -> dict[str, float | None]:
    """A replica's pool per caliber: the published recommended pool in requests, and in tokens
    the token knee at the request pool's share of the request knee (knee_tokens x pool /
    knee_requests), as the fleet rules and the KEDA token trigger convert it."""
    if not estimate:
        return {"requests": None, "tokens": None}
    pool, knee = estimate.get("recommended_pool"), estimate.get("knee_requests")
    requests = float(pool) if pool else None
    tokens = float(token_knee) * float(pool) / float(knee) if token_knee and pool and knee else None
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
    estimate: dict[str, Any] | None,
    token_knee: float | None,
    replicas_run: int,
    until: float,
) -> dict[str, Any]:
    """Replicas needed at the window's peak and at the trend next week, per caliber; the binding
    caliber is the one needing more replicas (ties: the higher peak over pool)."""
    peak = load.get("peak") or {}
    pool = pool_per_replica(estimate, token_knee)
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


def littles_law_windows(
    rows: dict[str, np.ndarray], start: float, end: float, step: int | None, tolerance: float
) -> dict[str, Any]:
    """Little's law per window with traffic: time-weighted mean in flight against completion rate
    x mean e2e (collector.report.figures.littles_law). A window is at least a minute and
    LITTLE_SPAN p95 durations long, or requests crossing its edges while the load ramps or drains
    would break the law without anything being wrong; over a whole
    week the law holds trivially (a near-idle mean equals a near-idle product), so it is checked
    where it can fail: windows about as long as the plot's bins.

    Returns {"window_s", "windows": [{"t", "measured_inflight", "predicted_inflight", "ratio",
    "consistent"}], "checked", "inconsistent", "worst"}.
    """
    e2e = rows["e2e_s"][~np.isnan(rows["e2e_s"])]
    if e2e.size == 0 or step is None:
        return {"window_s": None, "windows": [], "checked": 0, "inconsistent": 0, "worst": None}
    longest = LITTLE_SPAN * float(np.quantile(e2e, 0.95))
    window = next((s for s in STEPS if s >= max(step, longest, 60)), STEPS[-1])
    admitted, completed = rows["admitted"], rows["completed"]
    first = math.floor(float(np.nanmin(admitted)) / window) * window
    found = []
    for left in np.arange(max(first, math.floor(start / window) * window), end, window):
        right = float(left + window)
        overlaps = (admitted < right) & (completed > left)
        if not ((completed >= left) & (completed <= right)).any():
            continue
        law = littles_law(
            admitted[overlaps], completed[overlaps], rows["e2e_s"][overlaps], float(left), right, tolerance
        )
        window_law: dict[str, Any] = {"t": float(left), **law}
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
