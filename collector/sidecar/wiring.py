"""build_sidecar: the one place that decides, from a SidecarConfig, what a sidecar runs.

    sources   the engine's /metrics (config.engine; polled in the background) and the GPU (NVML),
              exported through one SourceHealth collector with headroom_source_scrape_*{source}
    sinks     the request log: a LogWriter in front of an in-process RequestStore at
              config.db_path, or of a LakeWriter staging Parquet files in config.lake
              (collector.lake); an OtelSink, a span sink, when config.otlp_endpoint is set
    jobs      the store's scheduled jobs, only where this sidecar owns its database (config.jobs)
    capacity  the headroom_capacity_* gauges those jobs publish; in fleet mode (config.lake and
              config.catalog) the fleet's estimates for this sidecar's models, read every minute
              (collector.lake.estimates.FleetPublisher)
    readers   where this sidecar owns its database: the store's token-protected routes under
              /headroom (token from HEADROOM_TOKEN or `<db>.token`), so the CLI's readers work
              while it runs (collector.store.owner)

create_app (collector.sidecar.app) then serves and runs them. A caller that brings parts of its
own (tests, a program embedding the sidecar) passes them in: `sinks`, extra RowSinks the sidecar
closes at shutdown; `span_sinks`, extra SpanSinks (an OtelSink of its own: tracing is on), closed
likewise; `log_sink`, a BatchSink for the request log that the caller keeps open (then no database
is opened here and no jobs run); `engine`, an EngineSource instead of config.engine's.

What was built is kept on the app once, as a SidecarState; `sidecar_state(app)` reads it back,
typed (the CLI's server options, the demo's reads of its store, tests).
"""

from __future__ import annotations

import functools
import os
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any

from apscheduler.schedulers.background import BackgroundScheduler
from fastapi import APIRouter, Depends, FastAPI
from prometheus_client import CollectorRegistry

from collector.exposition import new_registry
from collector.lake.stage import DEFAULT_SPOOL_DIR, LakeWriter
from collector.record import RowSink
from collector.service.auth import TOKEN_ENV, require_token, resolve_token
from collector.sidecar.adapters import AdapterMap, AdapterMetrics
from collector.sidecar.admin import AdminListener
from collector.sidecar.app import SidecarParts, create_app
from collector.sidecar.config import SidecarConfig
from collector.sidecar.otel import OtelSink, provider_name
from collector.sidecar.replica import ReplicaClass
from collector.sidecar.series import SeriesBudget
from collector.sidecar.tracecontext import SpanSink
from collector.sidecar.tracker import Tracker
from collector.sources import EngineSource, build_engine_source, default_metrics_url, models_url
from collector.sources.gpu import GpuCollector
from collector.sources.health import SourceHealth
from collector.store.capacity_gauges import CapacityGauges
from collector.store.writer import BatchSink, LogWriter
from collector.timewin import parse_duration

if TYPE_CHECKING:  # the one-box store's parts load DuckDB: imported where a --db sidecar builds them,
    # so a --lake sidecar neither imports nor needs DuckDB (tests/test_slim_fleet.py)
    from collector.lake.estimates import FleetPublisher  # pyiceberg: only in fleet mode
    from collector.store.db import RequestStore
    from collector.store.jobs import JobSettings

__all__ = ["build_sidecar", "job_settings", "SidecarState", "sidecar_state"]

SIDECAR_STORE_THREADS = 1  # DuckDB threads of the in-process store (RequestStore: why)
SIDECAR_STORE_BATCH_ROWS = 50_000  # the most rows one append to the in-process store takes (LogWriter)


@dataclass(frozen=True, slots=True)
class SidecarState:
    """What build_sidecar built and the app runs, kept on the app (`sidecar_state(app)` reads it)."""

    config: SidecarConfig
    registry: CollectorRegistry  # what /metrics exports (uvicorn's connection counters join it)
    tracker: Tracker  # the live requests and the per-request metrics
    capacity: CapacityGauges  # the headroom_capacity_* gauges the jobs (or the fleet) publish
    replica_class: ReplicaClass  # the engine's replica class, as the rows and estimates carry it
    writer: LogWriter | None = None  # the request log's writer, in front of batch_sink
    batch_sink: BatchSink | None = None  # where the writer appends: store, lake or the caller's log_sink
    store: RequestStore | None = None  # the in-process store (--db) this sidecar owns, else None
    lake: LakeWriter | None = None  # the lake's writer (--lake), else None
    scheduler: BackgroundScheduler | None = None  # the store's jobs, or the fleet's estimates
    admin: AdminListener | None = None  # the admin routes' own listener (--admin-listen)
    fleet_estimates: FleetPublisher | None = None  # fleet mode (--lake and --catalog)


