"""Adapter to the analysis package's capacity estimates: read the latest, refresh, feed the gauges.

The estimate itself (knee, SLO max, pool, Little's-law check) is computed and stored by
`collector.analysis.estimate`; this module only calls it, imported lazily so the store starts
even where analysis is not installed, and turns results into plain dicts.
"""

from __future__ import annotations

import logging
from datetime import datetime, timedelta
from typing import Any

from collector.store.db import RequestStore

__all__ = ["latest_estimate_dicts", "refresh_estimates", "publish_stored", "as_dict"]

log = logging.getLogger(__name__)


def as_dict(estimate: Any) -> dict[str, Any]:
    """An estimate object or mapping as a plain dict."""
    if hasattr(estimate, "to_dict"):
        return dict(estimate.to_dict())
    if isinstance(estimate, dict):
        return dict(estimate)
    return dict(vars(estimate))


def latest_estimate_dicts(store: RequestStore) -> list[dict[str, Any]]:
    """The newest stored estimate per model, as dicts; [] when none exist yet."""
    try:
        from collector.analysis.estimate import latest_estimates
    except ImportError:
        log.warning("collector.analysis.estimate is not available; no capacity estimates")
        return []
    found = latest_estimates(store)
    items = found.values() if isinstance(found, dict) else found
    return [as_dict(item) for item in items]


def _models(store: RequestStore, since: datetime, until: datetime) -> list[str]:
    rows = store.query("SELECT DISTINCT model FROM requests WHERE admitted_at >= ? AND admitted_at < ? "
                       "AND model IS NOT NULL ORDER BY model", [since, until])
    return [row[0] for row in rows]


def refresh_estimates(store: RequestStore, gauges, now: datetime, *, window: timedelta,
                      slo_ttft_p95_s: float | None = None, profile: str = "interactive") -> list[dict]:
    """Estimate each model active in [now - window, now), save it, then publish the newest
    estimate per model to the gauges; returns the new estimates as dicts."""
    from collector.analysis.estimate import (estimate_capacity, latest_estimates, publish_estimates,
                                             save_estimate)

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
        results.append(as_dict(estimate))
    if gauges is not None:
        publish_estimates(gauges, latest_estimates(store))
    return results


def publish_stored(store: RequestStore, gauges) -> int:
    """At start-up: export the newest stored estimate per model right away; returns how many."""
    try:
        from collector.analysis.estimate import latest_estimates, publish_estimates
    except ImportError:
        return 0
    estimates = latest_estimates(store)
    publish_estimates(gauges, estimates)
    return len(estimates)
