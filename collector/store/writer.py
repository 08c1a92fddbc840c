"""LogWriter: the request log's RowSink. The proxy only enqueues; I/O happens in the writer's thread.

`submit(row)` is a non-blocking put into a bounded queue (called on the event loop). A daemon
thread drains the queue in batches (up to `batch_rows`, or whatever arrived within
`flush_interval_s`) into a BatchSink: the in-process RequestStore, or the StoreShipper to the
store service. A full queue or a failing sink never stops the proxy: the rows are counted in
`headroom_log_rows_dropped_total{reason}`. `close()` flushes every queued row before returning
(bounded by its timeout, so a stuck database cannot hang shutdown), then closes the BatchSink
when the writer owns it (`owns_sink`: whoever opened the sink handed it over)."""

from __future__ import annotations

import logging
import queue
import threading
import time
from collections.abc import Sequence
from typing import Protocol

from prometheus_client import CollectorRegistry, Counter, Gauge

from collector.catalog import spec
from collector.record import RequestRecord

__all__ = ["BatchSink", "LogWriter", "RowsDropped"]

log = logging.getLogger(__name__)
_STOP = object()


class BatchSink(Protocol):
    """Where batches of rows go. Raising means the batch (or `RowsDropped.count` of it) is lost.

    `write_batch` returns how many rows its destination accepted now, None meaning all of them;
    the StoreShipper returns 0 for a batch it spooled (those count once the store accepts them).
    """

    def write_batch(self, rows: Sequence[RequestRecord]) -> int | None: ...

    def close(self) -> None: ...


class RowsDropped(Exception):
    """A sink lost `count` rows for `reason` (e.g. 'spool_full'); the rest were kept."""

    def __init__(self, reason: str, count: int) -> None:
        super().__init__(f"{count} request-log rows dropped: {reason}")
        self.reason, self.count = reason, count


class _Flush:
    __slots__ = ("event",)

    def __init__(self) -> None:
        self.event = threading.Event()


class LogWriter:
    """RowSink: bounded queue + one writer thread + pipeline-health metrics, in front of a BatchSink."""

    def __init__(
        self,
        sink: BatchSink,
        registry: CollectorRegistry | None = None,
        *,
        max_queue_rows: int = 50_000,
        batch_rows: int = 1_000,
        flush_interval_s: float = 0.5,
        owns_sink: bool = False,
    ) -> None:
        self.sink, self.owns_sink = sink, owns_sink
        self.batch_rows, self.flush_interval_s = batch_rows, flush_interval_s
        self._queue: queue.Queue = queue.Queue(maxsize=max_queue_rows)
        self.written = Counter(
            _name("headroom_log_rows_written_total"),
            spec("headroom_log_rows_written_total").help,
            registry=registry,
        )
        dropped = spec("headroom_log_rows_dropped_total")
        self.dropped = Counter(_name(dropped.name), dropped.help, dropped.labels, registry=registry)
        depth = Gauge("headroom_log_queue_rows", spec("headroom_log_queue_rows").help, registry=registry)
        depth.set_function(self._queue.qsize)
        self._thread = threading.Thread(target=self._run, name="headroom-log-writer", daemon=True)
        self._closed = False
        self._thread.start()

    def submit(self, record: RequestRecord) -> None:
        """Enqueue one record without blocking; a full queue drops it (counted, reason queue_full)."""
        try:
            self._queue.put_nowait(record)
        except queue.Full:
            self.dropped.labels("queue_full").inc()

    def flush(self, timeout_s: float = 30.0) -> bool:
        """Block until every row submitted before this call has been handed to the sink.

        Returns False when that did not happen within `timeout_s` (a stuck sink, a full queue,
        or a closed writer with rows left), never raises.
        """
        if not self._thread.is_alive():
            return self._queue.empty()
        deadline = time.monotonic() + timeout_s
        marker = _Flush()
        try:
            self._queue.put(marker, timeout=timeout_s)
        except queue.Full:
            return False
        return marker.event.wait(max(0.0, deadline - time.monotonic()))

    def close(self, timeout_s: float = 60.0) -> None:
        """Write every queued row, then stop the thread; never blocks past `timeout_s`.

        Rows still queued when the time is up (a stuck sink) are lost and logged. Then an owned
        sink is closed. Safe to call twice.
        """
        if self._closed:
            return
        self._closed = True
        deadline = time.monotonic() + timeout_s
        try:
            self._queue.put(_STOP, timeout=timeout_s)
        except queue.Full:
            pass
        self._thread.join(max(0.0, deadline - time.monotonic()))
        if self._thread.is_alive():
            log.error(
                "request-log writer did not finish within %.0f s; about %d queued rows are "
                "lost (is the database locked or its disk stuck?)",
                timeout_s,
                self._queue.qsize(),
            )
        if self.owns_sink:
            self.sink.close()

    def _run(self) -> None:
        stopping = False
        while not stopping:
            batch, markers, stopping = self._collect()
            self._write(batch)
            for marker in markers:
                marker.event.set()

    def _collect(self) -> tuple[list[RequestRecord], list[_Flush], bool]:
        """Wait for a first item, then take what else is queued up to the batch size."""
        batch: list[RequestRecord] = []
        markers: list[_Flush] = []
        try:
            item = self._queue.get(timeout=self.flush_interval_s)
        except queue.Empty:
            return batch, markers, False
        while True:
            if item is _STOP:
                return batch + self._drain(markers), markers, True
            if isinstance(item, _Flush):
                markers.append(item)
                return batch, markers, False
            batch.append(item)
            if len(batch) >= self.batch_rows:
                return batch, markers, False
            try:
                item = self._queue.get_nowait()
            except queue.Empty:
                return batch, markers, False

    def _drain(self, markers: list[_Flush]) -> list[RequestRecord]:
        rest: list[RequestRecord] = []
        while True:
            try:
                item = self._queue.get_nowait()
            except queue.Empty:
                return rest
            if isinstance(item, _Flush):
                markers.append(item)
            elif item is not _STOP:
                rest.append(item)

    def _write(self, batch: list[RequestRecord]) -> None:
        for start in range(0, len(batch), self.batch_rows):
            part = batch[start : start + self.batch_rows]
            try:
                accepted = self.sink.write_batch(part)
            except RowsDropped as exc:
                lost = min(exc.count, len(part))
                self.dropped.labels(exc.reason).inc(lost)
                self.written.inc(len(part) - lost)
            except BaseException:  # a failing sink, whatever it raises, must never stop the writer
                log.exception("request-log sink failed; %d rows dropped", len(part))
                self.dropped.labels("db_error").inc(len(part))
            else:
                self.written.inc(len(part) if accepted is None else accepted)


def _name(counter_name: str) -> str:
    return counter_name.removesuffix("_total")
