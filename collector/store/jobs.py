"""Scheduled jobs of the store: hourly rollup, daily Parquet export + retention, capacity-estimate
refresh feeding the headroom_capacity_* gauges, and the weekly capacity review.

The store owns the schedule and its own upkeep (rollup, retention). The work of the other two
lives above the store and is handed in by whoever runs the jobs (a sidecar with its in-process
store): `refresh` is collector.analysis.refresh.refresh_estimates and
`review` is collector.report.review.write_report_files. A job whose work is not given is left out.

Each job is a function of `now`, so tests drive it with an injected clock: `job_table()` lists
(name, trigger, run) and `run_due()` fires every trigger between two instants in order.
`build_scheduler()` wraps the same table in an APScheduler BackgroundScheduler whose jobs read
`settings.clock()`; the store's lifespan (and `headroom run` with an in-process store) starts it.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any, Protocol

from apscheduler.schedulers.background import BackgroundScheduler
from apscheduler.triggers.base import BaseTrigger
from apscheduler.triggers.cron import CronTrigger
from apscheduler.triggers.interval import IntervalTrigger

from collector.store.capacity_gauges import CapacityGauges
from collector.store.db import RequestStore
from collector.store.decision import PublishPolicy
from collector.store.retention import export_and_expire
from collector.store.rollup import rollup_recent
from collector.timewin import parse_duration, utc_now

__all__ = [
    "JobSettings",
    "ScheduledJob",
    "RefreshEstimates",
    "WriteReport",
    "job_table",
    "build_scheduler",
    "run_due",
    "parse_weekly_cron",
]

log = logging.getLogger(__name__)
_WEEKLY = re.compile(r"^(mon|tue|wed|thu|fri|sat|sun)\s+([01]?\d|2[0-3]):([0-5]\d)$")


@dataclass
class JobSettings:
    """What the jobs do and when. Times are UTC unless `timezone` says otherwise."""

    export_dir: Path | None = None  # None: no Parquet export and no retention
    retention_days: int = 30
    report_dir: Path | None = None  # None: no weekly report
    report_cron: str = "mon 09:00"  # "<day of week> HH:MM"
    report_since: str = "7d"
    estimate_interval_s: float = 900.0  # the traffic refresh (passive curves)
    estimate_window: str = "24h"
    probe_check_interval_s: float = 5.0  # finished probe runs -> estimate -> gauges
    probe_quiet_s: float = 10.0  # a run is finished this long after its last request (+ its longest)
    estimate_files: tuple[str, ...] = ()  # other DuckDB files whose estimates to import
    probe_max_age: str = "7d"  # a probe estimate beats traffic's this long
    slo_ttft_p95_s: float | None = None
    profile: str = "interactive"
    timezone: str = "UTC"
    clock: Callable[[], datetime] = field(default=utc_now)

    @property
    def policy(self) -> PublishPolicy:
        """The publication gate these settings ask for (collector.store.decision)."""
        return PublishPolicy(probe_max_age=parse_duration(self.probe_max_age))


class RefreshEstimates(Protocol):
    """The capacity jobs' work: estimate finished probe runs (and, with `traffic`, each active
    model's traffic), save, publish the decision to the gauges."""

    def __call__(
        self,
        store: RequestStore,
        gauges: CapacityGauges | None,
        now: datetime,
        *,
        window: timedelta,
        slo_ttft_p95_s: float | None,
        profile: str,
        traffic: bool,
        probe_quiet_s: float,
        estimate_files: tuple[str, ...],
        probe_max_age: timedelta,
    ) -> Any: ...


class WriteReport(Protocol):
    """The weekly job's work: write the capacity review for [now - since, now) into report_dir."""

    def __call__(
        self,
        store: RequestStore,
        report_dir: Path,
        since: str,
        now: datetime,
        *,
        slo_ttft_p95_s: float | None,
    ) -> Any: ...


@dataclass(frozen=True)
class ScheduledJob:
    """One job: a name, an APScheduler trigger, and a function of the firing time."""

    name: str
    trigger: BaseTrigger
    run: Callable[[datetime], Any]


def parse_weekly_cron(text: str, timezone: str = "UTC") -> CronTrigger:
    """'mon 09:00' -> a CronTrigger on Mondays at 09:00; ValueError naming the input otherwise."""
    match = _WEEKLY.match(text.strip().lower())
    if not match:
        raise ValueError(f"report schedule {text!r} is not '<mon|tue|...|sun> HH:MM', e.g. 'mon 09:00'")
    day, hour, minute = match.groups()
    return CronTrigger(day_of_week=day, hour=int(hour), minute=int(minute), timezone=timezone)


def _rollup(store: RequestStore) -> Callable[[datetime], Any]:
    return lambda now: rollup_recent(store, now)


