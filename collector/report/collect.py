"""Read what the review needs from a RequestStore: its figures aggregated where the rows are.

The only impure part of the report. Every figure that touches rows is a DuckDB aggregate with
parameters: per model and window the counts, sums and exact quantiles (`quantile_cont`, the same
definition as numpy's linear one); per model the outcomes, tenants, longest requests, LoRA
adapters and the latency curves by concurrency bucket; per replica class the load's ingredients
(histograms of admissions, first tokens and completions on the load's sampling grid, the bins
each replica served, the tokens completed per bin); per Little's-law window the busy time and
the completions. No row is fetched into Python, so the review of a week of 100 M rows in the
fleet's table reads only what it shows (BENCHMARKS.md §9b); collector.report.plan and .build turn
the aggregates into the review.

Estimates are what collector.store.decision publishes per model and replica class (task class
all). An instance's replica class is the one its rows name (the sidecar records its class in
each row) where that class has a published estimate, else the class of the probe runs it served
(its rows of a probe run whose estimate names the class), else the model's only published class,
as the rules fall back, else the class its rows name (`class_of`).

Where TTFT went and goodput (collector.analysis.engine_split) are per model and the replica class
each row names (the sidecar's own, none: the default class), over the current window's traffic.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

import numpy as np

from collector.analysis.engine_split import EngineSplit, engine_split
from collector.capacity import DEFAULT_REPLICA_CLASS
from collector.report.figures import QUANTILES
from collector.report.longest import LONGEST
from collector.report.plan import (
    ADMITTED,
    COMPLETED,
    FIRST_TOKEN,
    SPAN,
    LittleWindowSums,
    LoadSeries,
    little_window_s,
    sampling_grid,
)
from collector.store.db import RequestStore, SnapshotReads
from collector.store.decision import Decision, Published, decisions

__all__ = [
    "ReportInputs",
    "ModelFigures",
    "WindowFigures",
    "ClassFigures",
    "collect_inputs",
    "class_of",
    "LATENCIES",
    "ERRORS",
]

LATENCIES = ("ttft_s", "tpot_s", "e2e_s")
# DuckDB memory the review takes at least, on a store bounded lower (a sidecar's --store-memory-mb):
# its exact quantiles hold every value of their group; 10 M rows ran in 512 MB and 1 GB here, not
# in a sidecar's 256 MB
REVIEW_MEMORY_MB = 1024
ERRORS = ("upstream_error", "timeout")  # outcomes the curves count as errors

# The rows of [before, until), `now` for the current window [since, until); timestamps as POSIX
# seconds. Every query below starts from them: `w` is the traffic.
_COLUMNS = """
coalesce(model, 'unknown') AS model, coalesce(instance, 'unknown') AS instance,
coalesce(tenant, 'anonymous') AS tenant, coalesce(outcome, 'unknown') AS outcome, adapter,
epoch(admitted_at) AS a, epoch(first_token_at) AS f0, epoch(completed_at) AS c,
ttft_s, tpot_s, e2e_s, coalesce(prompt_tokens, 0) AS p, coalesce(completion_tokens, 0) AS g,
coalesce(cached_prompt_tokens, 0) AS cached, inflight_at_admit AS inflight,
active_tokens_at_admit AS active_tokens, admitted_at >= $since AS now"""
_BETWEEN = "admitted_at >= $before AND admitted_at < $until"
_W = f"w AS NOT MATERIALIZED (SELECT {_COLUMNS} FROM requests WHERE source = 'traffic' AND {_BETWEEN})"
_QUANTILES = "[" + ", ".join(str(q) for q in QUANTILES) + "]"

# per model and window: counts, sums, exact quantiles, and the LONGEST longest e2e (the
# threshold _LONGEST fetches from)
_SUMMARY = f"""
WITH {_W}
SELECT model, now, count(*) AS n, sum(p)::DOUBLE AS p, sum(g)::DOUBLE AS g,
       sum(cached)::DOUBLE AS cached, max(e2e_s, $count) AS longest_e2e,
       {", ".join(f"quantile_cont({m}, {_QUANTILES}) AS {m}" for m in LATENCIES)}
