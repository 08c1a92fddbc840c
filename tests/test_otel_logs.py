"""`--otlp-logs`: one gen_ai.client.inference.operation.details log event per request, over real
OTLP/HTTP to an in-test receiver that decodes the protobuf; and deploy/clickhouse/ (the
clickhouseexporter's otel_logs table and the typed view into headroom_requests) in chdb, fed the
decoded events as the exporter would write them, agreeing with DuckDB over the same rows.
"""

from __future__ import annotations

import asyncio
import json
import os
import threading
from datetime import UTC, datetime, timedelta
from decimal import Decimal
from pathlib import Path
from typing import Any

import httpx
import pytest
from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, StreamingResponse
from support.synthetic import synthetic_rows
from support.waiting import patient

from collector.record import FIELD_NAMES, RequestRecord
from collector.serving import serve_in_thread
from collector.sidecar.config import SidecarConfig
from collector.sidecar.otel import DETAILS_EVENT, EVENT_ONLY_FIELDS, ROW_ATTRIBUTES, OtelSink
from collector.sidecar.wiring import build_sidecar
from collector.store.db import RequestStore

ROOT = Path(__file__).resolve().parents[1]
MODEL = "fake-llm"
PROMPT = "the-secret-prompt-7f3a"  # must never leave the sidecar
WORDS = ("Zebra", "quokka", "narwhal")  # the completion: must never leave either
ATTRIBUTE_OF = {field: attribute for attribute, field in ROW_ATTRIBUTES} | {
    field: f"headroom.{field}" for field in EVENT_ONLY_FIELDS
}


def _fake_upstream() -> FastAPI:
    app = FastAPI()

    def chunk(delta: dict[str, Any], usage: dict[str, int] | None = None) -> bytes:
        body: dict[str, Any] = {"id": "cmpl-1", "object": "chat.completion.chunk", "model": MODEL}
        body["choices"] = [] if usage else [{"index": 0, "delta": delta, "finish_reason": None}]
        if usage:
            body["usage"] = usage
        return b"data: " + json.dumps(body).encode() + b"\n\n"

    @app.post("/v1/chat/completions")
    async def chat(request: Request) -> StreamingResponse:
        await request.body()

        async def stream() -> Any:
            yield chunk({"role": "assistant"})
            for word in WORDS:
                await asyncio.sleep(0)
                yield chunk({"content": word})
            yield chunk({}, usage={"prompt_tokens": 9, "completion_tokens": 3, "total_tokens": 12})
            yield b"data: [DONE]\n\n"

        return StreamingResponse(stream(), media_type="text/event-stream")

    return app


class Receiver:
    """An OTLP/HTTP receiver: /v1/logs and /v1/traces decoded from protobuf; raw bodies kept."""

    def __init__(self, logs_expected: int) -> None:
        self.logs: list[tuple[dict[str, Any], Any, Any]] = []  # (resource attributes, scope, LogRecord)
        self.spans: list[Any] = []
        self.bodies: list[bytes] = []
        self.logs_arrived = threading.Event()
        self._expected = logs_expected

    def app(self) -> FastAPI:
        from opentelemetry.proto.collector.logs.v1.logs_service_pb2 import ExportLogsServiceRequest
        from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest

        app = FastAPI()

        @app.post("/v1/logs")
        async def logs(request: Request) -> JSONResponse:
            body = await request.body()
            self.bodies.append(body)
            for resource_logs in ExportLogsServiceRequest.FromString(body).resource_logs:
                resource = {kv.key: _plain(kv.value) for kv in resource_logs.resource.attributes}
                for scope_logs in resource_logs.scope_logs:
                    self.logs.extend((resource, scope_logs.scope, r) for r in scope_logs.log_records)
            if len(self.logs) >= self._expected:
                self.logs_arrived.set()
            return JSONResponse({})

        @app.post("/v1/traces")
        async def traces(request: Request) -> JSONResponse:
            body = await request.body()
            self.bodies.append(body)
            for resource_spans in ExportTraceServiceRequest.FromString(body).resource_spans:
                for scope_spans in resource_spans.scope_spans:
                    self.spans.extend(scope_spans.spans)
            return JSONResponse({})

        return app


def _plain(value: Any) -> Any:
    """An OTLP AnyValue as Python (str, bool, int, float, or a list of those)."""
    kind = value.WhichOneof("value")
    if kind == "array_value":
        return [_plain(v) for v in value.array_value.values]
    return getattr(value, kind)


