"""OpenTelemetry export of finished requests: one GenAI span per request, off by default.

`OtelSink` is a RowSink (collector.record): the sidecar hands it the finished RequestRecord, the
same one the request log stores, and it turns that record into one span that follows the
OpenTelemetry GenAI semantic conventions:

    RequestRecord(endpoint="/v1/chat/completions", model="m", admitted_at=t0, first_token_at=t1,
                  completed_at=t2, prompt_tokens=12, completion_tokens=30, outcome="ok", ...)
    -> span "chat m" [t0, t2], kind CLIENT, gen_ai.operation.name="chat",
       gen_ai.request.model="m", gen_ai.usage.input_tokens=12, gen_ai.usage.output_tokens=30,
       event "gen_ai.first_token" at t1 (and gen_ai.response.time_to_first_chunk = t1 - t0)

A failed request (outcome != "ok") gets `error.type` = its outcome and an ERROR status. The span is
built with explicit timestamps after the request has ended, so the client never waits on it; export
is batched on the SDK's BatchSpanProcessor thread. The sink owns its own TracerProvider (never the
global one), so enabling it does not change anything else in the process. With OTLP off the sidecar
never constructs an OtelSink (`headroom run` builds one only with --otlp-endpoint or an
OTEL_EXPORTER_OTLP_(TRACES_)ENDPOINT variable) and no OpenTelemetry object exists per request.
"""

from __future__ import annotations

import logging
import os
from datetime import UTC, datetime
from typing import Any
from urllib.parse import urlsplit

from collector.record import RequestRecord

__all__ = ["OtelSink", "traces_url", "span_name", "span_attributes", "ROW_ATTRIBUTES", "FIRST_TOKEN_EVENT"]

FIRST_TOKEN_EVENT = "gen_ai.first_token"
_log = logging.getLogger(__name__)
_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)


def traces_url(endpoint: str) -> str:
    """The OTLP/HTTP traces URL for an endpoint given as a base or a full URL.

    Example: "http://collector:4318" -> "http://collector:4318/v1/traces";
    "http://collector:4318/v1/traces" is returned as it is.
    """
    parts = urlsplit(endpoint)
    if parts.scheme not in ("http", "https") or not parts.netloc:
        raise ValueError(
            f"OTLP endpoint {endpoint!r} is not an http(s) URL; "
            "pass e.g. --otlp-endpoint http://otel-collector:4318"
        )
    if parts.path in ("", "/"):
        return endpoint.rstrip("/") + "/v1/traces"
    return endpoint


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


def span_attributes(record: RequestRecord, server: tuple[str, int] | None = None) -> dict[str, Any]:
    """GenAI span attributes for one finished record (pure; see the module docstring for an example)."""
    attributes: dict[str, Any] = {"gen_ai.operation.name": _operation(record.endpoint)}
    for attribute, name in ROW_ATTRIBUTES:
        value = getattr(record, name)
        if value is not None:
            attributes[attribute] = value
    if server is not None:
        attributes["server.address"], attributes["server.port"] = server
    if record.outcome not in (None, "ok"):
        attributes["error.type"] = record.outcome
    return attributes


def _server(upstream: str | None) -> tuple[str, int] | None:
    """(host, port) of the upstream engine URL, the GenAI `server.*` attributes."""
    if not upstream:
        return None
    parts = urlsplit(upstream)
    if not parts.hostname:
        return None
    return parts.hostname, parts.port or (443 if parts.scheme == "https" else 80)


class OtelSink:
    """RowSink that emits one GenAI span per finished request through its own TracerProvider.

    `exporter` (e.g. InMemorySpanExporter in tests) is exported synchronously; without one, an
    OTLPSpanExporter to `endpoint` (or the OTEL_EXPORTER_OTLP_* variables) sits behind a
    BatchSpanProcessor, so export never runs on the event loop.
    """

    def __init__(
        self,
        endpoint: str | None = None,
        exporter: Any = None,
        *,
        upstream: str | None = None,
        service_name: str = "headroom-sidecar",
    ) -> None:
        # lazy: the OpenTelemetry SDK loads only when spans are turned on (--otlp-endpoint)
        from opentelemetry.sdk.resources import Resource
        from opentelemetry.sdk.trace import TracerProvider
        from opentelemetry.sdk.trace.export import BatchSpanProcessor, SimpleSpanProcessor

        resource_attributes = {} if os.environ.get("OTEL_SERVICE_NAME") else {"service.name": service_name}
        self._provider = TracerProvider(resource=Resource.create(resource_attributes))
        if exporter is not None:
            self._provider.add_span_processor(SimpleSpanProcessor(exporter))
        else:
            # lazy: the OTLP exporter's protobuf stack loads only when spans leave the process
            from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter

            url = traces_url(endpoint) if endpoint else None  # None: the SDK reads OTEL_* itself
            self._provider.add_span_processor(BatchSpanProcessor(OTLPSpanExporter(endpoint=url)))
        self._tracer = self._provider.get_tracer("llm-headroom")
        self._server = _server(upstream)
        self.spans_emitted = 0
        self.spans_failed = 0

    def submit(self, record: RequestRecord) -> None:
        """Turn one finished record into one ended span; never raises into the request path."""
        try:
            self._emit(record)
        except Exception:  # tracing must never break a request; count it and go on
            self.spans_failed += 1
            _log.exception("could not build the span of request %s", record.request_id)

    def _emit(self, record: RequestRecord) -> None:
        from opentelemetry.trace import SpanKind, Status, StatusCode  # lazy, as in __init__

        start_ns = _ns(record.admitted_at)
        if start_ns is None:
            return
        end_ns = _ns(record.completed_at) or start_ns
        span = self._tracer.start_span(
            span_name(record),
            kind=SpanKind.CLIENT,
            start_time=start_ns,
            attributes=span_attributes(record, self._server),
        )
        first_token_ns = _ns(record.first_token_at)
        if first_token_ns is not None:
            span.add_event(FIRST_TOKEN_EVENT, timestamp=first_token_ns)
        if record.outcome not in (None, "ok"):
            span.set_status(Status(StatusCode.ERROR, record.error or record.outcome))
        span.end(end_time=end_ns)
        self.spans_emitted += 1

    def force_flush(self, timeout_millis: int = 30_000) -> bool:
        """Export every span finished so far; True when the exporter confirmed in time."""
        return self._provider.force_flush(timeout_millis)

    def flush(self) -> bool:
        """RowSink flush: the same as force_flush() with its default timeout."""
        return self.force_flush()

    def close(self) -> None:
        """Flush and shut the provider down (the sidecar calls this at exit)."""
        self._provider.shutdown()