def sidecar_state(app: FastAPI) -> SidecarState:
    """The SidecarState build_sidecar kept on `app`; TypeError for an app it did not build."""
    state = getattr(app.state, "sidecar", None)
    if not isinstance(state, SidecarState):
        raise TypeError(f"{app!r} was not built by build_sidecar: it has no SidecarState")
    return state


def build_sidecar(
    config: SidecarConfig,
    *,
    sinks: Sequence[RowSink] = (),
    span_sinks: Sequence[SpanSink] = (),
    log_sink: BatchSink | None = None,
    engine: EngineSource | None = None,
) -> FastAPI:
    """The sidecar `config` describes, as an ASGI app (see the module docstring for the parts).

    Raises ValueError naming the bad setting (an unknown engine, a broken mapping file, a bad
    lake URI, a series budget too small), and duckdb.Error or SchemaTooNew when the database at config.db_path cannot be
    owned; the engine is checked before any database is opened.
    """
    budget = SeriesBudget(config.max_series, max_models=config.max_models, max_tenants=config.max_tenants)
    registry = new_registry()
    engine = engine if engine is not None else _engine_source(config)
    tracker = Tracker(
        registry,
        instance=config.instance,
        source=config.source,
        run_id=config.run_id,
        budget=budget,
        adapters=AdapterMap(
            config.adapters, learned=None if engine is None else lambda: engine.adapter_parents
        ),
        slo=config.request_slo(),
    )
    registry.register(AdapterMetrics(tracker, functools.partial(_adapter_slots, config, engine)))
    capacity = CapacityGauges()
    registry.register(capacity)
    gpu = GpuCollector()
    if engine is not None:  # its signals are judged against the traffic this sidecar sees
        engine.integrity.traffic = lambda: (tracker.load.requests, tracker.load.finished)
    registry.register(SourceHealth([source for source in (engine, gpu) if source is not None]))
    replica_class = ReplicaClass(config.replica_class, gpu_names=gpu.names, engine=engine)
    registry.register(replica_class)
    tracker.replica_class_of = lambda: replica_class.value
    spans = [*_otel_sinks(config, engine), *span_sinks]  # before the store: a bad endpoint opens nothing
    store = _own_store(config) if log_sink is None else None
    lake = _lake_writer(config) if log_sink is None and store is None else None
    batch_sink = log_sink if log_sink is not None else store or lake
    log = (
        None
        if batch_sink is None
        else LogWriter(
            batch_sink,
            registry,
            max_queue_rows=config.log_queue_rows,
            batch_rows=config.log_batch_rows,
            flush_interval_s=config.log_flush_interval_s,
            owns_sink=log_sink is None,
            # the own store catches up on a backlog in large appends
            max_batch_rows=SIDECAR_STORE_BATCH_ROWS if batch_sink is store else None,
        )
    )
    if lake is not None and log is not None:
        registry.register(lake)  # spool depth and age, lake up
        lake.report_to(log)  # rows count as written once a staged file holds them
    scheduler = (
        _scheduler(config, store, capacity, replica_class, log) if store is not None and config.jobs else None
    )
    fleet = _fleet_publisher(config, capacity, tracker)
    if fleet is not None:  # fleet mode: no store of its own, so no other jobs
        scheduler = _fleet_scheduler(fleet)
    token, token_file = _sidecar_token(config, store)
    routes = _store_routes(config, store, capacity, token)
    parts = SidecarParts(
        registry,
        tracker,
        sinks=[*([log] if log else []), *sinks],
        span_sinks=spans,
        engine=engine,
        scheduler=scheduler,
        store_routes=routes,
        token_in_file=token_file is not None,
        probe_token=token,
        owned_db=config.db_path if routes is not None else None,
    )
    app = create_app(config, parts)
    app.state.sidecar = SidecarState(
        config,
        registry,
        tracker,
        capacity,
        replica_class,
        writer=log,
        batch_sink=batch_sink,
        store=store,
        lake=lake,
        scheduler=scheduler,
        admin=app.admin,
        fleet_estimates=fleet,
    )
    return app


