"""One publication decision, every reader: the gauges (at start-up and after a probe is posted),
`headroom integrations keda|gateway|llm-d`, the backtest's replay (from the file and through the
store) and the query API's estimate route all give the estimate collector.store.decision
publishes — not merely the newest one.

The history every test here starts from: a good probe (knee 8), then a newer confident traffic
estimate (knee 16), then a newer probe that did not reach its knee, then a newer probe whose
requests failed with HTTP 400 a quarter of the time. The good probe stays published; once it is
older than the probe age limit, the traffic estimate is.
"""

from __future__ import annotations

from dataclasses import replace
from datetime import UTC, datetime, timedelta

import httpx
import pytest
import yaml
from click.testing import CliRunner
from prometheus_client import CollectorRegistry
from support.owner_routes import routes_app
from support.synthetic import closed_loop_rows
from test_analysis_estimate import _estimate

from collector.backtest.replay import from_db
from collector.capacity import CapacityEstimate
from collector.cli import main
from collector.serving import serve_in_thread
from collector.store.capacity_gauges import CapacityGauges
from collector.store.db import RequestStore
from collector.store.decision import MAX_ERROR_RATIO, PublishPolicy, decide, publish, published_estimates
from collector.store.estimates import save_estimate
from collector.store.jobs import JobSettings

TOKEN = "one-decision-token"


def _history(probe_age: timedelta) -> list[CapacityEstimate]:
    now = datetime.now(UTC)
    good = replace(_estimate(model="m", knee_at=8), run_id="probe-good", created_at=now - probe_age)
    traffic = replace(
        _estimate(model="m", knee_at=16),
        source="traffic",
        run_id=None,
        confidence="high",
        created_at=now - timedelta(hours=3),
    )
    unreached = _estimate(model="m", knee_at=32)
    unreached = replace(
        unreached,
        run_id="probe-short",
        created_at=now - timedelta(hours=2),
        knee=replace(unreached.knee, reached=False),
    )
    failing = replace(
        _estimate(model="m", knee_at=4),
        run_id="probe-400s",
        created_at=now - timedelta(hours=1),
        error_ratio=0.25,
    )
    return [good, traffic, unreached, failing]


@pytest.fixture(params=[timedelta(hours=4), timedelta(days=8)], ids=["fresh-probe", "aged-probe"])
def history(request, tmp_path):
    """(the request log's path, the knee every reader must give, its pool)."""
    estimates = _history(request.param)
    store = RequestStore(tmp_path / "log.duckdb")
    store.insert_rows(
        closed_loop_rows(
            slots=8, levels=(1, 2, 4), seconds_per_level=20, start=datetime.now(UTC) - timedelta(hours=6)
        )
    )
    for estimate in estimates:
        save_estimate(store, estimate)
    store.close()
    winner = estimates[0] if request.param < PublishPolicy().probe_max_age else estimates[1]
    return tmp_path / "log.duckdb", winner.knee_requests, winner.recommended_pool


def test_the_gauges_at_start_up_and_the_query_route_give_the_published_knee(history):
    path, knee, pool = history
    store = RequestStore(path)
    gauges, registry = CapacityGauges(), CollectorRegistry()
    registry.register(gauges)
    publish(store, gauges, None)  # what the owning sidecar does at start-up
    handle = serve_in_thread(routes_app(store, TOKEN, gauges=gauges))
    try:
        values = {
            s.labels.get("source"): s.value
            for metric in registry.collect()
            if metric.name == "headroom_capacity_knee_requests"
            for s in metric.samples
        }
        assert list(values.values()) == [knee], values
        rows = httpx.get(
            f"{handle.url}/v1/query/estimate", headers={"Authorization": f"Bearer {TOKEN}"}
        ).json()["rows"]
        assert [(r["knee_requests"], r["recommended_pool"]) for r in rows] == [(knee, pool)]
        assert "published_because" in rows[0]
    finally:
        handle.stop()
        store.close()


def test_the_replay_from_the_file_gives_the_published_knee(history):
    path, knee, _ = history
    log = from_db(str(path))
    assert [c.knee_requests for c in log.capacities] == [knee]


def test_every_integration_renders_the_published_estimate(history):
    path, knee, pool = history
    runner = CliRunner()

    def render(*args: str) -> dict:
        result = runner.invoke(main, ["integrations", *args, "--db", str(path)])
        assert result.exit_code == 0, result.output
        return yaml.safe_load(result.output)

    keda = render("keda", "--deployment", "d")
    assert f"or vector({pool})" in keda["spec"]["triggers"][0]["metadata"]["query"]
    gateway = render("gateway")
    assert gateway["plugins"][0]["parameters"]["maxConcurrency"] == pool
    llmd = render("llm-d")
    (entry,) = [yaml.safe_load(text) for text in llmd["data"].values()]
    assert entry["queueLengthThreshold"] == max(1, knee - pool)


def test_the_age_limit_of_the_settings_is_honoured_by_the_gauges_and_the_route(tmp_path):
    store = RequestStore(tmp_path / "log.duckdb")
    for estimate in _history(timedelta(hours=4)):
        save_estimate(store, estimate)
    gauges = CapacityGauges()
    policy = JobSettings(probe_max_age="2h").policy
    publish(store, gauges, None, policy)
    handle = serve_in_thread(routes_app(store, TOKEN, gauges=gauges, policy=policy))
    try:
        rows = httpx.get(
            f"{handle.url}/v1/query/estimate", headers={"Authorization": f"Bearer {TOKEN}"}
        ).json()["rows"]
        assert [r["knee_requests"] for r in rows] == [16]  # the probe is past the 2 h limit
        assert [p.knee_requests for p in gauges.published()] == [16]
    finally:
        handle.stop()
        store.close()


def test_why_nothing_newer_was_published_is_said():
    decision = decide(_history(timedelta(hours=4)), datetime.now(UTC))
    assert decision.estimate is not None and decision.estimate.run_id == "probe-good"
    assert "probe run probe-400s was not used: 25% of its requests failed" in decision.reason


@pytest.mark.parametrize(
    ("change", "why"),
    [
        ({"error_ratio": MAX_ERROR_RATIO + 0.01}, "failed for reasons other than capacity"),
        ({"recommended_pool": 0}, "a pool of 0"),
        ({"confidence": "none", "confidence_reason": "every level failed"}, "every level failed"),
        ({"knee": "not reached"}, "not reached"),
    ],
)
def test_an_unusable_estimate_alone_publishes_nothing_and_says_why(tmp_path, change, why):
    store = RequestStore(tmp_path / "log.duckdb")
    estimate = _estimate(model="m", knee_at=8)
    if "knee" in change:
        change = {"knee": replace(estimate.knee, reached=False)}
    save_estimate(store, replace(estimate, **change))
    gauges = CapacityGauges()
    (decision,) = publish(store, gauges)
    assert decision.estimate is None and why in decision.reason
    assert gauges.published() == [] and published_estimates(store) == []
    store.close()


def test_a_past_moment_answers_what_was_published_then(tmp_path):
    store = RequestStore(tmp_path / "log.duckdb")
    estimates = _history(timedelta(hours=4))
    for estimate in estimates:
        save_estimate(store, estimate)
    before_any = estimates[0].created_at - timedelta(minutes=1)
    assert published_estimates(store, as_of=before_any) == []
    between = estimates[1].created_at - timedelta(minutes=1)
    assert [p.estimate.run_id for p in published_estimates(store, as_of=between)] == ["probe-good"]
    store.close()
