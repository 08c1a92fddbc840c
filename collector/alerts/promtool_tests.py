"""promtool unit tests for the generated rules: for every alert, both sides of its `for:` and a quiet case.

Each `Case` gives input series and, per evaluation time, the alerts expected to be firing (labels
and the value as Prometheus formats it). Check times come from the config's `for:` durations
(collector.alerts.promtool_cases builds them), so the same cases test a config file's rules.
Expected annotations are rendered from the same `<label>` notation as the rules, so a template that
references a missing label or formats the value differently fails in promtool, not on call.
promtool 2.42 pitfalls handled here: every group sets `interval:`; expected labels and annotations
are complete.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from collector.alerts.alerting import Alert, alerting_groups, alerts
from collector.alerts.promtool_cases import cases
from collector.alerts.promtool_support import Case
from collector.alerts.recording import recording_groups
from collector.alerts.templating import to_text
from collector.rules.config import RulesConfig

__all__ = ["Case", "unit_test_document"]


def _expected(
    alert: Alert, config: RulesConfig, labels: dict[str, Any], value_text: str, calibers: dict[str, str]
) -> dict[str, Any]:
    rule = alert.to_rule(config)
    full = {**rule["labels"], **labels}
    return {
        "exp_labels": full,
        "exp_annotations": {
            "summary": to_text(alert.summary, full, value_text, calibers),
            "description": to_text(alert.description, full, value_text, calibers),
            "runbook_url": rule["annotations"]["runbook_url"],
        },
    }


def _group(case: Case, by_name: dict[str, list[Alert]], config: RulesConfig) -> dict[str, Any]:
    alert = by_name[case.alert][case.rule]
    return {
        "name": f"{case.alert}: {case.name}",
        "interval": "1m",
        "input_series": [{"series": s, "values": v} for s, v in case.series.items()],
        "alert_rule_test": [
            {
                "eval_time": at,
                "alertname": case.alert,
                "exp_alerts": [
                    _expected(alert, config, labels, value, case.calibers) for labels, value in firing
                ],
            }
            for at, firing in case.checks
        ],
    }


def unit_test_document(
    config: RulesConfig, rule_files: list[str], extra_groups: Sequence[dict[str, Any]] = ()
) -> dict[str, Any]:
    """The promtool test file: one group per case of `config`, then `extra_groups` (recording rules)."""
    by_name: dict[str, list[Alert]] = {}
    for alert in alerts(config):
        by_name.setdefault(alert.name, []).append(alert)
    # promtool evaluates groups by name unless told; records first, as the backtest does, so an
    # alert reads this evaluation's records (a live Prometheus runs groups side by side: one late)
    order = [group["name"] for group in recording_groups(config) + alerting_groups(config)]
    return {
        "rule_files": rule_files,
        "evaluation_interval": "1m",
        "group_eval_order": order,
        "tests": [_group(case, by_name, config) for case in cases(config)] + list(extra_groups),
    }
