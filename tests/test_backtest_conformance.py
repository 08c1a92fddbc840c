"""The backtest's alert evaluation agrees with Prometheus' own rule manager, minute by minute.

The same input goes through `evaluate()` (a real Prometheus over backfilled blocks, the state
machine of collector.backtest.alertstate, ALERTS substituted for the rules that read it) and
through `promtool test rules`, whose expectations are what the backtest computed at every minute:
promtool passing means `for:`, `keep_firing_for`, a rule reading its own ALERTS (hysteresis) and a
rule reading others' all behave as Prometheus 2.42 evaluates them. A wrong expectation makes
promtool fail, which the last test shows.
"""

from __future__ import annotations

import random
import subprocess
from datetime import timedelta

import pytest
import yaml
from conftest import require_tool
from support.waiting import patient

from collector.backtest.alertstate import AlertMachine
from collector.backtest.alertsvector import EMPTY_VECTOR, substitute
from collector.backtest.evaluate import RuleSet, _rule_seconds, evaluate, record_levels
from collector.backtest.openmetrics import SeriesSet
from collector.timewin import parse_duration

pytestmark = pytest.mark.integration
START, MINUTES = 1_767_571_200.0, 90
RULES = [
    {
        "name": "conformance",
        "rules": [
            {
                "alert": "Above5",
                "expr": "x > 5",
                "for": "2m",
                "keep_firing_for": "3m",
                "labels": {"severity": "warning"},
            },
            {"alert": "Above3", "expr": "x > 3", "for": "0s"},
            {
                "alert": "Sticky",
                "expr": 'x > 7\nor\n(x > 4 and on (job) ALERTS{alertname="Sticky", alertstate="firing"})',
                "for": "1m",
            },
            {
                "alert": "Both",
                "expr": 'count by (job) (ALERTS{alertstate="firing", alertname=~"Above5|Above3"}) >= 2',
                "for": "1m",
                "labels": {"severity": "critical"},
            },
        ],
    }
]


def _walk() -> list[int]:
    """A seeded random walk over 0..10: crosses every threshold several times."""
    rng, value, values = random.Random(12), 2, []
    for _ in range(MINUTES + 1):
        value = min(10, max(0, value + rng.choice((-2, -1, 0, 1, 2))))
        values.append(value)
    return values


def _firing(episodes, name: str, t: float) -> list[dict]:
    return [dict(e.labels) for e in episodes if e.label("alertname") == name and e.state_at(t) == "firing"]


def _promtool_document(episodes, values: list[int]) -> dict:
    tests = []
    for rule in RULES[0]["rules"]:
        checks = []
        for minute in range(MINUTES + 1):
            firing = _firing(episodes, rule["alert"], START + 60 * minute)
            checks.append(
                {
                    "eval_time": f"{minute}m",
                    "alertname": rule["alert"],
                    "exp_alerts": [
                        {"exp_labels": {k: v for k, v in labels.items() if k != "alertname"}}
                        for labels in firing
                    ],
                }
            )
        tests.append(
            {
                "name": rule["alert"],
                "interval": "1m",
                "alert_rule_test": checks,
                "input_series": [{"series": 'x{job="t"}', "values": " ".join(map(str, values))}],
            }
        )
    return {"rule_files": ["conformance.rules.yaml"], "evaluation_interval": "1m", "tests": tests}


@pytest.fixture(scope="module")
def backtested(tmp_path_factory):
    require_tool("prometheus")
    values = _walk()
    series = SeriesSet()
    for minute, value in enumerate(values):
        series.add("x", {"job": "t"}, START + 60 * minute, value)
    evaluation = evaluate(
        series,
        RuleSet([], RULES),
        START,
        START + 60 * MINUTES,
        interval_s=60,
        lookback_s=60,
        workdir=tmp_path_factory.mktemp("conformance"),
    )
    return evaluation, values


