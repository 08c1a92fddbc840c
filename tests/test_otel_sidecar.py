"""OtelSink through the real sidecar: one GenAI span per streamed request, matching the logged row.

The upstream is a tiny fake OpenAI server of our own (deterministic chunks and usage); the sidecar is
the real build_sidecar with a real DuckDB request log, served by uvicorn on loopback.
"""

from __future__ import annotations

import asyncio
import json
import threading
from datetime import UTC

import httpx
import pytest
from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, StreamingResponse
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import StatusCode
from support.waiting import patient

from collector.serving import serve_in_thread
from collector.sidecar.config import SidecarConfig
from collector.sidecar.otel import FIRST_TOKEN_EVENT, OtelSink
from collector.sidecar.wiring import build_sidecar, sidecar_state
from collector.store.db import RequestStore

MODEL = "fake-llm"
BUSY_MODEL = "busy-llm"  # the fake upstream answers 429 for this one
PROMPT_TOKENS, WORDS = 11, ("Hello", " there", " friend")


def _chunk(delta: dict, usage: dict | None = None) -> bytes:
    body = {
        "id": "c1",
        "object": "chat.completion.chunk",
        "model": MODEL,
        "choices": [] if usage else [{"index": 0, "delta": delta, "finish_reason": None}],
    }
    if usage:
        body["usage"] = usage
    return b"data: " + json.dumps(body).encode() + b"\n\n"


def _fake_upstream() -> FastAPI:
    app = FastAPI()

    @app.post("/v1/chat/completions")
    async def chat(request: Request):
        body = await request.json()
        if body["model"] == BUSY_MODEL:
            return JSONResponse({"error": {"message": "too many requests"}}, status_code=429)

        async def stream():
            yield _chunk({"role": "assistant"})
            for word in WORDS:
                await asyncio.sleep(0.03)
                yield _chunk({"content": word})
            if body.get("stream_options", {}).get("include_usage"):
                yield _chunk(
                    {},
                    usage={
                        "prompt_tokens": PROMPT_TOKENS,
                        "completion_tokens": len(WORDS),
                        "total_tokens": PROMPT_TOKENS + len(WORDS),
                    },
                )
            yield b"data: [DONE]\n\n"

        return StreamingResponse(stream(), media_type="text/event-stream")

    return app


@pytest.fixture(scope="module")
def upstream():
    handle = serve_in_thread(_fake_upstream())
    yield handle
    handle.stop()


def _run_requests(upstream_url: str, span_sinks, store: RequestStore | None, models: list[str]) -> None:
    """Serve a sidecar with these span sinks, send one streamed chat request per model, shut it down."""
    config = SidecarConfig(upstream=upstream_url, engine="none", db_path=None, instance="otel-test")
    sidecar = serve_in_thread(build_sidecar(config, span_sinks=span_sinks, log_sink=store))
    try:
        with httpx.Client(base_url=sidecar.url, timeout=patient(30)) as client:
            for model in models:
                payload = {
                    "model": model,
                    "stream": True,
                    "max_tokens": 16,
                    "messages": [{"role": "user", "content": "hi"}],
                }
                with client.stream("POST", "/v1/chat/completions", json=payload) as response:
                    response.read()
    finally:
        sidecar.stop()  # graceful: the request log flushes every row


def test_streamed_request_span_matches_the_logged_row(upstream, tmp_path):
    exporter = InMemorySpanExporter()
    store = RequestStore(tmp_path / "log.duckdb")
    _run_requests(upstream.url, [OtelSink(exporter=exporter, upstream=upstream.url)], store, [MODEL])
    (row,) = store.query_dicts("SELECT * FROM requests")
    (span,) = exporter.get_finished_spans()

    assert span.name == f"chat {MODEL}"
    attributes = span.attributes
    assert attributes["gen_ai.operation.name"] == "chat"
    assert attributes["gen_ai.request.model"] == MODEL
    assert attributes["gen_ai.request.max_tokens"] == 16
    assert attributes["server.address"] == "127.0.0.1" and attributes["server.port"] == upstream.port
    assert row["usage_source"] == "upstream"
    assert attributes["gen_ai.usage.input_tokens"] == row["prompt_tokens"] == PROMPT_TOKENS
    assert attributes["gen_ai.usage.output_tokens"] == row["completion_tokens"] == len(WORDS)
    assert "error.type" not in attributes

    (event,) = [e for e in span.events if e.name == FIRST_TOKEN_EVENT]
    assert row["ttft_s"] > 0
    assert (event.timestamp - span.start_time) / 1e9 == pytest.approx(row["ttft_s"], abs=1e-6)
    assert (span.end_time - span.start_time) / 1e9 == pytest.approx(row["e2e_s"], abs=1e-6)
    store.close()


