"""What `headroom demo` reports, computed from the DuckDB log the sidecar wrote.

Per concurrency level: request counts, 429s, output tokens/s and exact p50/p95/p99 TTFT and TPOT
(`quantile_cont`, docs/domain.md §11: the request log is the ground truth); the time course of both
calibers from the sidecar's /metrics; and, where the capacity analysis is built, the knee in both
calibers and the recommended pool (collector.analysis), else the raw table alone.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any, NotRequired, TypedDict

from collector.analysis.estimate import build_estimate, tokens_in_store
from collector.analysis.levels import summarize_level
from collector.capacity import Slo
from collector.sim.workload import CaliberSample
from collector.store.capacity_gauges import CapacityGauges
from collector.store.db import RequestStore
from collector.store.decision import publish
from collector.store.estimates import save_estimate

__all__ = [
    "LevelWindow",
    "LevelRow",
    "CaliberCourse",
    "CapacitySummary",
    "DemoSummary",
    "level_table",
    "caliber_course",
    "capacity_estimate",
    "sparkline",
    "LEVEL_SQL",
    "TOKENS_SQL",
]

# One level = requests admitted while its workers were sending: [start, stop).
LEVEL_SQL = """
SELECT count(*) AS requests,
       count(*) FILTER (WHERE outcome = 'ok') AS ok,
       count(*) FILTER (WHERE outcome = 'rate_limited') AS rate_limited,
       quantile_cont(ttft_s, [0.5, 0.95, 0.99]) FILTER (WHERE outcome = 'ok') AS ttft,
       quantile_cont(tpot_s, [0.5, 0.95, 0.99]) FILTER (WHERE outcome = 'ok') AS tpot,
       max(inflight_at_admit) AS inflight_at_admit_max,
       max(active_tokens_at_admit) AS active_tokens_at_admit_max
FROM requests WHERE admitted_at >= ? AND admitted_at < ?
"""
# Throughput = output tokens of requests completing inside the measurement window / its length.
TOKENS_SQL = """
SELECT coalesce(sum(completion_tokens), 0) FROM requests
WHERE outcome = 'ok' AND completed_at >= ? AND completed_at < ?
"""
_BARS = "▁▂▃▄▅▆▇█"


@dataclass(frozen=True)
class LevelWindow:
    """When one level ran: start, end of warm-up, workers stopped sending, last request done."""

    concurrency: int
    start: datetime
    measure_from: datetime
    stop: datetime
    end: datetime

    def to_dict(self) -> dict[str, Any]:
        """ISO-8601 times for JSON."""
        return {
            "concurrency": self.concurrency,
            "start": self.start.isoformat(),
            "measure_from": self.measure_from.isoformat(),
            "stop": self.stop.isoformat(),
            "end": self.end.isoformat(),
        }


class LevelRow(TypedDict):
    """One level of the demo's table: its window (ISO-8601) and what the requests table says."""

    concurrency: int
    start: str
    measure_from: str
    stop: str
    end: str
    requests: int
    ok: int
    rate_limited: int
    inflight_at_admit_max: int | None
    active_tokens_at_admit_max: int | None
    ttft_p50_s: float | None
    ttft_p95_s: float | None
    ttft_p99_s: float | None
    tpot_p50_s: float | None
    tpot_p95_s: float | None
    tpot_p99_s: float | None
    output_tokens_per_s: float | None


class CaliberCourse(TypedDict):
    """Both calibers over the run: peaks overall and per level, and every sample."""

    peak_inflight: float
    peak_active_tokens: float
    per_level_peaks: dict[int, dict[str, float]]
    time_course: list[dict[str, float]]


class Published(TypedDict):
    knee_requests: int | None
    reason: str


class CapacitySummary(TypedDict):
    """The capacity verdict of the demo's levels and what the shared decision published."""

    knee: dict[str, Any]
    token_capacity: dict[str, Any] | None  # the time-weighted figures every reader publishes
    slo_max: int | None
    recommended_pool: int
    profile: str
    published: Published


class SimSettings(TypedDict):
    max_num_seqs: int
    kv_cache_tokens: int
    speed: float
    seed: int


class DemoSummary(TypedDict):
    """What `headroom demo` prints and --json writes."""

    db: str
    sidecar_url: str
    sim_url: str
    sim: SimSettings
    levels: list[LevelRow]
    calibers: CaliberCourse
    capacity: CapacitySummary | None
    serving: bool
    json: NotRequired[str]  # where --json wrote it


def _quantiles(values: Sequence[float] | None) -> tuple[float | None, float | None, float | None]:
    if not values:
        return None, None, None
    p50, p95, p99 = values
    return p50, p95, p99


