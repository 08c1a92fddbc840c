"""The capacity jobs' work: estimate what is new, save it, and publish the decision to the gauges.

    refresh_estimates(store, gauges, now, window=timedelta(hours=24))
        -> [{"model": "m", "source": "traffic", "knee": {...}, ...}]   (the estimates it saved)

Two kinds of new evidence are estimated, then collector.analysis.publish decides what the gauges
export (a fresh probe beats traffic; traffic only with enough confidence; else nothing):

* probe runs whose rows arrived (through a sidecar, `--store-url`, or into this file) and whose
  last request ended at least `probe_quiet_s` ago, not estimated yet: one estimate per run, from
  its own rows, so `headroom probe` through a sidecar reaches the gauges within seconds;
* estimates another file holds (`estimate_files`: a `headroom probe --db PATH` beside a sidecar
  that owns its own file), copied in when that file is free;
* with `traffic=True`, the passive curve of every model active in [now - window, now), saved
  whatever its confidence (the history shows it), published only when it clears the bar.

collector.store.jobs schedules this: the probe check every few seconds, the traffic refresh every
15 minutes, both once at start-up. The store service and a sidecar with its own store hand it over.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from datetime import datetime, timedelta
from typing import Any

from collector.analysis.estimate import estimate_capacity, estimate_probe_run, save_estimate
from collector.analysis.publish import PublishPolicy, publish
from collector.store.capacity_gauges import CapacityGauges
from collector.store.estimates import import_estimates
from collector.store.db import RequestStore

__all__ = ["refresh_estimates", "finished_probe_runs"]

log = logging.getLogger(__name__)
MIN_CLASS_ROWS = 200  # a task class needs this many requests in the window for its own curve

_FINISHED_RUNS = """SELECT run_id FROM requests
WHERE source = 'probe' AND run_id IS NOT NULL AND completed_at IS NOT NULL
GROUP BY run_id HAVING max(completed_at) < ? ORDER BY min(admitted_at)"""
_ESTIMATED_RUNS = "SELECT DISTINCT run_id FROM capacity_estimates WHERE source = 'probe'"
_TABLE = "SELECT count(*) FROM information_schema.tables WHERE table_name = 'capacity_estimates'"


def finished_probe_runs(store: RequestStore, now: datetime, quiet_s: float) -> list[str]:
    """Probe runs whose last request ended more than `quiet_s` before `now` and that have no
    saved estimate yet, oldest first."""
    runs = [row[0] for row in store.query(_FINISHED_RUNS, [now - timedelta(seconds=quiet_s)])]
    if not runs or not store.query(_TABLE)[0][0]:
        return runs
    done = {row[0] for row in store.query(_ESTIMATED_RUNS)}
    return [run for run in runs if run not in done]


def _models(store: RequestStore, since: datetime, until: datetime) -> list[str]:
    rows = store.query("SELECT DISTINCT model FROM requests WHERE source = 'traffic' "
                       "AND admitted_at >= ? AND admitted_at < ? AND model IS NOT NULL "
                       "ORDER BY model", [since, until])
    return [row[0] for row in rows]


def _estimate_probes(store: RequestStore, now: datetime, quiet_s: float,
                     slo_ttft_p95_s: float | None, profile: str) -> list[dict[str, Any]]:
    saved = []
    for run_id in finished_probe_runs(store, now, quiet_s):
        estimate = estimate_probe_run(store, run_id, slo_ttft_p95_s=slo_ttft_p95_s, profile=profile)
        if estimate is None:
            log.info("probe run %s has no measured levels; nothing to estimate", run_id)
            continue
        save_estimate(store, estimate)
        saved.append(estimate.to_dict())
        log.info("probe run %s: knee %s", run_id, estimate.knee.requests)
    return saved


def _classes(store: RequestStore, model: str, since: datetime, until: datetime) -> list[str | None]:
    """None (every request) and each task class with enough traffic for a curve of its own."""
    rows = store.query("SELECT task_class FROM requests WHERE source = 'traffic' AND model = ? "
                       "AND admitted_at >= ? AND admitted_at < ? AND task_class IS NOT NULL "
                       "GROUP BY task_class HAVING count(*) >= ? ORDER BY task_class",
                       [model, since, until, MIN_CLASS_ROWS])
    classes = [row[0] for row in rows]
    return [None, *classes] if len(classes) > 1 else [None]  # one class alone is "all"


def _estimate_traffic(store: RequestStore, now: datetime, window: timedelta,
                      slo_ttft_p95_s: float | None, profile: str) -> list[dict[str, Any]]:
    since, saved = now - window, []
    for model in _models(store, since, now):
        for task_class in _classes(store, model, since, now):
            try:
                estimate = estimate_capacity(store, model=model, since=since, until=now,
                                             slo_ttft_p95_s=slo_ttft_p95_s, profile=profile,
                                             source="traffic", task_class=task_class)
            except ValueError as exc:  # too little traffic for a curve: keep what was there
                log.info("no new traffic estimate for %s/%s: %s", model, task_class or "all", exc)
                continue
            save_estimate(store, estimate)
            saved.append(estimate.to_dict())
    return saved


def refresh_estimates(store: RequestStore, gauges: CapacityGauges | None, now: datetime, *,
                      window: timedelta, slo_ttft_p95_s: float | None = None,
                      profile: str = "interactive", traffic: bool = True,
                      probe_quiet_s: float = 10.0, estimate_files: Sequence[str] = (),
                      probe_max_age: timedelta = PublishPolicy().probe_max_age
                      ) -> list[dict[str, Any]]:
    """Import estimates saved in `estimate_files` (`headroom probe --db` files), estimate
    finished probe runs (and, with `traffic`, each active model's traffic), save them, then
    publish the decision per model to the gauges; returns what was saved here."""
    for path in estimate_files:
        if imported := import_estimates(store, path):
            log.info("imported %d capacity estimates from %s", imported, path)
    saved = _estimate_probes(store, now, probe_quiet_s, slo_ttft_p95_s, profile)
    if traffic:
        saved += _estimate_traffic(store, now, window, slo_ttft_p95_s, profile)
    for decision in publish(store, gauges, now, PublishPolicy(probe_max_age=probe_max_age)):
        log.debug("capacity of %s/%s: %s", decision.model, decision.task_class, decision.reason)
    return saved
