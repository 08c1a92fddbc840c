"""CapacityEstimate: the answer an SRE decides with, its JSON schema, and where it is kept.

An estimate comes from a probe run (measured levels) or from traffic (passive buckets). It holds
the levels, the knee in both calibers, the SLO maximum and the recommended pool for a profile.
`to_dict()` is the stable JSON schema documented in docs/capacity.md (schema_version 1).
Estimates are kept by the store (collector.store.estimates, table `capacity_estimates`) as that
JSON; `save_estimate`, `latest_estimates` and `publish_estimates` here are the typed side of it,
and the newest estimate per model is what the sidecar and the store export as headroom_capacity_*.
"""

from __future__ import annotations

import re
from collections import Counter, defaultdict
from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

from collector.analysis.knee import KneeResult, detect_knee
from collector.analysis.levels import LevelStats, summarize_level
from collector.analysis.passive import passive_curve
from collector.analysis.recommend import recommended_pool
from collector.analysis.slo import Slo, slo_max
from collector.analysis.stats import seconds
from collector.store import estimates as saved
from collector.store.capacity_gauges import CapacityGauges
from collector.store.db import RequestStore

__all__ = [
    "CapacityEstimate",
    "build_estimate",
    "estimate_capacity",
    "estimate_from_probe",
    "estimate_probe_run",
    "probe_levels",
    "save_estimate",
    "latest_estimates",
    "publish_estimates",
    "SCHEMA_VERSION",
]

SCHEMA_VERSION = 1
_LEVEL_IN_ID = re.compile(r"-c(\d+)-\d+(-w)?$")


@dataclass
class CapacityEstimate:
    """Knee, SLO max and recommended pool of one model, with the levels they came from."""

    model: str | None
    source: str  # "probe" | "traffic"
    run_id: str | None
    profile: str
    levels: list[LevelStats]
    knee: KneeResult
    slo: Slo
    slo_max: int | None
    slo_max_tokens: int | None
    recommended_pool: int
    confidence: str = "measured"
    created_at: datetime = field(default_factory=lambda: datetime.now(UTC))
    stopped_early: str | None = None
    extra: dict[str, Any] = field(default_factory=dict)
    task_class: str = "all"  # the requests measured: a class of the workload, or all of them
    replica_class: str = "default"  # the replicas measured: model x hardware x engine configuration

    def to_dict(self) -> dict[str, Any]:
        """The documented JSON schema (docs/capacity.md); flat *_requests/*_tokens for gauges."""
        return {
            "schema_version": SCHEMA_VERSION,
            "run_id": self.run_id,
            "model": self.model,
            "task_class": self.task_class,
            "replica_class": self.replica_class,
            "source": self.source,
            "created_at": self.created_at.isoformat(),
            "profile": self.profile,
            "levels": [level.to_dict() for level in self.levels],
            "knee": self.knee.to_dict(),
            "slo": {
                "ttft_p95_s": self.slo.ttft_p95_s,
                "tpot_p95_s": self.slo.tpot_p95_s,
                "max_error_ratio": self.slo.max_error_ratio,
            },
            "slo_max": self.slo_max,
            "recommended_pool": self.recommended_pool,
            "confidence": self.confidence,
            "stopped_early": self.stopped_early,
            # flat values the capacity gauges read; a knee not reached is a lower bound: not exported
            "knee_requests": self.knee.requests if self.knee.reached else None,
            "knee_tokens": self.knee.tokens if self.knee.reached else None,
            "slo_max_requests": self.slo_max,
            "slo_max_tokens": self.slo_max_tokens,
        } | self.extra

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> CapacityEstimate:
        """Rebuild from to_dict() output (as read back from the store)."""
        levels = [
            LevelStats(**({k: v for k, v in level.items() if k != "windows"} | {"littles_law": None}))
            for level in data["levels"]
        ]
        known = {
            "schema_version",
            "run_id",
            "model",
            "task_class",
            "replica_class",
            "source",
            "created_at",
            "profile",
            "levels",
            "knee",
            "slo",
            "slo_max",
            "recommended_pool",
            "confidence",
            "stopped_early",
            "knee_requests",
            "knee_tokens",
            "slo_max_requests",
            "slo_max_tokens",
        }
        return cls(
            data["model"],
            data["source"],
            data["run_id"],
            data["profile"],
            levels,
            KneeResult(**data["knee"]),
            Slo(**data["slo"]),
            data["slo_max"],
            data.get("slo_max_tokens"),
            data["recommended_pool"],
            data["confidence"],
            datetime.fromisoformat(data["created_at"]),
            data.get("stopped_early"),
            {k: v for k, v in data.items() if k not in known},
            data.get("task_class") or "all",
            data.get("replica_class") or "default",
        )


