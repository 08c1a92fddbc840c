"""The store's capacity job: re-estimate every model active in a window, save, publish the gauges.

    refresh_estimates(store, gauges, now, window=timedelta(hours=24))
        -> [{"model": "m", "knee": {...}, "recommended_pool": 5, ...}]   (the new estimates)

A model with too little traffic for a curve keeps its previous estimate (logged, not raised). The
newest saved estimate per model then replaces the headroom_capacity_* gauges. collector.store.jobs
schedules this function; the store service and a sidecar with its own store hand it over.
"""

from __future__ import annotations

import logging
from datetime import datetime, timedelta
from typing import Any

from collector.analysis.estimate import estimate_capacity, latest_estimates, publish_estimates, save_estimate
from collector.store.capacity_gauges import CapacityGauges
from collector.store.db import RequestStore

__all__ = ["refresh_estimates"]

log = logging.getLogger(__name__)


def _models(store: RequestStore, since: datetime, until: datetime) -> list[str]:
    rows = store.query("SELECT DISTINCT model FROM requests WHERE admitted_at >= ? AND admitted_at < ? "
                       "AND model IS NOT NULL ORDER BY model", [since, until])
    return [row[0] for row in rows]


def refresh_estimates(store: RequestStore, gauges: CapacityGauges | None, now: datetime, *,
                      window: timedelta, slo_ttft_p95_s: float | None = None,
                      profile: str = "interactive") -> list[dict[str, Any]]:
    """Estimate each model active in [now - window, now), save it, then publish the newest
    estimate per model to the gauges; returns the new estimates as dicts."""
    since = now - window
    results = []
    for model in _models(store, since, now):
        try:
            estimate = estimate_capacity(store, model=model, since=since, until=now,
                                         slo_ttft_p95_s=slo_ttft_p95_s, profile=profile)
        except ValueError as exc:  # too little traffic for a curve: keep the previous estimate
            log.info("no new capacity estimate for %s: %s", model, exc)
            continue
        save_estimate(store, estimate)
        results.append(estimate.to_dict())
    if gauges is not None:
        publish_estimates(gauges, latest_estimates(store))
    return results
