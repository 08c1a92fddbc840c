"""The review that plans: replicas needed at the peak per replica class against the simulator's
known slots, a fleet's load per replica, the trend to next week, Little's law per window where it
can fail, the model heading.

The traffic is the simulator's own (support.offline: the real scheduler and cost model in
simulated time), probed as `headroom probe` would and estimated by collector.analysis; the expected
replica count is derived from the pool that was published, never a constant.
"""

from __future__ import annotations

import dataclasses
import math
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from support.estimates import capacity_estimate
from support.offline import START, closed_loop_rows

from collector.analysis.estimate import estimate_probe_run
from collector.capacity import CapacityEstimate
from collector.report.build import build_report, heading
from collector.report.collect import collect_inputs
from collector.report.plan import bin_step
from collector.sim.config import SimConfig
from collector.store.db import RequestStore
from collector.store.decision import decisions
from collector.store.estimates import save_estimate

SLOTS = 8
CLIENTS = 20  # load peaks at 20 concurrent requests against an engine of 8 slots


def _shifted(rows: list[dict[str, Any]], by: timedelta, **fields: Any) -> list[dict[str, Any]]:
    """Probe-shaped rows moved in time and relabelled (traffic from the probe's closed loop)."""
    stamps = ("admitted_at", "first_byte_at", "first_token_at", "completed_at")
    return [
        dict(row, **{k: row[k] + by for k in stamps if row[k] is not None}, **fields)
        | {"request_id": f"{fields.get('instance', 'x')}-{row['request_id']}"}
        for row in rows
    ]