def _exporter_string(value: Any) -> str:
    """An attribute value as the clickhouseexporter writes it into a Map(String, String): the
    collector's pcommon Value.AsString (ints in decimal, doubles in the shortest round-tripping
    form with no exponent, booleans true/false, arrays as JSON), as we read its source."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, float):
        text = format(Decimal(repr(value)), "f")
        return text[:-2] if text.endswith(".0") else text
    if isinstance(value, list):
        return json.dumps(value, separators=(",", ":"))
    return str(value)


def _attributes(record: Any) -> dict[str, Any]:
    return {kv.key: _plain(kv.value) for kv in record.attributes}


def _row_value(value: Any) -> Any:
    """A DuckDB row value as the event carries it (timestamps as ISO 8601 UTC, microseconds)."""
    if isinstance(value, datetime):
        return value.astimezone(UTC).isoformat(timespec="microseconds")
    return value


@pytest.fixture(scope="module")
def upstream() -> Any:
    handle = serve_in_thread(_fake_upstream())
    yield handle
    handle.stop()


def test_otlp_logs_sends_one_event_per_request_with_the_rows_fields_and_no_text(
    upstream: Any, tmp_path: Path
) -> None:
    """`headroom run --otlp-endpoint URL --otlp-logs` (build_sidecar): one details event per
    request reaches the receiver; its attributes are the row's (every field) and the span's; it
    sits in the span's trace; no prompt or completion text is in any byte that left."""
    requests = 3
    receiver = Receiver(logs_expected=requests)
    collector = serve_in_thread(receiver.app())
    store = RequestStore(tmp_path / "log.duckdb")
    try:
        config = SidecarConfig(
            upstream=upstream.url,
            db_path=None,
            instance="logs-test",
            engine="none",
            otlp_endpoint=collector.url,
            otlp_logs=True,
        )
        sidecar = serve_in_thread(build_sidecar(config, log_sink=store))
        try:
            with httpx.Client(base_url=sidecar.url, timeout=patient(30)) as client:
                for _ in range(requests):
                    payload = {
                        "model": MODEL,
                        "stream": True,
                        "max_tokens": 16,
                        "messages": [{"role": "user", "content": PROMPT}],
                    }
                    response = client.post("/v1/chat/completions", json=payload)
                    response.raise_for_status()
                    assert WORDS[0] in response.text  # the text exists, on the client's side
        finally:
            sidecar.stop()  # shutdown flushes the batch processors
        assert receiver.logs_arrived.wait(patient(15)), "the log events did not reach the receiver"
    finally:
        collector.stop()

    assert len(receiver.logs) == requests
    rows = {row["request_id"]: row for row in store.query_dicts("SELECT * FROM requests")}
    assert len(rows) == requests
    spans = {span.span_id: span for span in receiver.spans}
    for resource, scope, record in receiver.logs:
        assert record.event_name == DETAILS_EVENT
        assert resource["service.name"] == "headroom-sidecar" and scope.name == "llm-headroom"
        attributes = _attributes(record)
        row = rows.pop(attributes["headroom.request_id"])
        for field in FIELD_NAMES:  # every field of the row, under its one name, NULLs absent
            if row[field] is None:
                assert ATTRIBUTE_OF[field] not in attributes, field
            elif isinstance(row[field], float):
                assert attributes[ATTRIBUTE_OF[field]] == pytest.approx(row[field], rel=1e-12), field
            else:
                assert attributes[ATTRIBUTE_OF[field]] == _row_value(row[field]), field
        assert attributes["gen_ai.operation.name"] == "chat"
        assert attributes["gen_ai.provider.name"] == "openai"
        assert attributes["gen_ai.response.id"] == "cmpl-1"
        assert attributes["gen_ai.usage.output_tokens"] == 3
        assert not any(
            key.startswith(("gen_ai.input", "gen_ai.output", "gen_ai.system")) for key in attributes
        )
        span = spans[record.span_id]  # the event is in its request's span
        assert record.trace_id == span.trace_id
        assert {kv.key: _plain(kv.value) for kv in span.attributes}.items() <= attributes.items()
        assert record.time_unix_nano == span.end_time_unix_nano
    assert not rows
    for body in receiver.bodies:
        assert PROMPT.encode() not in body
        assert not any(word.encode() in body for word in WORDS)


def _statements(path: Path) -> list[str]:
    text = "\n".join(line for line in path.read_text().splitlines() if not line.lstrip().startswith("--"))
    return [statement for statement in text.split(";") if statement.strip()]


def _otel_logs_row(resource: dict[str, Any], scope: Any, record: Any) -> dict[str, Any]:
    """One decoded LogRecord as the clickhouseexporter inserts it into otel_logs."""
    return {
        "Timestamp": f"{record.time_unix_nano // 10**9}.{record.time_unix_nano % 10**9:09d}",  # seconds
        "TraceId": record.trace_id.hex(),
        "SpanId": record.span_id.hex(),
        "TraceFlags": record.flags & 0xFF,
        "SeverityText": record.severity_text,
        "SeverityNumber": int(record.severity_number),
        "ServiceName": resource.get("service.name", ""),
        "Body": "",
        "ResourceAttributes": {k: _exporter_string(v) for k, v in resource.items()},
        "ScopeName": scope.name,
        "ScopeVersion": scope.version,
        "LogAttributes": {kv.key: _exporter_string(_plain(kv.value)) for kv in record.attributes},
        "EventName": record.event_name,
    }


