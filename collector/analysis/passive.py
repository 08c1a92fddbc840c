"""Passive capacity curves from live traffic: no load test, just the request log (docs/domain.md §7).

Every `source='traffic'` row carries the concurrency it saw at admission, in both calibers
(`inflight_at_admit`, `active_tokens_at_admit`). Method:

1. Latency per bucket: rows are bucketed on that concurrency by the nearest power of two (log
   scale, so 6..11 -> 8) and each bucket gets n, p50/p95/p99 TTFT, TPOT and e2e, error ratios.
2. Throughput per bucket, from time windows, never from single requests: [since, until) is cut
   into windows of `window_s`; each window gets its time-weighted mean concurrency (from the rows'
   admit/first-token/complete stamps; generated tokens grow linearly over the decode) and its token
   throughput (prompt tokens counted when the first token arrives, completion tokens spread
   evenly over the decode); windows are bucketed by that mean and averaged per bucket.
3. The knee rule and Kneedle (knee.py) run on the bucket table. The knee carries a confidence:
   high (>= 100 requests and >= 5 windows in the knee bucket and the one above), medium (>= 20
   and >= 2), else low; and "not reached" when no bucket above the knee tripped the rule.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from collector.analysis.knee import KneeResult, detect_knee
from collector.analysis.levels import LevelStats
from collector.analysis.stats import mean, percentiles, power_of_two_bucket, seconds

__all__ = ["PassiveCurve", "passive_curve", "traffic_rows", "CALIBER_COLUMNS"]

Row = Mapping[str, Any]
CALIBER_COLUMNS = {"requests": "inflight_at_admit", "tokens": "active_tokens_at_admit"}
MIN_BUCKET_SAMPLES = 5


@dataclass
class PassiveCurve:
    """The per-bucket table of one caliber, the knee found on it, and how much to trust it."""

    caliber: str
    window_s: float
    buckets: list[LevelStats]
    windows_per_bucket: dict[int, int]
    knee: KneeResult | None
    confidence: str
    confidence_reason: str
    rows: int = 0
    extra: dict[str, Any] = field(default_factory=dict)

    def usable_buckets(self) -> list[LevelStats]:
        """Buckets with enough requests and at least one window: the ones the knee is judged on."""
        return [b for b in self.buckets
                if b.samples >= MIN_BUCKET_SAMPLES and self.windows_per_bucket.get(b.concurrency)]

    def to_dict(self) -> dict[str, Any]:
        """Plain dict for JSON: levels are the buckets, each with its window count."""
        return {"caliber": self.caliber, "window_s": self.window_s, "rows": self.rows,
                "levels": [b.to_dict() | {"windows": self.windows_per_bucket.get(b.concurrency, 0)}
                           for b in self.buckets],
                "knee": self.knee.to_dict() if self.knee else None,
                "confidence": self.confidence, "confidence_reason": self.confidence_reason}


def traffic_rows(store_or_rows: Any, since: datetime | None, until: datetime | None,
                 model: str | None = None, source: str = "traffic") -> list[dict]:
    """Rows of `source` admitted in [since, until) for `model`, from a RequestStore or a list."""
    if hasattr(store_or_rows, "query_dicts"):
        sql, params = "SELECT * FROM requests WHERE source = ?", [source]
        for clause, value in (("admitted_at >= ?", since), ("admitted_at < ?", until),
                              ("model = ?", model)):
            if value is not None:
                sql += f" AND {clause}"
                params.append(value)
        return store_or_rows.query_dicts(sql + " ORDER BY admitted_at", params)
    lo, hi = seconds(since), seconds(until)
    return [dict(r) for r in store_or_rows
            if r.get("source", source) == source and (model is None or r.get("model") == model)
            and (lo is None or seconds(r["admitted_at"]) >= lo)
            and (hi is None or seconds(r["admitted_at"]) < hi)]


def _overlap(a: float, b: float, lo: float, hi: float) -> float:
    return max(0.0, min(b, hi) - max(a, lo))


def _window_load(rows: Sequence[Row], lo: float, hi: float, caliber: str) -> tuple[float, float]:
    """(time-weighted mean concurrency, total tokens/s) of one window."""
    busy = tokens = 0.0
    for r in rows:
        start, end = seconds(r["admitted_at"]), seconds(r.get("completed_at"))
        if start is None or end is None or end <= lo or start >= hi:
            continue
        first = seconds(r.get("first_token_at")) or end
        prompt, completion = r.get("prompt_tokens") or 0, r.get("completion_tokens") or 0
        decode = max(end - first, 1e-9)
        if caliber == "requests":
            busy += _overlap(start, end, lo, hi)
        else:  # prompt held from admission; generated tokens grow linearly over the decode
            a, b = max(first, lo), min(end, hi)
            grown = completion * ((a - first) + (b - first)) / 2 / decode * max(b - a, 0.0)
            busy += prompt * _overlap(start, end, lo, hi) + grown
        if r.get("outcome") == "ok":
            tokens += prompt if lo <= first < hi else 0
            tokens += completion * _overlap(first, end, lo, hi) / decode
    return busy / (hi - lo), tokens / (hi - lo)


def _window_throughput(rows: Sequence[Row], caliber: str, window_s: float,
                       span: tuple[float, float]) -> dict[int, list[float]]:
    by_bucket: dict[int, list[float]] = defaultdict(list)
    lo = span[0]
    while lo + window_s <= span[1] + 1e-9:
        load, rate = _window_load(rows, lo, lo + window_s, caliber)
        bucket = power_of_two_bucket(load)
        if bucket is not None:
            by_bucket[bucket].append(rate)
        lo += window_s
    return by_bucket


def _bucket_stats(bucket: int, rows: Sequence[Row], rates: list[float], window_s: float) -> LevelStats:
    ok = [r for r in rows if r.get("outcome") == "ok"]
    ttft, tpot, e2e = (percentiles([r.get(k) for r in ok]) for k in ("ttft_s", "tpot_s", "e2e_s"))
    n = len(rows)
    return LevelStats(
        concurrency=bucket, samples=n, window_s=len(rates) * window_s,
        requests_per_s=0.0, output_tokens_per_s=0.0, total_tokens_per_s=mean(rates) or 0.0,
        ttft_p50_s=ttft[0], ttft_p95_s=ttft[1], ttft_p99_s=ttft[2],
        tpot_p50_s=tpot[0], tpot_p95_s=tpot[1], tpot_p99_s=tpot[2],
        e2e_p50_s=e2e[0], e2e_p95_s=e2e[1], e2e_p99_s=e2e[2],
        rate_limited_ratio=sum(r.get("outcome") == "rate_limited" for r in rows) / n,
        timeout_ratio=sum(r.get("outcome") == "timeout" for r in rows) / n,
        error_ratio=1 - len(ok) / n,
        mean_active_tokens=mean(r.get("active_tokens_at_admit") for r in rows), littles_law=None)


def _confidence(knee: KneeResult | None, buckets: list[LevelStats],
                windows: dict[int, int]) -> tuple[str, str]:
    if knee is None:
        return "none", "too few buckets with samples and windows"
    if not knee.reached:
        return "low", f"traffic never crossed the knee: no bucket above {knee.requests} tripped the rule"
    around = [b for b in buckets if b.concurrency >= knee.requests][:2]
    n = min(b.samples for b in around)
    w = min(windows.get(b.concurrency, 0) for b in around)
    level = "high" if n >= 100 and w >= 5 else "medium" if n >= 20 and w >= 2 else "low"
    return level, f"{n} requests and {w} windows in the thinnest of buckets {[b.concurrency for b in around]}"


def passive_curve(store_or_rows: Any, caliber: str, since: datetime | None = None,
                  until: datetime | None = None, model: str | None = None, *,
                  window_s: float | None = None) -> PassiveCurve:
    """Capacity curve of `caliber` ('requests' or 'tokens') from traffic rows in [since, until)."""
    if caliber not in CALIBER_COLUMNS:
        raise ValueError(f"caliber {caliber!r} is not one of {', '.join(CALIBER_COLUMNS)}")
    rows = [r for r in traffic_rows(store_or_rows, since, until, model)
            if r.get(CALIBER_COLUMNS[caliber]) is not None and r.get("completed_at") is not None]
    if not rows:
        window = f" between {since or 'the first row'} and {until or 'now'}" if since or until else ""
        raise ValueError(f"no traffic rows with {CALIBER_COLUMNS[caliber]}{window}"
                         f"{f' for model {model!r}' if model else ''}; widen the window or send "
                         "traffic through the sidecar first")
    span = (seconds(since) or min(seconds(r["admitted_at"]) for r in rows),
            seconds(until) or max(seconds(r["completed_at"]) for r in rows))
    window_s = window_s or max(1.0, 3 * (percentiles([r.get("e2e_s") for r in rows], (0.5,))[0] or 1))
    rates = _window_throughput(rows, caliber, window_s, span)
    grouped: dict[int, list[Row]] = defaultdict(list)
    for r in rows:
        grouped[power_of_two_bucket(r[CALIBER_COLUMNS[caliber]]) or 1].append(r)
    buckets = [_bucket_stats(b, grouped[b], rates.get(b, []), window_s) for b in sorted(grouped)]
    usable = [b for b in buckets if b.samples >= MIN_BUCKET_SAMPLES and rates.get(b.concurrency)]
    windows = {b: len(v) for b, v in rates.items()}
    knee = detect_knee(usable) if len(usable) >= 2 else None
    confidence, reason = _confidence(knee, usable, windows)
    return PassiveCurve(caliber, window_s, buckets, windows, knee, confidence, reason, len(rows))