def one_hour_store(
    path: Any = None, *, replicas: int = 1, slots: int = SLOTS, clients: int = CLIENTS
) -> tuple[RequestStore, datetime]:
    """A database with under an hour of traffic: a probe of the simulator (max_num_seqs=slots)
    through replica r0, its estimate (replica class slots<slots>) published, then `clients` closed-
    loop clients ramping up over ~12 minutes, spread evenly over `replicas` sidecars. Returns the
    store and a `now` 5 minutes after the last request."""
    config = SimConfig(max_num_seqs=slots)
    probe = closed_loop_rows(config, (1, 2, 4, 8, 16, 32), 15.0, run_id="probe-sim")
    probe = [dict(row, instance="r0") for row in probe]
    store = RequestStore(path) if path else RequestStore()
    store.insert_rows(probe)
    estimate = estimate_probe_run(store, "probe-sim", slo_ttft_p95_s=2.0)
    assert estimate is not None
    estimate = dataclasses.replace(
        estimate,
        task_class="all",
        replica_class=f"slots{slots}",
        created_at=max(row["completed_at"] for row in probe),
    )
    save_estimate(store, estimate)
    after = estimate.created_at - START + timedelta(minutes=1)
    per = clients // replicas
    last = estimate.created_at
    for r in range(replicas):
        levels = (max(1, per // 2), per)
        rows = closed_loop_rows(config, levels, 300.0, seed=10 + r, run_id="load")
        traffic = _shifted(rows, after, source="traffic", run_id=None, instance=f"r{r}")
        store.insert_rows(traffic)
        last = max(last, max(row["completed_at"] for row in traffic))
    return store, last + timedelta(minutes=5)


def _published_pool(store: RequestStore, now: datetime) -> int:
    (decision,) = [d for d in decisions(store, now) if d.task_class == "all"]
    assert decision.estimate is not None
    return decision.estimate.recommended_pool


@pytest.fixture(scope="module")
def one_replica():
    store, now = one_hour_store()
    report = build_report(collect_inputs(store, now - timedelta(days=7), now))
    pool = _published_pool(store, now)
    store.close()
    return report, pool


def test_the_planning_number_follows_the_published_pool(one_replica):
    report, pool = one_replica
    (model,) = report["models"]
    (entry,) = model["classes"]
    plan = entry["plan"]
    assert entry["replica_class"] == f"slots{SLOTS}" and entry["replicas_run"] == 1
    # 20 clients in a closed loop: the busiest minute carries ~20 requests in flight
    assert CLIENTS - 0.5 <= plan["peak"]["requests"] <= CLIENTS
    assert plan["pool_per_replica"]["requests"] == pool
    assert plan["replicas_needed"] == plan["needed"]["requests"] == math.ceil(CLIENTS / pool) > 1
    assert plan["binding_caliber"] == "requests"
    assert plan["trend"]["reason"] == "traffic on 1 day(s); a trend needs 2"
    estimate = entry["estimate"]
    assert estimate["source"] == "probe" and estimate["run_id"] == "probe-sim"
    assert estimate["published_because"].startswith("probe run probe-sim")
    assert estimate["age_h"] is not None and estimate["age_h"] < 1
    assert "mu_slo" not in estimate  # a closed-loop probe: no open-loop rates to show
    actions = [a["action"] for a in model["actions"]]
    assert f"Run {math.ceil(CLIENTS / pool)} replicas of class slots{SLOTS} at the peak (ran 1)" in actions


def test_the_planning_line_and_the_provenance_lead_the_model(one_replica):
    from collector.report.review import render_report

    report, pool = one_replica
    needed = math.ceil(CLIENTS / pool)
    for fmt in ("md", "html"):
        text = render_report(report, fmt).replace("&#x27;", "'")
        line = f"At this week's peak you needed {needed} replicas of class slots{SLOTS} (you ran 1)"
        assert line in text
        provenance = text.index("Knee of class slots8: 8 requests")
        assert "published because: probe run probe-sim" in text
        assert text.index(line[:20]) < provenance < text.index("Recommended actions")


def test_bins_and_throughput_are_per_replica_and_real(one_replica):
    report, _ = one_replica
    entry = report["models"][0]["classes"][0]
    load = entry["load"]
    assert load["step"] == bin_step(17 * 60) == 5  # ~17 minutes of traffic in 5 s bins
    busy = [b for b in load["bins"] if b["requests_per_replica"] > CLIENTS - 1]
    assert busy, "the busiest bins carry the 20 clients"
    # a real throughput: what the engine produced while busy, not the hour's tokens / 3600 s
    sim = [b["tokens_per_s_per_replica"] for b in busy]
    assert min(sim) > 200


def test_a_fleet_reads_per_replica_and_sums_the_demand():
    store, now = one_hour_store(replicas=2)
    report = build_report(collect_inputs(store, now - timedelta(days=7), now))
    pool = _published_pool(store, now)
    store.close()
    (entry,) = report["models"][0]["classes"]
    plan = entry["plan"]
    assert entry["instances"] == ["r0", "r1"] and plan["replicas_run"] == 2
    assert CLIENTS - 1 <= plan["peak"]["requests"] <= CLIENTS  # the class's two replicas together
    assert plan["replicas_needed"] == math.ceil(plan["peak"]["requests"] / pool)
    busiest = max(entry["load"]["bins"], key=lambda b: b["requests"])
    assert busiest["replicas"] == 2
    assert busiest["requests_per_replica"] == pytest.approx(busiest["requests"] / 2, abs=1e-3)
    # one replica's own peak (the sidecar's count at admission) is its half of the load
    assert entry["concurrency"]["peak_requests"] == CLIENTS // 2


def _burst(day: int, concurrent: int, start: datetime) -> list[dict[str, Any]]:
    """`concurrent` requests in flight together for 5 minutes on `day`."""
    begin = start + timedelta(days=day, hours=12)
    return [
        {
            "request_id": f"d{day}-{i}",
            "source": "traffic",
            "instance": "r0",
            "model": "m",
            "admitted_at": begin,
            "first_token_at": begin + timedelta(seconds=1),
            "completed_at": begin + timedelta(minutes=5),
            "outcome": "ok",
            "prompt_tokens": 100,
            "completion_tokens": 100,
            "e2e_s": 300.0,
            "ttft_s": 1.0,
            "inflight_at_admit": i + 1,
        }
        for i in range(concurrent)
    ]


def _estimate(pool: int, created: datetime) -> CapacityEstimate:
    return capacity_estimate(
        "m",
        run_id="p",
        knee_requests=pool + 2,
        slo_max_requests=pool,
        recommended_pool=pool,
        confidence="high",
        created_at=created,
    )


def test_the_trend_gives_next_weeks_replicas():
    """Daily peaks 4, 6, ..., 30 over 14 days (2 a day, each day at its start): next week's peak
    at the trend is the line at the end of next week, 4 + 2 x 21 = 46, so ceil(46 / 5) = 10."""
    store = RequestStore()
    first = datetime(2026, 11, 16, tzinfo=UTC)
    for day in range(14):
        store.insert_rows(_burst(day, 4 + 2 * day, first))
    until = first + timedelta(days=14)
    from collector.store.estimates import save_estimate as save

    save(store, _estimate(5, until - timedelta(days=1)))
    report = build_report(collect_inputs(store, until - timedelta(days=7), until))
    store.close()
    plan = report["models"][0]["classes"][0]["plan"]
    assert plan["peak"]["requests"] == 30 and plan["replicas_needed"] == 6
    trend = plan["trend"]
    assert trend["days"] == 14 and trend["per_day"]["requests"] == pytest.approx(2.0)
    assert trend["next_week_peak"]["requests"] == pytest.approx(46.0, abs=0.01)
    assert trend["replicas_needed"] == 10


def test_littles_law_per_window_catches_durations_that_disagree_with_the_stamps():
    store = RequestStore()
    start = datetime(2026, 11, 30, 8, tzinfo=UTC)
    rows = []
    for minute in range(120):
        begin = start + timedelta(minutes=minute)
        broken = minute >= 60  # the second hour's durations are half of what the stamps say
        for i in range(4):
            admitted = begin + timedelta(seconds=15 * i)
            rows.append(
                {
                    "request_id": f"r{minute}-{i}",
                    "source": "traffic",
                    "instance": "r0",
                    "model": "m",
                    "admitted_at": admitted,
                    "completed_at": admitted + timedelta(seconds=10),
                    "outcome": "ok",
                    "e2e_s": 5.0 if broken else 10.0,
                }
            )
    store.insert_rows(rows)
    until = start + timedelta(hours=3)
    report = build_report(collect_inputs(store, until - timedelta(days=7), until))
    store.close()
    law = report["models"][0]["littles_law"]
    assert law["window_s"] == 300 and law["checked"] == 24
    off = [w for w in law["windows"] if not w["consistent"]]
    assert len(off) == law["inconsistent"] == 12
    assert all(w["t"] >= (start + timedelta(hours=1)).timestamp() for w in off)
    assert off[0]["ratio"] == pytest.approx(2.0, rel=0.05)
    assert any(
        "Little's law is off in 12 of 24 windows" in a["reason"] for a in report["models"][0]["actions"]
    )


def test_littles_law_windows_count_requests_that_cross_edges_exactly():
    """The store sums each window's busy seconds in one pass by the window a request starts and
    ends in; a request crossing many windows, one ending exactly on an edge (counted in both
    windows, a closed interval) and one whose completion precedes its admission must give what
    the definition gives, computed here request by request."""
    start = datetime(2026, 11, 30, 8, tzinfo=UTC)
    spans = [(7.0 * i + 0.5, 1.0) for i in range(500)]  # short: p95 e2e 1 s, 60 s windows
    spans += [
        (100.25, 2990.0),
        (1200.0, 60.0),
        (1830.5, 29.5),
        (2000.0, -3.0),
    ]  # long, to an edge, ..., backwards
    rows = [
        {"request_id": f"r{i}", "source": "traffic", "instance": "r0", "model": "m", "outcome": "ok",
         "admitted_at": start + timedelta(seconds=a), "completed_at": start + timedelta(seconds=a + d),
         "e2e_s": d if d > 0 else None}
        for i, (a, d) in enumerate(spans)
    ]  # fmt: skip
    store = RequestStore()
    store.insert_rows(rows)
    report = build_report(collect_inputs(store, start, start + timedelta(hours=2)))
    store.close()
    law = report["models"][0]["littles_law"]
    assert law["window_s"] == 60
    t0 = start.timestamp()
    expected = []
    for k in range(int(t0 // 60), int((t0 + 7200) // 60)):
        left, right = k * 60.0, k * 60.0 + 60.0
        ends = [(t0 + a, t0 + a + d, d) for a, d in spans if left <= t0 + a + d <= right]
        if not ends:
            continue
        busy = sum(max(0.0, min(t0 + a + d, right) - max(t0 + a, left)) for a, d in spans if d > 0)
        e2e = sum(d for _, _, d in ends if d > 0)
        expected.append((left, busy / 60, e2e / 60))
    assert [w["t"] for w in law["windows"]] == [t for t, _, _ in expected]
    measured = [w["measured_inflight"] for w in law["windows"]]
    predicted = [w["predicted_inflight"] for w in law["windows"]]
    assert measured == pytest.approx([round(m, 4) for _, m, _ in expected], abs=1e-4)
    assert predicted == pytest.approx([round(p, 4) for _, _, p in expected], abs=1e-4)
    assert max(measured) > 1.5  # the long request counts in the windows it spans whole


def test_an_instance_takes_the_class_of_the_probe_runs_it_served():
    store, now = one_hour_store(replicas=1)
    # a second class probed through replica h1; its traffic is h1's
    config = SimConfig(max_num_seqs=16)
    probe = [dict(row, instance="h1") for row in closed_loop_rows(config, (1, 4, 16, 32), 10.0, run_id="p16")]
    store.insert_rows(_shifted(probe, timedelta(minutes=2), instance="h1"))
    estimate = estimate_probe_run(store, "p16", slo_ttft_p95_s=2.0)
    assert estimate is not None
    estimate = dataclasses.replace(
        estimate, task_class="all", replica_class="slots16", created_at=now - timedelta(minutes=1)
    )
    save_estimate(store, estimate)
    traffic = closed_loop_rows(config, (12,), 120.0, seed=5, run_id="load")
    store.insert_rows(_shifted(traffic, timedelta(minutes=10), source="traffic", run_id=None, instance="h1"))
    # h2 was never probed: its sidecar recorded its class in each row
    served = closed_loop_rows(config, (12,), 60.0, seed=6, run_id="load2")
    store.insert_rows(
        _shifted(
            served,
            timedelta(minutes=10),
            source="traffic",
            run_id=None,
            instance="h2",
            replica_class="slots16",
        )
    )
    report = build_report(collect_inputs(store, now - timedelta(days=7), now))
    store.close()
    classes = {c["replica_class"]: c for c in report["models"][0]["classes"]}
    assert sorted(classes) == ["slots16", "slots8"]
    assert classes["slots16"]["instances"] == ["h1", "h2"] and classes["slots8"]["instances"] == ["r0"]
    assert classes["slots16"]["plan"]["pool_per_replica"]["requests"] == estimate.recommended_pool


def test_a_class_its_rows_name_without_a_published_knee_falls_back_as_the_rules_do():
    """r1's sidecar says "nvidia-l4-slots8", which has no estimate: the rules judge it by the
    model's only published knee, and the review plans it there, not under a class with no knee."""
    store, now = one_hour_store(replicas=2)
    store.execute("UPDATE requests SET replica_class = 'nvidia-l4-slots8' WHERE instance = 'r1'")
    report = build_report(collect_inputs(store, now - timedelta(days=7), now))
    store.close()
    (entry,) = report["models"][0]["classes"]
    assert entry["replica_class"] == f"slots{SLOTS}" and entry["instances"] == ["r0", "r1"]
    assert entry["concurrency"]["binding_caliber"] in ("requests", "tokens")


def test_the_load_counts_requests_and_ramps_tokens_from_the_stores_histograms():
    """Two requests on one replica: admitted at 0 and 1 s, done at 3 and 2 s; the first has its
    first token at 1 s and generates 20 tokens evenly until 3 s, the second none. The load the
    store's histograms give (samples 0.1 s apart, at 0.05, 0.15, ...) is the sum over the two."""
    t0 = datetime(2026, 12, 1, tzinfo=UTC)
    at = lambda s: t0 + timedelta(seconds=s)  # noqa: E731
    base = {"model": "m", "instance": "a", "source": "traffic", "outcome": "ok"}
    store = RequestStore()
    store.insert_rows(
        [
            base | {"request_id": "one", "admitted_at": at(0), "first_token_at": at(1), "completed_at": at(3),
                    "prompt_tokens": 10, "completion_tokens": 20, "e2e_s": 3.0},
            base | {"request_id": "two", "admitted_at": at(1), "first_token_at": None, "completed_at": at(2),
                    "prompt_tokens": 5, "completion_tokens": 0, "e2e_s": 1.0},
        ]
    )  # fmt: skip
    (replicas,) = collect_inputs(store, t0, at(10)).models["m"].classes
    load = replicas.load
    assert load is not None and load.grid.dt == pytest.approx(0.1) and load.grid.origin == t0.timestamp()
    picked = [5, 15, 20, 25, 29]  # 0.55, 1.55, 2.05, 2.55, 2.95 s
    assert load.grid.times[picked] == pytest.approx([0.55, 1.55, 2.05, 2.55, 2.95])
    assert load.requests[picked].tolist() == [1, 2, 1, 1, 1]
    assert load.tokens[picked] == pytest.approx([10, 10 + 20 * 0.55 / 2 + 5, 10 + 20 * 1.05 / 2, 25.5, 29.5])
    assert load.grid.samples == 30  # nothing sampled after the last completion


def test_the_heading_is_the_served_name_and_a_path_its_file_stem():
    assert heading("/models/gemma-3-270m-it-Q8_0.gguf") == "gemma-3-270m-it-Q8_0"
    assert heading("meta-llama/Llama-3.1-8B-Instruct") == "meta-llama/Llama-3.1-8B-Instruct"
    assert heading("gemma.gguf") == "gemma" and heading("llama-3-8b") == "llama-3-8b"


def test_the_open_loop_rates_join_the_provenance():
    from collector.report.render_md import provenance_line
    from collector.store.estimates import save_estimate as save

    store = RequestStore()
    until = datetime(2026, 11, 30, tzinfo=UTC)
    store.insert_rows(_burst(0, 6, until - timedelta(days=1)))
    rates = {"mu_slo_requests_per_s": 3.25, "prefill_tokens_per_s": 1350.0}
    estimate = dataclasses.replace(_estimate(5, until - timedelta(hours=2)), rates=rates)
    save(store, estimate)
    report = build_report(collect_inputs(store, until - timedelta(days=7), until))
    store.close()
    entry = report["models"][0]["classes"][0]
    assert (entry["estimate"]["mu_slo"], entry["estimate"]["v_p"]) == (3.25, 1350.0)
    line = provenance_line(entry)
    assert "μ_slo 3.250 requests/s" in line and "V_P 1,350 prefill tokens/s" in line
    assert "2 h old at the window's end" in line
