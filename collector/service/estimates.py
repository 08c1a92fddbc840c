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

__all__ = ["latest_estimate_dicts", "refresh_estimates", "as_dict"]

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


def _number(value: Any) -> float | None:
    return float(value) if isinstance(value, (int, float)) else None


def feed_gauges(gauges, estimate: dict[str, Any]) -> None:
    """Set headroom_capacity_* for one estimate dict (both calibers where present)."""
    model = estimate.get("model")
    if gauges is None or not model:
        return
    for caliber in ("requests", "tokens"):
        knee = _number(estimate.get(f"knee_{caliber}"))
        slo_max = _number(estimate.get(f"slo_max_{caliber}"))
        pool = _number(estimate.get(f"recommended_pool_{caliber}",
                                    estimate.get("recommended_pool") if caliber == "requests" else None))
        if knee is not None or slo_max is not None or pool is not None:
            gauges.set(model, caliber, knee=knee, slo_max=slo_max, recommended_pool=pool)


def refresh_estimates(store: RequestStore, gauges, now: datetime, *, window: timedelta,
                      slo_ttft_p95_s: float | None = None, profile: str = "interactive") -> list[dict]:
    """Estimate each model active in [now - window, now), save it, feed the gauges; returns dicts."""
    from collector.analysis.estimate import estimate_capacity, save_estimate

    since = now - window
    results = []
    for model in _models(store, since, now):
        estimate = estimate_capacity(store, model=model, since=since, until=now,
                                     slo_ttft_p95_s=slo_ttft_p95_s, profile=profile)
        save_estimate(store, estimate)
        record = as_dict(estimate)
        feed_gauges(gauges, record)
        results.append(record)
    return results
