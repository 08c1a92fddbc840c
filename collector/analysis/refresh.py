"""The capacity jobs' work: estimate what is new, save it, and publish the decision to the gauges.

    refresh_estimates(store, gauges, now, window=timedelta(hours=24))
        -> [{"model": "m", "source": "traffic", "knee": {...}, ...}]   (the estimates it saved)

Two kinds of new evidence are estimated, then collector.store.decision decides what the gauges
export (a fresh probe beats traffic; traffic only with enough confidence; else nothing):

* probe runs whose rows arrived (through a sidecar, or into this file) and whose
  last request ended at least `probe_quiet_s` plus the run's longest request ago, not estimated
  yet: one estimate per run, from its own rows, so `headroom probe` through a sidecar reaches the
  gauges within seconds;
* estimates another file holds (`estimate_files`: a `headroom probe --db PATH` beside a sidecar
  that owns its own file), copied in when that file is free;
* with `traffic=True`, the passive curve of every model active in [now - window, now), saved
  whatever its confidence (the history shows it), published only when it clears the bar.

collector.store.jobs schedules this: the probe check every few seconds, the traffic refresh every
15 minutes, both once at start-up. A sidecar with its own store hands it over.
"""

from __future__ import annotations

import dataclasses
import functools
import logging
from collections.abc import Callable, Sequence
from datetime import datetime, timedelta
from typing import Any

from collector.analysis.estimate import estimate_probe_run
from collector.analysis.refresh_worker import traffic_estimates, traffic_estimates_isolated
from collector.capacity import DEFAULT_REPLICA_CLASS
from collector.store.capacity_gauges import CapacityGauges
from collector.store.db import RequestStore
from collector.store.decision import PublishPolicy, publish
from collector.store.estimates import import_estimates, save_estimate

__all__ = ["refresh_estimates", "refresh_estimates_isolated", "finished_probe_runs"]

log = logging.getLogger(__name__)

# A row reaches the store when its request ends, so a run's rows cannot say whether a request is
# still running: a closed-loop level sends the next one as its last ends. One that started at the
# last completion may run as long as the run's longest request so far, so the quiet time counts
# from then on; else a run whose requests outlast `quiet_s` (long generations on a slow engine)
# would be examined between two of them, from its warm-up alone or a level short.
_FINISHED_RUNS = """SELECT run_id FROM requests
WHERE source = 'probe' AND run_id IS NOT NULL AND completed_at IS NOT NULL
GROUP BY run_id HAVING max(completed_at) + to_seconds(coalesce(max(e2e_s), 0)) < ?
ORDER BY min(admitted_at)"""
_ESTIMATED_RUNS = "SELECT DISTINCT run_id FROM capacity_estimates WHERE source = 'probe'"
_TABLE = "SELECT count(*) FROM information_schema.tables WHERE table_name = ?"
# every probe run the job looked at, whatever came of it: a run is examined once, so runs with
# nothing to estimate (no measured level) cost one look, not one every few seconds for ever
_EXAMINED_DDL = """CREATE TABLE IF NOT EXISTS probe_runs_examined (
    run_id VARCHAR PRIMARY KEY, examined_at TIMESTAMPTZ NOT NULL, estimated BOOLEAN NOT NULL)"""
_EXAMINED_RUNS = "SELECT run_id FROM probe_runs_examined"
_MARK_EXAMINED = "INSERT OR IGNORE INTO probe_runs_examined VALUES (?, ?, ?)"


def finished_probe_runs(store: RequestStore, now: datetime, quiet_s: float) -> list[str]:
    """Probe runs with no request ended in the last `quiet_s` seconds plus their longest request
    (one may still be running) before `now`, and not examined yet (no saved estimate, no earlier
    look), oldest first.

    The rows are those in the store: a caller whose rows go through a log writer flushes it
    first (refresh_estimates' `rows_written`)."""
    runs = [row[0] for row in store.query(_FINISHED_RUNS, [now - timedelta(seconds=quiet_s)])]
    if not runs:
        return runs
    done: set[str] = set()
    if store.query(_TABLE, ["capacity_estimates"])[0][0]:
        done.update(row[0] for row in store.query(_ESTIMATED_RUNS))
    if store.query(_TABLE, ["probe_runs_examined"])[0][0]:
        done.update(row[0] for row in store.query(_EXAMINED_RUNS))
    return [run for run in runs if run not in done]


