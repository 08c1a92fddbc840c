"""build_sidecar: the one place that decides, from a SidecarConfig, what a sidecar runs.

    sources   the engine's /metrics (config.engine; polled in the background) and the GPU (NVML),
              exported through one SourceHealth collector with headroom_source_scrape_*{source}
    sinks     the request log: a LogWriter in front of an in-process RequestStore at
              config.db_path, or in front of a StoreShipper to config.store_url; an OtelSink
              when config.otlp_endpoint is set
    jobs      the store's scheduled jobs, only where this sidecar owns its database (config.jobs)
    capacity  the headroom_capacity_* gauges those jobs publish

create_app (collector.sidecar.app) then serves and runs them. A caller that brings parts of its
own (tests, a program embedding the sidecar) passes them in: `sinks`, extra RowSinks the sidecar
closes at shutdown; `log_sink`, a BatchSink for the request log that the caller keeps open (then
no database is opened here and no jobs run); `engine`, an EngineSource instead of config.engine's.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from apscheduler.schedulers.background import BackgroundScheduler
from fastapi import FastAPI
from prometheus_client import CollectorRegistry, disable_created_metrics

from collector.analysis.refresh import refresh_estimates
from collector.record import RowSink
from collector.report.review import write_report_files
from collector.sidecar.app import SidecarParts, create_app
from collector.sidecar.config import SidecarConfig
from collector.sidecar.otel import OtelSink
from collector.sidecar.series import SeriesBudget
from collector.sidecar.tracker import Tracker
from collector.sources import EngineSource, build_engine_source, default_metrics_url
from collector.sources.gpu import GpuCollector
from collector.sources.health import SourceHealth
from collector.store.capacity_gauges import CapacityGauges
from collector.store.db import RequestStore
from collector.store.jobs import JobSettings, build_scheduler
from collector.store.shipper import StoreShipper
from collector.store.writer import BatchSink, LogWriter

__all__ = ["build_sidecar"]


def build_sidecar(config: SidecarConfig, *, sinks: Sequence[RowSink] = (), log_sink: BatchSink | None = None,
                  engine: EngineSource | None = None) -> FastAPI:
    """The sidecar `config` describes, as an ASGI app (see the module docstring for the parts).

    Raises ValueError naming the bad setting (an unknown engine, a broken mapping file, a bad
    store URL, a series budget too small), and duckdb.Error or SchemaTooNew when the database at config.db_path cannot be
    owned; the engine is checked before any database is opened.
    """
    disable_created_metrics()  # no `_created` series (a contract): one less series per counter child
    budget = SeriesBudget(config.max_series, max_models=config.max_models, max_tenants=config.max_tenants)
    registry = CollectorRegistry()
    tracker = Tracker(registry, instance=config.instance, source=config.source, run_id=config.run_id,
                      budget=budget)
    capacity = CapacityGauges()
    registry.register(capacity)
    engine = engine if engine is not None else _engine_source(config)
    registry.register(SourceHealth([source for source in (engine, GpuCollector()) if source is not None]))
    extra = [*_otel_sinks(config), *sinks]
    store = _own_store(config) if log_sink is None else None
    batch_sink = log_sink if log_sink is not None else store or _shipper(config)
    log = None if batch_sink is None else LogWriter(
        batch_sink, registry, max_queue_rows=config.log_queue_rows, batch_rows=config.log_batch_rows,
        flush_interval_s=config.log_flush_interval_s, owns_sink=log_sink is None)
    scheduler = _scheduler(config, store, capacity) if store is not None and config.jobs else None
    parts = SidecarParts(registry, tracker, sinks=[*([log] if log else []), *extra], engine=engine,
                         scheduler=scheduler)
    app = create_app(config, parts)
    app.state.capacity, app.state.writer, app.state.batch_sink = capacity, log, batch_sink
    return app


def _engine_source(config: SidecarConfig) -> EngineSource | None:
    """The engine poller config.engine names (None for 'none'); ValueError on a bad setting."""
    if config.engine == "none":
        return None
    metrics_url = config.engine_metrics_url or default_metrics_url(config.upstream)
    return build_engine_source(config.engine, metrics_url, config.engine_poll_interval_s,
                               mapping_path=config.engine_mapping)


def _otel_sinks(config: SidecarConfig) -> list[RowSink]:
    """One OtelSink when an OTLP endpoint is configured, else none."""
    if not config.otlp_endpoint:
        return []
    return [OtelSink(endpoint=config.otlp_endpoint, upstream=config.upstream)]


def _own_store(config: SidecarConfig) -> RequestStore | None:
    """The in-process store: a DuckDB file this sidecar alone owns (not with --store-url)."""
    if config.store_url or not config.db_path:
        return None
    return RequestStore(config.db_path)


def _shipper(config: SidecarConfig) -> StoreShipper | None:
    """The shipper to a `headroom store` service, when config.store_url is set."""
    if not config.store_url:
        return None
    return StoreShipper(config.store_url, config.store_token, config.spool_dir)


def _scheduler(config: SidecarConfig, store: RequestStore, capacity: CapacityGauges) -> BackgroundScheduler:
    """The store's jobs on the in-process store; Parquet exports and reports go beside the file."""
    base = Path(config.db_path or "headroom.duckdb")
    settings = JobSettings(export_dir=base.with_suffix(".parquet"), report_dir=base.with_suffix(".reports"),
                           retention_days=config.retention_days, estimate_files=config.probe_dbs,
                           probe_max_age=config.probe_max_age)
    return build_scheduler(store, capacity, settings, refresh=refresh_estimates, review=write_report_files)
