"""The capacity review: figures equal direct SQL; week over week on two synthetic weeks with a known shift."""

from __future__ import annotations

import dataclasses
from datetime import UTC, datetime, timedelta

import pytest
from support.synthetic import synthetic_probe_run, synthetic_rows

from collector.analysis.estimate import estimate_capacity
from collector.report.build import build_report
from collector.report.collect import collect_inputs
from collector.store.db import RequestStore
from collector.store.estimates import save_estimate

UTC = UTC
WEEK = timedelta(days=7)
WEEK2 = datetime(2026, 11, 23, tzinfo=UTC)
WEEK1 = WEEK2 - WEEK
MODELS = ("model-a", "model-b")


@pytest.fixture(scope="module")
def store():
    store = RequestStore()
    # the same seed both weeks: week 2 is week 1 with every TTFT x 1.5, so the shift is known exactly
    store.insert_rows(synthetic_rows(1200, WEEK1, span=WEEK, models=MODELS, prefix="w1"))
    store.insert_rows(synthetic_rows(1200, WEEK2, span=WEEK, models=MODELS, prefix="w2", ttft_scale=1.5))
    # probe rows are not traffic: the review must leave them out
    store.insert_rows([dict(r, source="probe") for r in synthetic_rows(50, WEEK2, models=MODELS, prefix="p")])
    yield store
    store.close()


@pytest.fixture(scope="module")
def report(store):
    return build_report(collect_inputs(store, WEEK2, WEEK2 + WEEK, slo_ttft_p95_s=0.3))


def _sql(store, sql, model, since=WEEK2):
    return store.query(
        sql + " FROM requests WHERE source = 'traffic' AND model = ? AND admitted_at >= ? "
        "AND admitted_at < ?",
        [model, since, since + WEEK],
    )[0]


def test_report_figures_equal_direct_sql(store, report):
    assert [m["model"] for m in report["models"]] == list(MODELS)
    for m in report["models"]:
        model = m["model"]
        n, prompt, completion, peak_r, peak_t = _sql(
            store,
            "SELECT count(*), sum(prompt_tokens), "
            "sum(completion_tokens), max(inflight_at_admit), "
            "max(active_tokens_at_admit)",
            model,
        )
        assert (
            m["traffic"]["requests"],
            m["traffic"]["prompt_tokens"],
            m["traffic"]["completion_tokens"],
        ) == (n, prompt, completion)
        (entry,) = m["classes"]  # no estimate: every instance is of the default class
        assert entry["replica_class"] == "default"
        assert (entry["concurrency"]["peak_requests"], entry["concurrency"]["peak_tokens"]) == (
            peak_r,
            peak_t,
        )
        for metric in ("ttft_s", "tpot_s", "e2e_s"):
            expected = _sql(store, f"SELECT quantile_cont({metric}, [0.5, 0.95, 0.99])", model)[0]
            got = [m["latency"][metric][k] for k in ("p50", "p95", "p99")]
            assert got == pytest.approx(expected, rel=1e-12), metric
        limited, errors = _sql(
            store,
            "SELECT avg((outcome = 'rate_limited')::INT), "
            "avg((outcome IN ('upstream_error', 'timeout'))::INT)",
            model,
        )
        assert m["outcomes"]["rate_limited_ratio"] == pytest.approx(limited)
        assert m["outcomes"]["error_ratio"] == pytest.approx(errors)
        tenants = store.query(
            "SELECT tenant, sum(prompt_tokens + completion_tokens) AS t FROM requests "
            "WHERE source = 'traffic' AND model = ? AND admitted_at >= ? GROUP BY tenant "
            "ORDER BY t DESC, tenant",
            [model, WEEK2],
        )
        assert [(t["tenant"], t["tokens"]) for t in m["top_tenants"]] == [(a, int(b)) for a, b in tenants]
        buckets = store.query(
            "SELECT CASE WHEN inflight_at_admit < 1.5 THEN 1 ELSE CAST(pow(2, round(log2(inflight_at_admit))) "
            "AS BIGINT) END AS b, count(*), quantile_cont(ttft_s, 0.95) FROM requests WHERE source = 'traffic' "
            "AND model = ? AND admitted_at >= ? GROUP BY b ORDER BY b",
            [model, WEEK2],
        )
        assert [(c["bucket"], c["n"]) for c in m["curve"]] == [(b, n) for b, n, _ in buckets]
        assert [c["ttft_p95_s"] for c in m["curve"]] == pytest.approx([p for _, _, p in buckets], rel=1e-12)


