"""Pure SQL builders for the query API: whitelisted expressions in, (sql, params) out.

Nothing a caller sends is ever formatted into SQL text: metric and group-by names are looked up in
the fixed maps below, and every value (time bounds, filters, quantiles) travels as a parameter.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime

__all__ = [
    "METRICS",
    "GROUP_BY",
    "FILTER_COLUMNS",
    "Where",
    "power_of_two_bucket",
    "where_clause",
    "percentiles_sql",
    "curve_sql",
    "outcomes_sql",
    "probe_runs_sql",
    "quantile_label",
]

# Public name -> column. Only these may be asked for percentiles.
METRICS = {
    "ttft_s": "ttft_s",
    "tpot_s": "tpot_s",
    "e2e_s": "e2e_s",
    "prompt_tokens": "prompt_tokens",
    "completion_tokens": "completion_tokens",
}


def power_of_two_bucket(column: str) -> str:
    """SQL for the power of two nearest on a log scale, as collector.analysis.stats buckets it.

    Example: inflight_at_admit 1 -> 1, 3 -> 4, 5 -> 4, 6 -> 8, 11 -> 8, 12 -> 16; NULL for <= 0.
    """
    return (
        f"CASE WHEN {column} IS NULL OR {column} <= 0 THEN NULL WHEN {column} < 1.5 THEN 1 "
        f"ELSE CAST(pow(2, round(log2({column}))) AS BIGINT) END"
    )


# Public name -> SQL expression. Hours and days are UTC whatever the connection's time zone.
GROUP_BY = {
    "model": "model",
    "tenant": "tenant",
    "outcome": "outcome",
    "hour": "date_trunc('hour', timezone('UTC', admitted_at))",
    "day": "CAST(timezone('UTC', admitted_at) AS DATE)",
    "inflight_bucket": power_of_two_bucket("inflight_at_admit"),
    "active_tokens_bucket": power_of_two_bucket("active_tokens_at_admit"),
}
FILTER_COLUMNS = ("model", "tenant", "outcome", "source", "instance", "run_id", "endpoint")
CALIBER_COLUMNS = {"requests": "inflight_at_admit", "tokens": "active_tokens_at_admit"}


@dataclass(frozen=True)
class Where:
    """A time window [since, until) on admitted_at plus equality filters on FILTER_COLUMNS."""

    since: datetime | None = None
    until: datetime | None = None
    filters: dict[str, str] = field(default_factory=dict)


def where_clause(where: Where, extra: tuple[str, ...] = ()) -> tuple[str, list[object]]:
    """(" WHERE ...", params) for a Where; filter names must be in FILTER_COLUMNS.

    Example: Where(since=t0, filters={"model": "m"}) -> (" WHERE admitted_at >= ? AND model = ?", [t0, "m"])
    """
    parts = list(extra)
    params: list[object] = []
    if where.since is not None:
        parts.append("admitted_at >= ?")
        params.append(where.since)
    if where.until is not None:
        parts.append("admitted_at < ?")
        params.append(where.until)
    for name, value in sorted(where.filters.items()):
        if name not in FILTER_COLUMNS:
            raise ValueError(f"filter {name!r} is not one of {FILTER_COLUMNS}")
        parts.append(f"{name} = ?")
        params.append(value)
    return (" WHERE " + " AND ".join(parts) if parts else ""), params


def quantile_label(q: float) -> str:
    """0.95 -> 'p95', 0.999 -> 'p99.9', 0.5 -> 'p50'."""
    return f"p{round(q * 100, 6):g}"


def _group_select(group_by: tuple[str, ...]) -> tuple[str, str]:
    for name in group_by:
        if name not in GROUP_BY:
            raise ValueError(f"group_by {name!r} is not one of {tuple(GROUP_BY)}")
    select = "".join(f"{GROUP_BY[name]} AS {name}, " for name in group_by)
    tail = (" GROUP BY " + ", ".join(group_by) + " ORDER BY " + ", ".join(group_by)) if group_by else ""
    return select, tail


def percentiles_sql(
    metric: str, quantiles: list[float], group_by: tuple[str, ...], where: Where
) -> tuple[str, list[object]]:
    """Exact percentiles of one metric (quantile_cont over the rows), optionally grouped.

    Result columns: *group_by, n, mean, quantiles (a list in the order asked).
    """
    column = METRICS[metric]
    select, tail = _group_select(group_by)
    clause, params = where_clause(where, (f"{column} IS NOT NULL",))
    sql = (
        f"SELECT {select}count(*) AS n, avg({column}) AS mean, "
        f"quantile_cont({column}, ?) AS quantiles FROM requests{clause}{tail}"
    )
    return sql, [list(quantiles)] + params


def curve_sql(caliber: str, where: Where) -> tuple[str, list[object]]:
    """The passive capacity curve: per power-of-two concurrency bucket of one caliber, latency
    percentiles, error ratios and completion-token throughput share."""
    bucket = power_of_two_bucket(CALIBER_COLUMNS[caliber])
    clause, params = where_clause(where, (f"{CALIBER_COLUMNS[caliber]} > 0",))
    sql = (
        f"SELECT {bucket} AS bucket, count(*) AS n, "
        "quantile_cont(ttft_s, [0.5, 0.95, 0.99]) AS ttft_s, "
        "quantile_cont(tpot_s, [0.5, 0.95, 0.99]) AS tpot_s, "
        "quantile_cont(e2e_s, [0.5, 0.95, 0.99]) AS e2e_s, "
        "avg(CASE WHEN outcome = 'rate_limited' THEN 1.0 ELSE 0.0 END) AS rate_limited_ratio, "
        "avg(CASE WHEN outcome IN ('upstream_error', 'timeout') THEN 1.0 ELSE 0.0 END) AS error_ratio, "
        "sum(coalesce(completion_tokens, 0)) AS completion_tokens "
        f"FROM requests{clause} GROUP BY bucket ORDER BY bucket"
    )
    return sql, params


def outcomes_sql(group_by: tuple[str, ...], where: Where) -> tuple[str, list[object]]:
    """Counts of requests by outcome, optionally grouped further."""
    select, _ = _group_select(group_by)
    keys = list(group_by) + ["outcome"]
    clause, params = where_clause(where)
    sql = (
        f"SELECT {select}outcome AS outcome_name, count(*) AS n FROM requests{clause} "
        f"GROUP BY {', '.join(keys[:-1] + ['outcome_name'])} "
        f"ORDER BY {', '.join(keys[:-1] + ['outcome_name'])}"
    )
    return sql, params


def probe_runs_sql(where: Where) -> tuple[str, list[object]]:
    """One line per probe run: when, how many requests, the highest concurrency, outcome mix."""
    clause, params = where_clause(where, ("source = 'probe'",))
    sql = (
        "SELECT run_id, model, min(admitted_at) AS started_at, max(completed_at) AS ended_at, "
        "count(*) AS requests, max(inflight_at_admit) AS max_inflight, "
        "max(active_tokens_at_admit) AS max_active_tokens, "
        "avg(CASE WHEN outcome = 'ok' THEN 1.0 ELSE 0.0 END) AS ok_ratio "
        f"FROM requests{clause} GROUP BY run_id, model ORDER BY started_at DESC"
    )
    return sql, params
