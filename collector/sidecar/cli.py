"""`headroom run`: the sidecar command line (thin shell over build_sidecar and uvicorn)."""

from __future__ import annotations

import logging
import os
import socket

import click
import uvicorn

from collector.serving import parse_listen
from collector.sidecar.config import MAX_REQUEST_BODY_BYTES, SidecarConfig

__all__ = ["run"]


@click.command("run")
@click.option(
    "--upstream",
    required=True,
    metavar="URL",
    help="Base URL of the OpenAI-compatible engine, e.g. http://127.0.0.1:8000.",
)
@click.option(
    "--listen",
    default="127.0.0.1:9100",
    show_default=True,
    metavar="HOST:PORT",
    help="Where the proxy listens (and /metrics, /healthz, /readyz, /headroom without --admin-listen).",
)
@click.option(
    "--admin-listen",
    metavar="HOST:PORT",
    help="Serve /metrics, /healthz, /readyz and /headroom here instead of on --listen, which then "
    "serves only the proxy (keep tenant names, traffic and the request log off the client port).",
)
@click.option(
    "--db",
    "db_path",
    default="headroom.duckdb",
    show_default=True,
    metavar="PATH",
    help="DuckDB request log owned by this process (not with --lake).",
)
@click.option(
    "--checkpoint-mb",
    type=click.IntRange(1),
    metavar="MB",
    show_default="16, DuckDB's",
    help="Fold --db's write-ahead log into the file each time it holds this many MB. Larger "
    "takes bursts of rows faster and keeps up to that much more in memory (64: ~200,000 rows/s "
    "into a 10 M-row log, 30 MiB more at peak; BENCHMARKS.md §5g).",
)
@click.option(
    "--instance",
    default=socket.gethostname(),
    show_default="hostname",
    help="Name of this sidecar in rows and labels.",
)
@click.option(
    "--replica-class",
    metavar="NAME",
    show_default="derived: GPU name and engine slots, e.g. nvidia-l40s-slots8, else default",
    help="The replica class of the engine behind this sidecar (hardware x engine configuration, "
    "e.g. h100-tp1): exported as headroom_replica_info{replica_class}; the rules compare this "
    "sidecar's concurrency with its own class's knee, and its estimates carry the class.",
)
@click.option(
    "--tenant-header", default="X-Tenant-ID", show_default=True, help="Request header naming the tenant."
)
@click.option(
    "--max-tenants",
    default=50,
    show_default=True,
    type=click.IntRange(1),
    help="Distinct tenant label values before the rest become 'other'.",
)
@click.option(
    "--max-models",
    default=20,
    show_default=True,
    type=click.IntRange(1),
    help="Distinct model label values before the rest become 'other'.",
)
@click.option(
    "--max-series",
    default=2000,
    show_default=True,
    type=click.IntRange(1),
    help="The most series /metrics exports in all; a new model or tenant that would pass "
    "it is labelled 'other' (headroom_label_values_folded_total counts them).",
)
@click.option(
    "--max-upstream-connections",
    "max_connections",
    default=1024,
    show_default=True,
    type=click.IntRange(1),
    help="Pooled connections to the upstream engine; requests beyond them wait for a free one.",
)
@click.option(
    "--engine",
    default=SidecarConfig.engine,
    show_default=True,
    metavar="NAME",
    help="Which engine's /metrics to read: auto|none|vllm|sglang|tgi|llamacpp|generic "
    "(auto recognises it; none turns it off; generic needs --engine-mapping).",
)
@click.option(
    "--engine-mapping",
    type=click.Path(exists=True, dir_okay=False),
    metavar="PATH",
    help="YAML mapping for --engine generic (format in docs/engines.md).",
)
@click.option("--engine-metrics-url", metavar="URL", help="Engine metrics URL [default: UPSTREAM/metrics].")
@click.option(
    "--model",
    metavar="NAME",
    show_default="the engine's model label, else the one model UPSTREAM/v1/models lists",
    help="The served model as clients name it: the `model` label of the engine series "
    "(headroom_engine_*), so they pair with the request series. Needed where the engine's metrics "
    "name no model and /v1/models names another (llama-server without --alias) or several.",
)
@click.option(
    "--engine-poll-interval",
    default=1.0,
    show_default=True,
    type=click.FloatRange(0.05),
    help="Seconds between engine metric polls.",
)
@click.option(
    "--spool-dir",
    metavar="PATH",
    show_default="./headroom-spool",
    help="On-disk spool: --lake's write-ahead buffer, which holds rows while the lake is away (bounded).",
)
@click.option(
    "--lake",
    metavar="URI",
    help="Write rows as immutable Parquet files into this lake (a directory, file:// or s3://...) "
    "for `headroom lake commit` to register in the fleet's Iceberg table; instead of --db.",
)
@click.option(
    "--catalog",
    metavar="URI",
    envvar="HEADROOM_CATALOG",
    help="With --lake: the fleet's Iceberg catalog (sqlite:///path.db, postgresql://..., http(s):// REST), "
    "from whose headroom.capacity_estimates this sidecar publishes its models' capacity every minute "
    "(the [lake] extra) [env: HEADROOM_CATALOG].",
)
@click.option(
    "--lake-roll-seconds",
    default=60.0,
    show_default=True,
    type=click.FloatRange(1),
    metavar="SECONDS",
    help="Stage a Parquet file once the oldest spooled row is this old (freshness).",
)
@click.option(
    "--lake-roll-mb",
    default=64,
    show_default=True,
    type=click.IntRange(1),
    metavar="MB",
    help="Stage a Parquet file once the spool holds this many MB of rows.",
)
@click.option(
    "--otlp-endpoint",
    metavar="URL",
    envvar="OTEL_EXPORTER_OTLP_ENDPOINT",
    help="Emit one OpenTelemetry span per request over OTLP to this base endpoint; /v1/traces "
    "is appended (https://host/otlp -> https://host/otlp/v1/traces) [env: OTEL_EXPORTER_OTLP_ENDPOINT].",
)
@click.option(
    "--otlp-traces-endpoint",
    metavar="URL",
    envvar="OTEL_EXPORTER_OTLP_TRACES_ENDPOINT",
    help="The OTLP traces URL itself, used as it is [env: OTEL_EXPORTER_OTLP_TRACES_ENDPOINT].",
)
@click.option(
    "--otlp-protocol",
    type=click.Choice(["http/protobuf", "grpc"]),
    default="http/protobuf",
    show_default=True,
    envvar=["OTEL_EXPORTER_OTLP_TRACES_PROTOCOL", "OTEL_EXPORTER_OTLP_PROTOCOL"],
    help="OTLP transport; grpc needs pip install 'llm-headroom[otlp-grpc]' "
    "[env: OTEL_EXPORTER_OTLP_TRACES_PROTOCOL, OTEL_EXPORTER_OTLP_PROTOCOL].",
)
@click.option(
    "--otlp-metrics/--no-otlp-metrics",
    default=False,
    show_default=True,
    help="Also export the GenAI server histograms (gen_ai.server.*) over OTLP.",
)
@click.option(
    "--otlp-logs/--no-otlp-logs",
    default=False,
    show_default=True,
    help="Also export one OpenTelemetry log event per request over OTLP "
    "(gen_ai.client.inference.operation.details: the span's attributes and the row's fields, never text; "
    "/v1/logs is appended to --otlp-endpoint).",
)
@click.option(
    "--read-timeout",
    default=600.0,
    show_default=True,
    type=click.FloatRange(1),
    help="Seconds to wait for the next upstream bytes before giving up (outcome timeout).",
)
@click.option(
    "--max-request-body-bytes",
    default=MAX_REQUEST_BODY_BYTES,
    show_default=True,
    type=click.IntRange(1),
    metavar="BYTES",
    help="Largest request body accepted; past it 413 JSON and a row.",
)
@click.option(
    "--max-buffered-response-bytes",
    default=16 * 2**20,
    show_default=True,
    type=click.IntRange(1),
    metavar="BYTES",
    help="Most of a non-streamed answer kept to read its usage (it always streams through; "
    "past this its tokens are estimated).",
)
@click.option(
    "--max-sse-event-bytes",
    default=2**20,
    show_default=True,
    type=click.IntRange(1),
    metavar="BYTES",
    help="Largest SSE event; a longer one ends the stream as upstream_error.",
)
@click.option(
    "--header-timeout",
    default=10.0,
    show_default=True,
    type=click.FloatRange(0.1),
    metavar="SECONDS",
    help="A connection must send its request headers within this (else 408).",
)
@click.option(
    "--body-timeout",
    default=60.0,
    show_default=True,
    type=click.FloatRange(0.1),
    metavar="SECONDS",
    help="A request's body must be complete within this of its headers (else 408).",
)
@click.option(
    "--idle-timeout",
    default=5.0,
    show_default=True,
    type=click.FloatRange(0.1),
    metavar="SECONDS",
    help="Idle kept-alive client connections close after this.",
)
@click.option(
    "--max-client-connections",
    default=4096,
    show_default=True,
    type=click.IntRange(1),
    help="Open client connections at most; a new one past it gets 503 and is closed.",
)
@click.option(
    "--jobs/--no-jobs",
    default=True,
    show_default=True,
    help="Run the scheduled jobs (rollups, retention, capacity refresh, weekly report) "
    "on the in-process store.",
)
@click.option(
    "--retention-days",
    default=30,
    show_default=True,
    type=click.IntRange(1),
    help="Raw rows older than this are exported to Parquet beside --db, then deleted.",
)
@click.option(
    "--probe-db",
    "probe_dbs",
    multiple=True,
    metavar="PATH",
    type=click.Path(dir_okay=False),
    help="A DuckDB file `headroom probe --db PATH` writes while this sidecar owns --db: "
    "its capacity estimates are copied in and published (repeatable).",
)
@click.option(
    "--probe-max-age",
    default="7d",
    show_default=True,
    metavar="DURATION",
    help="A probe estimate beats traffic's for this long (e.g. 24h, 7d).",
)
@click.option(
    "--adapter",
    "adapters",
    multiple=True,
    metavar="ADAPTER=BASE",
    help="A LoRA adapter clients name in `model`, and its base model (repeat per adapter); "
    "vLLM's /v1/models says it by itself. Requests are attributed to both (docs/engines.md).",
)
@click.option(
    "--adapter-slots",
    type=click.IntRange(1),
    show_default="the engine's: vLLM max_lora, SGLang lora_pool_slots_total",
    help="LoRA adapters one engine batch holds (vLLM --max-loras, SGLang --max-loras-per-batch).",
)
@click.option(
    "--log-level",
    default="info",
    show_default=True,
    type=click.Choice(["debug", "info", "warning", "error"]),
    help="The sidecar's log threshold (uvicorn's access log stays off).",
)
def run(
    upstream: str,
    listen: str,
    admin_listen: str | None,
    db_path: str,
    checkpoint_mb: int | None,
    instance: str,
    replica_class: str | None,
    tenant_header: str,
    max_tenants: int,
    max_models: int,
    max_series: int,
    max_connections: int,
    engine: str,
    engine_mapping: str | None,
    engine_metrics_url: str | None,
    model: str | None,
    adapters: tuple[str, ...],
    adapter_slots: int | None,
    engine_poll_interval: float,
    spool_dir: str | None,
    lake: str | None,
    catalog: str | None,
    lake_roll_seconds: float,
    lake_roll_mb: int,
    otlp_endpoint: str | None,
    otlp_traces_endpoint: str | None,
    otlp_protocol: str,
    otlp_metrics: bool,
    otlp_logs: bool,
    read_timeout: float,
    max_request_body_bytes: int,
    max_buffered_response_bytes: int,
    max_sse_event_bytes: int,
    header_timeout: float,
    body_timeout: float,
    idle_timeout: float,
    max_client_connections: int,
    jobs: bool,
    retention_days: int,
    probe_dbs: tuple[str, ...],
    probe_max_age: str,
    log_level: str,
) -> None:
    """Run the sidecar: proxy the OpenAI API and export dual-caliber concurrency.

    \b
    Examples:
      headroom run --upstream http://127.0.0.1:8000
      headroom run --upstream http://vllm:8000 --listen 0.0.0.0:9100 --engine vllm
      headroom run --upstream http://vllm:8000 --listen 0.0.0.0:9100 --admin-listen 0.0.0.0:9101
      headroom run --upstream http://127.0.0.1:8080 --engine llamacpp --max-tenants 20
      headroom run --upstream http://127.0.0.1:8080 --engine llamacpp --model gemma-3-270m
      headroom run --upstream http://vllm:8000 --max-series 5000 --max-models 40
      headroom run --upstream http://sglang:30000 --engine sglang --adapter sql-lora=llama-3-8b
      headroom run --upstream http://10.0.0.5:8000 --engine generic --engine-mapping my-engine.yaml
      headroom run --upstream http://127.0.0.1:8000 --db headroom.duckdb --probe-db probes.duckdb
      headroom run --upstream http://vllm:8000 --lake s3://llm-logs/headroom --spool-dir /var/spool/headroom
      headroom run --upstream http://l40s-pod:8000 --replica-class l40s-tp1 --lake s3://llm-logs/headroom
      OTEL_EXPORTER_OTLP_ENDPOINT=http://otel-collector:4318 headroom run --upstream http://vllm:8000 --otlp-metrics

    Point clients at http://LISTEN/v1 instead of the engine; scrape http://LISTEN/metrics
    (http://ADMIN-LISTEN/metrics with --admin-listen).
    """
    # lazy: `headroom run --help` must not load DuckDB and the whole sidecar
    import duckdb

    from collector.sidecar.adapters import parse_adapter_pairs
    from collector.sidecar.server import fit_connection_cap, uvicorn_options
    from collector.sidecar.wiring import build_sidecar
    from collector.store.schema import SchemaTooNew

    os.umask(0o077)  # the request log, its WAL and the spool are readable by this user only
    logging.basicConfig(level=log_level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    # APScheduler narrates every job it adds and runs at INFO; its warnings still show.
    logging.getLogger("apscheduler").setLevel(max(logging.WARNING, logging.getLevelName(log_level.upper())))
    try:
        host, port = parse_listen(listen)
        config = SidecarConfig(
            upstream=upstream,
            listen_host=host,
            listen_port=port,
            admin_listen=None if admin_listen is None else parse_listen(admin_listen, "--admin-listen"),
            db_path=None if lake else db_path,
            checkpoint_mb=checkpoint_mb,
            instance=instance,
            replica_class=replica_class,
            tenant_header=tenant_header,
            max_tenants=max_tenants,
            max_models=max_models,
            max_series=max_series,
            max_connections=max_connections,
            spool_dir=spool_dir,
            lake=lake,
            catalog=catalog,
            lake_roll_seconds=lake_roll_seconds,
            lake_roll_mb=lake_roll_mb,
            engine=engine,
            engine_metrics_url=engine_metrics_url,
            model=model,
            adapters=parse_adapter_pairs(adapters),
            adapter_slots=adapter_slots,
            engine_poll_interval_s=engine_poll_interval,
            engine_mapping=engine_mapping,
            otlp_endpoint=otlp_endpoint,
            otlp_traces_endpoint=otlp_traces_endpoint,
            otlp_protocol=otlp_protocol,
            otlp_metrics=otlp_metrics,
            otlp_logs=otlp_logs,
            read_timeout_s=read_timeout,
            jobs=jobs,
            retention_days=retention_days,
            max_request_body_bytes=max_request_body_bytes,
            max_buffered_response_bytes=max_buffered_response_bytes,
            max_sse_event_bytes=max_sse_event_bytes,
            header_timeout_s=header_timeout,
            body_timeout_s=body_timeout,
            idle_timeout_s=idle_timeout,
            max_client_connections=max_client_connections,
            probe_dbs=tuple(probe_dbs),
            probe_max_age=probe_max_age,
        )
        app = build_sidecar(config)
    except ValueError as exc:
        raise click.UsageError(str(exc)) from None
    except OSError as exc:  # the spool directory or --lake cannot be created or written
        raise click.ClickException(f"cannot open the spool or --lake ({exc})") from None
    except (duckdb.Error, SchemaTooNew) as exc:  # locked by another process, not DuckDB, too new
        first = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
        hint = (
            "only one process may own it: stop the other one, or give this sidecar its own --db"
            if "lock" in first.lower()
            else ""
            if isinstance(exc, SchemaTooNew)
            else "pass a DuckDB file headroom wrote, or a new path"
        )
        raise click.ClickException(
            f"cannot open --db {db_path} ({first})" + (f"; {hint}" if hint else "")
        ) from None
    click.echo(
        f"headroom sidecar: http://{host}:{port} -> {config.upstream} "
        f"(metrics at {'' if admin_listen is None else 'http://' + admin_listen}/metrics, "
        f"log: {lake or os.path.abspath(db_path)})",
        err=True,
    )
    # descriptors for every allowed client, the upstream pool, and the files the sidecar opens;
    # the cap clamped (one WARNING) where the open-file limit cannot be raised that far
    max_client_connections = fit_connection_cap(max_client_connections, config.max_connections)
    uvicorn.run(
        app,
        host=host,
        port=port,
        log_level=log_level,
        access_log=False,
        timeout_graceful_shutdown=30,
        proxy_headers=False,  # nothing reads the client address, and the layer costs per request
        **uvicorn_options(
            app.state.registry,
            header_timeout_s=header_timeout,
            body_timeout_s=body_timeout,
            idle_timeout_s=idle_timeout,
            max_connections=max_client_connections,
        ),
    )