def _promtool(document: dict, directory) -> subprocess.CompletedProcess:
    (directory / "conformance.rules.yaml").write_text(yaml.safe_dump({"groups": RULES}))
    (directory / "test.yaml").write_text(yaml.safe_dump(document))
    return subprocess.run(
        [require_tool("promtool"), "test", "rules", "test.yaml"],
        cwd=directory,
        capture_output=True,
        text=True,
        timeout=patient(120),
    )


def test_every_state_change_matches_promtool(backtested, tmp_path):
    evaluation, values = backtested
    names = {e.label("alertname") for e in evaluation.episodes if e.fired}
    assert names == {"Above5", "Above3", "Sticky", "Both"}, "the walk must make every rule fire"
    assert any(e.ended_at is not None for e in evaluation.episodes if e.label("alertname") == "Sticky")
    result = _promtool(_promtool_document(evaluation.episodes, values), tmp_path)
    assert result.returncode == 0, result.stdout[-4000:] + result.stderr[-2000:]


def test_a_wrong_expectation_fails_promtool(backtested, tmp_path):
    """The comparison can fail: drop `keep_firing_for` from the expectations and promtool objects."""
    evaluation, values = backtested
    machine = AlertMachine("Above5", hold_s=120)
    for minute, value in enumerate(values):
        machine.step(
            START + 60 * minute,
            {(("alertname", "Above5"), ("job", "t"), ("severity", "warning")): value} if value > 5 else {},
        )
    others = [e for e in evaluation.episodes if e.label("alertname") != "Above5"]
    assert [(e.firing_at, e.ended_at) for e in machine.episodes if e.fired] != [
        (e.firing_at, e.ended_at) for e in evaluation.episodes if e.label("alertname") == "Above5" and e.fired
    ]
    result = _promtool(_promtool_document(others + machine.episodes, values), tmp_path)
    assert result.returncode != 0 and "alertname: Above5" in result.stdout + result.stderr


def test_state_machine_rules_by_hand():
    """for:, the dropped pending alert, keep_firing_for and its reset, one evaluation at a time."""
    labels = (("alertname", "A"),)
    machine = AlertMachine("A", hold_s=120, keep_firing_s=120)
    on, off = {labels: 1.0}, {}
    for t, result in enumerate([on, off, on, on, on, off, on, off, off, off, on]):
        machine.step(60.0 * t, result)
    first, second, third = machine.episodes
    assert (first.pending_at, first.firing_at, first.ended_at) == (0, None, 60)  # dropped while pending
    assert (second.pending_at, second.firing_at, second.ended_at) == (
        120,
        240,
        540,
    )  # kept 2 misses, reset by t=6
    assert (third.pending_at, third.firing_at, third.ended_at) == (600, None, None)
    assert machine.alerts() == [{"alertname": "A", "alertstate": "pending"}]


def test_alerts_substitution_and_helpers():
    alerts = [
        {"alertname": "Q", "alertstate": "firing", "model": "m"},
        {"alertname": "T", "alertstate": "pending", "model": "m"},
    ]
    expr, matched = substitute('count by (model) (ALERTS{alertstate="firing", alertname=~"Q|R"})', alerts)
    assert matched and expr == (
        "count by (model) ((label_replace(label_replace(label_replace(vector(1), "
        '"alertname", "Q", "", ""), "alertstate", "firing", "", ""), "model", "m", "", "")))'
    )
    assert substitute('ALERTS{alertname="Z"}', alerts) == (EMPTY_VECTOR, False)
    assert _rule_seconds("1h30m") == 5400 and _rule_seconds(None) == 0 and _rule_seconds("250ms") == 0.25
    with pytest.raises(ValueError, match="not a Prometheus duration"):
        _rule_seconds("5 minutes")
    # the same parser as the commands' windows (collector.timewin): one unit or several, spaces around
    assert parse_duration(" 7d ") == timedelta(days=7) and parse_duration("1h30m") == timedelta(minutes=90)
    levels = record_levels([{"record": "b:x:y", "expr": "a:x:y * 2"}, {"record": "a:x:y", "expr": "sum(up)"}])
    assert [[r["record"] for r in level] for level in levels] == [["a:x:y"], ["b:x:y"]]