FROM w GROUP BY model, now"""
# the LONGEST longest e2e per model (ties: the earliest admitted first): the rows at or above
# the model's threshold (`least`; `least_of_all` the lowest, a cheap filter before the join)
_LONGEST = f"""
WITH {_W},
top AS (SELECT unnest($l_model) AS model, unnest($l_least) AS least)
SELECT model, e2e_s, a, instance, tenant, outcome, g
FROM w JOIN top USING (model)
WHERE now AND e2e_s >= $least_of_all AND e2e_s >= least
QUALIFY row_number() OVER (PARTITION BY model ORDER BY e2e_s DESC, a) <= $count
ORDER BY model, e2e_s DESC, a"""
_OUTCOMES = f"WITH {_W} SELECT model, outcome, count(*) AS n FROM w WHERE now GROUP BY ALL"
_TENANTS = f"""
WITH {_W} SELECT model, tenant, sum(p + g)::DOUBLE AS tokens, count(*) AS n FROM w WHERE now GROUP BY ALL"""
# Per model and instance, over every source: the replica class its rows name (the most frequent;
# its sidecar's); over its traffic, its peaks at admission in the current window, the bounds of
# its requests' intervals (admission to completion) for the load's grid, and the current
# window's first and last admission. (One pass with the outcomes and tenants as grouping sets
# took longer than apart: 10.7 s against 8.1 s at 100 M rows.)
_INSTANCES = f"""
SELECT model, instance, mode(replica_class) AS served, bool_or(traffic) AS traffic,
       bool_or(traffic AND now) AS now,
       max(inflight) FILTER (traffic AND now) AS peak_requests,
       max(active_tokens) FILTER (traffic AND now) AS peak_tokens,
       min(a) FILTER (known) AS first_a, max(c) FILTER (known) AS last_c,
       min(a) FILTER (known AND now) AS now_first_a, max(c) FILTER (known AND now) AS now_last_c,
       min(a) FILTER (traffic AND now) AS first_admitted, max(a) FILTER (traffic AND now) AS last_admitted
FROM (SELECT {_COLUMNS}, replica_class, source = 'traffic' AS traffic,
             source = 'traffic' AND completed_at >= admitted_at AS known
      FROM requests WHERE {_BETWEEN})
GROUP BY model, instance"""
_TIMED = "ttft_s IS NOT NULL AND e2e_s IS NOT NULL AND e2e_s > ttft_s"
_ADAPTERS = f"""
WITH {_W}
SELECT model, adapter, count(*) AS n, quantile_cont(ttft_s, [0.5, 0.95]) AS ttft,
       coalesce(sum(g) FILTER ({_TIMED}), 0)::DOUBLE AS tokens,
       coalesce(sum(e2e_s - ttft_s) FILTER ({_TIMED}), 0) AS generating_s,
       coalesce(sum(e2e_s), 0) AS e2e_total
FROM w WHERE now AND model IN (SELECT model FROM w WHERE now AND adapter IS NOT NULL)
GROUP BY ALL"""


def _bucket(column: str) -> str:
    """The power-of-two bucket of collector.report.figures.nearest_power_of_two, NULL for <= 0."""
    return (
        f"CASE WHEN {column} > 0 THEN (CASE WHEN {column} < 1.5 THEN 1 "
        f"ELSE CAST(pow(2, round(log2({column}))) AS BIGINT) END) END"
    )


_CURVES = f"""
WITH {_W}
SELECT model, grouping(rb) = 0 AS by_requests, coalesce(rb, tb) AS bucket, count(*) AS n,
       quantile_cont(ttft_s, 0.95) AS ttft_p95_s, quantile_cont(tpot_s, 0.95) AS tpot_p95_s,
       count(*) FILTER (outcome IN ({", ".join(f"'{e}'" for e in ERRORS)})) AS errors
FROM (SELECT *, {_bucket("inflight")} AS rb, {_bucket("active_tokens")} AS tb FROM w WHERE now)
GROUP BY GROUPING SETS ((model, rb), (model, tb))
HAVING coalesce(rb, tb) IS NOT NULL"""
# (model, instance) -> the replica class of the probe runs it served
_PROBED = """
SELECT DISTINCT coalesce(r.model, 'unknown'), coalesce(r.instance, 'unknown'),
       coalesce(e.replica_class, 'default')