def test_week_over_week_shows_the_known_shift(report):
    for m in report["models"]:
        ttft, tpot = m["latency"]["ttft_s"], m["latency"]["tpot_s"]
        assert ttft["change_p95"] == pytest.approx(0.5, abs=1e-9)
        assert ttft["p50"] == pytest.approx(1.5 * ttft["previous"]["p50"], rel=1e-9)
        assert tpot["change_p95"] == pytest.approx(0.0, abs=1e-9)
        assert m["traffic"]["requests_change"] == 0.0
        reasons = " ".join(a["reason"] for a in m["actions"])
        assert "p95 TTFT rose 50% week over week" in reasons
        assert m["littles_law"]["checked"] > 0 and m["littles_law"]["inconsistent"] == 0


def _save_probe_estimate(store, run_id, start, knee):
    store.insert_rows(synthetic_probe_run(start, run_id=run_id, knee=knee, levels=(1, 2, 4, 8, 16, 32, 64)))
    estimate = estimate_capacity(store, "model-a", start, start + timedelta(hours=2))
    estimate = dataclasses.replace(estimate, created_at=start + timedelta(hours=2))
    save_estimate(store, estimate)
    return estimate


def test_a_moved_knee_recommends_a_pool_change_and_peaks_are_judged_against_it():
    store = RequestStore()
    store.insert_rows(synthetic_rows(300, WEEK2, span=WEEK, prefix="t"))
    old = _save_probe_estimate(store, "run-old", WEEK1 + timedelta(days=1), knee=32)
    new = _save_probe_estimate(store, "run-new", WEEK2 + timedelta(days=1), knee=16)
    model = build_report(collect_inputs(store, WEEK2, WEEK2 + WEEK))["models"][0]
    store.close()
    assert (old.knee.requests, new.knee.requests) == (32, 16) and old.recommended_pool != new.recommended_pool
    (entry,) = model["classes"]
    assert entry["concurrency"]["knee_requests"] == 16
    assert entry["concurrency"]["headroom_requests"] == pytest.approx(1 - 16 / 16)
    assert model["traffic"]["requests"] == 300  # the probe runs' rows are not traffic
    actions = {a["action"]: a["reason"] for a in model["actions"]}
    change = f"Change the pool from {old.recommended_pool} to {new.recommended_pool} concurrent requests"
    assert "the knee moved from 32 to 16 requests" in actions[change]
    assert (
        "16 on one replica against the knee 16: peak is 1.0 × the knee"
        in actions["Add capacity or cap admission (requests caliber)"]
    )


def test_an_empty_window_builds_an_empty_report():
    store = RequestStore()
    report = build_report(collect_inputs(store, WEEK2, WEEK2 + WEEK))
    store.close()
    assert report["models"] == [] and report["window"]["previous_since"] == WEEK1.isoformat()


def test_a_store_bounded_for_a_writer_lends_the_review_its_memory_and_takes_it_back(tmp_path, monkeypatch):
    """A sidecar's store is bounded (--store-memory-mb, 256 MB by default) and its exact
    quantiles over a busy week did not fit (10 M rows: out of memory at 256 MB, 10.7 s in 1 GB):
    the review runs with at least REVIEW_MEMORY_MB and the bound is back afterwards."""
    from collector.report import collect

    store = RequestStore(tmp_path / "log.duckdb", memory_mb=64)
    store.insert_rows(synthetic_rows(200, WEEK2, span=WEEK, seed=5))
    limit = "SELECT current_setting('memory_limit')"
    seen: list[str] = []
    rows = collect._Reader.rows

    def watched(self, sql, **extra):
        seen.append(store.query(limit)[0][0])
        return rows(self, sql, **extra)

    monkeypatch.setattr(collect._Reader, "rows", watched)
    before = store.query(limit)[0][0]
    build_report(collect_inputs(store, WEEK2, WEEK2 + WEEK))
    assert before.startswith("61") and store.query(limit)[0][0] == before  # 64 MB (61.0 MiB)
    assert seen and all(value == seen[0] != before for value in seen)
    assert seen[0].startswith("976")  # 1024 MB, as DuckDB says it (976.5 MiB)
    store.close()
