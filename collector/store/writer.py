"""LogWriter: the request log's RowSink. The proxy only enqueues; I/O happens in the writer's thread.

`submit(record)` appends to a bounded in-memory queue (called on the event loop: no lock, no
thread woken, about a tenth of a microsecond). A daemon thread wakes every `flush_interval_s`, or
as soon as `batch_rows` records are waiting, and writes what is queued in batches of up to
`max_batch_rows` to a BatchSink: the in-process RequestStore, or the lake's writer
(collector.lake.stage.LakeWriter). Waking on a timer rather than on each row matters twice: batches stay large under a
steady trickle (each INSERT has a fixed cost, a WAL sync included), and the proxy's thread never
hands the interpreter to the writer once per row. A full queue or a failing sink never stops the
proxy: the rows are counted in `headroom_log_rows_dropped_total{reason}`. `close()` writes every
queued row before returning (bounded by its timeout, so a stuck database cannot hang shutdown),
then closes the BatchSink when the writer owns it (`owns_sink`: whoever opened the sink handed it
over)."""

from __future__ import annotations

import collections
import enum
import logging
import threading
import time
from collections.abc import Sequence
from typing import Protocol

from prometheus_client import CollectorRegistry, Counter, Gauge

from collector.catalog import spec
from collector.record import RequestRecord

__all__ = ["BatchSink", "LogWriter", "RowsDropped"]

log = logging.getLogger(__name__)


class _Stop(enum.Enum):
    """The sentinel close() queues behind the last row."""

    STOP = enum.auto()


class BatchSink(Protocol):
    """Where batches of rows go. Raising means the batch (or `RowsDropped.count` of it) is lost.

    `write_batch` returns how many rows its destination accepted now, None meaning all of them;
    the LakeWriter returns 0 for a batch it spooled (those count once a staged file holds them).
    A sink that goes on working after write_batch returns (the LakeWriter's roller) also has
    `flush(timeout_s) -> bool`, which LogWriter.flush waits on.
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
        max_batch_rows: int | None = None,
    ) -> None:
        """`batch_rows` queued rows wake the writer; it writes what is queued in batches of up to
        `max_batch_rows` (default `batch_rows`). A writer that fell behind so catches up in few
        large batches where its sink takes them faster per row: DuckDB took 10 M-row-table
        appends of 50,000 rows at about 1.7x the rate of appends of 5,000 (BENCHMARKS.md §5h)."""
        self.sink, self.owns_sink = sink, owns_sink
        self.max_queue_rows, self.batch_rows = max_queue_rows, batch_rows
        self.max_batch_rows = max(batch_rows, max_batch_rows or batch_rows)
        self.flush_interval_s = flush_interval_s
        # records, flush markers, the stop sentinel; append and popleft are atomic under the GIL
        self._queue: collections.deque[RequestRecord | _Flush | _Stop] = collections.deque()
        self._wake = threading.Event()
        self.written = Counter(
            _name("headroom_log_rows_written_total"),
            spec("headroom_log_rows_written_total").help,
            registry=registry,
        )
        dropped = spec("headroom_log_rows_dropped_total")
        self.dropped = Counter(_name(dropped.name), dropped.help, dropped.labels, registry=registry)
        self._queue_full = self.dropped.labels("queue_full")
        depth = Gauge("headroom_log_queue_rows", spec("headroom_log_queue_rows").help, registry=registry)
        depth.set_function(self._queue.__len__)
        self._thread = threading.Thread(target=self._run, name="headroom-log-writer", daemon=True)
        self._closed = False
        self._thread.start()

    def submit(self, record: RequestRecord) -> None:
        """Enqueue one record without blocking; a full queue drops it (counted, reason queue_full)."""
        queued = len(self._queue)
        if queued >= self.max_queue_rows:
            self._queue_full.inc()
            return
        self._queue.append(record)
        if queued + 1 == self.batch_rows:  # a full batch is waiting: write it now
            self._wake.set()

    def flush(self, timeout_s: float = 30.0) -> bool:
        """Block until every row submitted before this call has been handed to the sink, and the
        sink has finished with it when it works behind write_batch (the LakeWriter's `flush`).

        Returns False when that did not happen within `timeout_s` (a stuck sink, or a closed
        writer with rows left), never raises.
        """
        if not self._thread.is_alive():
            return not self._queue
        marker = _Flush()
        self._queue.append(marker)
        self._wake.set()
        began = time.monotonic()
        if not marker.event.wait(timeout_s):
            return False
        sink_flush = getattr(self.sink, "flush", None)  # optional: only a sink that works behind has it
        return (
            True if sink_flush is None else bool(sink_flush(max(0.0, timeout_s - (time.monotonic() - began))))
        )

    def lost(self, reason: str, count: int) -> None:
        """Count `count` rows the sink lost after write_batch returned (e.g. the lake writer's)."""
        self.dropped.labels(reason).inc(count)

    def close(self, timeout_s: float = 60.0) -> None:
        """Write every queued row, then stop the thread; never blocks past `timeout_s`.

        Rows still queued when the time is up (a stuck sink) are lost and logged. Then an owned
        sink is closed. Safe to call twice.
        """
        if self._closed:
            return
        self._closed = True
        self._queue.append(_Stop.STOP)
        self._wake.set()
        self._thread.join(timeout_s)
        if self._thread.is_alive():
            log.error(
                "request-log writer did not finish within %.0f s; about %d queued rows are "
                "lost (is the database locked or its disk stuck?)",
                timeout_s,
                len(self._queue),
            )
        if self.owns_sink:
            self.sink.close()

    def _run(self) -> None:
        while True:
            self._wake.wait(self.flush_interval_s)
            self._wake.clear()
            if self._write_queued():
                return

    def _write_queued(self) -> bool:
        """Write what is queued now, max_batch_rows at a time; True once the stop sentinel came."""
        batch: list[RequestRecord] = []
        stopping = False
        while True:
            try:
                item = self._queue.popleft()
            except IndexError:
                self._write(batch)
                return stopping
            if item is _Stop.STOP:
                stopping = True  # and write whatever is still queued behind it
            elif isinstance(item, _Flush):
                self._write(batch)
                batch = []
                item.event.set()
            else:
                batch.append(item)
                if len(batch) >= self.max_batch_rows:
                    self._write(batch)
                    batch = []

    def _write(self, batch: list[RequestRecord]) -> None:
        if not batch:
            return
        try:
            accepted = self.sink.write_batch(batch)
        except RowsDropped as exc:
            lost = min(exc.count, len(batch))
            self.dropped.labels(exc.reason).inc(lost)
            self.written.inc(len(batch) - lost)
        except BaseException:  # a failing sink, whatever it raises, must never stop the writer
            if len(batch) > self.batch_rows:
                # A catch-up batch failed as a whole (one bad row, a full disk for a moment): retry
                # it batch_rows at a time, so one failure loses at most that many rows, not up to
                # max_batch_rows. Safe to resend: the store ignores a request_id it already holds.
                log.warning(
                    "request-log batch of %d rows failed; retrying it in batches of %d",
                    len(batch),
                    self.batch_rows,
                    exc_info=True,
                )
                for start in range(0, len(batch), self.batch_rows):
                    self._write(batch[start : start + self.batch_rows])
                return
            log.exception("request-log sink failed; %d rows dropped", len(batch))
            self.dropped.labels("db_error").inc(len(batch))
        else:
            self.written.inc(len(batch) if accepted is None else accepted)


def _name(counter_name: str) -> str:
    return counter_name.removesuffix("_total")