FROM requests r JOIN capacity_estimates e ON r.run_id = e.run_id
WHERE r.source = 'probe' AND e.created_at <= ?"""
_HAS_ESTIMATES = "SELECT count(*) FROM information_schema.tables WHERE table_name = 'capacity_estimates'"


def _sample(column: str) -> str:
    """The first sample at or after the event: a sample t counts the events at or before t."""
    return f"greatest(0, ceil(({column} - t0) / dt))::BIGINT"


# What each replica class's load is made of (collector.report.plan.LoadSeries.from_sums), on its
# grid (collector.report.plan.Grid, shifted by its origin; `grid` gives each instance its class's
# key, its grid and a number of its own) in one pass over the rows: per
# sample, the sums of the admissions (count, prompt), the completions (count, prompt, slope,
# slope x first token) and the first tokens (slope, slope x first token), whose running sums are
# the load; and per instance the first and last bin of each request (deduplicated: the replicas
# serving per bin) with the tokens of those requests (by last bin: the tokens completed per bin). A request's interval is admission
# to completion, its first token clamped into it (a missing or impossible one is its completion),
# its tokens generated evenly from the first token on (`slope` tokens a second).
_LOAD = f"""
WITH {_W},
grid AS (SELECT unnest($g_model) AS model, unnest($g_instance) AS instance, unnest($g_code) AS code,
                unnest($g_key) AS key,
                unnest($g_origin) AS origin, unnest($g_t0) AS t0, unnest($g_dt) AS dt,
                unnest($g_step) AS step),
iv AS NOT MATERIALIZED (
    SELECT key, code, t0, dt, step, p, g, a - origin AS a, f - origin AS f, c - origin AS c
    FROM (SELECT *, CASE WHEN f0 IS NULL OR f0 < a OR f0 > c THEN c ELSE f0 END AS f
          FROM w WHERE c >= a)
    JOIN grid USING (model, instance)),
events AS NOT MATERIALIZED (
    SELECT key, code, p, g, f, CASE WHEN c > f THEN g / (c - f) ELSE 0.0 END AS slope,
           {_sample("a")} AS ba, {_sample("c")} AS bc, {_sample("f")} AS bf,
           floor(a / step)::BIGINT AS lo, floor(c / step)::BIGINT AS hi
    FROM iv)
SELECT key,
       CASE WHEN grouping(ba) = 0 THEN {ADMITTED} WHEN grouping(bc) = 0 THEN {COMPLETED}
            WHEN grouping(bf) = 0 THEN {FIRST_TOKEN} ELSE {SPAN} END AS part,
       coalesce(ba, bc, bf, lo) AS b, hi, code,
       count(*)::DOUBLE AS n, sum(p)::DOUBLE AS wp, sum(slope) AS s, sum(slope * f) AS sf,
       sum(p + g)::DOUBLE AS tokens
FROM events
GROUP BY GROUPING SETS ((key, ba), (key, bc), (key, bf), (key, code, lo, hi))"""
# Little's law per window of `span` seconds (collector.report.plan.littles_law_windows): the
# request-seconds inside each window of the requests that overlap it, the completions in it and
# the e2e of those with one; a completion on a window's edge counts in both windows, as a closed
# interval does. One pass, by the window a request starts in (`lo`) and the one it ends in (`hi`):
# a request inside one window adds its e2e to it; one that crosses edges adds its first part to
# `lo`, its last part to `hi` and `span` to every window between (`opens` at lo + 1, `closes` at
# hi: their running difference counts the requests spanning a whole window).
_LITTLE = f"""
WITH {_W},
lw AS (SELECT unnest($l_model) AS model, unnest($l_window) AS span),
ended AS NOT MATERIALIZED (
    SELECT w.model, span, a, c, e2e_s, floor(a / span)::BIGINT AS lo, floor(c / span)::BIGINT AS hi,
           c = floor(c / span) * span AS on_edge
    FROM w JOIN lw USING (model) WHERE now AND c IS NOT NULL)
