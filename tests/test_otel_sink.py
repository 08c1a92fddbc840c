"""OtelSink on request records: span name, GenAI attributes, timestamps, error type, endpoint handling."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import SpanKind, StatusCode

from collector.record import RequestRecord
from collector.sidecar.otel import FIRST_TOKEN_EVENT, OtelSink, span_attributes, traces_url

T0 = datetime(2026, 3, 2, 10, 0, 0, 123456, tzinfo=UTC)
T0_NS = 1772445600_123456_000


def _row(**overrides) -> RequestRecord:
    row = dict(
        request_id="r-1",
        source="traffic",
        instance="sidecar-a",
        model="llama-3-8b",
        tenant="team-a",
        endpoint="/v1/chat/completions",
        stream=True,
        admitted_at=T0,
        first_byte_at=T0 + timedelta(milliseconds=100),
        first_token_at=T0 + timedelta(milliseconds=250),
        completed_at=T0 + timedelta(seconds=2, microseconds=7),
        status_code=200,
        outcome="ok",
        prompt_tokens=42,
        cached_prompt_tokens=16,
        completion_tokens=17,
        max_tokens=64,
        usage_source="upstream",
        ttft_s=0.25,
        tpot_s=0.1,
        e2e_s=2.000007,
        inflight_at_admit=3,
        active_tokens_at_admit=300,
    )
    row.update(overrides)
    return RequestRecord(**row)


@pytest.fixture
def exporter() -> InMemorySpanExporter:
    return InMemorySpanExporter()


def _one_span(exporter, row):
    sink = OtelSink(exporter=exporter, upstream="http://engine.internal:8000")
    sink.submit(row)
    (span,) = exporter.get_finished_spans()
    return span


def test_chat_row_becomes_one_client_span_with_exact_timestamps(exporter):
    span = _one_span(exporter, _row())
    assert span.name == "chat llama-3-8b"
    assert span.kind is SpanKind.CLIENT
    assert span.start_time == T0_NS
    assert span.end_time == T0_NS + 2_000_007_000
    (event,) = span.events
    assert event.name == FIRST_TOKEN_EVENT
    assert event.timestamp - span.start_time == 250_000_000
    assert span.status.status_code is StatusCode.UNSET


def test_genai_attributes_come_from_the_row(exporter):
    attributes = _one_span(exporter, _row()).attributes
    assert attributes["gen_ai.operation.name"] == "chat"
    assert attributes["gen_ai.request.model"] == "llama-3-8b"
    assert attributes["gen_ai.request.max_tokens"] == 64
    assert attributes["gen_ai.usage.input_tokens"] == 42
    assert attributes["gen_ai.usage.output_tokens"] == 17
    assert attributes["gen_ai.usage.cache_read.input_tokens"] == 16
    assert attributes["gen_ai.response.time_to_first_chunk"] == 0.25
    assert (attributes["server.address"], attributes["server.port"]) == ("engine.internal", 8000)
    assert attributes["headroom.request_id"] == "r-1"
    assert "error.type" not in attributes
    assert "headroom.run_id" not in attributes  # NULL columns are left out, not sent as ""


def test_completions_endpoint_is_text_completion():
    attributes = span_attributes(_row(endpoint="/v1/completions"))
    assert attributes["gen_ai.operation.name"] == "text_completion"


def test_failed_request_carries_error_type_and_error_status(exporter):
    row = _row(
        status_code=429,
        outcome="rate_limited",
        error="upstream 429",
        first_token_at=None,
        completion_tokens=0,
        ttft_s=None,
    )
    span = _one_span(exporter, row)
    assert span.attributes["error.type"] == "rate_limited"
    assert span.attributes["http.response.status_code"] == 429
    assert span.status.status_code is StatusCode.ERROR
    assert span.events == ()  # no first token, no event


def test_sink_has_its_own_provider_not_the_global_one(exporter):
    from opentelemetry import trace

    before = trace.get_tracer_provider()
    OtelSink(exporter=exporter).submit(_row())
    assert trace.get_tracer_provider() is before
    assert len(exporter.get_finished_spans()) == 1


def test_a_broken_row_is_counted_not_raised(exporter):
    sink = OtelSink(exporter=exporter)
    sink.submit(_row(admitted_at="not a datetime"))
    assert (sink.spans_emitted, sink.spans_failed) == (0, 1)


@pytest.mark.parametrize(
    ("given", "expected"),
    [
        ("http://collector:4318", "http://collector:4318/v1/traces"),
        ("http://collector:4318/", "http://collector:4318/v1/traces"),
        ("https://otlp.example/custom/traces", "https://otlp.example/custom/traces"),
    ],
)
def test_traces_url(given, expected):
    assert traces_url(given) == expected


def test_traces_url_rejects_a_bare_host_with_advice():
    with pytest.raises(ValueError, match="--otlp-endpoint http://"):
        traces_url("collector:4318")