def level_table(store: RequestStore, windows: Sequence[LevelWindow]) -> list[LevelRow]:
    """One row per level, every number straight from the requests table."""
    table = []
    for window in windows:
        row = store.query_dicts(LEVEL_SQL, [window.start, window.stop])[0]
        tokens = store.query(TOKENS_SQL, [window.measure_from, window.stop])[0][0]
        span_s = (window.stop - window.measure_from).total_seconds()
        ttft, tpot = _quantiles(row["ttft"]), _quantiles(row["tpot"])
        table.append(
            LevelRow(
                concurrency=window.concurrency,
                start=window.start.isoformat(),
                measure_from=window.measure_from.isoformat(),
                stop=window.stop.isoformat(),
                end=window.end.isoformat(),
                requests=row["requests"],
                ok=row["ok"],
                rate_limited=row["rate_limited"],
                inflight_at_admit_max=row["inflight_at_admit_max"],
                active_tokens_at_admit_max=row["active_tokens_at_admit_max"],
                ttft_p50_s=ttft[0],
                ttft_p95_s=ttft[1],
                ttft_p99_s=ttft[2],
                tpot_p50_s=tpot[0],
                tpot_p95_s=tpot[1],
                tpot_p99_s=tpot[2],
                output_tokens_per_s=float(tokens) / span_s if span_s > 0 else None,
            )
        )
    return table


def sparkline(values: Sequence[float], width: int = 60) -> str:
    """Unicode bars scaled to the maximum, at most `width` wide. Example: [0, 5, 10] -> '▁▄█'."""
    if not values:
        return ""
    step = max(1, -(-len(values) // width))
    points = [max(values[i : i + step]) for i in range(0, len(values), step)]
    top = max(points) or 1.0
    return "".join(_BARS[min(len(_BARS) - 1, int(v / top * (len(_BARS) - 1) + 0.5))] for v in points)


def caliber_course(samples: Sequence[CaliberSample], levels: Sequence[int]) -> CaliberCourse:
    """Peaks overall and per level, plus the sampled time course of both calibers."""

    def series(key: str, chosen: Sequence[CaliberSample] = samples) -> list[float]:
        return [s.values.get(key, 0.0) for s in chosen]

    per_level: dict[int, dict[str, float]] = {}
    for level in levels:
        chosen = [s for s in samples if s.level == level]
        per_level[level] = {
            key: max(series(key, chosen), default=0.0)
            for key in ("inflight", "active_tokens", "engine_waiting", "kv_usage")
        }
    return {
        "peak_inflight": max(series("inflight"), default=0.0),
        "peak_active_tokens": max(series("active_tokens"), default=0.0),
        "per_level_peaks": per_level,
        "time_course": [{"t_s": round(s.t_s, 3), "level": s.level} | s.values for s in samples],
    }


def capacity_estimate(
    store: RequestStore,
    windows: Sequence[LevelWindow],
    model: str,
    slo_ttft_p95_s: float | None,
    gauges: CapacityGauges | None = None,
    kv_capacity_tokens: int | None = None,
) -> CapacitySummary | None:
    """Knee and recommended pool from collector.analysis (saved and published); None under 2 levels."""
    levels = []
    for w in windows:
        rows = store.query_dicts(
            "SELECT * FROM requests WHERE admitted_at >= ? AND admitted_at < ? ORDER BY admitted_at",
            [w.start, w.end],
        )
        if rows:
            levels.append(
                summarize_level(rows, w.concurrency, window=(w.measure_from.timestamp(), w.stop.timestamp()))
            )
    if len(levels) < 2:
        return None
    # the demo's load is a concurrency gradient: a probe run, by what it measures
    run_id = f"demo-{windows[0].start:%Y%m%dT%H%M%SZ}"
    # the token caliber in the gauge's units, with the demo load's own length mix (the one figure
    # the gauges, the alerts and the review read: collector.analysis.token_knee)
    estimate = build_estimate(
        levels,
        slo=Slo(ttft_p95_s=slo_ttft_p95_s),
        model=model,
        source="probe",
        run_id=run_id,
        tokens=tokens_in_store(store, model=model, at=None, kv_capacity_tokens=kv_capacity_tokens),
    )
    save_estimate(store, estimate)
    # what is published comes from the one decision every reader shares (collector.store.decision)
    decision = next(d for d in publish(store, gauges, datetime.now(UTC)) if d.model == model)
    return {
        "knee": estimate.knee.to_dict(),
        "token_capacity": estimate.token_capacity,
        "slo_max": estimate.slo_max,
        "recommended_pool": estimate.recommended_pool,
        "profile": estimate.profile,
        "published": {"knee_requests": decision.knee_requests, "reason": decision.reason},
    }