SELECT model, grouping(lo) = 0 AS by_start, coalesce(lo, hi) AS k,
       sum(CASE WHEN c < a THEN 0 WHEN lo = hi THEN c - a ELSE (lo + 1) * span - a END) AS first_part,
       sum(CASE WHEN c < a OR lo = hi THEN 0 ELSE c - hi * span END) AS last_part,
       count(*) FILTER (hi > lo + 1) AS spanning,
       count(*) AS completions, count(e2e_s) AS done, coalesce(sum(e2e_s), 0) AS e2e,
       count(*) FILTER (on_edge) AS edge_completions, count(e2e_s) FILTER (on_edge) AS edge_done,
       coalesce(sum(e2e_s) FILTER (on_edge), 0) AS edge_e2e
FROM ended GROUP BY GROUPING SETS ((model, lo), (model, hi))"""

Key = tuple[str, str]  # (model, replica class) or (model, instance)


@dataclass
class WindowFigures:
    """One model's traffic in one window."""

    requests: int = 0
    prompt_tokens: float = 0.0
    completion_tokens: float = 0.0
    cached_prompt_tokens: float = 0.0
    # metric -> {"p50", "p95", "p99"} (None when no row has one)
    latency: dict[str, dict[str, float | None]] = field(
        default_factory=lambda: {m: {"p50": None, "p95": None, "p99": None} for m in LATENCIES}
    )


@dataclass
class ClassFigures:
    """One replica class of a model: its instances of the current window, their peaks at
    admission, and the class's load over both windows."""

    replica_class: str
    instances: list[str]
    peak_requests: float | None
    peak_tokens: float | None
    load: LoadSeries | None


@dataclass
class ModelFigures:
    """One model's aggregates (current window unless named `previous`)."""

    current: WindowFigures = field(default_factory=WindowFigures)
    previous: WindowFigures = field(default_factory=WindowFigures)
    first_admitted: float | None = None  # the current window's first and last admission
    last_admitted: float | None = None
    outcomes: dict[str, int] = field(default_factory=dict)
    tenants: list[tuple[str, float, int]] = field(default_factory=list)  # (tenant, tokens, requests)
    longest: list[dict[str, Any]] = field(default_factory=list)
    # per adapter (None: the base model's own requests): requests, ttft p50/p95, timed tokens and
    # generating seconds; empty when no request named an adapter
    adapters: list[dict[str, Any]] = field(default_factory=list)
    e2e_total_s: float = 0.0
    curve: list[dict[str, Any]] = field(default_factory=list)
    curve_tokens: list[dict[str, Any]] = field(default_factory=list)
    little: LittleWindowSums | None = None
    classes: list[ClassFigures] = field(default_factory=list)


@dataclass
class ReportInputs:
    """Everything build_report needs: the aggregates per model, and what was published."""

    since: datetime
    until: datetime
    models: dict[str, ModelFigures] = field(default_factory=dict)
    # (model, replica class) -> the published estimate, with why it is the one
    estimates: dict[Key, Published] = field(default_factory=dict)
    previous_estimates: dict[Key, Published] = field(default_factory=dict)
    slo_ttft_p95_s: float | None = None
    # model -> what is published per task class and replica class: {task_class, ..., reason}
    classes: dict[str, list[dict[str, Any]]] = field(default_factory=dict)
    # (model, replica class its rows name) -> V_P, cache hit rate, the TTFT split and goodput
    engine: dict[Key, EngineSplit] = field(default_factory=dict)

    @property
    def previous_since(self) -> datetime:
        """Start of the previous window, as long as the current one."""
        return self.since - (self.until - self.since)


def _published(made: list[Decision]) -> dict[Key, Published]:
    """What the gauges publish per model and replica class (collector.store.decision), task class
    all: the same estimate the sidecar, the store and the other readers use, with its reason."""
    return {
        (d.model, d.replica_class): Published(d.estimate, d.reason)
        for d in made
        if d.estimate is not None and d.task_class == "all"
    }


