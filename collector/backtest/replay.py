"""A user's own request log as a backtest: "would these rules have warned us last Tuesday?".

Rows come from a DuckDB file (`--db`, through its owning sidecar while one serves it) or the
fleet's Iceberg table (`--catalog --lake`, pruned to the window's days). The sidecar's series are rebuilt from them by collector.backtest.exposition,
the same code the scenarios use: both calibers from the admit, first-token and completion times,
the histograms from TTFT, TPOT and end-to-end times, counters by outcome. The capacity gauges come
from the newest saved estimate per model. What rows cannot tell is **missing**, never invented:
the engine's queue, batch and KV cache, the GPU, the request log's own health; alerts that read
only those cannot fire in a replay and are named as such. `up` is taken as 1 for every instance in
the log (a scrape's health is not in it either; the output says so).

`time_scale` stretches the log's time axis: a log written against `headroom sim --speed 8` replays
in the simulator's own time with 8, and a demo of a few seconds needs more to fill the rules'
5-minute windows (concurrency is the same at any scale; latencies stretch with it).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime
from typing import Any

import duckdb

from collector.backtest.exposition import GoodputSlo, scrape_times, sidecar_series
from collector.backtest.lifecycle import Lifecycle
from collector.backtest.openmetrics import SeriesSet
from collector.capacity import CapacityEstimate
from collector.lake.source import open_log
from collector.rules.naming import metric_names
from collector.store.decision import published_estimates
from collector.store.owner import OwnerError

__all__ = [
    "ReplayLog",
    "from_db",
    "stretched",
    "replay_series",
    "missing_series",
    "ReplayError",
    "MAX_WINDOW_S",
    "ENGINE_SIDE",
]

MAX_WINDOW_S = 2 * 86400.0
_MARGIN_S = 600.0  # rows admitted this long before the window still in flight inside it
_PAGE = 50_000
_MAX_PAGES = 40
_COLUMNS = (
    "request_id, instance, model, tenant, stream, admitted_at, first_token_at, completed_at, "
    "outcome, status_code, prompt_tokens, completion_tokens, max_tokens, task_class, adapter"
)
# Series a request log cannot rebuild: the engine's own metrics, the GPU, the pipeline's health.
ENGINE_SIDE = (
    "headroom_engine_up",
    "headroom_engine_requests_running",
    "headroom_engine_requests_waiting",
    "headroom_engine_kv_cache_usage_ratio",
    "headroom_engine_kv_cache_capacity_tokens",
    "headroom_engine_max_concurrency_requests",
    "headroom_adapter_slots",  # the engine's LoRA slots (its metrics or --adapter-slots)
    "headroom_signal_valid",  # the engine source's judgement of those series
    "headroom_gpu_up",
    "headroom_gpu_utilization_ratio",
    "headroom_log_rows_dropped_total",
    "headroom_log_sink_up",
    "headroom_log_sink_lag_seconds",
    "headroom_log_spool_bytes",
)


class ReplayError(ValueError):
    """The log or the window cannot be replayed; the message says which input and what to do."""


@dataclass
class ReplayLog:
    """Records of a window, the capacity estimates published for it, and where they came from."""

    records: list[Lifecycle]
    capacities: list[CapacityEstimate]
    start: float
    end: float
    source: str
    notes: list[str] = field(default_factory=list)


def _window(
    rows_start: float | None,
    rows_end: float | None,
    since: datetime | None,
    until: datetime | None,
    source: str,
) -> tuple[float, float]:
    start = since.timestamp() if since else rows_start
    end = until.timestamp() if until else rows_end
    if start is None or end is None or end <= start:
        raise ReplayError(
            f"{source} has no finished requests in the window asked for; widen --since/--until "
            "or check the file"
        )
    if end - start > MAX_WINDOW_S:
        raise ReplayError(
            f"the window is {(end - start) / 3600:.0f} h; replay at most {MAX_WINDOW_S / 3600:.0f} h "
            "at a time (narrow --since/--until)"
        )
    return start, end


def _published_then(
    published_at: Callable[[datetime | None], list[CapacityEstimate]], end: float
) -> tuple[list[CapacityEstimate], str | None]:
    """What the publication gate (collector.store.decision) published at the window's end, which
    the rules then divided by; when nothing was yet (a probe run after the traffic), what it
    publishes now, and a note that says so."""
    then = published_at(datetime.fromtimestamp(end, UTC))
    if then:
        return then, None
    now = published_at(None)
    if not now:
        return [], None
    return now, "no estimate was published at the end of the window: the knee published now is used"


def from_db(
    path: str | None,
    since: datetime | None = None,
    until: datetime | None = None,
    model: str | None = None,
    *,
    catalog: str | None = None,
    lake: str | None = None,
    table: str = "headroom.requests",
) -> ReplayLog:
    """Rows and the estimates published then from a request log: the DuckDB file `path` read-only
    (while a sidecar owns it, a snapshot through that owner: collector.store.owner), or, with
    `lake`, the fleet's Iceberg table in `catalog`, read from `since` less a margin to `until`."""
    name = f"--lake {lake}" if lake else f"--db {path}"
    read_from = None if since is None else datetime.fromtimestamp(since.timestamp() - _MARGIN_S, UTC)
    try:
        with open_log(path, catalog, lake, table=table, since=read_from, until=until) as store:
            where, params = ["completed_at IS NOT NULL"], []
            if model:
                where.append("model = ?")
                params.append(model)
            extent = store.query(
                f"SELECT min(admitted_at), max(completed_at) FROM requests WHERE {' AND '.join(where)}",
                params,
            )[0]
            first, last = (t.timestamp() if t else None for t in extent)
            start, end = _window(first, last, since, until, name)
            rows = store.query_dicts(
                f"SELECT {_COLUMNS} FROM requests WHERE {' AND '.join(where)} "
                "AND admitted_at >= ? AND admitted_at < ? ORDER BY admitted_at",
                params + [datetime.fromtimestamp(start - _MARGIN_S, UTC), datetime.fromtimestamp(end, UTC)],
            )
            estimates, note = _published_then(
                lambda at: [p.estimate for p in published_estimates(store, as_of=at)], end
            )
    except ReplayError:
        raise
    except (FileNotFoundError, OwnerError, ValueError) as exc:  # ValueError: --lake without --catalog
        raise ReplayError(f"{name}: {exc}") from None
    except duckdb.Error as exc:  # not a database headroom wrote
        raise ReplayError(
            f"cannot open {name} read-only ({str(exc).splitlines()[0]}); pass a request log a sidecar wrote"
        ) from None
    return _log(rows, estimates, start, end, name, model, note)