def build_estimate(
    levels: Sequence[LevelStats],
    *,
    slo: Slo = Slo(),
    profile: str = "interactive",
    model: str | None = None,
    source: str = "probe",
    run_id: str | None = None,
    confidence: str = "measured",
    knee: KneeResult | None = None,
    stopped_early: str | None = None,
) -> CapacityEstimate:
    """Knee, SLO max and pool from a list of levels."""
    ordered = sorted(levels, key=lambda s: s.concurrency)
    knee = knee or detect_knee(ordered)
    best = slo_max(ordered, slo)
    at_best = next((s for s in ordered if s.concurrency == best), None)
    tokens = int(round(at_best.mean_active_tokens)) if at_best and at_best.mean_active_tokens else None
    return CapacityEstimate(
        model,
        source,
        run_id,
        profile,
        ordered,
        knee,
        slo,
        best,
        tokens,
        recommended_pool(knee, best, profile),
        confidence,
        stopped_early=stopped_early,
    )


def probe_levels(rows: Sequence[dict]) -> list[LevelStats]:
    """Levels of one stored probe run, the level read from the request id.

    Each level is measured from its first to its last measured (not warm-up) admission, as the
    probe measured it; every completion inside that window counts towards throughput, warm-up
    rows' too, so a queued level's long requests do not make it look slower than it was.
    """
    grouped: dict[int, list[dict]] = defaultdict(list)
    measured: dict[int, list[float]] = defaultdict(list)
    for row in rows:
        match = _LEVEL_IN_ID.search(row["request_id"])
        if match:
            level = int(match.group(1))
            grouped[level].append(row)
            if not match.group(2):
                measured[level].append(seconds(row["admitted_at"]))
    return [
        summarize_level(
            grouped[level], level, window=(min(times), max(times)) if max(times) > min(times) else None
        )
        for level, times in sorted(measured.items())
    ]


def _latest_run(store: Any, model: str | None, since: datetime | None, until: datetime | None) -> str | None:
    sql, params = "SELECT run_id FROM requests WHERE source = 'probe' AND run_id IS NOT NULL", []
    for clause, value in (("admitted_at >= ?", since), ("admitted_at < ?", until), ("model = ?", model)):
        if value is not None:
            sql += f" AND {clause}"
            params.append(value)
    found = store.query(sql + " ORDER BY admitted_at DESC LIMIT 1", params)
    return found[0][0] if found else None


def _from_probe_run(
    store: Any, run_id: str, model: str | None, slo: Slo, profile: str
) -> CapacityEstimate | None:
    rows = store.query_dicts("SELECT * FROM requests WHERE run_id = ? ORDER BY admitted_at", [run_id])
    levels = probe_levels(rows)
    if not levels:
        return None
    estimate = build_estimate(
        levels, slo=slo, profile=profile, model=model or rows[0]["model"], source="probe", run_id=run_id
    )
    classes = Counter(row.get("task_class") or "all" for row in rows)
    estimate.task_class = classes.most_common(1)[0][0]  # the workload class the probe named
    # the run's own time: a probe stored hours ago must not look fresh when estimated now
    estimate.created_at = max(row["completed_at"] for row in rows if row["completed_at"])
    return estimate