def _classes(made: list[Decision]) -> dict[str, list[dict[str, Any]]]:
    """Per model, the decision for every task class, published or not, with its reason."""
    by_model: dict[str, list[dict[str, Any]]] = {}
    for d in made:
        estimate = d.estimate
        by_model.setdefault(d.model, []).append(
            {
                "task_class": d.task_class,
                "replica_class": d.replica_class,
                "knee_requests": estimate.knee_requests if estimate else None,
                "recommended_pool": estimate.recommended_pool if estimate else None,
                "slo_max": estimate.slo_max if estimate else None,
                "source": estimate.source if estimate else None,
                "engine_max_concurrency": estimate.extra.get("engine_max_concurrency") if estimate else None,
                "reason": d.reason,
            }
        )
    return by_model


def class_of(served: str | None, probed: str | None, published: Sequence[str]) -> str:
    """An instance's replica class: the one its rows name where that class has a published
    estimate; else its probe runs'; else the model's only published class, as the rules fall back
    to it (a sidecar whose class has no knee is judged against the model's default one); else the
    class its rows name, or the default class."""
    if served is not None and served in published:
        return served
    if probed:
        return probed
    if len(published) == 1:
        return published[0]
    return served or DEFAULT_REPLICA_CLASS


class _Reader:
    """The store and the window's parameters; runs the aggregates."""

    def __init__(self, store: SnapshotReads, before: datetime, since: datetime, until: datetime) -> None:
        self.store = store
        self.window = {"before": before, "since": since, "until": until}

    def rows(self, sql: str, **extra: Any) -> list[dict[str, Any]]:
        """The query's rows as dicts; only the parameters the SQL names are passed."""
        params = {k: v for k, v in (self.window | extra).items() if re.search(rf"\${k}\b", sql)}
        return self.store.query_dicts(sql, params)

    def columns(self, sql: str, **extra: Any) -> dict[str, np.ndarray]:
        """The query's columns as numpy arrays (for results as long as a load's grid)."""
        params = {k: v for k, v in (self.window | extra).items() if re.search(rf"\${k}\b", sql)}
        return self.store.numpy(sql, params)


def _window(row: dict[str, Any]) -> WindowFigures:
    latency: dict[str, dict[str, float | None]] = {
        m: dict(zip(("p50", "p95", "p99"), row[m] or (None, None, None))) for m in LATENCIES
    }
    return WindowFigures(int(row["n"]), row["p"], row["g"], row["cached"], latency)


def _per_model(reader: _Reader) -> dict[str, ModelFigures]:
    """The aggregates that need no replica class: windows, outcomes, tenants, longest, adapters,
    curves."""
    models: dict[str, ModelFigures] = {}
    thresholds = {}
    for row in reader.rows(_SUMMARY, count=LONGEST):
        figures = models.setdefault(row["model"], ModelFigures())
        if row["now"]:
            figures.current = _window(row)
            if row["longest_e2e"]:
                thresholds[row["model"]] = min(row["longest_e2e"])
        else:
            figures.previous = _window(row)
    for row in reader.rows(_OUTCOMES):
        models[row["model"]].outcomes[row["outcome"]] = int(row["n"])
    for row in reader.rows(_TENANTS):
        models[row["model"]].tenants.append((row["tenant"], row["tokens"], int(row["n"])))
    if thresholds:
        names = sorted(thresholds)
        least = [thresholds[m] for m in names]
        for row in reader.rows(
            _LONGEST, count=LONGEST, l_model=names, l_least=least, least_of_all=min(least)
        ):
            models[row.pop("model")].longest.append(row)
    for row in reader.rows(_ADAPTERS):
        ttft = row["ttft"] or [None, None]
        models[row["model"]].adapters.append(
            {
                "adapter": row["adapter"],
                "requests": int(row["n"]),
                "ttft_p50_s": ttft[0],
                "ttft_p95_s": ttft[1],
                "tokens": row["tokens"],
                "generating_s": row["generating_s"],
                "e2e_total_s": row["e2e_total"],
            }
        )
    for row in sorted(reader.rows(_CURVES), key=lambda r: (r["model"], r["bucket"])):
        entry = {
            "bucket": int(row["bucket"]),
            "n": int(row["n"]),
            "ttft_p95_s": row["ttft_p95_s"],
            "tpot_p95_s": row["tpot_p95_s"],
            "errors": int(row["errors"]),
        }
        figures = models[row["model"]]
        (figures.curve if row["by_requests"] else figures.curve_tokens).append(entry)
    return models


