"""Generated rules evaluated over backfilled series by a real Prometheus: records, then alerts.

1. Recording rules, level by level: a rule's level is one more than the deepest record it reads.
   Each level is range-queried at every evaluation time (start, start + interval, ... end), its
   results backfilled as blocks, and the server restarted to read them, as
   `promtool tsdb create-blocks-from rules` does for one level (it cannot chain them).
2. Alerting rules, in file order. A rule that does not read ALERTS is one range query, run through
   the alert state machine (collector.backtest.alertstate). A rule that reads ALERTS is evaluated
   evaluation by evaluation, ALERTS replaced by the alerts held at that moment
   (collector.backtest.alertsvector): as `promtool test rules` evaluates groups in order, it sees
   the rules above it as of this evaluation, itself and the rules below as of the previous one.
   Where no alert matches its selectors the one range query with ALERTS empty answers.

    evaluation = evaluate(series, rules, start, end, interval_s=30, lookback_s=30, workdir=tmp)
    evaluation.episodes  -> [Episode(labels=(("alertname", "HeadroomQueueNotDraining"), ...), ...)]
"""

from __future__ import annotations

import time
from collections import defaultdict
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from collector.backtest.alertstate import AlertMachine, Episode, Labels
from collector.backtest.alertsvector import reads_alerts, substitute
from collector.backtest.openmetrics import SeriesKey, SeriesSet
from collector.backtest.prometheus import BackfilledPrometheus, Matrix
from collector.rules.naming import metric_names
from collector.timewin import parse_duration

__all__ = ["RuleSet", "Evaluation", "evaluate", "record_levels"]

Rule = dict[str, Any]  # a rule (or group) as the rule files hold it: record/alert, expr, for, labels


def _rule_seconds(text: str | None) -> float:
    """Seconds of a rule's `for` or `keep_firing_for` (collector.timewin.parse_duration):
    '1h30m' -> 5400.0; None or '' (not set) -> 0."""
    return parse_duration(str(text)).total_seconds() if text else 0.0


@dataclass(frozen=True)
class RuleSet:
    """Recording and alerting rules as Prometheus rule-group dicts (what the rule files hold)."""

    recording: list[Rule]
    alerting: list[Rule]

    def records(self) -> list[Rule]:
        return [rule for group in self.recording for rule in group["rules"]]

    def alerts(self) -> list[Rule]:
        return [rule for group in self.alerting for rule in group["rules"]]


@dataclass
class Evaluation:
    """Every alert episode of the window, the evaluation times, and what the evaluation cost."""

    times: list[float]
    episodes: list[Episode]
    severities: dict[str, str]
    levels: int = 0
    timings_s: dict[str, float] = field(default_factory=dict)


def record_levels(rules: list[Rule]) -> list[list[Rule]]:
    """Recording rules grouped by dependency level: [[rules reading raw series], [rules reading those], ...]."""
    names = {rule["record"] for rule in rules}
    level: dict[str, int] = {}
    for _ in range(len(rules) + 1):
        changed = False
        for rule in rules:
            deps = metric_names(rule["expr"]) & names - {rule["record"]}
            value = 1 + max((level.get(dep, 1) for dep in deps), default=0)
            if level.get(rule["record"], 0) < value:
                level[rule["record"]], changed = value, True
        if not changed:
            break
    else:
        raise ValueError("recording rules read each other in a cycle")
    depth = max(level.values(), default=0)
    return [[rule for rule in rules if level[rule["record"]] == n] for n in range(1, depth + 1)]


def _record_series(
    rules: list[Rule], prometheus: BackfilledPrometheus, times: list[float], step_s: float
) -> SeriesSet:
    collected: dict[SeriesKey, list[tuple[float, float]]] = defaultdict(list)
    for rule in rules:
        for labels, points in prometheus.query_range(rule["expr"], times[0], times[-1], step_s):
            labels = {k: v for k, v in labels.items() if k != "__name__"} | rule.get("labels", {})
            collected[(rule["record"], tuple(sorted(labels.items())))].extend(points)
    out = SeriesSet()
    for key, points in sorted(collected.items()):
        for t, value in sorted(points):
            out.add_key(key, t, value)
    return out


def _alert_labels(rule: Rule, labels: dict[str, str]) -> Labels:
    merged = {k: v for k, v in labels.items() if k != "__name__"} | rule.get("labels", {})
    return tuple(sorted((merged | {"alertname": rule["alert"]}).items()))