def test_rate_limited_request_span_carries_the_error_type(upstream, tmp_path):
    exporter = InMemorySpanExporter()
    store = RequestStore(tmp_path / "log.duckdb")
    _run_requests(upstream.url, [OtelSink(exporter=exporter)], store, [BUSY_MODEL])
    (row,) = store.query_dicts("SELECT outcome, status_code FROM requests")
    (span,) = exporter.get_finished_spans()
    assert row == {"outcome": "rate_limited", "status_code": 429}
    assert span.attributes["error.type"] == "rate_limited"
    assert span.attributes["http.response.status_code"] == 429
    assert span.status.status_code is StatusCode.ERROR
    assert not [e for e in span.events if e.name == FIRST_TOKEN_EVENT]
    store.close()


@pytest.fixture
def otel_object_counter(monkeypatch) -> list[str]:
    """Counts every span or tracer call OpenTelemetry makes, in the API and in the SDK."""
    from opentelemetry import trace as api
    from opentelemetry.sdk import trace as sdk

    created: list[str] = []

    def counting(cls, method: str) -> None:
        original = getattr(cls, method)

        def wrapper(self, *args, **kwargs):
            created.append(f"{cls.__name__}.{method}")
            return original(self, *args, **kwargs)

        monkeypatch.setattr(cls, method, wrapper)

    for cls, method in (
        (sdk.Tracer, "start_span"),
        (sdk.ReadableSpan, "__init__"),
        (sdk.TracerProvider, "__init__"),
        (api.NoOpTracer, "start_span"),
        (api.ProxyTracer, "start_span"),
        (api.NonRecordingSpan, "__init__"),
    ):
        counting(cls, method)
    return created


def test_with_otlp_off_no_opentelemetry_object_is_created_per_request(upstream, otel_object_counter):
    _run_requests(upstream.url, [], None, [MODEL] * 5)
    assert otel_object_counter == []


def test_the_counter_sees_spans_when_otlp_is_on(upstream, otel_object_counter):
    """Positive control for the test above: the same counter does count the sink's spans."""
    sink = OtelSink(exporter=InMemorySpanExporter())
    otel_object_counter.clear()  # the sink's own provider, created once, is not per request
    _run_requests(upstream.url, [sink], None, [MODEL] * 3)
    assert otel_object_counter.count("Tracer.start_span") == 3


def _fake_otlp_collector(received: list, arrived: threading.Event, prefix: str = "") -> FastAPI:
    """An OTLP/HTTP receiver at `prefix`/v1/traces: decodes each protobuf export request into its spans."""
    from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest

    app = FastAPI()

    @app.post(prefix + "/v1/traces")
    async def traces(request: Request):
        export = ExportTraceServiceRequest.FromString(await request.body())
        for resource_spans in export.resource_spans:
            for scope_spans in resource_spans.scope_spans:
                received.extend(scope_spans.spans)
        arrived.set()
        return JSONResponse({})

    return app


