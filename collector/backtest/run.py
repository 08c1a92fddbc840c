"""One backtest, end to end: series -> a real Prometheus -> rules -> timeline -> verdict.

    result = run_scenario(SCENARIOS["ramp"], DEFAULT, workdir)
    result.timeline.lead_page_s   -> 540.0
    result.checks                 -> [Check("lead of the first page >= 5m", True, "9.0m (...)"), ...]

`run_series` is the same for series rebuilt from a request log (collector.backtest.replay).
"""

from __future__ import annotations

import time
from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

from collector.alerts.alerting import alerting_groups
from collector.alerts.alertmanager import PRODUCTION_RECEIVERS, alertmanager_config
from collector.alerts.recording import recording_groups
from collector.backtest.evaluate import RuleSet, evaluate
from collector.backtest.exposition import goodput_slo, scrape_times
from collector.backtest.lifecycle import Lifecycle
from collector.backtest.notifications import Notification, notify
from collector.backtest.openmetrics import SeriesSet
from collector.backtest.scenario import Expect, Incident, Scenario
from collector.backtest.scenario_series import scenario_series
from collector.backtest.simulate import simulate
from collector.backtest.timeline import Timeline, build_timeline
from collector.backtest.truth import breaches
from collector.backtest.verdict import Check, verdict
from collector.rules.config import RulesConfig

__all__ = ["BacktestResult", "run_scenario", "run_series", "generated_rules", "EVALUATION_INTERVAL_S"]

EVALUATION_INTERVAL_S = 30.0


@dataclass
class BacktestResult:
    """A backtest's timeline and checks, the calibers for the plot, and what each stage took.

    `notifications`: what the generated Alertmanager configuration would send of the timeline's
    alerts (collector.backtest.notifications), page and ticket.
    """

    name: str
    summary: str
    timeline: Timeline
    checks: list[Check]
    calibers: dict[str, list[tuple[float, float]]]  # "requests" / "tokens" -> [(t, fleet total)]
    knee: dict[str, float]  # caliber -> published knee (per replica)
    missing: list[str] = field(default_factory=list)  # series a replay could not rebuild
    timings_s: dict[str, float] = field(default_factory=dict)
    replicas: int = 1
    notifications: list[Notification] = field(default_factory=list)

    @property
    def passed(self) -> bool:
        return all(check.ok for check in self.checks)

    def notified(self, receiver: str) -> list[Notification]:
        """The notifications of one receiver: "page" or "ticket"."""
        return [n for n in self.notifications if n.receiver == receiver]

    @property
    def page_incidents(self) -> list[Notification]:
        """The page notifications that open an incident at the pager (the rest update one)."""
        return [n for n in self.notified("page") if n.opens]


def generated_rules(config: RulesConfig) -> RuleSet:
    """The rules `headroom alerts generate` would write under `config`."""
    config.validate()
    return RuleSet(recording_groups(config), alerting_groups(config))


def _calibers(series: SeriesSet) -> dict[str, list[tuple[float, float]]]:
    totals: dict[str, dict[float, float]] = {"requests": defaultdict(float), "tokens": defaultdict(float)}
    for key in series.keys():
        caliber = {"headroom_inflight_requests": "requests", "headroom_active_tokens": "tokens"}.get(key[0])
        if caliber:
            for t, value in series.samples(key):
                totals[caliber][t] += value
    return {caliber: sorted(points.items()) for caliber, points in totals.items()}


def run_series(
    name: str,
    summary: str,
    series: SeriesSet,
    records: list[Lifecycle],
    start: float,
    end: float,
    config: RulesConfig,
    workdir: Path,
    *,
    rules: RuleSet | None = None,
    scrape_interval_s: float,
    interval_s: float = EVALUATION_INTERVAL_S,
    incidents: Sequence[Incident] = (),
    expect: Expect | None = None,
    knee: dict[str, float] | None = None,
    prometheus: str | None = None,
    promtool: str | None = None,
) -> BacktestResult:
    """Evaluate the rules over `series` and judge them against the truth in `records`."""
    began = time.perf_counter()
    evaluation = evaluate(
        series,
        rules or generated_rules(config),
        start,
        end,
        interval_s=interval_s,
        lookback_s=max(scrape_interval_s, interval_s),
        workdir=workdir,
        prometheus=prometheus,
        promtool=promtool,
    )
    truth = breaches(records, scrape_times(start, end, interval_s), config.slo_for, config.slo_min_requests)
    timeline = build_timeline(name, evaluation, truth, list(incidents), start, end)
    manager = alertmanager_config(PRODUCTION_RECEIVERS, config.receivers, config.cluster_label)
    notifications = notify(timeline.fired, manager, end)
    origin = min((start + i.start_s for i in incidents), default=None)
    checks = verdict(timeline, expect, origin, notifications) if expect is not None else []
    timings = dict(evaluation.timings_s) | {"evaluate_s": time.perf_counter() - began}
    return BacktestResult(
        name,
        summary,
        timeline,
        checks,
        _calibers(series),
        knee or {},
        timings_s=timings,
        notifications=notifications,
    )


def run_scenario(
    scenario: Scenario,
    config: RulesConfig,
    workdir: Path,
    *,
    rules: RuleSet | None = None,
    interval_s: float | None = None,
    prometheus: str | None = None,
    promtool: str | None = None,
) -> BacktestResult:
    """Simulate `scenario`, export its series to `config.sidecar_job`, and backtest the rules on it."""
    began = time.perf_counter()
    result = simulate(scenario)
    simulated = time.perf_counter()
    series = scenario_series(result, config.sidecar_job, goodput_slo(config))
    exported = time.perf_counter()
    backtest = run_series(
        scenario.name,
        scenario.summary,
        series,
        result.records,
        result.epoch,
        result.end,
        config,
        Path(workdir),
        rules=rules,
        scrape_interval_s=scenario.scrape_interval_s,
        interval_s=interval_s or scenario.evaluation_interval_s,
        incidents=scenario.problems(),
        expect=scenario.expect,
        knee={"requests": scenario.knee_requests, "tokens": result.scenario.knee_tokens or 0},
        prometheus=prometheus,
        promtool=promtool,
    )
    backtest.timings_s |= {
        "simulate_s": simulated - began,
        "series_s": exported - simulated,
        "total_s": time.perf_counter() - began,
        "samples": float(len(series)),
    }
    backtest.replicas = len(scenario.replicas)
    return backtest