def _by_time(rule: Rule, matrix: Matrix) -> dict[float, dict[Labels, float]]:
    results: dict[float, dict[Labels, float]] = defaultdict(dict)
    for labels, points in matrix:
        key = _alert_labels(rule, labels)
        for t, value in points:
            results[t][key] = value
    return results


class _Alerting:
    """The alerting rules' machines, stepped in file order over the evaluation times."""

    def __init__(
        self, rules: list[Rule], prometheus: BackfilledPrometheus, times: list[float], step_s: float
    ) -> None:
        self.rules, self.prometheus, self.times, self.step_s = rules, prometheus, times, step_s
        self.machines = [
            AlertMachine(r["alert"], _rule_seconds(r.get("for")), _rule_seconds(r.get("keep_firing_for")))
            for r in rules
        ]
        self.stateful = [reads_alerts(r["expr"]) for r in rules]
        self.history: list[dict[int, list[dict[str, str]]]] = [{} for _ in rules]  # rule -> time -> ALERTS
        self.instant_queries = 0

    def _query(self, expr: str) -> Matrix:
        return self.prometheus.query_range(expr, self.times[0], self.times[-1], self.step_s)

    def run(self) -> None:
        baselines: dict[int, dict[float, dict[Labels, float]]] = {}
        for index, rule in enumerate(self.rules):
            if self.stateful[index]:
                baselines[index] = _by_time(rule, self._query(substitute(rule["expr"], [])[0]))
                continue
            by_time = _by_time(rule, self._query(rule["expr"]))
            for position, t in enumerate(self.times):
                self._step(index, position, by_time.get(t, {}))
        stateful = [i for i, flag in enumerate(self.stateful) if flag]
        for position, t in enumerate(self.times):
            for index in stateful:
                self._step(index, position, self._results(index, t, position, baselines[index]))

    def _results(
        self, index: int, t: float, position: int, baseline: dict[float, dict[Labels, float]]
    ) -> dict[Labels, float]:
        """A rule reading ALERTS at `t`: one instant query with ALERTS substituted, or the baseline."""
        expr, matched = substitute(self.rules[index]["expr"], self._visible(index, position))
        if not matched:
            return baseline.get(t, {})
        self.instant_queries += 1
        return {
            _alert_labels(self.rules[index], labels): value
            for labels, value in self.prometheus.query(expr, t)
        }

    def _step(self, index: int, position: int, results: dict[Labels, float]) -> None:
        machine = self.machines[index]
        machine.step(self.times[position], results)
        alerts = machine.alerts()
        if alerts:
            self.history[index][position] = alerts

    def _visible(self, index: int, position: int) -> list[dict[str, str]]:
        """ALERTS as rule `index` reads it at evaluation `position` (rules above: now; the rest: before)."""
        visible: list[dict[str, str]] = []
        for other, history in enumerate(self.history):
            at = position if other < index else position - 1
            visible.extend(history.get(at, ()))
        return visible


def evaluate(
    series: SeriesSet,
    rules: RuleSet,
    start: float,
    end: float,
    *,
    interval_s: float,
    lookback_s: float,
    workdir: Path,
    prometheus: str | None = None,
    promtool: str | None = None,
) -> Evaluation:
    """Backfill `series`, evaluate `rules` at start, start + interval_s, ... end; every episode."""
    timings, began = {}, time.perf_counter()
    count = int((end - start) / interval_s + 1e-9)
    times = [start + i * interval_s for i in range(count + 1)]
    with BackfilledPrometheus(
        workdir, lookback_s=lookback_s, prometheus=prometheus, promtool=promtool
    ) as server:
        server.backfill(series)
        timings["backfill_s"] = time.perf_counter() - began
        levels = record_levels(rules.records())
        for level in levels:
            server.backfill(_record_series(level, server, times, interval_s))
        timings["recording_s"] = time.perf_counter() - began - timings["backfill_s"]
        alerting = _Alerting(rules.alerts(), server, times, interval_s)
        alerting.run()
        timings["alerting_s"] = time.perf_counter() - began - timings["backfill_s"] - timings["recording_s"]
    episodes = sorted(
        (e for m in alerting.machines for e in m.episodes), key=lambda e: (e.pending_at, e.labels)
    )
    severities = {rule["alert"]: rule.get("labels", {}).get("severity", "") for rule in rules.alerts()}
    timings["instant_queries"] = alerting.instant_queries
    return Evaluation(times, episodes, severities, len(levels), timings)
