"""A finished request as sinks receive it: the row type, and the RowSink protocol they share.

When a request reaches its one terminal transition the sidecar's tracker turns it into a row (the
request-log columns of collector.store.schema, e.g. {"request_id": "…", "model": "m",
"outcome": "ok", "ttft_s": 0.21, ...}) and submits it to every RowSink it was given: the
request-log writer (collector.store.writer.LogWriter, in front of the in-process store or the
shipper to `headroom store`), the OpenTelemetry span exporter (collector.sidecar.otel.OtelSink),
or a MemorySink in a test. `Row` is named here only, so the row type can change in one place.

A Row is a dict of the columns and nothing else, so every sink that stores or ships it sees
exactly the schema; what only tracing reads (the trace context, the response's id, model and
finish reasons: collector.sidecar.tracecontext.Telemetry) rides beside the keys, as the
`telemetry` attribute, None unless tracing is on.
"""

from __future__ import annotations

from typing import Any, Protocol

__all__ = ["Row", "RowSink", "MemorySink"]

class Row(dict[str, Any]):
    """A finished request: request-log column -> value; `.telemetry` for the span sink only."""

    telemetry: Any = None


class RowSink(Protocol):
    """Where finished rows go. `submit` runs on the event loop: it must not block or raise."""

    def submit(self, row: Row) -> None:
        """Take one finished row (enqueue it; do the I/O elsewhere)."""

    def flush(self) -> bool:
        """Hand on every row submitted so far; False when that did not finish in time."""

    def close(self) -> None:
        """Flush, then release what the sink holds; called once, at the sidecar's shutdown."""


class MemorySink:
    """RowSink that keeps every row in `rows`: for tests and trials, like OTel's in-memory exporter."""

    def __init__(self) -> None:
        self.rows: list[Row] = []
        self.closed = False

    def submit(self, row: Row) -> None:
        """Append the row."""
        self.rows.append(row)

    def flush(self) -> bool:
        """Nothing is buffered: always True."""
        return True

    def close(self) -> None:
        """Mark the sink closed (rows stay readable)."""
        self.closed = True