def estimate_probe_run(
    store: Any, run_id: str, *, slo_ttft_p95_s: float | None = None, profile: str = "interactive"
) -> CapacityEstimate | None:
    """The estimate of one stored probe run (rows through a sidecar, a store or a --db file);
    None when it has no measured level."""
    return _from_probe_run(store, run_id, None, Slo(ttft_p95_s=slo_ttft_p95_s), profile)


def _from_traffic(
    store: Any,
    model: str | None,
    since: datetime | None,
    until: datetime | None,
    slo: Slo,
    profile: str,
    task_class: str | None = None,
) -> CapacityEstimate:
    curve = passive_curve(store, "requests", since, until, model, task_class=task_class)
    if curve.knee is None:
        raise ValueError(
            f"too little traffic between {since} and {until} for a capacity curve "
            f"({curve.rows} rows); widen the window"
        )
    tokens = passive_curve(store, "tokens", since, until, model, task_class=task_class)
    estimate = build_estimate(
        curve.usable_buckets(),
        slo=slo,
        profile=profile,
        model=model,
        source="traffic",
        confidence=curve.confidence,
        knee=curve.knee,
    )
    estimate.task_class = task_class or "all"
    estimate.extra = {
        "confidence_reason": curve.confidence_reason,
        "window_s": curve.window_s,
        "token_curve": tokens.to_dict(),
    }
    return estimate


def estimate_capacity(
    store: Any,
    model: str | None = None,
    since: datetime | None = None,
    until: datetime | None = None,
    slo_ttft_p95_s: float | None = None,
    profile: str = "interactive",
    *,
    source: str = "auto",
    task_class: str | None = None,
) -> CapacityEstimate:
    """Estimate from the newest probe run in the window ('auto' prefers it), else from traffic.

    Raises ValueError naming the window when there is too little data for either.
    """
    if source not in ("auto", "probe", "traffic"):
        raise ValueError(f"source {source!r} is not one of auto, probe, traffic")
    slo = Slo(ttft_p95_s=slo_ttft_p95_s)
    run_id = _latest_run(store, model, since, until) if source != "traffic" else None
    estimate = _from_probe_run(store, run_id, model, slo, profile) if run_id else None
    if estimate is not None:
        return estimate
    if source == "probe":
        raise ValueError(f"no probe run in the store between {since} and {until}; run headroom probe")
    return _from_traffic(store, model, since, until, slo, profile, task_class)


def save_estimate(store: RequestStore, estimate: CapacityEstimate) -> str:
    """Save the estimate in the store's capacity_estimates; returns its estimate_id."""
    return saved.save_estimate(store, estimate.to_dict())


def latest_estimates(store: RequestStore) -> list[CapacityEstimate]:
    """The newest saved estimate per model (empty when none were saved yet)."""
    return [CapacityEstimate.from_dict(data) for data in saved.latest_estimates(store)]


def publish_estimates(gauges: CapacityGauges, estimates: Sequence[CapacityEstimate]) -> None:
    """Replace the headroom_capacity_* gauges with these estimates (both calibers)."""
    saved.publish_estimates(gauges, [estimate.to_dict() for estimate in estimates])


def estimate_from_probe(result: Any, *, slo: Slo = Slo(), profile: str = "interactive") -> CapacityEstimate:
    """The estimate of a finished probe run (collector.analysis.probe.ProbeResult)."""
    estimate = build_estimate(
        [level.stats for level in result.levels],
        slo=slo,
        profile=profile,
        model=result.model,
        source="probe",
        run_id=result.run_id,
        stopped_early=result.stopped_early,
    )
    estimate.task_class = result.task_class
    if getattr(result, "engine_max_concurrency", None) is not None:
        estimate.extra["engine_max_concurrency"] = result.engine_max_concurrency
    return estimate
