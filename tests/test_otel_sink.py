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
        ("https://host/otlp", "https://host/otlp/v1/traces"),  # a base endpoint with a path (OTLP spec)
        ("http://collector:4318/v1/traces", "http://collector:4318/v1/traces"),
    ],
)
def test_traces_url(given, expected):
    assert traces_url(given) == expected


def test_traces_url_rejects_a_bare_host_with_advice():
    with pytest.raises(ValueError, match="--otlp-endpoint http://"):
        traces_url("collector:4318")


def test_genai_server_metrics_are_recorded_from_rows():
    from opentelemetry.sdk.metrics.export import InMemoryMetricReader

    reader = InMemoryMetricReader()
    sink = OtelSink(exporter=InMemorySpanExporter(), metric_reader=reader, provider="vllm")
    sink.submit(_row())
    sink.submit(_row(request_id="r-2", outcome="timeout", ttft_s=None, tpot_s=None, e2e_s=30.0))
    points = {
        m.name: m.data.data_points
        for rm in reader.get_metrics_data().resource_metrics
        for sm in rm.scope_metrics
        for m in sm.metrics
    }
    assert set(points) == {
        "gen_ai.server.request.duration",
        "gen_ai.server.time_to_first_token",
        "gen_ai.server.time_per_output_token",
    }
    durations = {dict(p.attributes).get("error.type"): p for p in points["gen_ai.server.request.duration"]}
    assert durations[None].count == 1 and durations["timeout"].sum == 30.0
    (ttft,) = points["gen_ai.server.time_to_first_token"]
    assert ttft.sum == 0.25 and dict(ttft.attributes)["gen_ai.provider.name"] == "vllm"
    assert dict(ttft.attributes)["gen_ai.request.model"] == "llama-3-8b"


def test_traceparent_parsing_follows_w3c():
    from collector.sidecar.tracecontext import Telemetry, parse_traceparent

    assert parse_traceparent("00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01") == (
        0x4BF92F3577B34DA6A3CE929D0E0E4736,
        0x00F067AA0BA902B7,
        1,
    )
    for bad in (
        None,
        "",
        "00-00000000000000000000000000000000-00f067aa0ba902b7-01",
        "00-4bf92f3577b34da6a3ce929d0e0e4736-0000000000000000-01",
        "ff-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",
        "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01-extra",
        "garbage",
    ):
        assert parse_traceparent(bad) is None, bad
    fresh = Telemetry.start(None)
    assert fresh.parent_span_id is None and fresh.traceparent().startswith(f"00-{fresh.trace_id:032x}-")


def test_provider_name_is_the_engine_family_as_auto_detects_it(exporter, monkeypatch):
    """`--engine auto` learns the engine on its first poll: spans before it say openai (the API
    spoken), spans after it the family; llamacpp is spelled llama.cpp."""
    from collector.sidecar import wiring
    from collector.sidecar.config import SidecarConfig
    from collector.sources.base import EngineSnapshot

    class Detected:  # the EngineSource attribute the sink reads
        latest = EngineSnapshot.down("auto", "not polled yet")

    made: list[dict] = []
    monkeypatch.setattr(wiring, "OtelSink", lambda **options: made.append(options))
    config = SidecarConfig(upstream="http://127.0.0.1:8000", engine="auto", otlp_endpoint="http://otel:4318")
    wiring._otel_sinks(config, Detected())  # type: ignore[arg-type]
    provider = made[0]["provider"]
    assert provider() == "openai"
    Detected.latest = EngineSnapshot.down("llamacpp", "down for the test")
    assert provider() == "llama.cpp"
    sink = OtelSink(exporter=exporter, provider=provider)
    sink.submit(_row())
    (span,) = exporter.get_finished_spans()
    assert span.attributes["gen_ai.provider.name"] == "llama.cpp"