FLEET_ESTIMATES_EVERY_S = 60.0  # how often a fleet-mode sidecar reads the fleet's estimates


def _fleet_publisher(
    config: SidecarConfig, capacity: CapacityGauges, tracker: Tracker
) -> FleetPublisher | None:
    """With --lake and --catalog: a FleetPublisher (collector.lake.estimates) of the fleet's
    estimates for the models this sidecar serves (those it has seen, and --model); else None."""
    if config.catalog is None:
        return None
    if not config.lake:
        raise ValueError("--catalog needs --lake: a sidecar with --db publishes its own estimates")
    from collector.store.decision import PublishPolicy  # lazy: DuckDB (see the imports)

    try:
        from collector.lake.estimates import FleetPublisher  # lazy: pyiceberg, the [lake] extra
    except ImportError as exc:
        raise ValueError(
            f"--catalog needs pyiceberg to read the fleet's estimates: pip install 'llm-headroom[lake]' ({exc})"
        ) from None

    def models() -> set[str]:
        return tracker.models_seen() | ({config.model} if config.model else set())

    return FleetPublisher(
        config.catalog,
        config.lake,
        capacity,
        models,
        policy=PublishPolicy(probe_max_age=parse_duration(config.probe_max_age)),
    )


def _fleet_scheduler(fleet: FleetPublisher) -> BackgroundScheduler:
    """The fleet-mode sidecar's one job: publish the fleet's estimates, at start and every minute."""
    scheduler = BackgroundScheduler(timezone="UTC")
    scheduler.add_job(
        fleet.refresh,
        "interval",
        seconds=FLEET_ESTIMATES_EVERY_S,
        id="fleet_estimates",
        next_run_time=datetime.now(UTC),
        max_instances=1,
        coalesce=True,
    )
    return scheduler


def _adapter_slots(config: SidecarConfig, engine: EngineSource | None) -> int | None:
    """The engine's LoRA slots: --adapter-slots, else what its metrics said last (None: unknown)."""
    if config.adapter_slots is not None or engine is None:
        return config.adapter_slots
    return engine.latest.adapter_slots


def _engine_source(config: SidecarConfig) -> EngineSource | None:
    """The engine poller config.engine names (None for 'none'); ValueError on a bad setting."""
    if config.engine == "none":
        return None
    metrics_url = config.engine_metrics_url or default_metrics_url(config.upstream)
    return build_engine_source(
        config.engine,
        metrics_url,
        config.engine_poll_interval_s,
        mapping_path=config.engine_mapping,
        model=config.model,
        models_list_url=models_url(config.upstream),
        learn_adapters=True,
    )


def _otel_sinks(config: SidecarConfig, engine: EngineSource | None = None) -> list[SpanSink]:
    """One OtelSink when an OTLP endpoint is configured, else none. Its gen_ai.provider.name is the
    engine family (vllm, sglang, tgi, llama.cpp) as --engine names it or `auto` found it, else openai."""
    if not (config.otlp_endpoint or config.otlp_traces_endpoint):
        return []
    options: dict[str, Any] = {"endpoint": config.otlp_endpoint, "upstream": config.upstream}
    if config.otlp_traces_endpoint:
        options["traces_endpoint"] = config.otlp_traces_endpoint
    if config.otlp_protocol != "http/protobuf":
        options["protocol"] = config.otlp_protocol
    if config.otlp_metrics:
        options["metrics"] = True
    if config.otlp_logs:
        options["logs"] = True
    if engine is not None:  # read per span: `auto` knows the engine after its first poll
        options["provider"] = lambda: provider_name(engine.latest.engine)
    elif provider_name(config.engine) != "openai":
        options["provider"] = provider_name(config.engine)
    return [OtelSink(**options)]


def _own_store(config: SidecarConfig) -> RequestStore | None:
    """The in-process store: a DuckDB file this sidecar alone owns (not with --lake), on one
    of DuckDB's threads (the proxy keeps the other cores), folding its write-ahead log every
    --checkpoint-mb (DuckDB's 16 MB unless told), its memory bounded by --store-memory-mb (DuckDB
    would cache every block it writes up to 80 % of the machine's memory: BENCHMARKS.md §10)."""
    if config.lake or not config.db_path:
        return None
    from collector.store.db import RequestStore  # lazy: DuckDB (see the imports)

    return RequestStore(
        config.db_path,
        threads=SIDECAR_STORE_THREADS,
        checkpoint_mb=config.checkpoint_mb,
        memory_mb=config.store_memory_mb,
    )


