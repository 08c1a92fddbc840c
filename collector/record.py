"""A finished request as every consumer receives it: the record type, its derivations, RowSink.

`RequestRecord` is declared once, here: the request-log columns (collector.store.schema derives
the DuckDB table from its fields), the store's ingest parser, the probe's and
the synthetic rows and the OpenTelemetry span all follow its fields. When a request reaches its
one terminal transition the sidecar's tracker builds one record and submits it to every RowSink
(the request-log writer, collector.store.writer.LogWriter, or a MemorySink in a test) and, with
the request's trace context beside it, to every SpanSink (collector.sidecar.tracecontext: the span
exporter, collector.sidecar.otel.OtelSink).

Beside it live the two derivations every producer of records shares: the outcome of an HTTP
status (`outcome_for_status`) and TPOT (`time_per_output_token`).
"""

from __future__ import annotations

import typing
from collections.abc import Mapping
from dataclasses import dataclass, field, fields
from datetime import datetime
from typing import Any, Protocol

__all__ = [
    "RequestRecord",
    "FIELD_NAMES",
    "Row",
    "RowSink",
    "MemorySink",
    "OUTCOMES",
    "LOAD_SHEDDING",
    "outcome_for_status",
    "time_per_output_token",
    "field_types",
    "INT64_FIELDS",
]

Row = Mapping[str, Any]  # a record as column -> value, as DuckDB and the analysis read it

OUTCOMES = (
    "ok",
    "rate_limited",
    "overloaded",
    "client_cancelled",
    "upstream_error",
    "timeout",
    "bad_request",
)
LOAD_SHEDDING = ("rate_limited", "overloaded")  # 429 and 503: errors, and capacity evidence

_WIDE = {"bits": 64}  # field metadata: a count that may pass 2**31 (a BIGINT column)


@dataclass(frozen=True, slots=True)
class RequestRecord:
    """One finished request: counts and times, never text. Field order is the column order."""

    request_id: str
    source: str | None = None  # 'traffic' or 'probe'
    run_id: str | None = None
    instance: str | None = None
    model: str | None = None
    tenant: str | None = None
    endpoint: str | None = None
    stream: bool | None = None
    admitted_at: datetime | None = None
    first_byte_at: datetime | None = None
    first_token_at: datetime | None = None
    completed_at: datetime | None = None
    status_code: int | None = None
    outcome: str | None = None  # one of OUTCOMES
    error: str | None = None  # a short reason of ours, never upstream or client bytes
    prompt_tokens: int | None = None
    cached_prompt_tokens: int | None = None
    completion_tokens: int | None = None
    max_tokens: int | None = None
    usage_source: str | None = None  # 'upstream' or 'estimated'
    ttft_s: float | None = None
    tpot_s: float | None = None
    e2e_s: float | None = None
    inflight_at_admit: int | None = None
    active_tokens_at_admit: int | None = field(default=None, metadata=_WIDE)
    engine_waiting_at_admit: int | None = None
    kv_usage_at_admit: float | None = None
    upstream_retries: int | None = None
    task_class: str | None = None  # collector.tasks: short, medium, long, or a probe workload's name
    adapter: str | None = None  # the LoRA adapter the request named (`model` is then its base model)
    # what a `headroom probe` request measured (its X-Headroom-Probe-* headers; None for traffic):
    # the closed-loop concurrency level, or the open-loop offered rate, and whether it warmed up
    probe_level: int | None = None
    probe_rate_per_s: float | None = None
    probe_warmup: bool | None = None
    # the replica class of the engine that served it (the sidecar's --replica-class or the derived
    # one; None while undecided): the review plans per class from it
    replica_class: str | None = None
    # the client's own id for the request (its X-Request-Id, bounded and sanitised; None when it
    # sent none or one the sidecar refused): a correlation id only, never unique. `request_id`
    # stays the sidecar's own, the row's key, so two clients sending one id never collide
    client_request_id: str | None = None
    # how an exchange failed where no upstream status says so (reset, truncated, truncated_event,
    # bad_encoding, read_timeout, ...: collector.sidecar.ending.FAILURES); None for every answer
    # the upstream completed. The outcome stays upstream_error or timeout (the SLO's errors)
    failure: str | None = None
    # what headroom_active_tokens held for it, in the sidecar's own count: the prompt estimate added
    # at admission and the tokens counted while relaying (usage may later say otherwise in
    # prompt_tokens / completion_tokens). The token capacity is computed in these units
    # (collector.analysis.token_knee), so it divides the gauge like for like. None: not a sidecar row
    held_prompt_tokens: int | None = None
    held_generated_tokens: int | None = None
    # goodput (collector.goodput): the bounds this request was judged by (the sidecar's SLO,
    # narrowed by the request's own SLO headers) and its verdict (met, missed, shed, aborted,
    # error, invalid); None: a row the sidecar did not judge (probe load, or written before)
    slo_ttft_s: float | None = None
    slo_tpot_s: float | None = None
    slo_e2e_s: float | None = None
    verdict: str | None = None
    # the engine's own account (collector.engine_timings): its shape ('llamacpp', 'vllm'), its
    # queue (llama.cpp does not report one: TTFT less the hop and the prefill), prefill and decode
    # seconds, and the prompt tokens it computed and read from its prefix cache; None: not said
    engine_timings: str | None = None
    engine_queue_s: float | None = None
    engine_prefill_s: float | None = None
    engine_decode_s: float | None = None
    engine_prompt_computed: int | None = None
    engine_prompt_cached: int | None = None
    engine_generated: int | None = None
    # the sidecar's own hop before the engine: admission to the request written upstream
    sidecar_hop_s: float | None = None
    # what load tools report beside TTFT: time to the second token-carrying read, and the longest
    # gap between two such reads (the stall a reader saw); None below two such reads
    ttst_s: float | None = None
    itl_max_s: float | None = None
    # it asked for exactly max_tokens (`ignore_eos`, as load tools do) and got fewer; None: it did
    # not ask, or was not answered
    output_short: bool | None = None

    def as_row(self) -> dict[str, Any]:
        """The record as {column: value} in column order, e.g. for the analysis or a test."""
        return {name: getattr(self, name) for name in FIELD_NAMES}

    @classmethod
    def from_row(cls, row: Row) -> RequestRecord:
        """A record from a {column: value} mapping; missing columns are None, unknown ones raise."""
        return cls(**row)


