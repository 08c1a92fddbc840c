"""The committed rules, backtested on every built-in scenario with the real Prometheus: the numbers hold.

Each scenario runs once (simulated time, backfilled into a real Prometheus, the generated rules
evaluated over it) and is judged twice: by its own expectations (collector.backtest.scenarios, the
same checks `headroom alerts backtest` prints), and by the acceptance points spelled out here, so a
reader sees the numbers without opening the scenario table. Timing is measured by
benchmarks/backtest_scenario.py, never asserted here.
"""

from __future__ import annotations

from collections import Counter
from pathlib import Path

import pytest
from conftest import require_tool

from collector.backtest.report import render_text, scenario_table
from collector.backtest.run import run_scenario
from collector.backtest.scenarios import SCENARIOS, scenario_names
from collector.backtest.simulate import simulate
from collector.backtest.verdict import matches
from collector.rules.config import DEFAULT

pytestmark = [pytest.mark.integration, pytest.mark.slow, pytest.mark.timeout(900)]
MIN = 60.0


@pytest.fixture(scope="module")
def backtest(tmp_path_factory):
    """Run a scenario on first use and keep its result for the other tests of the module."""
    require_tool("prometheus"), require_tool("promtool")
    done = {}

    def run(name: str):
        if name not in done:
            done[name] = run_scenario(SCENARIOS[name], DEFAULT, tmp_path_factory.mktemp(name))
        return done[name]

    return run


@pytest.mark.parametrize("name", scenario_names())
def test_scenario_meets_its_expectations(backtest, name):
    result = backtest(name)
    assert result.checks, f"{name} checks nothing"
    assert result.passed, render_text(result)


def test_steady_half_load_for_six_hours_is_silent(backtest):
    timeline = backtest("steady").timeline
    assert timeline.end - timeline.start == 6 * 3600
    assert (timeline.pages, timeline.warnings, timeline.first_breach) == ([], [], None)


def test_ramp_warns_fifteen_minutes_and_pages_five_minutes_before_the_slo_breach(backtest):
    timeline = backtest("ramp").timeline
    assert timeline.first_breach is not None and timeline.first_breach.kind == "ttft"
    assert timeline.lead_warning_s >= 15 * MIN, render_text(backtest("ramp"))
    assert timeline.lead_page_s >= 5 * MIN, render_text(backtest("ramp"))
    assert timeline.false_pages == []


def test_token_shift_warns_on_tokens_before_the_breach_while_request_caliber_stays_silent(backtest):
    """Tokens bind when tokens bind (#46): the token capacity is the one the product publishes for
    the first 15 minutes' mix (knee x time-weighted tokens per request in flight, not a hand-set
    number); as prompts lengthen at a flat request rate the token caliber warns >= 15 min and pages
    >= 5 min before the SLO breach, and the request caliber says nothing until then."""
    result = backtest("token_shift")
    timeline = result.timeline
    published = simulate(SCENARIOS["token_shift"]).scenario.knee_tokens
    assert SCENARIOS["token_shift"].knee_tokens is None and 32 * 200 < published < 16384
    breach = timeline.first_breach.start
    early = [s for s in timeline.fired if s.firing_at < breach]
    assert any(s.name == "HeadroomTokenCaliberDivergence" or matches('{caliber="tokens"}', s) for s in early)
    assert not [
        s for s in early if matches('{caliber="requests"}', s) or s.name == "HeadroomQueueNotDraining"
    ]
    assert timeline.lead_warning_s >= 15 * MIN and timeline.lead_page_s >= 5 * MIN, render_text(result)


def _first_firing(timeline, name: str) -> float:
    return min(s.firing_at for s in timeline.firing(name)) - timeline.start


def test_kv_saturation_storm_and_metrics_down_each_raise_their_own_alert_in_time(backtest):
    kv = backtest("kv_saturation").timeline
    assert _first_firing(kv, "HeadroomKVCacheNearFull") - 45 * MIN <= 12 * MIN
    assert _first_firing(kv, "HeadroomKVCacheExhausted") - 45 * MIN <= 15 * MIN
    storm = backtest("shedding_storm").timeline
    assert _first_firing(storm, "HeadroomAvailabilityBudgetBurnFast") - 45 * MIN <= 5 * MIN
    assert _first_firing(storm, "HeadroomLoadShedding") - 45 * MIN <= 8 * MIN
    down = backtest("engine_metrics_down").timeline
    assert _first_firing(down, "HeadroomEngineScrapeFailing") - 40 * MIN <= 5 * MIN
    assert down.pages == [] and not storm.firing("HeadroomNearCapacityLimit")


def test_overload_shed_at_the_door_burns_goodput_while_the_admitted_latency_stays_fine(backtest):
    """An engine without a queue at 140 % of the knee refuses a third of the arrivals with 429; the
    requests it admits keep their TTFT, so no latency SLI burns: goodput attainment does (the
    issue's "shedding cannot make the SLO look better"), within 10 minutes of the overload."""
    result = backtest("overload_shedding")
    timeline = result.timeline
    overload = [
        r
        for r in simulate(SCENARIOS["overload_shedding"]).records
        if 30 * MIN <= r.admitted - timeline.start < 75 * MIN
    ]
    shed = sum(r.outcome == "rate_limited" for r in overload) / len(overload)
    ttfts = sorted(r.ttft_s for r in overload if r.ttft_s is not None)
    assert shed > 0.25 and ttfts[int(0.95 * len(ttfts))] < 0.5 and ttfts[-1] < DEFAULT.ttft_slo_seconds
    assert timeline.first_breach is not None and timeline.first_breach.kind == "availability"
    assert 30 * MIN < _first_firing(timeline, "HeadroomGoodputBudgetBurnFast") <= 40 * MIN, render_text(
        result
    )
    for quiet in ("HeadroomTTFTBudgetBurnFast", "HeadroomTTFTBudgetBurnSlow", "HeadroomTTFTRising"):
        assert not timeline.firing(quiet), render_text(result)
    assert timeline.false_pages == [] and timeline.false_warnings == [], render_text(result)