def _lake_writer(config: SidecarConfig) -> LakeWriter | None:
    """The lake's writer, when config.lake is set: the spool is its write-ahead (collector.lake.stage)."""
    if not config.lake:
        return None
    return LakeWriter(
        config.lake,
        config.instance,
        config.spool_dir if config.spool_dir is not None else DEFAULT_SPOOL_DIR,
        roll_seconds=config.lake_roll_seconds,
        roll_bytes=config.lake_roll_mb * 2**20,
    )


def _sidecar_token(config: SidecarConfig, store: RequestStore | None) -> tuple[str | None, Path | None]:
    """(the sidecar's token, the file it is kept in): the store routes' token where this sidecar
    owns a database file (HEADROOM_TOKEN, else `<db>.token`), else HEADROOM_TOKEN or None.

    The same token makes a request the probe's (X-Headroom-Probe-Token); with None no probe mark
    is trusted and the probe's load through this sidecar counts as traffic.
    """
    if store is None or config.db_path is None or config.db_path == ":memory:":
        return os.environ.get(TOKEN_ENV, "").strip() or None, None
    return resolve_token(None, config.db_path)


def _store_routes(
    config: SidecarConfig, store: RequestStore | None, capacity: CapacityGauges, token: str | None
) -> APIRouter | None:
    """The store's routes on the owned database behind its token; None without one."""
    if store is None or config.db_path is None or config.db_path == ":memory:" or token is None:
        return None
    from collector.service.routes import build_store_routes  # lazy: DuckDB (see the imports)
    from collector.store.decision import PublishPolicy  # lazy: DuckDB (see the imports)

    policy = PublishPolicy(probe_max_age=parse_duration(config.probe_max_age))
    return build_store_routes(
        store,
        [Depends(require_token(token))],
        report_dir=_report_dir(config),
        gauges=capacity,
        policy=policy,
    )


def _report_dir(config: SidecarConfig) -> Path:
    return Path(config.db_path or "headroom.duckdb").with_suffix(".reports")


def _scheduler(
    config: SidecarConfig,
    store: RequestStore,
    capacity: CapacityGauges,
    replica_class: ReplicaClass,
    log: LogWriter | None,
) -> BackgroundScheduler:
    """The store's jobs on the in-process store; Parquet exports and reports go beside the file.

    The estimates made here (probe runs through this sidecar, its traffic) carry its replica class.
    Each refresh first waits for the log writer to write what it holds: a probe run is judged
    finished by its rows in the store.
    """
    from collector.analysis.refresh import refresh_estimates_isolated  # lazy: DuckDB (see the imports)
    from collector.store.jobs import build_scheduler  # lazy: DuckDB (see the imports)

    refresh = functools.partial(
        refresh_estimates_isolated,
        replica_class=lambda: replica_class.value,
        rows_written=log.flush if log is not None else None,
    )
    return build_scheduler(store, capacity, job_settings(config), refresh=refresh, review=_weekly_review)


def job_settings(config: SidecarConfig) -> JobSettings:
    """What the store's jobs take from `headroom run`'s options."""
    from collector.store.jobs import JobSettings  # lazy: DuckDB (see the imports)

    base = Path(config.db_path or "headroom.duckdb")
    return JobSettings(
        export_dir=base.with_suffix(".parquet"),
        report_dir=_report_dir(config),
        retention_days=config.retention_days,
        estimate_files=config.probe_dbs,
        probe_max_age=config.probe_max_age,
        slo_ttft_p95_s=config.slo_ttft_p95_s,
    )


def _weekly_review(
    store: RequestStore, report_dir: Path, since: str, now: datetime, **options: Any
) -> list[Path]:
    """The weekly job's work (report.review.write_report_files), loaded when it first runs."""
    # lazy: the review needs numpy (and matplotlib for its plots), which a slim sidecar install
    # (`pip install llm-headroom`, without [report]) does not have; only this job needs them
    try:
        from collector.report.review import write_report_files  # lazy: numpy, matplotlib (see above)
    except ImportError as exc:
        raise RuntimeError(
            f"the weekly review needs the report extra ({exc.name} is missing): "
            "pip install 'llm-headroom[report]'"
        ) from None
    return write_report_files(store, report_dir, since, now, **options)