def _instance_classes(
    store: SnapshotReads,
    reader: _Reader,
    models: dict[str, ModelFigures],
    published: dict[Key, Published],
) -> tuple[dict[Key, str], list[dict[str, Any]]]:
    """(model, instance) -> replica class for every instance with traffic, and the instances'
    rows; each model's first and last admission of the current window go into `models`."""
    probed: dict[Key, str] = {}
    if store.query(_HAS_ESTIMATES)[0][0]:
        probed = {(str(m), str(i)): str(c) for m, i, c in store.query(_PROBED, [reader.window["until"]])}
    every = reader.rows(_INSTANCES)
    served = {(r["model"], r["instance"]): r["served"] for r in every if r["served"] is not None}
    instances = [r for r in every if r["traffic"]]
    for model, figures in models.items():
        now = [r for r in instances if r["model"] == model and r["first_admitted"] is not None]
        if now:
            figures.first_admitted = min(r["first_admitted"] for r in now)
            figures.last_admitted = max(r["last_admitted"] for r in now)
    by_model = {m: sorted(c for mm, c in published if mm == m) for m in models}
    mapping = {
        (r["model"], r["instance"]): class_of(
            served.get((r["model"], r["instance"])),
            probed.get((r["model"], r["instance"])),
            by_model[r["model"]],
        )
        for r in instances
    }
    return mapping, instances


def _loads(
    reader: _Reader,
    mapping: dict[Key, str],
    bounds: dict[Key, tuple[float, float, float | None, float | None]],
    window: tuple[float, float, float],
) -> dict[Key, LoadSeries]:
    """Each replica class's load over both windows, from the sums on its grid (`bounds`: its
    requests' first admission and last completion, and those of the current window's;
    `window`: start, end, and the previous window's start)."""
    start, end, before = window
    grids = {
        key: grid
        for key, bound in bounds.items()
        if (grid := sampling_grid(*bound, start, end, before)) is not None
    }
    if not grids:
        return {}
    keys = sorted(grids)
    index = {key: i for i, key in enumerate(keys)}
    served = sorted(pair for pair in mapping if (pair[0], mapping[pair]) in grids)
    of = [grids[(m, mapping[(m, i)])] for m, i in served]
    sums = reader.columns(
        _LOAD,
        g_model=[m for m, _ in served],
        g_instance=[i for _, i in served],
        g_code=list(range(len(served))),
        g_key=[index[(m, mapping[(m, i)])] for m, i in served],
        g_origin=[grid.origin for grid in of],
        g_t0=[float(grid.times[0]) for grid in of],
        g_dt=[grid.dt for grid in of],
        g_step=[grid.step for grid in of],
    )
    found = {}
    for i, key in enumerate(keys):
        mine = sums["key"] == i
        found[key] = LoadSeries.from_sums(grids[key], {name: values[mine] for name, values in sums.items()})
    return found


def _bounds(
    instances: list[dict[str, Any]], mapping: dict[Key, str]
) -> dict[Key, tuple[float, float, float | None, float | None]]:
    """Per (model, replica class): the first admission and last completion of its requests'
    intervals, and of the current window's (None when it had none)."""
    found: dict[Key, list[list[float]]] = {}
    for row in instances:
        if row["first_a"] is None:
            continue
        parts = found.setdefault((row["model"], mapping[(row["model"], row["instance"])]), [[], [], [], []])
        for part, name in zip(parts, ("first_a", "last_c", "now_first_a", "now_last_c")):
            if row[name] is not None:
                part.append(float(row[name]))
    return {
        key: (
            min(first),
            max(last),
            min(now_first) if now_first else None,
            max(now_last) if now_last else None,
        )
        for key, (first, last, now_first, now_last) in found.items()
    }


def _little(reader: _Reader, models: dict[str, ModelFigures]) -> None:
    """Each model's Little's-law windows (their length from its traffic, plan.little_window_s)."""
    lengths = {}
    for model, figures in models.items():
        first, last, p95 = (
            figures.first_admitted,
            figures.last_admitted,
            figures.current.latency["e2e_s"]["p95"],
        )
        if first is None or last is None or p95 is None:
            continue
        lengths[model] = little_window_s(last - first, p95)
    if not lengths:
        return
    names = sorted(lengths)
    rows = reader.rows(_LITTLE, l_model=names, l_window=[float(lengths[m]) for m in names])
    for model in names:
        mine = [row for row in rows if row["model"] == model]
        models[model].little = LittleWindowSums(lengths[model], _little_windows(mine, lengths[model]))