def _estimate_probes(
    store: RequestStore,
    now: datetime,
    quiet_s: float,
    slo_ttft_p95_s: float | None,
    profile: str,
    replica_class: str,
) -> list[dict[str, Any]]:
    saved = []
    for run_id in finished_probe_runs(store, now, quiet_s):
        estimate = estimate_probe_run(store, run_id, slo_ttft_p95_s=slo_ttft_p95_s, profile=profile)
        store.execute(_EXAMINED_DDL)
        store.execute(_MARK_EXAMINED, [run_id, now, estimate is not None])
        if estimate is None:
            log.info("probe run %s has no measured levels; nothing to estimate", run_id)
            continue
        estimate = dataclasses.replace(estimate, replica_class=replica_class)
        save_estimate(store, estimate)
        saved.append(estimate.to_dict())
        log.info("probe run %s: knee %s", run_id, estimate.knee.requests)
    return saved


def _estimate_traffic(
    store: RequestStore,
    now: datetime,
    window: timedelta,
    slo_ttft_p95_s: float | None,
    profile: str,
    isolated: bool,
    replica_class: str,
) -> list[dict[str, Any]]:
    estimate = traffic_estimates_isolated if isolated else traffic_estimates
    saved = []
    for made in estimate(store, now, window=window, slo_ttft_p95_s=slo_ttft_p95_s, profile=profile):
        found = dataclasses.replace(made, replica_class=replica_class)
        save_estimate(store, found)
        saved.append(found.to_dict())
    return saved


def refresh_estimates(
    store: RequestStore,
    gauges: CapacityGauges | None,
    now: datetime,
    *,
    window: timedelta,
    slo_ttft_p95_s: float | None = None,
    profile: str = "interactive",
    traffic: bool = True,
    probe_quiet_s: float = 10.0,
    estimate_files: Sequence[str] = (),
    probe_max_age: timedelta = PublishPolicy().probe_max_age,
    isolated: bool = False,
    replica_class: str | Callable[[], str | None] | None = None,
    rows_written: Callable[[], object] | None = None,
) -> list[dict[str, Any]]:
    """Import estimates saved in `estimate_files` (`headroom probe --db` files), estimate
    finished probe runs (and, with `traffic`, each active model's traffic), save them, then
    publish the decision per model to the gauges; returns what was saved here.

    With `isolated`, the traffic curves are computed in a child process
    (collector.analysis.refresh_worker): what a process that also proxies or ingests runs.

    `replica_class` labels the estimates made here (a sidecar passes its own class, or a callable
    that says it once the sidecar has decided; a caller whose rows come from sidecars of any class
    passes nothing: "default").

    `rows_written` returns once every row of a request that ended before it was called is in
    `store`: a sidecar passes its log writer's `flush`. A run is judged finished by the rows in
    the store, and the writer holds rows back (up to its flush interval, seconds on a busy host):
    judged without them, a run is examined from its first rows and estimated a level short, or
    from its warm-up alone as nothing.
    """
    if rows_written is not None:
        rows_written()
    found_class = replica_class() if callable(replica_class) else replica_class
    own_class = found_class or DEFAULT_REPLICA_CLASS
    for path in estimate_files:
        if imported := import_estimates(store, path):
            log.info("imported %d capacity estimates from %s", imported, path)
    saved = _estimate_probes(store, now, probe_quiet_s, slo_ttft_p95_s, profile, own_class)
    if traffic:
        saved += _estimate_traffic(store, now, window, slo_ttft_p95_s, profile, isolated, own_class)
    for decision in publish(store, gauges, now, PublishPolicy(probe_max_age=probe_max_age)):
        log.debug("capacity of %s/%s: %s", decision.model, decision.task_class, decision.reason)
    return saved


# the scheduled job of `headroom run`, whose process also serves requests:
# probe runs and imports stay in-process (a few hundred rows each), the traffic curves go to a
# child process (collector.analysis.refresh_worker)
refresh_estimates_isolated = functools.partial(refresh_estimates, isolated=True)