def test_clickhouse_view_types_the_events_into_the_requests_columns_and_p95_equals_duckdbs(
    tmp_path: Path,
) -> None:
    """deploy/clickhouse/ in chdb: otel_logs (the exporter's schema) receives the events of 600
    rows over 3 models (a retried batch among them); the view's ReplacingMergeTree holds each
    request once, with the requests columns, and p50/p95/p99 TTFT per model equal DuckDB's."""
    ci = os.environ.get("CI", "").lower() == "true"
    chdb_session = __import__("chdb.session").session if ci else pytest.importorskip("chdb.session")
    start = datetime(2026, 3, 2, 8, 0, tzinfo=UTC)
    rows = synthetic_rows(600, start, span=timedelta(hours=30), models=("a", "b", "c"), seed=11)
    rows[0] = {**rows[0], "stream": False, "error": "sidecar shut down", "adapter": "lora-1"}
    receiver = Receiver(logs_expected=len(rows))
    collector = serve_in_thread(receiver.app())
    try:
        sink = OtelSink(endpoint=collector.url, logs=True)
        for row in rows:
            sink.submit(RequestRecord.from_row(row))
        assert sink.force_flush(), "the exporters did not confirm"
        sink.close()
        assert receiver.logs_arrived.wait(patient(15))
    finally:
        collector.stop()
    assert len(receiver.logs) == len(rows)

    session = chdb_session.Session(str(tmp_path / "chdb"))
    try:
        for name in ("otel_logs.sql", "requests.sql"):
            for statement in _statements(ROOT / "deploy" / "clickhouse" / name):
                session.query(statement)
        inserted = [_otel_logs_row(*log) for log in receiver.logs]
        retried = inserted[:50]  # an exporter retrying a batch the server had taken
        for batch in (inserted, retried):
            lines = "\n".join(json.dumps(row) for row in batch)
            session.query(f"INSERT INTO otel_logs FORMAT JSONEachRow\n{lines}")

        def query(sql: str) -> list[list[Any]]:
            return list(json.loads(str(session.query(sql, "JSONCompact")))["data"])

        columns = [name for name, *_ in query("DESCRIBE TABLE headroom_requests")]
        assert tuple(columns) == FIELD_NAMES  # the requests columns, in order: a new field fails here
        assert query("SELECT count() FROM otel_logs") == [[len(rows) + len(retried)]]
        assert query("SELECT count(), uniqExact(request_id) FROM headroom_requests FINAL") == [
            [len(rows), len(rows)]
        ]
        click = query(
            "SELECT model, count(), quantilesExactInclusive(0.5, 0.95, 0.99)(ttft_s), sum(completion_tokens) "
            "FROM headroom_requests FINAL GROUP BY model ORDER BY model"
        )
        typed = json.loads(
            str(
                session.query(
                    f"SELECT * FROM headroom_requests FINAL WHERE request_id = '{rows[0]['request_id']}'",
                    "JSONEachRow",
                )
            )
        )
    finally:
        session.close()

    duck = RequestStore()
    duck.insert_rows(rows)
    ours = duck.query(
        "SELECT model, count(*), quantile_cont(ttft_s, [0.5, 0.95, 0.99]), sum(completion_tokens) "
        "FROM requests GROUP BY model ORDER BY model"
    )
    assert [(m, n, int(t)) for m, n, _, t in ours] == [(m, int(n), int(t)) for m, n, _, t in click]
    for (_, _, mine, _), (_, _, theirs, _) in zip(ours, click, strict=True):
        assert mine == pytest.approx(theirs, rel=1e-12, abs=1e-12)
    (first,) = duck.query_dicts("SELECT * FROM requests WHERE request_id = ?", [rows[0]["request_id"]])
    assert typed["stream"] is False and typed["error"] == "sidecar shut down" and typed["adapter"] == "lora-1"
    assert typed["ttft_s"] == first["ttft_s"] and typed["prompt_tokens"] == first["prompt_tokens"]
    admitted = datetime.fromisoformat(typed["admitted_at"]).replace(tzinfo=UTC)
    assert admitted == first["admitted_at"]
    duck.close()


def test_the_collector_recipe_sends_otlp_logs_to_clickhouses_otel_logs() -> None:
    import yaml

    config = yaml.safe_load((ROOT / "deploy" / "clickhouse" / "collector.yaml").read_text())
    logs = config["service"]["pipelines"]["logs"]
    assert logs["receivers"] == ["otlp"] and logs["exporters"] == ["clickhouse"]
    assert set(logs["processors"]) <= set(config["processors"])
    exporter = config["exporters"]["clickhouse"]
    assert exporter["logs_table_name"] == "otel_logs" and exporter["create_schema"] is True
    assert config["receivers"]["otlp"]["protocols"]["http"]["endpoint"].endswith(":4318")