def _little_windows(rows: list[dict[str, Any]], span: int) -> list[tuple[int, float, int, int, float]]:
    """Per window k with a completion (in order): busy request-seconds, completions, those with
    an e2e, their e2e summed; from _LITTLE's sums by start window and by end window."""
    if not rows:
        return []
    first = min(int(row["k"]) for row in rows) - 1  # an edge completion counts in the window before
    size = max(int(row["k"]) for row in rows) - first + 2
    busy, whole = np.zeros(size), np.zeros(size)
    ended = np.zeros((3, size))
    for row in rows:
        i = int(row["k"]) - first
        if row["by_start"]:
            busy[i] += row["first_part"]
            whole[i + 1] += row["spanning"]  # from the next window on, a whole window each
        else:
            busy[i] += row["last_part"]
            whole[i] -= row["spanning"]
            ended[:, i] += (row["completions"], row["done"], row["e2e"])
            ended[:, i - 1] += (row["edge_completions"], row["edge_done"], row["edge_e2e"])
    busy += np.cumsum(whole) * span
    return [
        (int(first + i), float(busy[i]), int(ended[0, i]), int(ended[1, i]), float(ended[2, i]))
        for i in np.flatnonzero(ended[0])
    ]


def collect_inputs(
    store: RequestStore, since: datetime, until: datetime, *, slo_ttft_p95_s: float | None = None
) -> ReportInputs:
    """The aggregates of [since, until) and of the window before it, plus what was published at
    its end and at its start, per model (collector.store.decision)."""
    if until <= since:
        raise ValueError(
            f"report window is empty: since {since.isoformat()} is not before until {until.isoformat()}"
        )
    before = since - (until - since)
    made = decisions(store, as_of=until)
    inputs = ReportInputs(
        since,
        until,
        estimates=_published(made),
        previous_estimates=_published(decisions(store, as_of=since)),  # what was published when it began
        slo_ttft_p95_s=slo_ttft_p95_s,
        classes=_classes(made),
    )
    # one snapshot for every query: rows a live sidecar writes meanwhile (a new model among them)
    # never show in one query and not in the one before it
    with store.memory_at_least(REVIEW_MEMORY_MB), store.one_snapshot() as snapshot:
        inputs.models = _aggregates(snapshot, _Reader(snapshot, before, since, until), inputs.estimates)
        inputs.engine = {(g.model, g.replica_class): g for g in engine_split(snapshot, since, until).groups}
    return inputs


def _aggregates(
    store: SnapshotReads, reader: _Reader, published: dict[Key, Published]
) -> dict[str, ModelFigures]:
    """Every model's aggregates of both windows (module docstring)."""
    since, until, before = (reader.window[name] for name in ("since", "until", "before"))
    models = _per_model(reader)
    if not models:
        return models
    mapping, instances = _instance_classes(store, reader, models, published)
    window = (since.timestamp(), until.timestamp(), before.timestamp())
    loads = _loads(reader, mapping, _bounds(instances, mapping), window)
    for model, figures in models.items():
        mine = [r for r in instances if r["model"] == model]
        for replica_class in sorted({mapping[(model, r["instance"])] for r in mine}):
            current = [r for r in mine if r["now"] and mapping[(model, r["instance"])] == replica_class]
            peaks_r = [r["peak_requests"] for r in current if r["peak_requests"] is not None]
            peaks_t = [r["peak_tokens"] for r in current if r["peak_tokens"] is not None]
            figures.classes.append(
                ClassFigures(
                    replica_class,
                    sorted(r["instance"] for r in current),
                    float(max(peaks_r)) if peaks_r else None,
                    float(max(peaks_t)) if peaks_t else None,
                    loads.get((model, replica_class)),
                )
            )
        figures.e2e_total_s = sum(a["e2e_total_s"] for a in figures.adapters)
    _little(reader, models)
    return models