@pytest.mark.parametrize("name", scenario_names())
def test_the_goodput_burn_fires_only_inside_a_problem(backtest, name):
    """No scenario gets a false page or ticket from goodput; where nothing hurts users, it is silent."""
    result = backtest(name)
    timeline = result.timeline
    goodput = [s for s in timeline.fired if s.name.startswith("HeadroomGoodputBudgetBurn")]
    assert all(s.earned for s in goodput), render_text(result)
    if name in ("steady", "engine_metrics_down", "log_sink_outage", "night_trickle", "daily_spike"):
        assert goodput == [], render_text(result)


def test_the_composite_fires_only_where_a_latency_and_a_saturation_signal_coincide(backtest):
    fired = 0
    for name in (
        "ramp",
        "kv_saturation",
        "token_shift",
        "shedding_storm",
        "engine_metrics_down",
        "engine_outage",
    ):
        result = backtest(name)
        composite = [c for c in result.checks if c.what.startswith("the composite")]
        assert all(c.ok for c in composite), render_text(result)
        fired += len(composite)
    assert fired >= 2, "the composite must fire somewhere for this check to mean anything"


def test_outages_slow_nights_and_slow_replicas(backtest):
    outage = backtest("engine_outage").timeline
    assert _first_firing(outage, "HeadroomAvailabilityBudgetBurnFast") - 40 * MIN <= 5 * MIN
    sink = backtest("log_sink_outage").timeline
    assert sink.pages == [] and sink.firing("HeadroomLogSinkDown")
    assert backtest("night_trickle").timeline.pages == []
    slow = backtest("slow_replica").timeline
    assert {s.labels["instance"] for s in slow.firing("HeadroomSlowReplica")} == {"replica-3"}


def test_daily_cycle_spike_warns_but_never_pages(backtest):
    timeline = backtest("daily_spike").timeline
    assert timeline.pages == []
    assert any(14 * 3600 <= s.firing_at - timeline.start <= 14 * 3600 + 30 * MIN for s in timeline.warnings)


def test_two_clusters_alert_for_the_cluster_over_its_knee_only(backtest):
    """The same instance name in two clusters: cluster a's ramp warns and pages in time, b stays silent."""
    result = backtest("two_clusters")
    timeline = result.timeline
    assert timeline.first_breach is not None and timeline.first_breach.cluster == "a", render_text(result)
    assert timeline.lead_warning_s >= 15 * MIN, render_text(result)
    assert timeline.lead_page_s >= 5 * MIN, render_text(result)
    assert timeline.first_warning.labels.get("cluster") == "a"
    assert timeline.first_page.labels.get("cluster") == "a"
    a = [s for s in timeline.fired if matches('{cluster="a"}', s)]
    assert [s for s in a if s.is_page] and [s for s in a if not s.is_page], render_text(result)
    assert [s for s in timeline.fired if matches('{cluster="b"}', s)] == [], render_text(result)
    assert timeline.false_pages == []


def test_eight_adapters_on_four_slots_raise_the_adapter_thrash_warning_in_time(backtest):
    """The alert exists, fires within 10 minutes of the 8-adapter phase, and resolves after it."""
    result = backtest("adapter_thrash")
    timeline = result.timeline
    thrash = timeline.firing("HeadroomAdapterThrash")
    assert thrash, render_text(result)
    assert all(s.severity == "warning" and s.earned for s in thrash), render_text(result)
    assert 70 * MIN <= _first_firing(timeline, "HeadroomAdapterThrash") <= 80 * MIN, render_text(result)
    assert all(s.ended_at is not None and s.ended_at - timeline.start <= 110 * MIN + 15 * MIN for s in thrash)
    assert {s.labels.get("instance") for s in thrash} == {"replica-0"}


def test_two_adapters_on_four_slots_stay_quiet(backtest):
    """Within the slots nothing fires at all: before the 8-adapter phase, and 15 minutes after it."""
    result = backtest("adapter_thrash")
    timeline = result.timeline
    quiet = [
        s
        for s in timeline.fired
        if s.fired_at - timeline.start < 70 * MIN or s.fired_at - timeline.start > 125 * MIN
    ]
    assert quiet == [], render_text(result)
    assert timeline.false_pages == [] and timeline.false_warnings == []


@pytest.mark.parametrize("name", scenario_names())
def test_each_incident_opens_one_page_at_the_pager(backtest, name):
    """Per model (and cluster) a scenario's pages open at most one incident at a pager keyed on
    Alertmanager's group key, whatever order they fire in (collector.alerts.alertmanager)."""
    result = backtest(name)
    opened = Counter(n.group for n in result.page_incidents)
    assert all(count == 1 for count in opened.values()), render_text(result)
    if result.notified("page"):
        assert opened, render_text(result)


def test_docs_show_these_numbers(backtest):
    """docs/rules.md's scenario table is this run's, row for row (regenerate it with --table)."""
    text = (Path(__file__).resolve().parent.parent / "docs" / "rules.md").read_text()
    documented = text.split("<!-- /scenario table -->")[0].split("compares -->\n", 1)[1]
    assert documented == scenario_table([backtest(name) for name in scenario_names()])