def test_otlp_endpoint_flag_exports_spans_over_otlp_http(upstream):
    """`headroom run --otlp-endpoint URL` (build_sidecar) sends the spans to a Collector, batched."""
    received, arrived = [], threading.Event()
    collector = serve_in_thread(_fake_otlp_collector(received, arrived))
    try:
        config = SidecarConfig(
            upstream=upstream.url,
            db_path=None,
            instance="otlp-test",
            engine="none",
            otlp_endpoint=collector.url,
        )
        sidecar = serve_in_thread(build_sidecar(config))
        try:
            with httpx.Client(base_url=sidecar.url, timeout=patient(30)) as client:
                for _ in range(2):
                    payload = {
                        "model": MODEL,
                        "stream": True,
                        "messages": [{"role": "user", "content": "hi"}],
                    }
                    client.post("/v1/chat/completions", json=payload).raise_for_status()
        finally:
            sidecar.stop()  # shutdown flushes the BatchSpanProcessor
        assert arrived.wait(patient(15)), "no OTLP export reached the fake Collector"
    finally:
        collector.stop()
    assert [span.name for span in received] == [f"chat {MODEL}"] * 2
    first = received[0]
    attributes = {a.key: a.value for a in first.attributes}
    assert attributes["gen_ai.usage.output_tokens"].int_value == len(WORDS)
    assert [event.name for event in first.events] == [FIRST_TOKEN_EVENT]


def test_headroom_run_without_otlp_creates_no_opentelemetry_object_per_request(
    upstream, otel_object_counter, tmp_path, monkeypatch
):
    """The path `headroom run` takes (CLI -> build_sidecar), with no flag and no OTEL_* variable."""
    from click.testing import CliRunner

    from collector.sidecar import cli

    for name in ("OTEL_EXPORTER_OTLP_ENDPOINT", "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT"):
        monkeypatch.delenv(name, raising=False)
    built = {}

    def serve(app, **_):  # stands in for uvicorn.run: serve in a thread and send requests
        built["app"] = app
        sidecar = serve_in_thread(app)
        try:
            with httpx.Client(base_url=sidecar.url, timeout=patient(30)) as client:
                for _ in range(5):
                    client.post(
                        "/v1/chat/completions",
                        json={
                            "model": MODEL,
                            "stream": True,
                            "messages": [{"role": "user", "content": "hi"}],
                        },
                    )
        finally:
            sidecar.stop()

    monkeypatch.setattr("uvicorn.run", serve)
    result = CliRunner().invoke(
        cli.run,
        ["--upstream", upstream.url, "--engine", "none", "--no-jobs", "--db", str(tmp_path / "h.duckdb")],
    )
    assert result.exit_code == 0, result.output
    assert sidecar_state(built["app"]).config.otlp_endpoint is None
    assert otel_object_counter == []
    rows = RequestStore(tmp_path / "h.duckdb").count()
    assert rows == 5


def test_the_standard_otel_variable_turns_spans_on_through_the_cli(upstream, monkeypatch, tmp_path):
    from click.testing import CliRunner

    from collector.sidecar import cli
    from collector.sidecar.otel import OtelSink as RealSink

    monkeypatch.setenv("OTEL_EXPORTER_OTLP_ENDPOINT", "http://127.0.0.1:4318")
    made = []
    monkeypatch.setattr(
        "collector.sidecar.wiring.OtelSink",
        lambda **kw: made.append(kw) or RealSink(exporter=InMemorySpanExporter()),
    )
    monkeypatch.setattr("uvicorn.run", lambda app, **_: None)
    result = CliRunner().invoke(
        cli.run,
        ["--upstream", upstream.url, "--engine", "none", "--no-jobs", "--db", str(tmp_path / "h.duckdb")],
    )
    assert result.exit_code == 0, result.output
    assert made == [{"endpoint": "http://127.0.0.1:4318", "upstream": upstream.url}]


CLIENT_TRACE, CLIENT_SPAN = "4bf92f3577b34da6a3ce929d0e0e4736", "00f067aa0ba902b7"


