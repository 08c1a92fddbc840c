"""The backtest's judgement of alerts without Prometheus: false alerts that outlast their problem,
and the notifications the generated Alertmanager configuration makes of them (grouping, inhibition).

The live counterpart, a real Alertmanager delivering the ramp's one page, is
tests/test_alertmanager_one_page.py.
"""

from __future__ import annotations

from collector.alerts.alertmanager import alertmanager_config
from collector.backtest.alertstate import Episode
from collector.backtest.evaluate import Evaluation
from collector.backtest.notifications import Matcher, duration_s, notify
from collector.backtest.timeline import GRACE_S, AlertSpan, build_timeline
from collector.backtest.truth import Breach

M = 60.0
SEVERITIES = {
    "HeadroomConcurrencyNearKnee": "warning",
    "HeadroomTTFTBudgetBurnSlow": "warning",
    "HeadroomCapacityForecast": "critical",
    "HeadroomNearCapacityLimit": "critical",
    "HeadroomTTFTBudgetBurnFast": "critical",
    "HeadroomKVCacheExhausted": "critical",
}


def _episode(name: str, firing_min: float, ended_min: float | None, **labels: str) -> Episode:
    every = {"alertname": name, "severity": SEVERITIES[name], "model": "m"} | labels
    return Episode(
        tuple(sorted(every.items())),
        firing_min * M - 300,
        firing_min * M,
        None if ended_min is None else ended_min * M,
    )


def _timeline(*episodes: Episode, end_min: float = 180):
    evaluation = Evaluation([], list(episodes), SEVERITIES)
    breach = Breach("ttft", "m", 60 * M, 80 * M)
    return build_timeline("t", evaluation, [breach], [], 0.0, end_min * M)


def test_an_alert_that_starts_in_a_breach_and_outlasts_its_tail_is_false():
    timeline = _timeline(
        _episode("HeadroomConcurrencyNearKnee", 65, None),  # to the end: 100 min after the breach
        _episode("HeadroomConcurrencyNearKnee", 62, 90, caliber="requests"),  # 10 min after: its tail
        _episode("HeadroomTTFTBudgetBurnSlow", 70, 300),  # a slow burn's 6 h window outlasts by design
        end_min=300,
    )
    late, within, slow = timeline.alerts
    assert not late.earned and late.why.startswith("outlasts ttft SLO breach (m)")
    assert "by 220.0m" in late.why and f"{GRACE_S / 60:g}m" in late.why
    assert within.earned and within.why == ""
    assert slow.earned
    assert timeline.false_warnings == [late]


def test_an_alert_outside_every_problem_is_false_and_one_in_the_lead_window_is_not():
    timeline = _timeline(
        _episode("HeadroomCapacityForecast", 10, 20),  # 40 min before the breach: outside
        _episode("HeadroomCapacityForecast", 40, 85),  # 20 min before, into it: earned
    )
    early, lead = timeline.alerts
    assert (early.earned, early.why) == (False, "outside every problem")
    assert lead.earned


def _span(name: str, firing_min: float, ended_min: float | None = None, **labels: str) -> AlertSpan:
    every = {"severity": SEVERITIES[name], "model": "m"} | labels
    ended = None if ended_min is None else ended_min * M
    return AlertSpan(name, SEVERITIES[name], every, firing_min * M, firing_min * M, ended, True)


def test_the_ramps_pages_in_order_are_one_notification():
    spans = [
        _span("HeadroomCapacityForecast", 34.5),
        _span("HeadroomNearCapacityLimit", 63.5),
        _span("HeadroomTTFTBudgetBurnFast", 67.5),
        _span("HeadroomConcurrencyNearKnee", 56.5, instance="a", signal="near_knee"),
    ]
    sent = notify(spans, alertmanager_config(), 120 * M)
    pages = [n for n in sent if n.receiver == "page"]
    assert [(n.at, n.new) for n in pages] == [(35 * M, ("HeadroomCapacityForecast",))]
    assert pages[0].group == (("cluster", ""), ("model", "m"))
    tickets = [n for n in sent if n.receiver == "ticket"]
    assert [n.new for n in tickets] == [("HeadroomConcurrencyNearKnee",)]  # muted by the composite later


def test_a_page_joining_an_open_incident_rides_on_its_next_hourly_notification_and_opens_nothing():
    spans = [
        _span("HeadroomCapacityForecast", 30, 50),
        _span("HeadroomTTFTBudgetBurnFast", 40),  # muted until the forecast resolves at 50
        _span("HeadroomCapacityForecast", 30, model="other"),
        _span("HeadroomTTFTBudgetBurnFast", 31, cluster="b"),
    ]
    pages = [n for n in notify(spans, alertmanager_config(), 180 * M) if n.receiver == "page"]
    assert [(n.at / M, dict(n.group)["model"], dict(n.group)["cluster"], n.new, n.opens) for n in pages] == [
        (30.5, "m", "", ("HeadroomCapacityForecast",), True),
        (30.5, "other", "", ("HeadroomCapacityForecast",), True),
        (31.5, "m", "b", ("HeadroomTTFTBudgetBurnFast",), True),
        (90.5, "m", "", ("HeadroomTTFTBudgetBurnFast",), False),  # the group's next flush, an hour on
    ]


def test_an_unordered_incident_is_one_page_incident_whatever_order_its_pages_fire_in():
    """The composite before the forecast: the forecast joins the open group and is an update."""
    spans = [_span("HeadroomNearCapacityLimit", 30), _span("HeadroomCapacityForecast", 45)]
    pages = [(n.new, n.opens) for n in notify(spans, alertmanager_config(), 120 * M) if n.receiver == "page"]
    assert pages == [(("HeadroomNearCapacityLimit",), True), (("HeadroomCapacityForecast",), False)]


def test_a_page_after_the_incident_resolved_opens_a_new_one():
    spans = [_span("HeadroomCapacityForecast", 30, 40), _span("HeadroomTTFTBudgetBurnFast", 200)]
    pages = [
        (n.at / M, n.opens) for n in notify(spans, alertmanager_config(), 300 * M) if n.receiver == "page"
    ]
    assert pages == [(30.5, True), (200.5, True)]


def test_matchers_and_durations_read_as_alertmanager_reads_them():
    assert Matcher.parse('alertname=~"A|B"').matches({"alertname": "B"})
    assert not Matcher.parse('alertname=~"A|B"').matches({"alertname": "AB"})
    assert Matcher.parse('family=~".+"').matches({"family": "x"})
    assert not Matcher.parse('family=~".+"').matches({})
    assert Matcher.parse('severity!="critical"').matches({})
    assert duration_s("1h30m") == 5400 and duration_s("30s") == 30
