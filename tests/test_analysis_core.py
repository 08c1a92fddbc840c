"""Pure core: percentiles agree with DuckDB, power-of-two buckets, per-level summary, Little's law."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import duckdb
import pytest
from support.synthetic import closed_loop_rows

from collector.analysis.levels import summarize_level
from collector.analysis.littles_law import littles_law_check, time_weighted_inflight
from collector.analysis.stats import percentile, percentiles, power_of_two_bucket

T0 = datetime(2026, 1, 1, tzinfo=UTC)


def _row(i, admitted_s, e2e_s, *, ttft_s=0.1, outcome="ok", prompt=10, completion=20):
    return {
        "request_id": f"r{i}",
        "admitted_at": T0 + timedelta(seconds=admitted_s),
        "completed_at": T0 + timedelta(seconds=admitted_s + e2e_s),
        "outcome": outcome,
        "ttft_s": ttft_s if outcome == "ok" else None,
        "e2e_s": e2e_s,
        "tpot_s": (e2e_s - ttft_s) / (completion - 1) if outcome == "ok" else None,
        "prompt_tokens": prompt,
        "completion_tokens": completion if outcome == "ok" else 0,
        "active_tokens_at_admit": 100,
        "inflight_at_admit": 2,
    }


@pytest.mark.parametrize("values", [[1.0, 2.0, 3.0, 4.0], [0.3, 0.1, 0.9, 5.0, 2.2, 0.4, 0.41], [7.0]])
def test_percentiles_match_duckdb_quantile_cont(values):
    expected = (
        duckdb.connect()
        .execute(
            "SELECT quantile_cont(v, [0.5, 0.95, 0.99]) FROM (SELECT unnest(?::DOUBLE[]) AS v)", [values]
        )
        .fetchone()[0]
    )
    assert list(percentiles(values)) == pytest.approx(expected)


def test_percentile_ignores_missing_and_rejects_bad_quantile():
    assert percentile([None, 1.0, float("nan"), 3.0], 0.5) == 2.0
    assert percentile([], 0.5) is None
    with pytest.raises(ValueError, match="0.95 for p95"):
        percentile([1.0], 95)


@pytest.mark.parametrize(
    "value, bucket",
    [
        (1, 1),
        (1.4, 1),
        (2, 2),
        (3, 4),
        (5, 4),
        (6, 8),
        (7.6, 8),
        (11, 8),
        (12, 16),
        (1000, 1024),
        (0, None),
        (None, None),
    ],
)
def test_power_of_two_bucket_is_nearest_on_log_scale(value, bucket):
    assert power_of_two_bucket(value) == bucket


def test_summarize_level_rates_from_window_and_error_ratios():
    # 2 workers, 1 s requests back to back for 10 s: 20 completions, one of them a 429
    rows = [_row(i, i // 2, 1.0) for i in range(20)]
    rows[5] = _row(5, 2, 1.0, outcome="rate_limited")
    stats = summarize_level(rows, 2, window=(0 + T0.timestamp(), 10 + T0.timestamp()))
    assert stats.requests_per_s == pytest.approx(2.0)
    assert stats.output_tokens_per_s == pytest.approx(19 * 20 / 10)
    assert stats.total_tokens_per_s == pytest.approx(19 * 30 / 10)
    assert stats.rate_limited_ratio == pytest.approx(1 / 20)
    assert stats.error_ratio == pytest.approx(1 / 20)
    assert stats.ttft_p95_s == pytest.approx(0.1)
    assert stats.tpot_p50_s == pytest.approx(0.9 / 19)
    assert stats.littles_law.consistent and stats.littles_law.measured_inflight == pytest.approx(2.0)


def test_summarize_level_rejects_empty_level():
    with pytest.raises(ValueError, match="level 4 has no rows"):
        summarize_level([], 4)


def test_time_weighted_inflight_counts_only_overlap():
    rows = [_row(0, 0, 5.0), _row(1, 8, 4.0)]  # 5 s + 2 s inside [0, 10]
    assert time_weighted_inflight(rows, T0.timestamp(), T0.timestamp() + 10) == pytest.approx(0.7)


def test_littles_law_holds_on_a_closed_loop_and_flags_lost_rows():
    rows = [r for r in closed_loop_rows(slots=4, levels=(8,), seconds_per_level=60)]
    start = rows[0]["admitted_at"].timestamp() + 5
    end = start + 40
    assert littles_law_check(rows, start, end).consistent
    # a counter that saw 8 in flight while half the rows never reached the log
    lost = littles_law_check(rows[::2], start, end, measured_inflight=8.0)
    assert not lost.consistent and lost.ratio == pytest.approx(2.0, rel=0.1)


@pytest.mark.parametrize(
    "values, expected",
    [
        ([0.1] * 19 + [0.9], 0.1),  # one stall, second half only: ignored
        ([0.9] + [0.1] * 19, 0.1),  # ... or first half only
        ([0.5] * 20, 0.5),  # a queue lifts both halves
        ([0.1, 0.2, 0.3], None),  # too few to split
    ],
)
def test_persistent_p95_needs_both_halves(values, expected):
    from collector.analysis.levels import persistent_p95

    assert persistent_p95(values) == (None if expected is None else pytest.approx(expected))


def test_summarize_level_reports_persistent_p95_in_admission_order():
    rows = [_row(i, i * 0.5, 1.0, ttft_s=0.1) for i in range(20)]
    rows[15]["ttft_s"] = 2.0  # one stalled request late in the level
    stats = summarize_level(rows, 2)
    assert stats.ttft_p95_s > 0.1 and stats.ttft_p95_persistent_s == pytest.approx(0.1)