def test_a_span_joins_the_clients_trace_and_the_engine_gets_the_sidecars_span_as_parent():
    """traceparent in -> span parent; the engine's traceparent names the span; GenAI response facts;
    OTEL-style base endpoint https://host/otlp is posted to /otlp/v1/traces."""
    from support.upstream import ID, FakeUpstream
    from support.upstream import MODEL as ENGINE_MODEL

    fake = engine = FakeUpstream()
    received, arrived = [], threading.Event()
    collector = serve_in_thread(_fake_otlp_collector(received, arrived, prefix="/otlp"))
    try:
        config = SidecarConfig(
            upstream=engine.url,
            db_path=None,
            instance="trace-test",
            engine="vllm",
            engine_metrics_url=engine.url + "/metrics",
            otlp_endpoint=collector.url + "/otlp",
        )
        sidecar = serve_in_thread(build_sidecar(config))
        try:
            answer = httpx.post(
                sidecar.url + "/v1/chat/completions",
                timeout=patient(30),
                headers={"traceparent": f"00-{CLIENT_TRACE}-{CLIENT_SPAN}-01", "tracestate": "vendor=1"},
                json={"model": "m1", "stream": True, "messages": [{"role": "user", "content": "hi"}]},
            )
            answer.raise_for_status()
        finally:
            sidecar.stop()
        assert arrived.wait(patient(15)), "no OTLP export reached /otlp/v1/traces"
    finally:
        collector.stop()
        engine.stop()
    (span,) = received
    assert span.trace_id.hex() == CLIENT_TRACE and span.parent_span_id.hex() == CLIENT_SPAN
    sent = fake.requests[-1]["headers"]
    assert sent["traceparent"] == f"00-{CLIENT_TRACE}-{span.span_id.hex()}-01", (
        "the engine's parent is our span"
    )
    assert sent["tracestate"] == "vendor=1"
    attributes = {a.key: a.value for a in span.attributes}
    assert attributes["gen_ai.provider.name"].string_value == "vllm"
    assert attributes["gen_ai.response.id"].string_value == ID
    assert attributes["gen_ai.response.model"].string_value == ENGINE_MODEL
    assert [v.string_value for v in attributes["gen_ai.response.finish_reasons"].array_value.values] == [
        "length"
    ]
    assert attributes["gen_ai.request.model"].string_value == "m1"


def test_without_tracing_the_clients_traceparent_reaches_the_engine_untouched(upstream):
    from support.upstream import FakeUpstream

    fake = engine = FakeUpstream()
    sidecar = serve_in_thread(build_sidecar(SidecarConfig(upstream=engine.url, db_path=None, engine="none")))
    try:
        header = f"00-{CLIENT_TRACE}-{CLIENT_SPAN}-01"
        httpx.post(
            sidecar.url + "/v1/chat/completions",
            headers={"traceparent": header},
            timeout=patient(30),
            json={"model": "m1", "messages": [{"role": "user", "content": "hi"}]},
        ).raise_for_status()
    finally:
        sidecar.stop()
        engine.stop()
    assert fake.requests[-1]["headers"]["traceparent"] == header


def test_otlp_over_grpc_reaches_a_grpc_collector():
    """--otlp-protocol grpc (the [otlp-grpc] extra): the span goes to a real gRPC TraceService."""
    grpc = pytest.importorskip("grpc")
    from concurrent import futures

    from conftest import free_port
    from opentelemetry.proto.collector.trace.v1 import trace_service_pb2, trace_service_pb2_grpc

    received, arrived = [], threading.Event()

    class Collector(trace_service_pb2_grpc.TraceServiceServicer):
        def Export(self, request, context):  # noqa: N802 -- the generated service's method name
            received.extend(s for rs in request.resource_spans for ss in rs.scope_spans for s in ss.spans)
            arrived.set()
            return trace_service_pb2.ExportTraceServiceResponse()

    server = grpc.server(futures.ThreadPoolExecutor(max_workers=2))
    trace_service_pb2_grpc.add_TraceServiceServicer_to_server(Collector(), server)
    port = free_port()
    server.add_insecure_port(f"127.0.0.1:{port}")
    server.start()
    try:
        sink = OtelSink(traces_endpoint=f"http://127.0.0.1:{port}", protocol="grpc")
        row = _row_for_grpc()
        sink.submit(row)
        sink.close()
        assert arrived.wait(patient(15)), "no span reached the gRPC collector"
    finally:
        server.stop(0)
    (span,) = received
    assert span.name == "chat m-grpc"


def _row_for_grpc():
    from datetime import datetime, timedelta

    from collector.record import RequestRecord

    start = datetime.now(UTC)
    return RequestRecord(
        request_id="g-1",
        model="m-grpc",
        endpoint="/v1/chat/completions",
        admitted_at=start,
        completed_at=start + timedelta(seconds=1),
        outcome="ok",
    )
