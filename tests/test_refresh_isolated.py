"""The traffic refresh in a child process (what `headroom run` schedules)
computes exactly the estimates the in-process refresh does, publishes them, and a child that
fails or runs too long costs the refresh its new traffic estimates and nothing else."""

from __future__ import annotations

import logging
import math
import os
import subprocess
import sys
import threading
from datetime import timedelta

import duckdb
import pytest
from support.offline import Mix, closed_loop_rows, poisson_rows

from collector.analysis.estimate import probe_levels
from collector.analysis.knee import detect_knee
from collector.analysis.refresh import refresh_estimates_isolated
from collector.analysis.refresh_worker import in_background, traffic_estimates, traffic_estimates_isolated
from collector.analysis.stats import seconds
from collector.sim.config import SimConfig
from collector.store.capacity_gauges import CapacityGauges
from collector.store.db import RequestStore

pytestmark = pytest.mark.subprocess


@pytest.fixture(scope="module")
def traffic(tmp_path_factory):
    """Ten minutes of two-tenant simulator traffic ramping past an 8-slot engine's knee, in two
    task classes (4,500 requests: each class has a curve of its own, the knee is reached);
    `now` just after its last request."""
    config = SimConfig(max_num_seqs=8)
    mix = Mix(output_tokens=64, long_share=0.2, long_prompt_tokens=400, tenants=2)
    levels = probe_levels(closed_loop_rows(config, (1, 2, 4, 8, 16, 32), 30.0, mix, seed=3))
    knee = detect_knee(levels).requests
    capacity = next(level for level in levels if level.concurrency == knee).requests_per_s
    rows = poisson_rows(config, lambda t: capacity * (0.3 + t / 600), 600.0, mix, seed=3)
    for index, row in enumerate(rows):
        row["task_class"] = "long" if index % 3 == 0 else "short"
    store = RequestStore(tmp_path_factory.mktemp("refresh") / "log.duckdb")
    store.insert_rows(rows)
    now = max(row["completed_at"] for row in rows) + timedelta(seconds=1)
    yield store, now, knee
    store.close()


@pytest.fixture
def at_the_tests_priority(monkeypatch):
    """The window's copy and the child at the test's own priority, not at nice 19: what the child
    computes does not depend on it, and on a host whose cores are busy (two CPU hogs) a nice-19
    child waits minutes for its two seconds of CPU, by design. The priority has its own test
    (test_the_copy_and_the_child_run_below_the_proxy_from_the_child_s_first_instruction)."""
    monkeypatch.setattr("collector.analysis.refresh_worker.in_background", lambda work: work())


def _comparable(estimate) -> dict:
    return {k: v for k, v in estimate.to_dict().items() if k != "created_at"}


def test_the_child_computes_what_the_process_itself_would(traffic, at_the_tests_priority):
    store, now, knee = traffic
    here = traffic_estimates(store, now, window=timedelta(hours=1))
    there = traffic_estimates_isolated(store, now, window=timedelta(hours=1))
    assert [(e.model, e.task_class) for e in here] == [
        ("headroom-sim", "all"),
        ("headroom-sim", "long"),
        ("headroom-sim", "short"),
    ]
    assert [_comparable(e) for e in there] == [_comparable(e) for e in here]
    assert here[0].knee.reached and abs(math.log2(here[0].knee.requests / knee)) <= 1  # one level
    assert seconds(there[0].created_at) > 0


def test_the_isolated_refresh_publishes_to_the_gauges(traffic, at_the_tests_priority):
    store, now, _ = traffic
    gauges = CapacityGauges()
    saved = refresh_estimates_isolated(store, gauges, now, window=timedelta(hours=1))
    published = gauges.get("headroom-sim")
    assert saved and published is not None
    assert published.knee_requests == saved[0]["knee_requests"]