def _retention(store: RequestStore, export_dir: Path, retention_days: int) -> Callable[[datetime], Any]:
    return lambda now: export_and_expire(store, export_dir, retention_days, now)


def _estimates(
    store: RequestStore,
    gauges: CapacityGauges | None,
    settings: JobSettings,
    refresh: RefreshEstimates,
    traffic: bool,
) -> Callable[[datetime], Any]:
    window = parse_duration(settings.estimate_window)
    probe_max_age = parse_duration(settings.probe_max_age)
    return lambda now: refresh(
        store,
        gauges,
        now,
        window=window,
        probe_max_age=probe_max_age,
        slo_ttft_p95_s=settings.slo_ttft_p95_s,
        profile=settings.profile,
        traffic=traffic,
        probe_quiet_s=settings.probe_quiet_s,
        estimate_files=settings.estimate_files,
    )


def _weekly_report(
    store: RequestStore, settings: JobSettings, report_dir: Path, review: WriteReport
) -> Callable[[datetime], Any]:
    return lambda now: review(
        store, report_dir, settings.report_since, now, slo_ttft_p95_s=settings.slo_ttft_p95_s
    )


def job_table(
    store: RequestStore,
    gauges: CapacityGauges | None,
    settings: JobSettings,
    *,
    refresh: RefreshEstimates | None = None,
    review: WriteReport | None = None,
) -> list[ScheduledJob]:
    """The jobs these settings (and the work given) enable, with their triggers.

    Interval triggers start at settings.clock().
    """
    tz = settings.timezone
    jobs = [ScheduledJob("rollup", CronTrigger(minute=5, timezone=tz), _rollup(store))]
    if settings.export_dir is not None:
        jobs.append(
            ScheduledJob(
                "retention",
                CronTrigger(hour=0, minute=15, timezone=tz),
                _retention(store, settings.export_dir, settings.retention_days),
            )
        )
    if refresh is not None and settings.estimate_interval_s > 0:
        trigger = IntervalTrigger(
            seconds=settings.estimate_interval_s, start_date=settings.clock(), timezone=tz
        )
        jobs.append(
            ScheduledJob(
                "capacity_estimates", trigger, _estimates(store, gauges, settings, refresh, traffic=True)
            )
        )
    if refresh is not None and settings.probe_check_interval_s > 0:
        trigger = IntervalTrigger(
            seconds=settings.probe_check_interval_s, start_date=settings.clock(), timezone=tz
        )
        jobs.append(
            ScheduledJob("probe_runs", trigger, _estimates(store, gauges, settings, refresh, traffic=False))
        )
    if review is not None and settings.report_dir is not None:
        jobs.append(
            ScheduledJob(
                "weekly_report",
                parse_weekly_cron(settings.report_cron, tz),
                _weekly_report(store, settings, settings.report_dir, review),
            )
        )
    return jobs


def _guarded(job: ScheduledJob, clock: Callable[[], datetime]) -> Callable[[], None]:
    def run() -> None:
        try:
            job.run(clock())
        except Exception:  # one failing job must not stop the others; the log says which
            log.exception("store job %s failed", job.name)

    return run


def build_scheduler(
    store: RequestStore,
    gauges: CapacityGauges | None,
    settings: JobSettings | None = None,
    *,
    refresh: RefreshEstimates | None = None,
    review: WriteReport | None = None,
) -> BackgroundScheduler:
    """An APScheduler BackgroundScheduler (not started) running job_table(); call .start()."""
    settings = settings or JobSettings()
    scheduler = BackgroundScheduler(timezone=settings.timezone)
    for job in job_table(store, gauges, settings, refresh=refresh, review=review):
        # the capacity gauges must not stay empty until the first interval has passed
        first = {"next_run_time": settings.clock()} if job.name == "capacity_estimates" else {}
        scheduler.add_job(
            _guarded(job, settings.clock),
            job.trigger,
            id=job.name,
            name=job.name,
            coalesce=True,
            max_instances=1,
            misfire_grace_time=3600,
            **first,
        )
    return scheduler


def run_due(jobs: list[ScheduledJob], start: datetime, end: datetime) -> list[tuple[datetime, str]]:
    """Fire every job whose trigger falls in (start, end], in time order; returns (when, name).

    Example: the rollup (minute 5) over 08:00-10:00 fires at 08:05 and 09:05.
    """
    due: list[tuple[datetime, int, ScheduledJob]] = []
    for order, job in enumerate(jobs):
        previous, cursor = None, start + timedelta(microseconds=1)
        while (fire := job.trigger.get_next_fire_time(previous, cursor)) is not None and fire <= end:
            due.append((fire, order, job))
            previous, cursor = fire, fire + timedelta(microseconds=1)
    due.sort(key=lambda item: (item[0], item[1]))
    for fire, _, job in due:
        job.run(fire)
    return [(fire, job.name) for fire, _, job in due]