def _log(
    rows: list[dict[str, Any]],
    estimates: list[CapacityEstimate],
    start: float,
    end: float,
    source: str,
    model: str | None,
    note: str | None = None,
) -> ReplayLog:
    records = [Lifecycle.from_row(row) for row in rows]
    # whole seconds: Prometheus answers at millisecond timestamps, and every evaluation time is
    # start + k * interval, so a start with microseconds would match none of its answers
    start = float(math.floor(start))
    capacities = [e for e in estimates if e.knee_requests or e.knee_tokens]
    if model:
        capacities = [c for c in capacities if c.model == model]
    notes = ["`up` is taken as 1 for every instance in the log (scrape health is not in it)"]
    if note:
        notes.append(note)
    if not capacities:
        notes.append(
            "no saved capacity estimate: the knee alerts stay silent (run `headroom probe` or the "
            "store's capacity job)"
        )
    return ReplayLog(records, capacities, start, end, source, notes)


def stretched(log: ReplayLog, time_scale: float) -> ReplayLog:
    """`log` with its time axis stretched `time_scale` times from its start (1: unchanged)."""
    if time_scale == 1:
        return log
    if not time_scale > 0:
        raise ReplayError(
            f"--time-scale {time_scale} must be positive (e.g. 8 for a log from `headroom sim --speed 8`)"
        )

    def at(t: float) -> float:
        return log.start + (t - log.start) * time_scale

    def maybe(t: float | None) -> float | None:
        return None if t is None else at(t)

    records = [
        replace(r, admitted=at(r.admitted), first_token=maybe(r.first_token), completed=maybe(r.completed))
        for r in log.records
    ]
    end = log.start + (log.end - log.start) * time_scale
    return replace(log, records=records, end=end, notes=log.notes + [f"times stretched {time_scale:g}x"])


def replay_series(
    log: ReplayLog, job: str, scrape_interval_s: float, slo_of: GoodputSlo | None = None
) -> SeriesSet:
    """The series the log's sidecars exported, plus the published knees, at the scrape interval;
    goodput judged by `slo_of` (exposition.goodput_slo of the rules config, by default the default's)."""
    times = scrape_times(log.start, log.end, scrape_interval_s)
    out = SeriesSet()
    sidecar_series(log.records, times, job, out, slo_of=slo_of)
    instances = sorted({r.instance for r in log.records})
    names = {
        "knee_requests": "headroom_capacity_knee_requests",
        "knee_tokens": "headroom_capacity_knee_tokens",
        "knee_tokens_p95": "headroom_capacity_knee_tokens_p95",
        "recommended_pool": "headroom_capacity_recommended_pool_requests",
    }
    for capacity in log.capacities:
        for instance in instances:
            model, task_class, _, source, confidence = capacity.labels
            labels = {
                "job": job,
                "instance": instance,
                "model": model,
                "task_class": task_class,
                "source": source,
                "confidence": confidence,
            }
            for field_name, metric in names.items():
                value = getattr(capacity, field_name)
                if value is not None:
                    for t in times:
                        out.add(metric, labels, t, float(value))
    return out


def missing_series(
    alert_rules: list[dict[str, Any]], record_rules: list[dict[str, Any]]
) -> tuple[list[str], list[str]]:
    """(engine-side metrics a replay lacks that the rules read, alerts that read nothing else)."""
    records = {rule["record"]: metric_names(rule["expr"]) for rule in record_rules}

    def raw(names: set[str], depth: int = 0) -> set[str]:
        found: set[str] = set()
        for name in names:
            found |= raw(records[name], depth + 1) if name in records and depth < 10 else {name}
        return found

    needed, blind = set(), []
    for rule in alert_rules:
        reads = raw(metric_names(rule["expr"])) - {"ALERTS"}
        lacking = reads & set(ENGINE_SIDE)
        needed |= lacking
        if reads and reads <= set(ENGINE_SIDE) | {"up"} and lacking and rule["alert"] not in blind:
            blind.append(rule["alert"])
    return sorted(needed), blind