def test_what_else_the_child_prints_does_not_spoil_its_answer(
    traffic, at_the_tests_priority, tmp_path, monkeypatch
):
    # a starved child's DuckDB drew progress bars on stdout, where its JSON used to go
    noisy = tmp_path / "noisy-python"
    noisy.write_text(f'#!/bin/sh\necho " 50% [=====     ]"\nexec "{sys.executable}" "$@"\n')
    noisy.chmod(0o755)
    monkeypatch.setattr("collector.analysis.refresh_worker.sys.executable", str(noisy))
    store, now, _ = traffic
    found = traffic_estimates_isolated(store, now, window=timedelta(hours=1))
    assert [e.task_class for e in found] == ["all", "long", "short"]


def test_a_child_past_its_time_costs_only_the_new_traffic_estimates(traffic, caplog):
    store, now, _ = traffic
    with caplog.at_level(logging.ERROR, logger="collector.analysis.refresh_worker"):
        assert traffic_estimates_isolated(store, now, window=timedelta(hours=1), timeout_s=0.01) == []
    assert "ran past" in caplog.text


def test_a_failing_child_says_why(traffic, caplog, monkeypatch):
    store, now, _ = traffic
    monkeypatch.setattr("collector.analysis.refresh_worker.sys.executable", "/bin/false")
    with caplog.at_level(logging.ERROR, logger="collector.analysis.refresh_worker"):
        assert traffic_estimates_isolated(store, now, window=timedelta(hours=1)) == []
    assert "the traffic refresh failed (exit 1)" in caplog.text


def test_an_empty_window_starts_no_child(traffic, monkeypatch):
    store, now, _ = traffic
    monkeypatch.setattr("collector.analysis.refresh_worker.subprocess.run", None)  # would raise
    assert traffic_estimates_isolated(store, now + timedelta(days=2), window=timedelta(hours=1)) == []


def test_the_copy_and_the_child_run_below_the_proxy_from_the_child_s_first_instruction():
    # the child inherits the nice value of the thread that starts it: started from the
    # refresh's nice-19 thread, it never runs its imports beside the proxy at nice 0
    def niceness() -> tuple[int, str]:
        mine = os.getpriority(os.PRIO_PROCESS, threading.get_native_id())
        child = subprocess.run(
            [sys.executable, "-S", "-c", "import os; print(os.getpriority(os.PRIO_PROCESS, 0))"],
            capture_output=True,
            text=True,
            check=True,
        )
        return mine, child.stdout.strip()

    caller = os.getpriority(os.PRIO_PROCESS, threading.get_native_id())
    assert in_background(niceness) == (19, "19")
    assert os.getpriority(os.PRIO_PROCESS, threading.get_native_id()) == caller  # the caller's is its own
    with pytest.raises(ZeroDivisionError):
        in_background(lambda: 1 / 0)  # what the work raised reaches the caller


def test_a_store_over_a_parquet_copy_reads_its_rows_and_nulls_the_columns_left_out(traffic, tmp_path):
    store, now, _ = traffic
    copied = tmp_path / "it's rows.parquet"  # a quote in the path: the view's SQL must escape it
    window = [now - timedelta(hours=1), now]
    sql = "SELECT request_id, admitted_at, ttft_s FROM requests WHERE admitted_at >= ? AND admitted_at < ?"
    count = store.copy_out(sql, window, copied)
    reader = RequestStore.over_parquet(copied)
    try:
        assert reader.count() == count > 0
        expected = store.query(f"{sql} ORDER BY request_id LIMIT 5", window)
        assert reader.query(f"{sql} ORDER BY request_id LIMIT 5", window) == expected
        # a column the copy left out is there, and NULL, as in a table of the full schema
        assert reader.query("SELECT count(*) FROM requests WHERE tenant IS NOT NULL") == [(0,)]
        with pytest.raises(duckdb.CatalogException, match="not an? table"):  # a view of the file
            reader.insert_rows([{"request_id": "new"}])
    finally:
        reader.close()
