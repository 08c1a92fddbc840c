"""SidecarConfig: everything `headroom run` can be told, with defaults suited to LLM traffic."""

from __future__ import annotations

import socket
from dataclasses import dataclass, field

from collector.goodput import HEADER_MODES, PRESETS, HeaderMode, RequestSlo
from collector.store.capacity_gauges import check_replica_class

__all__ = ["MAX_REQUEST_BODY_BYTES", "SidecarConfig"]


def _bound(preset: float | None, override: float | None) -> float | None:
    """A preset's bound, or the override (0 switches the bound off)."""
    if override is None:
        return preset
    return override or None


MAX_REQUEST_BODY_BYTES = 64 * 2**20  # --max-request-body-bytes' default
MIN_STORE_MEMORY_MB = 64  # below it the rows waiting for a checkpoint (16 MB of log) crowd out queries


@dataclass
class SidecarConfig:
    """Settings of one sidecar. Timeouts are long because a generation can stream for minutes."""

    upstream: str
    listen_host: str = "127.0.0.1"
    listen_port: int = 9100
    # --admin-listen: /metrics, /healthz, /readyz and /headroom on this address only (not on listen)
    admin_listen: tuple[str, int] | None = None
    db_path: str | None = "headroom.duckdb"
    checkpoint_mb: int | None = None  # --checkpoint-mb: fold db_path's WAL every N MB (DuckDB: 16)
    store_memory_mb: int = 256  # --store-memory-mb: db_path's DuckDB memory_limit (its cache stops there)
    instance: str = field(default_factory=socket.gethostname)
    # --replica-class: hardware x engine configuration; None derives it (collector.sidecar.replica)
    replica_class: str | None = None
    tenant_header: str = "X-Tenant-ID"
    max_tenants: int = 50
    max_models: int = 20
    max_series: int = 3000  # the whole /metrics exposition (collector.sidecar.series)
    spool_dir: str | None = None
    lake: str | None = None  # --lake URI: stage rows as Parquet for `headroom lake commit` (collector.lake)
    lake_roll_seconds: float = 60.0
    lake_roll_mb: int = 64
    # --catalog URI with --lake: publish the fleet's estimates for this sidecar's models (collector.lake.estimates)
    catalog: str | None = None
    engine: str = "auto"  # --engine: recognise the engine on its first answer; "none" polls nothing
    engine_metrics_url: str | None = None
    engine_mapping: str | None = None  # YAML mapping file for engine "generic"
    engine_poll_interval_s: float = 1.0
    model: str | None = None  # --model: the engine series' model label (else the engine's, /v1/models)
    adapters: dict[str, str] = field(default_factory=dict)  # --adapter NAME=BASE: LoRA adapter -> base
    adapter_slots: int | None = None  # --adapter-slots: the engine's LoRA slots (else its metrics')
    otlp_endpoint: str | None = None  # OTLP base endpoint: /v1/traces (and /v1/metrics) appended
    otlp_traces_endpoint: str | None = None  # the traces URL itself, used as it is
    otlp_protocol: str = "http/protobuf"  # or "grpc" (the [otlp-grpc] extra)
    otlp_metrics: bool = False  # also export the GenAI server histograms over OTLP
    otlp_logs: bool = False  # also one gen_ai.client.inference.operation.details log event per request
    # The store's scheduled jobs run only where this sidecar owns its database (db_path, no lake).
    jobs: bool = True
    retention_days: int = 30
    probe_dbs: tuple[str, ...] = ()  # `headroom probe --db` files whose estimates to import
    probe_max_age: str = "7d"  # how long a probe estimate beats traffic's
    slo_ttft_p95_s: float | None = None  # --slo-ttft-p95: the estimates' and the review's latency SLO
    # goodput (collector.goodput): each request's SLO, a preset and its overrides (0: that bound off),
    # and what a request's own SLO headers may do (tighten, trust, ignore)
    goodput_slo: str = "default"
    goodput_ttft_s: float | None = None
    goodput_tpot_s: float | None = None
    goodput_e2e_s: float | None = None
    goodput_headers: HeaderMode = "tighten"
    source: str = "traffic"
    run_id: str | None = None
    # Upstream client: connect fast or fail; between two chunks a long prefill may take minutes.
    connect_timeout_s: float = 10.0
    read_timeout_s: float = 600.0
    max_connections: int = 1024  # pooled upstream connections (--max-upstream-connections)
    # --upstream-wait-timeout: a request waits this long at most for a free pooled connection (503)
    upstream_wait_timeout_s: float = 30.0
    # Bounds on clients (docs/sidecar.md, "Limits"): a breach is a JSON error naming the flag.
    max_request_body_bytes: int = MAX_REQUEST_BODY_BYTES
    max_buffered_response_bytes: int = 16 * 2**20
    max_sse_event_bytes: int = 2**20
    header_timeout_s: float = 10.0
    body_timeout_s: float = 60.0  # --body-timeout: a request's body complete within this of its headers
    idle_timeout_s: float = 5.0
    max_client_connections: int = 4096
    # per client address (docs/sidecar.md, "Limits"); None: --max-client-connections, and a quarter
    # of it (at least 64) for the requests not fully sent (collector.sidecar.addresses.source_limits)
    max_connections_per_source: int | None = None
    max_partial_requests_per_source: int | None = None
    write_stall_timeout_s: float = 60.0  # --write-stall-timeout: a client taking nothing is cut off
    log_queue_rows: int = 50_000
    log_batch_rows: int = 1_000
    log_flush_interval_s: float = 0.5

    def request_slo(self) -> RequestSlo:
        """The SLO a request without SLO headers is judged by: the preset, with the overrides."""
        preset = PRESETS[self.goodput_slo]
        return RequestSlo(
            _bound(preset.ttft_s, self.goodput_ttft_s),
            _bound(preset.tpot_s, self.goodput_tpot_s),
            _bound(preset.e2e_s, self.goodput_e2e_s),
        )

    def __post_init__(self) -> None:
        self.upstream = self.upstream.rstrip("/")
        if not self.upstream.startswith(("http://", "https://")):
            raise ValueError(
                f"--upstream {self.upstream!r} is not an http(s) URL; "
                "expected e.g. http://127.0.0.1:8000 (the engine's OpenAI-compatible base URL)"
            )
        url = self.engine_metrics_url
        if url is not None and not url.startswith(("http://", "https://")):
            raise ValueError(
                f"--engine-metrics-url {url!r} is not an http(s) URL; expected e.g. http://127.0.0.1:8000/metrics"
            )
        if self.replica_class is not None:
            check_replica_class(self.replica_class)
        if self.goodput_slo not in PRESETS:
            raise ValueError(f"--goodput-slo {self.goodput_slo!r} is not one of {', '.join(PRESETS)}")
        if self.goodput_headers not in HEADER_MODES:
            raise ValueError(
                f"--goodput-headers {self.goodput_headers!r} is not one of {', '.join(HEADER_MODES)}"
            )
        self.request_slo()  # a bound that is not a positive number fails here, naming it
        counts: tuple[tuple[str, int], ...] = (
            ("--max-tenants", self.max_tenants),
            ("--max-models", self.max_models),
            ("--adapter-slots", 1 if self.adapter_slots is None else self.adapter_slots),
            ("--max-upstream-connections", self.max_connections),
            ("--checkpoint-mb", 1 if self.checkpoint_mb is None else self.checkpoint_mb),
            (
                "--max-connections-per-source",
                1 if self.max_connections_per_source is None else self.max_connections_per_source,
            ),
            (
                "--max-partial-requests-per-source",
                1 if self.max_partial_requests_per_source is None else self.max_partial_requests_per_source,
            ),
        )
        if self.store_memory_mb < MIN_STORE_MEMORY_MB:
            raise ValueError(
                f"--store-memory-mb must be at least {MIN_STORE_MEMORY_MB}, got {self.store_memory_mb}"
            )
        for name, count in counts:
            if count < 1:
                raise ValueError(f"{name} must be at least 1, got {count}")
        for flag, value in (
            ("--max-request-body-bytes", self.max_request_body_bytes),
            ("--max-buffered-response-bytes", self.max_buffered_response_bytes),
            ("--max-sse-event-bytes", self.max_sse_event_bytes),
            ("--max-client-connections", self.max_client_connections),
            ("--header-timeout", self.header_timeout_s),
            ("--body-timeout", self.body_timeout_s),
            ("--idle-timeout", self.idle_timeout_s),
            ("--write-stall-timeout", self.write_stall_timeout_s),
            ("--upstream-wait-timeout", self.upstream_wait_timeout_s),
        ):
            if value <= 0:
                raise ValueError(f"{flag} must be positive, got {value}")
