"""`headroom run`'s options, each declared once with SidecarConfig's default, and the config they make.

The command (collector.sidecar.cli) takes them as keyword arguments; `config_from_options` turns
them into the SidecarConfig that `build_sidecar` wires, renaming the few whose config field names
its unit (`--read-timeout` -> `read_timeout_s`). tests/test_sidecar_cli_options.py checks that every
option's default is the config's and that every option reaches the config.
"""

from __future__ import annotations

import socket
from collections.abc import Callable
from typing import Any, TypeVar

import click

from collector.goodput import HEADER_MODES, PRESETS
from collector.serving import parse_listen
from collector.sidecar.config import MIN_STORE_MEMORY_MB, SidecarConfig

__all__ = ["RENAMED", "NOT_CONFIG", "config_from_options", "sidecar_options"]

F = TypeVar("F", bound=Callable[..., Any])

# option -> SidecarConfig field, where the field names its unit
RENAMED = {
    "engine_poll_interval": "engine_poll_interval_s",
    "read_timeout": "read_timeout_s",
    "header_timeout": "header_timeout_s",
    "body_timeout": "body_timeout_s",
    "idle_timeout": "idle_timeout_s",
    "write_stall_timeout": "write_stall_timeout_s",
    "upstream_wait_timeout": "upstream_wait_timeout_s",
    "slo_ttft_p95": "slo_ttft_p95_s",
    "goodput_ttft": "goodput_ttft_s",
    "goodput_tpot": "goodput_tpot_s",
    "goodput_e2e": "goodput_e2e_s",
}
# options that are not a config field as they are: parsed into several (listen), or the process's
NOT_CONFIG = ("listen", "admin_listen", "adapters", "log_level")

