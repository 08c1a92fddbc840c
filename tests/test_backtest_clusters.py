"""Replicas in clusters: every series of a replica carries its `cluster`, and the truth is per cluster.

No Prometheus here (tests/test_backtest_scenarios.py runs `two_clusters` through the rules): short
simulated scenarios and hand-made records, so each point runs in well under a second or two.
"""

from __future__ import annotations

import dataclasses

import pytest

from collector.backtest.alertstate import Episode
from collector.backtest.evaluate import Evaluation
from collector.backtest.lifecycle import Lifecycle
from collector.backtest.scenario import Expect, Replica, Scenario, constant
from collector.backtest.scenario_series import scenario_series
from collector.backtest.scenarios import SCENARIOS
from collector.backtest.simulate import EPOCH, arrival_rate, simulate
from collector.backtest.timeline import build_timeline
from collector.backtest.truth import Breach, breaches
from collector.backtest.verdict import matches, verdict
from collector.rules.config import DEFAULT

JOB = DEFAULT.sidecar_job
MIN = 60.0


def _short(*replicas: Replica, load: float = 0.5) -> Scenario:
    return Scenario("short", "", 10 * MIN, constant(load), replicas=replicas)


def _labels(key) -> dict[str, str]:
    return dict(key[1])


def test_every_series_of_a_replica_in_a_cluster_carries_the_cluster_and_nothing_else_changes():
    """A replica in cluster a exports the series of the same replica without one, plus the label."""
    plain = scenario_series(simulate(_short(Replica("replica-0"))), JOB)
    clustered = scenario_series(simulate(_short(Replica("replica-0", cluster="a"))), JOB)
    assert all("cluster" not in _labels(key) for key in plain.keys())
    assert all(_labels(key).get("cluster") == "a" for key in clustered.keys())
    stripped = {
        (name, tuple(pair for pair in labels if pair[0] != "cluster")): clustered.samples((name, labels))
        for name, labels in clustered.keys()
    }
    assert stripped == {key: plain.samples(key) for key in plain.keys()}
    names = {key[0] for key in clustered.keys()}
    for name in (  # sidecar, target, engine, GPU, published capacity and log series alike
        "up",
        "headroom_inflight_requests",
        "headroom_requests_total",
        "headroom_time_to_first_token_seconds_bucket",
        "headroom_engine_up",
        "headroom_engine_requests_running",
        "headroom_gpu_utilization_ratio",
        "headroom_capacity_knee_requests",
        "headroom_log_rows_written_total",
    ):
        assert name in names


def test_the_same_instance_in_two_clusters_gives_two_sets_of_series():
    result = simulate(
        _short(
            Replica("replica-0", cluster="a", load=constant(1.0)),
            Replica("replica-0", cluster="b", load=constant(0.3)),
        )
    )
    assert set(result.engine) == {"a/replica-0", "b/replica-0"}
    assert {r.cluster for r in result.records} == {"a", "b"}
    assert len({r.request_id for r in result.records}) == len(result.records)
    series = scenario_series(result, JOB)
    up = sorted(key for key in series.keys() if key[0] == "up")
    assert up == [
        ("up", (("cluster", "a"), ("instance", "replica-0"), ("job", JOB))),
        ("up", (("cluster", "b"), ("instance", "replica-0"), ("job", JOB))),
    ]
    knees = [key for key in series.keys() if key[0] == "headroom_capacity_knee_requests"]
    assert sorted(_labels(key)["cluster"] for key in knees) == ["a", "b"]


def test_a_replica_load_replaces_the_scenario_load_for_that_replica_only():
    scenario = _short(Replica("r-0"), Replica("r-1", load=constant(1.0)), load=0.25)
    own, inherited = scenario.replicas[1], scenario.replicas[0]
    assert arrival_rate(scenario, own, 0.0) == pytest.approx(
        arrival_rate(_short(Replica("r-1"), load=1.0), Replica("r-1"), 0.0)
    )
    assert arrival_rate(scenario, inherited, 0.0) < arrival_rate(scenario, own, 0.0) / 3
    result = simulate(scenario)
    counts = {name: sum(r.instance == name for r in result.records) for name in ("r-0", "r-1")}
    assert counts["r-1"] > 3 * counts["r-0"] > 0
    assert [(r.request_id, r.admitted) for r in simulate(scenario).records] == [
        (r.request_id, r.admitted) for r in result.records
    ]