FIELD_NAMES: tuple[str, ...] = tuple(f.name for f in fields(RequestRecord))
INT64_FIELDS = frozenset(f.name for f in fields(RequestRecord) if f.metadata.get("bits") == 64)


def field_types() -> dict[str, type]:
    """{field: its Python type without None}, e.g. {'request_id': str, 'stream': bool, ...}."""
    hints = typing.get_type_hints(RequestRecord)
    return {
        name: next(t for t in typing.get_args(hints[name]) or (hints[name],) if t is not type(None))
        for name in FIELD_NAMES
    }


def outcome_for_status(status: int) -> str:
    """Outcome of a request the upstream answered with `status`, e.g. 429 -> 'rate_limited'.

    503 is `overloaded`: an engine shedding load (vLLM's --max-num-queued-reqs) or a gateway with
    no healthy engine behind it. 429 and 503 together are load shedding; both count as errors.
    """
    if status == 429:
        return "rate_limited"
    if status == 503:
        return "overloaded"
    if status >= 500:
        return "upstream_error"
    if status >= 400:
        return "bad_request"
    return "ok"


def time_per_output_token(e2e_s: float, ttft_s: float | None, completion_tokens: int | None) -> float | None:
    """TPOT = (e2e - TTFT) / (completion tokens - 1); None without a TTFT or above one token only.

    Example: e2e 2.1 s, TTFT 0.1 s, 101 tokens -> 0.02 s.
    """
    if ttft_s is None or completion_tokens is None or completion_tokens <= 1:
        return None
    return (e2e_s - ttft_s) / (completion_tokens - 1)


class RowSink(Protocol):
    """Where finished records go. `submit` runs on the event loop: it must not block or raise."""

    def submit(self, record: RequestRecord) -> None:
        """Take one finished record (enqueue it; do the I/O elsewhere)."""

    def flush(self) -> bool:
        """Hand on every record submitted so far; False when that did not finish in time."""

    def close(self) -> None:
        """Flush, then release what the sink holds; called once, at the sidecar's shutdown."""


class MemorySink:
    """RowSink that keeps every record in `rows`: for tests and trials, like OTel's in-memory exporter."""

    def __init__(self) -> None:
        self.rows: list[RequestRecord] = []
        self.closed = False

    def submit(self, record: RequestRecord) -> None:
        """Append the record."""
        self.rows.append(record)

    def flush(self) -> bool:
        """Nothing is buffered: always True."""
        return True

    def close(self) -> None:
        """Mark the sink closed (records stay readable)."""
        self.closed = True
