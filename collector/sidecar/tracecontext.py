"""W3C trace context and the response facts a GenAI span needs, captured on the request path.

When tracing is on (an OtelSink is wired), each accounted request gets a `Telemetry` at admission:
the client's `traceparent` becomes the parent of the sidecar's span, and the engine receives a
`traceparent` naming that span, so the engine's own spans join the same trace (W3C Trace Context,
https://www.w3.org/TR/trace-context/). While the stream passes, the response's id, model and
finish reasons are noted from chunks the proxy parses anyway; no text is kept. At the terminal
transition the tracker hands the Telemetry to the OtelSink beside the frozen RequestRecord
(Tracker.add_span_sink); it never reaches the request log. What takes both is a `SpanSink`, wired
apart from the request log's RowSinks (collector.sidecar.app.SidecarParts.span_sinks).

    parse_traceparent("00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01")
        -> (0x4bf92f3577b34da6a3ce929d0e0e4736, 0x00f067aa0ba902b7, 1)
    Telemetry.start("00-4bf9...-00f0...-01").traceparent()
        -> "00-4bf92f3577b34da6a3ce929d0e0e4736-<this span's id>-01"
"""

from __future__ import annotations

import random
import re
from dataclasses import dataclass, field
from typing import Protocol

from collector.record import RequestRecord

__all__ = ["Telemetry", "SpanSink", "parse_traceparent", "TRACEPARENT"]

TRACEPARENT = "traceparent"
_TRACEPARENT = re.compile(r"^([0-9a-f]{2})-([0-9a-f]{32})-([0-9a-f]{16})-([0-9a-f]{2})(?:-.*)?$")
_random = random.Random()  # ids need uniqueness, not secrecy: the OTel SDK's generator does the same
MAX_FINISH_REASONS = 8  # n choices can each finish; a client asking n=10000 must not grow the span


def parse_traceparent(header: str | None) -> tuple[int, int, int] | None:
    """(trace id, parent span id, flags) of a valid version-00 traceparent, else None (then a new trace)."""
    if not header:
        return None
    match = _TRACEPARENT.match(header.strip().lower())
    if match is None or match.group(1) == "ff":
        return None
    version, trace_id, parent_id, flags = match.groups()
    if version == "00" and len(header.strip()) != 55:
        return None  # version 00 has no fields after the flags
    trace, parent = int(trace_id, 16), int(parent_id, 16)
    if trace == 0 or parent == 0:
        return None
    return trace, parent, int(flags, 16)


@dataclass(slots=True)
class Telemetry:
    """One request's trace context and the response facts its span reports."""

    trace_id: int
    span_id: int
    parent_span_id: int | None = None  # None: the sidecar's span is the root of a new trace
    flags: int = 1  # sampled
    response_id: str | None = None
    response_model: str | None = None
    finish_reasons: list[str] = field(default_factory=list)

    @classmethod
    def start(cls, traceparent: str | None) -> Telemetry:
        """Telemetry for a request that arrived with `traceparent` (or none: a new trace)."""
        parent = parse_traceparent(traceparent)
        span_id = _random.getrandbits(64) or 1
        if parent is None:
            return cls(trace_id=_random.getrandbits(128) or 1, span_id=span_id)
        trace_id, parent_span_id, flags = parent
        return cls(trace_id=trace_id, span_id=span_id, parent_span_id=parent_span_id, flags=flags & 0xFF)

    def traceparent(self) -> str:
        """The header the engine receives: this request's trace, with the sidecar's span as parent."""
        return f"00-{self.trace_id:032x}-{self.span_id:016x}-{self.flags:02x}"

    def note(self, response_id: object, model: object, finish_reason: object) -> None:
        """Keep the first id and model a chunk (or a whole answer) names, and each finish reason."""
        if self.response_id is None and isinstance(response_id, str):
            self.response_id = response_id[:128]
        if self.response_model is None and isinstance(model, str):
            self.response_model = model[:256]
        if isinstance(finish_reason, str) and len(self.finish_reasons) < MAX_FINISH_REASONS:
            self.finish_reasons.append(finish_reason[:32])

    def note_answer(self, payload: object) -> None:
        """The facts of one parsed stream chunk, or of a whole non-streamed JSON answer."""
        if not isinstance(payload, dict):
            return
        choices = payload.get("choices")
        reasons = (
            [c.get("finish_reason") for c in choices if isinstance(c, dict)]
            if isinstance(choices, list)
            else []
        )
        self.note(payload.get("id"), payload.get("model"), None)
        for reason in reasons:
            self.note(None, None, reason)


class SpanSink(Protocol):
    """Where finished requests go with their trace context and response facts: the span exporter
    (collector.sidecar.otel.OtelSink). Like a RowSink (collector.record), `submit` runs on the event
    loop and must not block or raise, and `close` is called once, at the sidecar's shutdown."""

    def submit(self, record: RequestRecord, telemetry: Telemetry | None) -> None:
        """Take one finished record and its request's Telemetry (None: the request had none)."""

    def flush(self) -> bool:
        """Hand on every span submitted so far; False when that did not finish in time."""

    def close(self) -> None:
        """Flush, then release what the sink holds."""
