"""The weekly review's longest-running requests (#39 item 1): equal to direct SQL on the request log,
probe rows left out, and shown in the Markdown review."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from support.synthetic import synthetic_rows

from collector.report.build import build_report
from collector.report.collect import collect_inputs
from collector.report.longest import LONGEST
from collector.report.render_md import render_md
from collector.store.db import RequestStore

WEEK = timedelta(days=7)
SINCE = datetime(2026, 11, 23, tzinfo=UTC)


def test_the_longest_running_requests_are_the_log_s_longest_traffic_rows_and_are_rendered():
    store = RequestStore()
    try:
        store.insert_rows(synthetic_rows(600, SINCE, span=WEEK, models=("model-a",), prefix="t"))
        # a probe request longer than any: the review is about traffic and must leave it out
        (probe,) = synthetic_rows(1, SINCE + timedelta(hours=1), models=("model-a",), prefix="p")
        store.insert_rows([dict(probe, source="probe", e2e_s=9999.0)])
        model = build_report(collect_inputs(store, SINCE, SINCE + WEEK))["models"][0]
        expected = store.query(
            "SELECT e2e_s, tenant, outcome FROM requests WHERE source = 'traffic' AND model = 'model-a' "
            "AND admitted_at >= ? AND admitted_at < ? AND e2e_s IS NOT NULL ORDER BY e2e_s DESC LIMIT ?",
            [SINCE, SINCE + WEEK, LONGEST],
        )
    finally:
        store.close()
    got = [(e["e2e_s"], e["tenant"], e["outcome"]) for e in model["longest_running"]]
    assert [g[0] for g in got] == [row[0] for row in expected] and 9999.0 not in [g[0] for g in got]
    assert {g[1] for g in got} == {row[1] for row in expected}
    text = render_md({"models": [model]} | _frame())
    assert "| longest-running request | e2e (s) |" in text
    assert f"| {expected[0][0]:.1f} |" in text


def _frame() -> dict:
    """The rest of a report render_md reads, from a real (empty) report."""
    store = RequestStore()
    try:
        report = build_report(collect_inputs(store, SINCE, SINCE + WEEK))
    finally:
        store.close()
    return {k: v for k, v in report.items() if k != "models"}
