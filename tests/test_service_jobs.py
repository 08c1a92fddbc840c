"""Store jobs: triggers fire on an injected clock; rollup, Parquet export + retention, estimates, report."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest
from fastapi.testclient import TestClient
from support.owner_routes import routes_app
from support.synthetic import synthetic_probe_run, synthetic_rows

from collector.analysis.refresh import refresh_estimates
from collector.report.review import write_report_files
from collector.store.capacity_gauges import CapacityGauges
from collector.store.db import RequestStore
from collector.store.decision import publish
from collector.store.jobs import JobSettings, build_scheduler, job_table, parse_weekly_cron, run_due
from collector.store.retention import export_and_expire
from collector.store.rollup import rollup_hours

# The work `headroom run` hands to the store's jobs.
WORK = {"refresh": refresh_estimates, "review": write_report_files}

UTC = UTC
SUNDAY_EVENING = datetime(2026, 11, 29, 22, 30, tzinfo=UTC)  # 2026-11-30 is a Monday
MONDAY_MORNING = datetime(2026, 11, 30, 9, 30, tzinfo=UTC)
DAY_P95 = (
    "SELECT {day} AS day, model, count(*), quantile_cont(ttft_s, 0.95), quantile_cont(e2e_s, 0.5) "
    "FROM {source} WHERE ttft_s IS NOT NULL GROUP BY ALL ORDER BY ALL"
)


@pytest.fixture
def store():
    store = RequestStore()
    yield store
    store.close()


def test_jobs_fire_on_their_triggers_with_an_injected_clock(store, tmp_path):
    store.insert_rows(
        synthetic_rows(
            600, datetime(2026, 11, 27, tzinfo=UTC), span=timedelta(days=3), models=("model-a", "model-b")
        )
    )
    store.insert_rows(synthetic_probe_run(datetime(2026, 11, 30, 1, tzinfo=UTC)))
    gauges = CapacityGauges()
    settings = JobSettings(
        export_dir=tmp_path / "parquet",
        report_dir=tmp_path / "reports",
        estimate_interval_s=6 * 3600,
        probe_check_interval_s=3600,  # (every 5 s by default: 7,920 checks over these 11 hours)
        retention_days=30,
        clock=lambda: SUNDAY_EVENING,
    )
    fired = run_due(job_table(store, gauges, settings, **WORK), SUNDAY_EVENING, MONDAY_MORNING)
    names = [name for _, name in fired]
    assert names.count("rollup") == 11  # 23:05 ... 09:05
    assert names.count("probe_runs") == 11  # 23:30 ... 09:30
    assert [when for when, name in fired if name == "retention"] == [
        datetime(2026, 11, 30, 0, 15, tzinfo=UTC)
    ]
    assert [when for when, name in fired if name == "capacity_estimates"] == [
        SUNDAY_EVENING + timedelta(hours=6)
    ]
    assert [when for when, name in fired if name == "weekly_report"] == [
        datetime(2026, 11, 30, 9, tzinfo=UTC)
    ]
    assert [when for when, _ in fired] == sorted(when for when, _ in fired)
    # the effects: rollups, a Parquet partition per sealed day, the gauges, the report
    assert store.query("SELECT count(DISTINCT hour) FROM requests_hourly")[0][0] >= 2
    assert sorted(p.name for p in (tmp_path / "parquet").iterdir()) == [
        "day=2026-11-27",
        "day=2026-11-28",
        "day=2026-11-29",
    ]
    assert gauges.get("model-a").knee_requests == 8.0
    assert (tmp_path / "reports" / "latest.html").read_text().startswith("<!doctype html>")
    assert (tmp_path / "reports" / "capacity-review-2026-11-30.md").exists()
    with TestClient(routes_app(store, "t", report_dir=tmp_path / "reports")) as client:
        served = client.get("/reports/latest", headers={"Authorization": "Bearer t"})
    assert served.status_code == 200 and "model-b" in served.text and "data:image/png;base64," in served.text


def test_weekly_report_schedule_is_configurable():
    trigger = parse_weekly_cron("fri 17:30")
    assert trigger.get_next_fire_time(None, SUNDAY_EVENING) == datetime(2026, 12, 4, 17, 30, tzinfo=UTC)
    assert parse_weekly_cron("mon 09:00").get_next_fire_time(None, SUNDAY_EVENING) == datetime(
        2026, 11, 30, 9, 0, tzinfo=UTC
    )
    with pytest.raises(ValueError, match="'monday 9am'"):
        parse_weekly_cron("monday 9am")


def test_stored_estimates_are_published_and_served_and_the_scheduler_holds_every_job(store, tmp_path):
    # a run two hours ago: the gauges and the estimate route count its age on the present's clock
    # (a fixed date here would pass the 7-day probe age one week after it was written)
    ran_at = datetime.now(UTC) - timedelta(hours=2)
    store.insert_rows(synthetic_probe_run(ran_at, model="model-z"))
    refresh_estimates(store, None, ran_at + timedelta(hours=1), window=timedelta(hours=2))
    settings = JobSettings(export_dir=tmp_path / "pq", report_dir=tmp_path / "reports")
    gauges = CapacityGauges()
    publish(store, gauges, None)  # what an owning sidecar does at start, before the first refresh
    assert gauges.get("model-z").knee_requests == 8.0
    scheduler = build_scheduler(store, gauges, settings, **WORK)
    with TestClient(routes_app(store, "t", gauges=gauges, report_dir=tmp_path / "reports")) as client:
        auth = {"Authorization": "Bearer t"}
        estimate = client.get("/v1/query/estimate", params={"model": "model-z"}, headers=auth).json()["rows"]
        assert [(e["knee_requests"], e["source"], e["run_id"]) for e in estimate] == [(8, "probe", "run-1")]
        assert all("littles_law" in level for level in estimate[0]["levels"])
        runs = client.get("/v1/query/probe-runs", headers=auth).json()["rows"]
        assert [(r["run_id"], r["model"], r["requests"], r["max_inflight"]) for r in runs] == [
            ("run-1", "model-z", store.count(), 32)
        ]
        assert {job.id for job in scheduler.get_jobs()} == {
            "rollup",
            "retention",
            "capacity_estimates",
            "probe_runs",
            "weekly_report",
        }
        assert client.get("/reports/latest", headers={"Authorization": "Bearer t"}).status_code == 404
    default_jobs = build_scheduler(store, None, JobSettings(), **WORK).get_jobs()
    assert {job.id for job in default_jobs} == {"rollup", "capacity_estimates", "probe_runs"}


def test_parquet_export_reads_back_with_the_same_percentiles_and_retention_expires(store, tmp_path):
    store.insert_rows(
        synthetic_rows(
            1500, datetime(2026, 11, 24, tzinfo=UTC), span=timedelta(days=5), models=("model-a", "model-b")
        )
    )
    day = "CAST(timezone('UTC', admitted_at) AS DATE)"
    live = store.query(DAY_P95.format(day=day, source="requests"))
    done = export_and_expire(store, tmp_path, 30, datetime(2026, 11, 30, 0, 15, tzinfo=UTC))
    assert len(done["exported"]) == 5 and done["expired"] == []
    parquet = f"read_parquet('{tmp_path}/**/*.parquet', hive_partitioning=true)"
    exported = store.query(DAY_P95.format(day="day", source=parquet))
    assert exported == live  # exact: same rows, same quantile_cont
    # retention of 3 days deletes raw rows of the 3 oldest days, the export still holds them
    done = export_and_expire(store, tmp_path, 3, datetime(2026, 11, 30, 0, 15, tzinfo=UTC))
    assert [d.isoformat() for d in done["expired"]] == ["2026-11-24", "2026-11-25", "2026-11-26"]
    assert store.query(f"SELECT min({day}) FROM requests")[0][0].isoformat() == "2026-11-27"
    assert store.query(DAY_P95.format(day="day", source=parquet)) == live
    # a late row for an expired day is appended to its partition, then expired too
    late = synthetic_rows(1, datetime(2026, 11, 24, 12, tzinfo=UTC), prefix="late")
    store.insert_rows(late)
    export_and_expire(store, tmp_path, 3, datetime(2026, 11, 30, 1, tzinfo=UTC))
    assert store.query("SELECT count(*) FROM requests WHERE request_id = 'late-00000000'")[0][0] == 0
    assert store.query(f"SELECT count(*), count(DISTINCT request_id) FROM {parquet}") == [(1501, 1501)]


def test_rollup_matches_the_raw_rows_and_is_rerunnable(store):
    start = datetime(2026, 11, 29, 6, tzinfo=UTC)
    store.insert_rows(synthetic_rows(800, start, span=timedelta(hours=4), models=("model-a", "model-b")))
    for _ in range(2):
        rollup_hours(store, start, start + timedelta(hours=4))
    rolled = store.query(
        "SELECT hour, model, sum(requests), max(max_inflight) FROM requests_hourly GROUP BY ALL ORDER BY ALL"
    )
    raw = store.query(
        "SELECT timezone('UTC', date_trunc('hour', timezone('UTC', admitted_at))), model, count(*), "
        "max(inflight_at_admit) FROM requests GROUP BY ALL ORDER BY ALL"
    )
    assert rolled == raw and len(rolled) == 8
    p95 = store.query(
        "SELECT ttft_p95_s FROM requests_hourly WHERE model = 'model-a' AND outcome = 'ok' "
        "AND tenant = 'team-a' AND hour = ?",
        [start],
    )[0][0]
    direct = store.query(
        "SELECT quantile_cont(ttft_s, 0.95) FROM requests WHERE model = 'model-a' AND "
        "outcome = 'ok' AND tenant = 'team-a' AND admitted_at >= ? AND admitted_at < ?",
        [start, start + timedelta(hours=1)],
    )[0][0]
    assert p95 == pytest.approx(direct, rel=1e-12)