def test_a_replica_twice_in_one_cluster_is_refused():
    with pytest.raises(ValueError, match="a/replica-0 appear twice"):
        _short(Replica("replica-0", cluster="a"), Replica("replica-0", cluster="a"))
    _short(Replica("replica-0", cluster="a"), Replica("replica-0", cluster="b"))  # fine


def _record(i: int, cluster: str, ttft_s: float) -> Lifecycle:
    admitted = EPOCH + i
    return Lifecycle(
        request_id=f"{cluster}-{i}",
        instance="replica-0",
        model="m",
        tenant="t",
        stream=True,
        admitted=admitted,
        prompt_tokens=100,
        first_token=admitted + ttft_s,
        completed=admitted + ttft_s + 1,
        completion_tokens=10,
        outcome="ok",
        status_code=200,
        cluster=cluster,
    )


class _Slo:
    ttft_seconds = 1.0
    e2e_seconds = None


def test_a_breach_in_one_cluster_is_not_diluted_by_the_other():
    """8 % slow in cluster a is a breach, though a and b together are under 5 % slow."""
    rows = [_record(i, "a", 5.0 if i % 12 == 0 else 0.2) for i in range(100)]
    rows += [_record(i, "b", 0.2) for i in range(100)]
    times = [EPOCH + 120.0]
    found = breaches(rows, times, lambda model: _Slo())
    assert [(b.kind, b.cluster) for b in found] == [("ttft", "a")]
    merged = [dataclasses.replace(r, cluster="") for r in rows]
    assert breaches(merged, times, lambda model: _Slo()) == []


def test_another_clusters_alert_neither_leads_nor_is_earned_by_a_breach():
    breach = Breach("ttft", "m", EPOCH + 3600, EPOCH + 4000, cluster="a")

    def episode(name: str, at: float, **labels: str) -> Episode:
        pairs = tuple(sorted({"alertname": name, "model": "m", **labels}.items()))
        return Episode(pairs, at - 300, at, EPOCH + 4500)  # resolved within the breach's tail

    evaluation = Evaluation(
        [],
        [
            episode("Early", EPOCH + 2400, cluster="b"),  # before a's breach, but b's
            episode("Fleet", EPOCH + 2700),  # no cluster: the whole fleet's
            episode("Own", EPOCH + 3000, cluster="a"),
        ],
        {"Early": "warning", "Fleet": "warning", "Own": "critical"},
    )
    timeline = build_timeline("t", evaluation, [breach], [], EPOCH, EPOCH + 7200)
    assert timeline.first_warning.name == "Fleet" and timeline.first_page.name == "Own"
    assert [s.name for s in timeline.false_warnings] == ["Early"]
    assert timeline.problems[0].name == "ttft SLO breach (m in cluster a)"
    checks = verdict(
        timeline, Expect(fired=('{cluster="a"}', '{cluster="c"}'), silent=('{cluster="b"}',)), None
    )
    assert [(c.what, c.ok) for c in checks if "cluster" in c.what] == [
        ('{cluster="a"} fires', True),
        ('{cluster="c"} fires', False),
        ('{cluster="b"} stays silent', False),
    ]
    assert matches('HeadroomX{cluster="b"}', timeline.alerts[0]) is False
    assert matches('Early{cluster="b"}', timeline.alerts[0])


def test_the_built_in_two_clusters_scenario_tells_its_replicas_apart_only_by_cluster():
    scenario = SCENARIOS["two_clusters"]
    assert {r.instance for r in scenario.replicas} == {"replica-0"}
    assert [r.cluster for r in scenario.replicas] == ["a", "b"]
    a, b = scenario.replicas
    assert a.load is not None and b.load is not None
    assert (a.load(0), a.load(2 * 3600)) == pytest.approx((0.3, 1.5))
    assert (b.load(0), b.load(3600), b.load(2 * 3600)) == (0.5, 0.5, 0.5)
    assert '{cluster="b"}' in scenario.expect.silent
