"""OpenTelemetry export of finished requests: one GenAI span per request, off by default.

`OtelSink` is a RowSink (collector.record): the sidecar hands it the finished RequestRecord, the
same one the request log stores, and it turns that record into one span that follows the OpenTelemetry GenAI
semantic conventions:

    {"endpoint": "/v1/chat/completions", "model": "m", "admitted_at": t0, "first_token_at": t1,
     "completed_at": t2, "prompt_tokens": 12, "completion_tokens": 30, "outcome": "ok", ...}
    -> span "chat m" [t0, t2], kind CLIENT, gen_ai.operation.name="chat",
       gen_ai.request.model="m", gen_ai.usage.input_tokens=12, gen_ai.usage.output_tokens=30,
       event "gen_ai.first_token" at t1 (and gen_ai.response.time_to_first_chunk = t1 - t0)

plus the required `gen_ai.provider.name` and, from the stream, `gen_ai.response.id`,
`gen_ai.response.model` and `gen_ai.response.finish_reasons` (the request's Telemetry, handed in beside the record,
collector.sidecar.tracecontext). The span joins the client's trace: its parent is the client's
`traceparent`, and its span id is the one the engine received in its own `traceparent`.

A failed request (outcome != "ok") gets `error.type` = its outcome and an ERROR status. The span is
built with explicit timestamps after the request has ended, so the client never waits on it; export
is batched on the SDK's BatchSpanProcessor thread. With `metrics`, the GenAI server histograms
(`gen_ai.server.request.duration`, `gen_ai.server.time_to_first_token`,
`gen_ai.server.time_per_output_token`) are recorded from the same rows and exported over OTLP. The
sink owns its own providers (never the global ones), so enabling it does not change anything else in
the process. With `logs` (`headroom run --otlp-logs`) each request is also one OpenTelemetry log
event, `gen_ai.client.inference.operation.details` (the GenAI conventions' opt-in event: a
LogRecord with `event_name`), at the request's end, in the span's trace, carrying the span's
attributes and the row's other fields as `headroom.*` (see `event_attributes`); never prompt or
completion text, and exported on the SDK's BatchLogRecordProcessor thread. It is the real-time tap
that deploy/clickhouse/ lands in ClickHouse. With OTLP off the sidecar never constructs an OtelSink (`headroom run` builds one only
with --otlp-endpoint, --otlp-traces-endpoint or an OTEL_EXPORTER_OTLP_(TRACES_)ENDPOINT variable)
and no OpenTelemetry object exists per request.

Endpoints as the OTLP exporter specification says: a base endpoint
(OTEL_EXPORTER_OTLP_ENDPOINT, --otlp-endpoint) gets `/v1/traces` or `/v1/metrics` appended to its
path (`https://host/otlp` -> `https://host/otlp/v1/traces`); a per-signal endpoint
(OTEL_EXPORTER_OTLP_TRACES_ENDPOINT, --otlp-traces-endpoint) is used as it is. Over gRPC
(`protocol="grpc"`, the [otlp-grpc] extra) the endpoint is the collector's address, with no path.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Callable
from datetime import UTC, datetime
from typing import Any
from urllib.parse import urlsplit, urlunsplit

from collector.record import FIELD_NAMES, RequestRecord
from collector.sidecar.tracecontext import Telemetry

__all__ = [
    "OtelSink",
    "signal_url",
    "traces_url",
    "span_name",
    "span_attributes",
    "provider_name",
    "ROW_ATTRIBUTES",
    "FIRST_TOKEN_EVENT",
    "DETAILS_EVENT",
    "EVENT_ONLY_FIELDS",
    "event_attributes",
    "PROTOCOLS",
]

PROTOCOLS = ("http/protobuf", "grpc")

FIRST_TOKEN_EVENT = "gen_ai.first_token"
# the GenAI semantic conventions' per-operation event (opt-in; its message attributes are not ours to send)
DETAILS_EVENT = "gen_ai.client.inference.operation.details"
_log = logging.getLogger(__name__)
_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)


def signal_url(endpoint: str, signal: str) -> str:
    """The OTLP/HTTP URL of `signal` (traces, metrics) for a *base* endpoint, per the OTLP spec.

    Example: "http://collector:4318" -> "http://collector:4318/v1/traces";
    "https://host/otlp" -> "https://host/otlp/v1/traces"; a URL already ending in /v1/traces is kept.
    """
    parts = urlsplit(endpoint)
    if parts.scheme not in ("http", "https") or not parts.netloc:
        raise ValueError(
            f"OTLP endpoint {endpoint!r} is not an http(s) URL; "
            "pass e.g. --otlp-endpoint http://otel-collector:4318"
        )
    suffix = f"/v1/{signal}"
    path = parts.path.rstrip("/")
    return urlunsplit(parts._replace(path=path if path.endswith(suffix) else path + suffix))


def traces_url(endpoint: str) -> str:
    """signal_url(endpoint, "traces"): the traces URL of a base endpoint."""
    return signal_url(endpoint, "traces")


def provider_name(engine: str | None) -> str:
    """`gen_ai.provider.name` for the engine behind the sidecar: its name, or "openai" (the API it speaks)."""
    known = {"vllm": "vllm", "sglang": "sglang", "tgi": "tgi", "llamacpp": "llama.cpp"}
    return known.get((engine or "").lower(), "openai")


def _ns(moment: datetime | None) -> int | None:
    """Nanoseconds since the epoch of a tz-aware datetime, exact to the microsecond."""
    if moment is None:
        return None
    if moment.tzinfo is None:
        moment = moment.replace(tzinfo=UTC)
    delta = moment - _EPOCH
    return ((delta.days * 86_400 + delta.seconds) * 1_000_000 + delta.microseconds) * 1_000


def _operation(endpoint: str | None) -> str:
    """GenAI operation name for a proxied endpoint: chat for chat completions, else text_completion."""
    return "chat" if endpoint and "chat" in endpoint else "text_completion"


def span_name(record: RequestRecord) -> str:
    """Span name per the GenAI conventions: "{operation} {model}", or the operation alone."""
    operation = _operation(record.endpoint)
    return f"{operation} {record.model}" if record.model else operation


# (span attribute, record field). Only non-NULL values are set; never prompt or completion text.
# tests/test_record.py checks that every field named here is a RequestRecord field.
ROW_ATTRIBUTES = (
    ("gen_ai.request.model", "model"),
    ("gen_ai.request.max_tokens", "max_tokens"),
    ("gen_ai.request.stream", "stream"),
    ("gen_ai.usage.input_tokens", "prompt_tokens"),
    ("gen_ai.usage.output_tokens", "completion_tokens"),
    ("gen_ai.usage.cache_read.input_tokens", "cached_prompt_tokens"),
    ("gen_ai.response.time_to_first_chunk", "ttft_s"),
    ("http.response.status_code", "status_code"),
    ("url.path", "endpoint"),
    ("headroom.request_id", "request_id"),
    ("headroom.source", "source"),
    ("headroom.run_id", "run_id"),
    ("headroom.instance", "instance"),
    ("headroom.tenant", "tenant"),
    ("headroom.outcome", "outcome"),
    ("headroom.usage_source", "usage_source"),
    ("headroom.tpot_s", "tpot_s"),
    ("headroom.inflight_at_admit", "inflight_at_admit"),
    ("headroom.active_tokens_at_admit", "active_tokens_at_admit"),
    ("headroom.engine_waiting_at_admit", "engine_waiting_at_admit"),
    ("headroom.kv_usage_at_admit", "kv_usage_at_admit"),
)


def span_attributes(
    record: RequestRecord,
    server: tuple[str, int] | None = None,
    provider: str = "openai",
    telemetry: Telemetry | None = None,
) -> dict[str, Any]:
    """GenAI span attributes for one finished row (pure; see the module docstring for an example)."""
    attributes: dict[str, Any] = {
        "gen_ai.operation.name": _operation(record.endpoint),
        "gen_ai.provider.name": provider,
    }
    for attribute, name in ROW_ATTRIBUTES:
        value = getattr(record, name)
        if value is not None:
            attributes[attribute] = value
    if telemetry is not None:
        for attribute, value in (
            ("gen_ai.response.id", telemetry.response_id),
            ("gen_ai.response.model", telemetry.response_model),
        ):
            if value is not None:
                attributes[attribute] = value
        if telemetry.finish_reasons:
            attributes["gen_ai.response.finish_reasons"] = tuple(telemetry.finish_reasons)
    if server is not None:
        attributes["server.address"], attributes["server.port"] = server
    if record.outcome not in (None, "ok"):
        attributes["error.type"] = record.outcome
    return attributes


# Row fields the span does not carry under any name: the log event adds them as headroom.<field>
# (times as ISO 8601 UTC strings, microseconds). With ROW_ATTRIBUTES they cover every field.
EVENT_ONLY_FIELDS: tuple[str, ...] = tuple(
    name for name in FIELD_NAMES if name not in {field for _, field in ROW_ATTRIBUTES}
)


def _event_value(value: Any) -> Any:
    """A row value as a log attribute: datetimes as ISO 8601 in UTC, the rest as they are."""
    if isinstance(value, datetime):
        moment = value.replace(tzinfo=UTC) if value.tzinfo is None else value.astimezone(UTC)
        return moment.isoformat(timespec="microseconds")
    return value


def event_attributes(
    record: RequestRecord,
    server: tuple[str, int] | None = None,
    provider: str = "openai",
    telemetry: Telemetry | None = None,
) -> dict[str, Any]:
    """Attributes of the DETAILS_EVENT log record: the span's, plus headroom.<field> for each
    EVENT_ONLY_FIELDS field that is not NULL. Every row field is then readable from the event
    (`model` as gen_ai.request.model, `ttft_s` as gen_ai.response.time_to_first_chunk, ...).

    Example: {..., "headroom.admitted_at": "2025-01-02T03:04:05.000006+00:00", "headroom.e2e_s": 1.5}
    """
    attributes = span_attributes(record, server, provider, telemetry)
    for name in EVENT_ONLY_FIELDS:
        value = getattr(record, name)
        if value is not None:
            attributes[f"headroom.{name}"] = _event_value(value)
    return attributes


def _server(upstream: str | None) -> tuple[str, int] | None:
    """(host, port) of the upstream engine URL, the GenAI `server.*` attributes."""
    if not upstream:
        return None
    parts = urlsplit(upstream)
    if not parts.hostname:
        return None
    return parts.hostname, parts.port or (443 if parts.scheme == "https" else 80)


def _chosen_ids() -> Any:
    """An IdGenerator handing out the ids the request already carries: the span id the engine
    received in its traceparent and, for a new trace, the trace id; random ids for a record without
    Telemetry. Used on one thread: the event loop that submits rows."""
    from opentelemetry.sdk.trace.id_generator import RandomIdGenerator  # lazy, as in OtelSink

    class ChosenIds(RandomIdGenerator):
        trace_id: int | None = None
        span_id: int | None = None

        def generate_span_id(self) -> int:
            chosen, self.span_id = self.span_id, None
            return chosen or super().generate_span_id()

        def generate_trace_id(self) -> int:
            chosen, self.trace_id = self.trace_id, None
            return chosen or super().generate_trace_id()

    return ChosenIds()


def _span_exporter(protocol: str, endpoint: str | None, traces_endpoint: str | None) -> Any:
    """The OTLP span exporter for `protocol`; None endpoints leave it to the OTEL_* variables."""
    if protocol not in PROTOCOLS:
        raise ValueError(f"OTLP protocol {protocol!r} is not one of {PROTOCOLS}")
    if protocol == "grpc":
        try:
            # lazy: the [otlp-grpc] extra
            from opentelemetry.exporter.otlp.proto.grpc import trace_exporter as grpc_traces
        except ImportError:
            raise ValueError(
                "--otlp-protocol grpc needs the gRPC exporter: pip install 'llm-headroom[otlp-grpc]'"
            ) from None
        return grpc_traces.OTLPSpanExporter(endpoint=traces_endpoint or endpoint)
    # lazy: the OTLP exporter's protobuf stack loads only when spans leave the process
    from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter

    url = traces_endpoint or (traces_url(endpoint) if endpoint else None)  # None: the SDK reads OTEL_*
    return OTLPSpanExporter(endpoint=url)


def _log_exporter(protocol: str, endpoint: str | None) -> Any:
    """The OTLP log exporter for `protocol`; a None endpoint leaves it to the OTEL_* variables."""
    if protocol == "grpc":
        try:
            # lazy: the [otlp-grpc] extra
            from opentelemetry.exporter.otlp.proto.grpc import _log_exporter as grpc_logs
        except ImportError:
            raise ValueError(
                "--otlp-protocol grpc needs the gRPC exporter: pip install 'llm-headroom[otlp-grpc]'"
            ) from None
        return grpc_logs.OTLPLogExporter(endpoint=endpoint)
    from opentelemetry.exporter.otlp.proto.http._log_exporter import OTLPLogExporter  # lazy, as spans

    return OTLPLogExporter(endpoint=signal_url(endpoint, "logs") if endpoint else None)


class OtelSink:
    """RowSink that emits one GenAI span per finished request through its own TracerProvider.

    `exporter` (e.g. InMemorySpanExporter in tests) is exported synchronously; without one, an OTLP
    exporter (`protocol` http/protobuf or grpc) to `endpoint` (a base URL), `traces_endpoint` (used
    as it is) or the OTEL_EXPORTER_OTLP_* variables sits behind a BatchSpanProcessor, so export
    never runs on the event loop. `metrics` (or a `metric_reader` in tests) adds the GenAI server
    histograms (collector.sidecar.otel_metrics). `logs` (or a `log_exporter` in tests, exported
    synchronously) adds one DETAILS_EVENT log record per request, batched like the spans.
    """

    def __init__(
        self,
        endpoint: str | None = None,
        exporter: Any = None,
        *,
        upstream: str | None = None,
        service_name: str = "headroom-sidecar",
        traces_endpoint: str | None = None,
        protocol: str = "http/protobuf",
        provider: str | Callable[[], str] = "openai",
        metrics: bool = False,
        metric_reader: Any = None,
        logs: bool = False,
        log_exporter: Any = None,
    ) -> None:
        # lazy: the OpenTelemetry SDK loads only when spans are turned on (--otlp-endpoint)
        from opentelemetry.sdk.resources import Resource
        from opentelemetry.sdk.trace import TracerProvider
        from opentelemetry.sdk.trace.export import BatchSpanProcessor, SimpleSpanProcessor

        resource_attributes = {} if os.environ.get("OTEL_SERVICE_NAME") else {"service.name": service_name}
        resource = Resource.create(resource_attributes)
        self._ids = _chosen_ids()
        self._provider = TracerProvider(resource=resource, id_generator=self._ids)
        if exporter is not None:
            self._provider.add_span_processor(SimpleSpanProcessor(exporter))
        else:
            self._provider.add_span_processor(
                BatchSpanProcessor(_span_exporter(protocol, endpoint, traces_endpoint))
            )
        self._tracer = self._provider.get_tracer("llm-headroom")
        self._server = _server(upstream)
        # the engine family, read per span: `--engine auto` knows it only after the first poll
        self._provider_name: Callable[[], str] = provider if callable(provider) else (lambda: provider)
        self._metrics = None
        if metrics or metric_reader is not None:
            from collector.sidecar.otel_metrics import GenAiMetrics  # lazy: the metrics SDK only when on

            self._metrics = GenAiMetrics(resource, protocol=protocol, endpoint=endpoint, reader=metric_reader)
        self._logs: Any = None
        self._logger: Any = None
        if logs or log_exporter is not None:
            # lazy: the OpenTelemetry SDK only when OTLP export is on
            from opentelemetry.sdk._logs import LoggerProvider  # lazy: the logs SDK only when on
            from opentelemetry.sdk._logs.export import BatchLogRecordProcessor, SimpleLogRecordProcessor

            self._logs = LoggerProvider(resource=resource, shutdown_on_exit=False)
            self._logs.add_log_record_processor(
                SimpleLogRecordProcessor(log_exporter)
                if log_exporter is not None
                else BatchLogRecordProcessor(_log_exporter(protocol, endpoint))
            )
            self._logger = self._logs.get_logger("llm-headroom")
        self.spans_emitted = 0
        self.spans_failed = 0
        self.events_emitted = 0

    def submit(self, record: RequestRecord, telemetry: Telemetry | None = None) -> None:
        """Turn one finished record into one ended span; never raises into the request path."""
        try:
            self._emit(record, telemetry)
            if self._metrics is not None:
                self._metrics.record(record, self._provider_name(), self._server, telemetry)
        except Exception:  # tracing must never break a request; count it and go on
            self.spans_failed += 1
            _log.exception("could not build the span of request %s", record.request_id)

    def _parent(self, telemetry: Telemetry | None) -> Any:
        """The client's span as a remote parent context (None: the span starts a trace)."""
        # lazy, as in __init__
        from opentelemetry import trace
        from opentelemetry.trace import NonRecordingSpan, SpanContext, TraceFlags

        if telemetry is None:
            return None
        self._ids.span_id = telemetry.span_id
        if telemetry.parent_span_id is None:
            self._ids.trace_id = telemetry.trace_id
            return None
        parent = SpanContext(
            telemetry.trace_id,
            telemetry.parent_span_id,
            is_remote=True,
            trace_flags=TraceFlags(telemetry.flags),
        )
        return trace.set_span_in_context(NonRecordingSpan(parent))

    def _emit(self, record: RequestRecord, telemetry: Telemetry | None) -> None:
        # lazy: the OpenTelemetry SDK only when OTLP export is on
        from opentelemetry import trace  # lazy, as in __init__
        from opentelemetry.trace import SpanKind, Status, StatusCode

        start_ns = _ns(record.admitted_at)
        if start_ns is None:
            return
        end_ns = _ns(record.completed_at) or start_ns
        span = self._tracer.start_span(
            span_name(record),
            context=self._parent(telemetry),
            kind=SpanKind.CLIENT,
            start_time=start_ns,
            attributes=span_attributes(record, self._server, self._provider_name(), telemetry),
        )
        first_token_ns = _ns(record.first_token_at)
        if first_token_ns is not None:
            span.add_event(FIRST_TOKEN_EVENT, timestamp=first_token_ns)
        if record.outcome not in (None, "ok"):
            span.set_status(Status(StatusCode.ERROR, record.error or record.outcome))
        span.end(end_time=end_ns)
        self.spans_emitted += 1
        if self._logger is not None:
            self._logger.emit(
                timestamp=end_ns,
                context=trace.set_span_in_context(span),  # the event's TraceId and SpanId: the span's
                event_name=DETAILS_EVENT,
                attributes=event_attributes(record, self._server, self._provider_name(), telemetry),
            )
            self.events_emitted += 1

    def force_flush(self, timeout_millis: int = 30_000) -> bool:
        """Export every span (and metric point) finished so far; True when the exporters confirmed in time."""
        done = self._provider.force_flush(timeout_millis)
        if self._logs is not None:
            done = self._logs.force_flush(timeout_millis) and done
        return (self._metrics.force_flush(timeout_millis) if self._metrics is not None else True) and done

    def flush(self) -> bool:
        """RowSink flush: the same as force_flush() with its default timeout."""
        return self.force_flush()

    def close(self) -> None:
        """Flush and shut the providers down (the sidecar calls this at exit)."""
        self._provider.shutdown()
        if self._logs is not None:
            self._logs.shutdown()
        if self._metrics is not None:
            self._metrics.shutdown()
