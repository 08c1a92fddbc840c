"""Query SQL builders: buckets agree with the analysis package; the benchmark's query shape on 200k rows."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import duckdb
import pytest

from collector.analysis.stats import power_of_two_bucket
from collector.service import querysql
from collector.service.querysql import Where
from collector.store.db import RequestStore

BENCHMARK = Path(__file__).resolve().parents[1] / "benchmarks" / "store_query_10m.py"


def test_sql_buckets_equal_the_analysis_buckets():
    values = [0, 1, 2, 3, 5, 6, 11, 12, 23, 24, 47, 48, 1000, 3000, 70000]
    sql = f"SELECT {querysql.power_of_two_bucket('x')} FROM unnest(?) WITH ORDINALITY t(x, o) ORDER BY o"
    got = [row[0] for row in duckdb.execute(sql, [values]).fetchall()]
    assert got == [power_of_two_bucket(v) for v in values]


@pytest.mark.parametrize("bad", [{"group_by": ("model; DROP TABLE requests",)}, {"filters": {"1=1 --": "x"}}])
def test_builders_refuse_names_outside_the_whitelists(bad):
    with pytest.raises(ValueError, match="not one of"):
        querysql.percentiles_sql(
            "ttft_s", [0.5], bad.get("group_by", ()), Where(filters=bad.get("filters", {}))
        )


def test_values_travel_as_parameters_never_as_text():
    sql, params = querysql.percentiles_sql("e2e_s", [0.9], ("tenant",), Where(filters={"model": "m'--"}))
    assert "m'--" not in sql and params == [[0.9], "m'--"]
    assert querysql.quantile_label(0.999) == "p99.9" and querysql.quantile_label(0.5) == "p50"


def test_p95_by_bucket_on_200k_generated_rows():
    spec = importlib.util.spec_from_file_location("store_query_10m", BENCHMARK)
    bench = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bench)
    store = RequestStore()
    bench.generate(store, 200_000)
    sql, params = querysql.percentiles_sql("ttft_s", [0.95], ("inflight_bucket",), Where())
    rows = store.query(sql, params)
    store.close()
    assert [row[0] for row in rows] == [1, 2, 4, 8, 16, 32, 64]
    assert sum(row[1] for row in rows) == 200_000
    p95 = [row[3][0] for row in rows]
    assert p95 == sorted(p95)  # TTFT grows with the concurrency a request saw