_OPTIONS = [
    click.option(
        "--upstream",
        required=True,
        metavar="URL",
        help="Base URL of the OpenAI-compatible engine, e.g. http://127.0.0.1:8000.",
    ),
    click.option(
        "--listen",
        default=f"{SidecarConfig.listen_host}:{SidecarConfig.listen_port}",
        show_default=True,
        metavar="HOST:PORT",
        help="Where the proxy listens (and /metrics, /healthz, /readyz, /headroom without --admin-listen).",
    ),
    click.option(
        "--admin-listen",
        metavar="HOST:PORT",
        help="Serve /metrics, /healthz, /readyz and /headroom here instead of on --listen, which then "
        "serves only the proxy (keep tenant names, traffic and the request log off the client port).",
    ),
    click.option(
        "--db",
        "db_path",
        default=SidecarConfig.db_path,
        show_default=True,
        metavar="PATH",
        help="DuckDB request log owned by this process (not with --lake).",
    ),
    click.option(
        "--checkpoint-mb",
        type=click.IntRange(1),
        metavar="MB",
        show_default="16, DuckDB's",
        help="Fold --db's write-ahead log into the file each time it holds this many MB. Larger "
        "takes bursts of rows faster and keeps up to that much more in memory (64: ~200,000 rows/s "
        "into a 10 M-row log, 30 MiB more at peak; BENCHMARKS.md §5g).",
    ),
    click.option(
        "--store-memory-mb",
        default=SidecarConfig.store_memory_mb,
        show_default=True,
        type=click.IntRange(MIN_STORE_MEMORY_MB),
        metavar="MB",
        help="The most memory --db's DuckDB holds: past it, it drops cached blocks of the log (without "
        "a bound it keeps every block it writes, up to 80% of the machine's memory) and a query that "
        "needs more fails, naming the limit (BENCHMARKS.md §10).",
    ),
    click.option(
        "--instance",
        default=socket.gethostname(),
        show_default="hostname",
        help="Name of this sidecar in rows and labels.",
    ),
    click.option(
        "--replica-class",
        metavar="NAME",
        show_default="derived: GPU name and engine slots, e.g. nvidia-l40s-slots8, else default",
        help="The replica class of the engine behind this sidecar (hardware x engine configuration, "
        "e.g. h100-tp1): exported as headroom_replica_info{replica_class}; the rules compare this "
        "sidecar's concurrency with its own class's knee, and its estimates carry the class.",
    ),
    click.option(
        "--tenant-header", default="X-Tenant-ID", show_default=True, help="Request header naming the tenant."
    ),
    click.option(
        "--max-tenants",
        default=SidecarConfig.max_tenants,
        show_default=True,
        type=click.IntRange(1),
        help="Distinct tenant label values before the rest become 'other'.",
    ),
    click.option(
        "--max-models",
        default=SidecarConfig.max_models,
        show_default=True,
        type=click.IntRange(1),
        help="Distinct model label values before the rest become 'other'.",
    ),
    click.option(
        "--max-series",
        default=SidecarConfig.max_series,
        show_default=True,
        type=click.IntRange(1),
        help="The most series /metrics exports in all; a new model or tenant that would pass "
        "it is labelled 'other' (headroom_label_values_folded_total counts them).",
    ),
    click.option(
        "--max-upstream-connections",
        "max_connections",
        default=SidecarConfig.max_connections,
        show_default=True,
        type=click.IntRange(1),
        help="Pooled connections to the upstream engine; requests beyond them wait for a free one "
        "(at most --upstream-wait-timeout).",
    ),
    click.option(
        "--upstream-wait-timeout",
        default=SidecarConfig.upstream_wait_timeout_s,
        show_default=True,
        type=click.FloatRange(0.1),
        metavar="SECONDS",
        help="The longest a request waits for a free upstream connection; past it 503 JSON naming "
        "this flag, outcome overloaded, counted in headroom_upstream_wait_timeouts_total.",
    ),
    click.option(
        "--engine",
        default=SidecarConfig.engine,
        show_default=True,
        metavar="NAME",
        help="Which engine's /metrics to read: auto|none|vllm|sglang|tgi|llamacpp|generic "
        "(auto recognises it; none turns it off; generic needs --engine-mapping).",
    ),
    click.option(
        "--engine-mapping",
        type=click.Path(exists=True, dir_okay=False),
        metavar="PATH",
        help="YAML mapping for --engine generic (format in docs/engines.md).",
    ),
    click.option(
        "--engine-metrics-url", metavar="URL", help="Engine metrics URL [default: UPSTREAM/metrics]."
    ),
    click.option(
        "--model",
        metavar="NAME",
        show_default="the engine's model label, else the one model UPSTREAM/v1/models lists",
        help="The served model as clients name it: the `model` label of the engine series "
        "(headroom_engine_*), so they pair with the request series. Needed where the engine's metrics "
        "name no model and /v1/models names another (llama-server without --alias) or several.",
    ),
    click.option(
        "--engine-poll-interval",
        default=SidecarConfig.engine_poll_interval_s,
        show_default=True,
        type=click.FloatRange(0.05),
        help="Seconds between engine metric polls.",
    ),
    click.option(
        "--spool-dir",
        metavar="PATH",
        show_default="./headroom-spool",
        help="On-disk spool: --lake's write-ahead buffer, which holds rows while the lake is away (bounded).",
    ),
    click.option(
        "--lake",
        metavar="URI",
        help="Write rows as immutable Parquet files into this lake (a directory, file:// or s3://...) "
        "for `headroom lake commit` to register in the fleet's Iceberg table; instead of --db.",
    ),
    click.option(
        "--catalog",
        metavar="URI",
        envvar="HEADROOM_CATALOG",
        help="With --lake: the fleet's Iceberg catalog (sqlite:///path.db, postgresql://..., http(s):// REST), "
        "from whose headroom.capacity_estimates this sidecar publishes its models' capacity every minute "
        "(the [lake] extra) [env: HEADROOM_CATALOG].",
    ),
    click.option(
        "--lake-roll-seconds",
        default=SidecarConfig.lake_roll_seconds,
        show_default=True,
        type=click.FloatRange(1),
        metavar="SECONDS",
        help="Stage a Parquet file once the oldest spooled row is this old (freshness).",
    ),
    click.option(
        "--lake-roll-mb",
        default=SidecarConfig.lake_roll_mb,
        show_default=True,
        type=click.IntRange(1),
        metavar="MB",
        help="Stage a Parquet file once the spool holds this many MB of rows.",
    ),
    click.option(
        "--otlp-endpoint",
        metavar="URL",
        envvar="OTEL_EXPORTER_OTLP_ENDPOINT",
        help="Emit one OpenTelemetry span per request over OTLP to this base endpoint; /v1/traces "
        "is appended (https://host/otlp -> https://host/otlp/v1/traces) [env: OTEL_EXPORTER_OTLP_ENDPOINT].",
    ),
    click.option(
        "--otlp-traces-endpoint",
        metavar="URL",
        envvar="OTEL_EXPORTER_OTLP_TRACES_ENDPOINT",
        help="The OTLP traces URL itself, used as it is [env: OTEL_EXPORTER_OTLP_TRACES_ENDPOINT].",
    ),
    click.option(
        "--otlp-protocol",
        type=click.Choice(["http/protobuf", "grpc"]),
        default=SidecarConfig.otlp_protocol,
        show_default=True,
        envvar=["OTEL_EXPORTER_OTLP_TRACES_PROTOCOL", "OTEL_EXPORTER_OTLP_PROTOCOL"],
        help="OTLP transport; grpc needs pip install 'llm-headroom[otlp-grpc]' "
        "[env: OTEL_EXPORTER_OTLP_TRACES_PROTOCOL, OTEL_EXPORTER_OTLP_PROTOCOL].",
    ),
    click.option(
        "--otlp-metrics/--no-otlp-metrics",
        default=SidecarConfig.otlp_metrics,
        show_default=True,
        help="Also export the GenAI server histograms (gen_ai.server.*) over OTLP.",
    ),
    click.option(
        "--otlp-logs/--no-otlp-logs",
        default=SidecarConfig.otlp_logs,
        show_default=True,
        help="Also export one OpenTelemetry log event per request over OTLP "
        "(gen_ai.client.inference.operation.details: the span's attributes and the row's fields, never text; "
        "/v1/logs is appended to --otlp-endpoint).",
    ),
    click.option(
        "--read-timeout",
        default=SidecarConfig.read_timeout_s,
        show_default=True,
        type=click.FloatRange(1),
        help="Seconds to wait for the next upstream bytes before giving up (outcome timeout).",
    ),
    click.option(
        "--max-request-body-bytes",
        default=SidecarConfig.max_request_body_bytes,
        show_default=True,
        type=click.IntRange(1),
        metavar="BYTES",
        help="Largest request body accepted; past it 413 JSON and a row.",
    ),
    click.option(
        "--max-buffered-response-bytes",
        default=SidecarConfig.max_buffered_response_bytes,
        show_default=True,
        type=click.IntRange(1),
        metavar="BYTES",
        help="Most of a non-streamed answer kept to read its usage (it always streams through; "
        "past this its tokens are estimated).",
    ),
    click.option(
        "--max-sse-event-bytes",
        default=SidecarConfig.max_sse_event_bytes,
        show_default=True,
        type=click.IntRange(1),
        metavar="BYTES",
        help="Largest SSE event; a longer one ends the stream as upstream_error.",
    ),
    click.option(
        "--header-timeout",
        default=SidecarConfig.header_timeout_s,
        show_default=True,
        type=click.FloatRange(0.1),
        metavar="SECONDS",
        help="A connection must send its request headers within this (else 408).",
    ),
    click.option(
        "--body-timeout",
        default=SidecarConfig.body_timeout_s,
        show_default=True,
        type=click.FloatRange(0.1),
        metavar="SECONDS",
        help="A request's body must be complete within this of its headers (else 408).",
    ),
    click.option(
        "--idle-timeout",
        default=SidecarConfig.idle_timeout_s,
        show_default=True,
        type=click.FloatRange(0.1),
        metavar="SECONDS",
        help="Idle kept-alive client connections close after this.",
    ),
    click.option(
        "--max-client-connections",
        default=SidecarConfig.max_client_connections,
        show_default=True,
        type=click.IntRange(1),
        help="Open client connections at most; a new one past it gets 503 and is closed.",
    ),
    click.option(
        "--max-connections-per-source",
        type=click.IntRange(1),
        metavar="N",
        show_default="--max-client-connections",
        help="Open connections from one client address (an IPv6 /64) at most; past it only /metrics, "
        "/healthz and /readyz on a reserved slot, anything else 429 and closed.",
    ),
    click.option(
        "--max-partial-requests-per-source",
        type=click.IntRange(1),
        metavar="N",
        show_default="a quarter of --max-client-connections, at least 64",
        help="Requests from one client address whose headers or body are still arriving, at most; "
        "past it 429 and closed.",
    ),
    click.option(
        "--write-stall-timeout",
        default=SidecarConfig.write_stall_timeout_s,
        show_default=True,
        type=click.FloatRange(0.1),
        metavar="SECONDS",
        help="A client that takes nothing of its answer for this long is disconnected (client_cancelled), "
        "freeing the upstream connection its paused stream held.",
    ),
    click.option(
        "--jobs/--no-jobs",
        default=SidecarConfig.jobs,
        show_default=True,
        help="Run the scheduled jobs (rollups, retention, capacity refresh, weekly report) "
        "on the in-process store.",
    ),
    click.option(
        "--retention-days",
        default=SidecarConfig.retention_days,
        show_default=True,
        type=click.IntRange(1),
        help="Raw rows older than this are exported to Parquet beside --db, then deleted.",
    ),
    click.option(
        "--probe-db",
        "probe_dbs",
        multiple=True,
        metavar="PATH",
        type=click.Path(dir_okay=False),
        help="A DuckDB file `headroom probe --db PATH` writes while this sidecar owns --db: "
        "its capacity estimates are copied in and published (repeatable).",
    ),
    click.option(
        "--probe-max-age",
        default=SidecarConfig.probe_max_age,
        show_default=True,
        metavar="DURATION",
        help="A probe estimate beats traffic's for this long (e.g. 24h, 7d).",
    ),
    click.option(
        "--slo-ttft-p95",
        type=click.FloatRange(min=0, min_open=True),
        metavar="SECONDS",
        help="The p95 TTFT SLO the store's jobs hold capacity to: the refreshed estimates' "
        "SLO-bound concurrency and μ_slo (probe runs and traffic), and the weekly review's verdict. "
        "Unset: the knee alone (docs/capacity.md).",
    ),
    click.option(
        "--goodput-slo",
        type=click.Choice(list(PRESETS)),
        default=SidecarConfig.goodput_slo,
        show_default=True,
        help="Each request's SLO for goodput: default (TTFT 2 s, TPOT 100 ms, e2e 60 s), MLPerf Server's "
        "(mlperf-server 2 s / 100 ms, mlperf-interactive 500 / 30 ms; -70b- for llama2-70b), none.",
    ),
    *(
        click.option(
            f"--goodput-{bound}",
            type=click.FloatRange(min=0),
            metavar="SECONDS",
            help=f"Override the preset's {what} (0: none).",
        )
        for bound, what in (
            ("ttft", "TTFT bound of a streamed request"),
            ("tpot", "TPOT bound"),
            ("e2e", "end-to-end bound, the one a non-streamed request is judged by"),
        )
    ),
    click.option(
        "--goodput-headers",
        type=click.Choice(list(HEADER_MODES)),
        default=SidecarConfig.goodput_headers,
        show_default=True,
        help="A request's SLO headers (x-llm-d-slo-ttft-ms, x-slo-tpot-ms, ...) tighten the bounds, are trusted, or ignored.",
    ),
    click.option(
        "--adapter",
        "adapters",
        multiple=True,
        metavar="ADAPTER=BASE",
        help="A LoRA adapter clients name in `model`, and its base model (repeat per adapter); "
        "vLLM's /v1/models says it by itself. Requests are attributed to both (docs/engines.md).",
    ),
    click.option(
        "--adapter-slots",
        type=click.IntRange(1),
        show_default="the engine's: vLLM max_lora, SGLang lora_pool_slots_total",
        help="LoRA adapters one engine batch holds (vLLM --max-loras, SGLang --max-loras-per-batch).",
    ),
    click.option(
        "--log-level",
        default="info",
        show_default=True,
        type=click.Choice(["debug", "info", "warning", "error"]),
        help="The sidecar's log threshold (uvicorn's access log stays off).",
    ),
]


def sidecar_options(command: F) -> F:
    """Attach every `headroom run` option, in --help order."""
    for option in reversed(_OPTIONS):
        command = option(command)
    return command


def config_from_options(options: dict[str, Any]) -> SidecarConfig:
    """The SidecarConfig of `headroom run`'s options; ValueError naming a bad value."""
    from collector.sidecar.adapters import parse_adapter_pairs  # lazy: keeps --help fast

    host, port = parse_listen(options["listen"])
    admin = options["admin_listen"]
    fields = {RENAMED.get(name, name): value for name, value in options.items() if name not in NOT_CONFIG}
    fields["db_path"] = None if options["lake"] else options["db_path"]
    fields["probe_dbs"] = tuple(options["probe_dbs"])
    return SidecarConfig(
        listen_host=host,
        listen_port=port,
        admin_listen=None if admin is None else parse_listen(admin, "--admin-listen"),
        adapters=parse_adapter_pairs(options["adapters"]),
        **fields,
    )
