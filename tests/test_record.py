"""The request record is declared once: the DuckDB table, the ingest parser, the JSON a client sends and
the span mapping all follow its fields, and the shared rules (outcome, TPOT, tokens) have one home."""

from __future__ import annotations

import dataclasses
from datetime import UTC, datetime

import orjson
import pytest
from fastapi import HTTPException

from collector.inflight import Inflight
from collector.record import FIELD_NAMES, RequestRecord, outcome_for_status, time_per_output_token
from collector.service.ingest import parse_batch
from collector.sidecar.otel import ROW_ATTRIBUTES
from collector.store.db import RequestStore
from collector.store.schema import COLUMNS
from collector.tokens import estimate_tokens

T0 = datetime(2026, 3, 2, 10, 0, 0, 123456, tzinfo=UTC)
FULL = RequestRecord(
    request_id="r-1",
    source="traffic",
    run_id="run",
    instance="i",
    model="m",
    tenant="t",
    endpoint="/v1/chat/completions",
    stream=True,
    admitted_at=T0,
    first_byte_at=T0,
    first_token_at=T0,
    completed_at=T0,
    status_code=200,
    outcome="ok",
    error="e",
    prompt_tokens=2**31 - 1,
    cached_prompt_tokens=3,
    completion_tokens=4,
    max_tokens=5,
    usage_source="upstream",
    ttft_s=0.25,
    tpot_s=0.5,
    e2e_s=1.0,
    inflight_at_admit=6,
    active_tokens_at_admit=2**40,
    engine_waiting_at_admit=7,
    kv_usage_at_admit=0.5,
    upstream_retries=1,
    task_class="short",
    adapter="sql-lora",
    probe_level=8,
    probe_rate_per_s=2.5,
    probe_warmup=False,
    replica_class="slots8",
    client_request_id="req-42",
    failure="reset",
    held_prompt_tokens=110,
    held_generated_tokens=52,
    slo_ttft_s=2.0,
    slo_tpot_s=0.1,
    slo_e2e_s=60.0,
    verdict="met",
    engine_timings="llamacpp",
    engine_queue_s=0.01,
    engine_prefill_s=0.0885,
    engine_decode_s=10.65,
    engine_prompt_computed=34,
    engine_prompt_cached=1,
    engine_generated=300,
    sidecar_hop_s=0.0004,
    ttst_s=0.14,
    itl_max_s=0.09,
    output_short=False,
)


def test_every_field_of_the_full_record_is_set():
    assert all(getattr(FULL, name) is not None for name in FIELD_NAMES)


def test_the_duckdb_table_is_the_record():
    store = RequestStore(":memory:")
    described = store.query(
        "SELECT column_name, data_type FROM information_schema.columns "
        "WHERE table_name = 'requests' ORDER BY ordinal_position"
    )
    expected = {
        name: sql.split()[0].replace("TIMESTAMPTZ", "TIMESTAMP WITH TIME ZONE") for name, sql in COLUMNS
    }
    # migrations append columns, so the file's order is the order they were added in
    assert dict(described) == expected and list(expected) == list(FIELD_NAMES)


def test_a_record_survives_json_the_ingest_parser_and_duckdb():
    (parsed,) = parse_batch(orjson.dumps({"rows": [FULL]}))  # what a client of /v1/ingest sends
    assert parsed == FULL
    store = RequestStore(":memory:")
    assert store.insert_rows([parsed]) == 1
    (stored,) = store.query_dicts("SELECT * FROM requests")
    assert RequestRecord.from_row(stored) == FULL


@pytest.mark.parametrize(
    ("column", "value"),
    [
        ("prompt_tokens", 2**31),
        ("prompt_tokens", "7"),
        ("prompt_tokens", True),
        ("stream", 1),
        ("ttft_s", "0.2"),
        ("active_tokens_at_admit", 2**63),
        ("model", 5),
        ("error", "x" * 5000),
        ("admitted_at", "yesterday"),
    ],
)
def test_the_ingest_parser_refuses_what_the_field_cannot_hold(column, value):
    with pytest.raises(HTTPException) as raised:
        parse_batch(orjson.dumps({"rows": [{"request_id": "a", column: value}]}))
    assert raised.value.status_code == 400 and column in raised.value.detail


def test_the_ingest_parser_accepts_exactly_the_record_fields():
    with pytest.raises(HTTPException, match="unknown column"):
        parse_batch(b'{"rows":[{"request_id":"a","prompt_text":"x"}]}')
    (minimal,) = parse_batch(b'{"rows":[{"request_id":"a","ttft_s":1}]}')
    assert minimal == RequestRecord("a", ttft_s=1.0)


def test_span_attributes_name_record_fields():
    assert {name for _, name in ROW_ATTRIBUTES} <= set(FIELD_NAMES)


def test_record_is_frozen_and_slotted():
    with pytest.raises(dataclasses.FrozenInstanceError):
        FULL.outcome = "timeout"  # type: ignore[misc]
    assert not hasattr(FULL, "__dict__")


@pytest.mark.parametrize(
    ("status", "outcome"),
    [
        (200, "ok"),
        (400, "bad_request"),
        (404, "bad_request"),
        (429, "rate_limited"),
        (500, "upstream_error"),
        (502, "upstream_error"),
        (503, "overloaded"),
        (504, "upstream_error"),
    ],
)
def test_outcome_for_status(status, outcome):
    assert outcome_for_status(status) == outcome


def test_tpot_only_above_one_token():
    assert time_per_output_token(2.1, 0.1, 101) == pytest.approx(0.02)
    assert time_per_output_token(2.1, 0.1, 1) is None
    assert time_per_output_token(2.1, None, 101) is None


@pytest.mark.parametrize(
    ("text", "tokens"), [("", 0), ("a", 1), ("abcdefg", 1), ("abcdefgh", 2), ("hello world!", 3)]
)
def test_token_estimate_rounds_down_with_at_least_one(text, tokens):
    assert estimate_tokens(text) == tokens


def test_inflight_counts_both_calibers_and_their_integral():
    load = Inflight()
    assert load.admit(100) == (1, 100)
    load.generated(5)
    assert load.admit(50) == (2, 155)
    load.release(105)
    assert (load.requests, load.tokens) == (1, 50) and load.area() > 0
