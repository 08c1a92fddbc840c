"""StoreShipper: a BatchSink that POSTs request-log batches to `headroom store` without losing them.

Live batches (from the LogWriter's thread) go straight to the store as Arrow IPC streams
(`rows_to_ipc`: the store reads them without parsing a value, where a JSON body cost it more
to parse than DuckDB takes to insert it; BENCHMARKS.md §5e), with a few retries. When
the store stays unreachable the batch goes to a bounded on-disk spool, and while the store is
known to be down new batches join the spool at once (the writer thread never waits on a dead
store). A replay thread drains the spool concurrently with live shipping:

- **Live first, backlog beside it.** Once the store answers again, live batches go straight to
  it, and the replay thread sends the backlog, oldest first, in merged batches of up to
  `replay_batch_rows` rows (spooled payloads are joined byte for byte, never re-parsed). A
  merged batch costs one POST and one insert, so the drain outpaces the inflow it catches up
  with: at 5,000 rows per POST, a backlog of 100,000 rows is 20 POSTs. Arrow payloads merge
  record batch by record batch (their buffers are copied, no value is read); the JSON payloads
  an earlier version spooled (`.json` files) still replay, merged among themselves.
- **Back-pressure.** The spool is bounded (`max_spool_bytes`); a batch that does not fit is
  dropped and counted (RowsDropped "spool_full"). The store caps an ingest body at 64 MiB, so a
  merged batch stays under `replay_batch_bytes`.
- **Order.** Rows carry their own timestamps and ingest is idempotent by request_id, so live
  rows overtaking spooled ones, or a batch resent after a lost reply, change nothing.
- **Pipelined** (`pipelined=True`, the sidecar's): `write_batch` converts the batch and hands it
  to a sender thread, so the LogWriter converts the next batch while the store inserts this
  one; at most one batch waits behind the one being sent. What the sender's batches become is
  reported through `on_accepted` and `on_dropped` (`report_to(writer)` wires both), `flush()`
  waits for them, and `close()` sends what was handed over (or spools it) before returning.

Health metrics (collect()): headroom_log_spool_files, _bytes, _oldest_age_seconds,
headroom_log_rows_spooled_total, headroom_log_ship_lag_seconds (age of the oldest row the store
has not accepted: the oldest spooled batch, or a live batch being sent) and headroom_store_up.
Rows count as written (LogWriter's headroom_log_rows_written_total) only once the store accepts
them: `write_batch` returns how many it accepted now, `on_accepted` hears of the rest.

It lives with the store, not the sidecar, because both the sidecar (`headroom run --store-url`,
behind its LogWriter) and the probe (`headroom probe --store-url`) ship rows through it.
"""

from __future__ import annotations

import logging
import queue
import threading
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pyarrow as pa
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric

from collector.catalog import spec
from collector.record import RequestRecord
from collector.store.db import ARROW_STREAM_TYPE, rows_to_ipc
from collector.store.spool import ARROW, JSON, Spool, SpoolEntry
from collector.store.writer import LogWriter, RowsDropped

if TYPE_CHECKING:  # imported where used: a sidecar without --store-url never loads httpx (~10 MiB)
    import httpx

__all__ = ["StoreShipper", "DEFAULT_SPOOL_DIR", "merge_arrow_payloads", "merge_payloads"]

DEFAULT_SPOOL_DIR = "headroom-spool"  # beside the working directory, like the default headroom.duckdb

log = logging.getLogger(__name__)
_RETRYABLE = {408, 425, 429, 500, 502, 503, 504}
_NOT_YET = {401, 403}  # a token problem: keep the rows until the operator fixes it
_HEAD, _TAIL = b'{"rows":[', b"]}"


class _Rejected(Exception):
    """The store refused the payload itself (400/413/422): resending cannot help."""


_CONTENT_TYPES = {ARROW: ARROW_STREAM_TYPE, JSON: "application/json"}


def merge_payloads(payloads: Iterable[bytes]) -> bytes:
    """One ingest body from several JSON ones, joined as bytes: {"rows":[a]} + {"rows":[b,c]} ->
    {"rows":[a,b,c]}. (The JSON that versions before Arrow shipping spooled.)"""
    inner = [payload[len(_HEAD) : -len(_TAIL)] for payload in payloads]
    return _HEAD + b",".join(part for part in inner if part) + _TAIL


def merge_arrow_payloads(payloads: Iterable[bytes]) -> bytes:
    """One Arrow IPC stream holding every record batch of several, in order; raises
    pa.ArrowInvalid when one is not a stream or their schemas differ.

    Example: streams of 3 and 2 rows -> one stream of 5 rows (two record batches).
    """
    sink = pa.BufferOutputStream()
    writer: pa.ipc.RecordBatchStreamWriter | None = None
    schema: pa.Schema | None = None
    try:
        for payload in payloads:
            reader = pa.ipc.open_stream(payload)
            if writer is None:
                schema = reader.schema
                writer = pa.ipc.new_stream(sink, schema)
            elif not reader.schema.equals(schema):
                raise pa.ArrowInvalid("spooled Arrow payloads have different schemas")
            for batch in reader:
                writer.write_batch(batch)
    finally:
        if writer is not None:
            writer.close()
    return bytes(sink.getvalue().to_pybytes())


def _merged(entries: list[SpoolEntry], payloads: list[bytes]) -> tuple[bytes, str] | None:
    """One body for several entries of one kind, with its content type; None when they cannot merge."""
    kinds = {entry.kind for entry in entries}
    if len(entries) < 2 or len(kinds) != 1:
        return None
    if kinds == {ARROW}:
        try:
            return merge_arrow_payloads(payloads), ARROW_STREAM_TYPE
        except (pa.ArrowInvalid, OSError):
            return None  # one is not a stream: sent one by one, so only that one is lost
    if all(payload.startswith(_HEAD) and payload.endswith(_TAIL) for payload in payloads):
        return merge_payloads(payloads), _CONTENT_TYPES[JSON]
    return None


class StoreShipper:
    """POST batches to `<url>/v1/ingest` with a bearer token; spool to `spool_dir` when it fails."""

    def __init__(
        self,
        url: str,
        token: str | None,
        spool_dir: str | Path | None = None,
        *,
        max_spool_bytes: int = 256 * 2**20,
        max_attempts: int = 3,
        backoff_initial_s: float = 0.2,
        backoff_max_s: float = 10.0,
        timeout_s: float = 10.0,
        replay_batch_rows: int = 5_000,
        replay_batch_bytes: int = 8 * 2**20,
        transport: httpx.BaseTransport | None = None,
        pipelined: bool = False,
    ) -> None:
        if not url.startswith(("http://", "https://")):
            raise ValueError(
                f"store url {url!r} must start with http:// or https://, e.g. http://127.0.0.1:9200"
            )
        if not token:
            log.warning(
                "no store token given (--store-token or HEADROOM_TOKEN); the store will answer 401 "
                "and rows will wait in the spool"
            )
        self.ingest_url = url.rstrip("/") + "/v1/ingest"
        self.spool = Spool(spool_dir if spool_dir is not None else DEFAULT_SPOOL_DIR, max_spool_bytes)
        self.max_attempts, self.backoff_initial_s, self.backoff_max_s = (
            max_attempts,
            backoff_initial_s,
            backoff_max_s,
        )
        self.replay_batch_rows, self.replay_batch_bytes = replay_batch_rows, replay_batch_bytes
        headers = {"Authorization": f"Bearer {token or ''}"}
        import httpx  # lazily: only a process that ships rows loads it (~5 MiB with its CLI deps)

        # one client per thread: the writer's live sends and the replay never share a connection
        self._live = httpx.Client(timeout=timeout_s, transport=transport, headers=headers)
        self._backlog = httpx.Client(timeout=timeout_s, transport=transport, headers=headers)
        self.sent_rows = self.spooled_rows = self.replayed_rows = 0
        self.store_up: bool | None = None  # None until the first shipment
        # rows the store took after write_batch returned (from the spool, or sent behind it)
        self.on_accepted: Callable[[int], object] | None = None
        # rows lost after write_batch returned (pipelined): (reason, count)
        self.on_dropped: Callable[[str, int], object] | None = None
        self._sending_since_ns: int | None = None
        self._handoff: queue.Queue[tuple[bytes, int] | None] = queue.Queue(maxsize=1)
        self._unfinished = 0  # batches handed to the sender and not yet sent, spooled or dropped
        self._idle = threading.Condition()
        self._sender = (
            threading.Thread(target=self._send_loop, name="store-shipper-send", daemon=True)
            if pipelined
            else None
        )
        if self._sender is not None:
            self._sender.start()
        self._replay_lock = threading.Lock()
        self._stop = threading.Event()
        self._wake = threading.Event()
        self._thread = threading.Thread(target=self._replay_loop, name="store-shipper-replay", daemon=True)
        self._thread.start()

    # --- BatchSink -----------------------------------------------------------------------------
    def write_batch(self, rows: Sequence[RequestRecord | Mapping[str, Any]]) -> int:
        """Send `rows` now, or spool them; returns rows the store accepted (0 when spooled).

        Pipelined, a batch for a store not known to be down is handed to the sender instead
        (returns 0; on_accepted and on_dropped hear of it). Raises RowsDropped when the rows can
        be neither sent nor spooled here.
        """
        if not rows:
            return 0
        payload = rows_to_ipc(rows)  # a value that fits no column is sent as NULL, not its batch lost
        if self._sender is None or self.store_up is False:
            return self._ship(payload, len(rows))
        with self._idle:
            self._unfinished += 1
        self._handoff.put((payload, len(rows)))  # waits while one batch is sent and one waits
        return 0

    def report_to(self, writer: LogWriter) -> None:
        """Count what happens to rows after write_batch returned in `writer`'s metrics."""
        self.on_accepted = writer.written.inc
        self.on_dropped = writer.lost

    def flush(self, timeout_s: float = 30.0) -> bool:
        """Wait until every batch handed to the sender was sent, spooled or dropped; False on timeout."""
        with self._idle:
            return self._idle.wait_for(lambda: self._unfinished == 0, timeout_s)

    def close(self, timeout_s: float = 10.0) -> None:
        """Send (or spool) what was handed over, stop the replay thread after one last replay
        attempt; rows left stay on disk. Idempotent."""
        if self._stop.is_set():
            return
        self._stop.set()  # from here a failed send spools at once instead of backing off
        self._wake.set()
        if self._sender is not None:
            try:
                self._handoff.put(None, timeout=timeout_s)  # behind the batches already handed over
            except queue.Full:
                log.error("store shipper's sender is stuck; the batch it holds is lost")
            self._sender.join(timeout_s)
        self._thread.join(timeout_s)
        self.replay()
        self._live.close()
        self._backlog.close()

    def _ship(self, payload: bytes, rows: int) -> int:
        """Send one payload with retries, else spool it; rows accepted now. Raises RowsDropped."""
        if self.store_up is not False:  # up, or not known yet: try now
            self._sending_since_ns = time.time_ns()
            try:
                if self._send_with_retry(self._live, payload, ARROW_STREAM_TYPE):
                    self.sent_rows += rows
                    return rows
            except _Rejected as exc:
                raise RowsDropped("store_rejected", rows) from exc
            finally:
                self._sending_since_ns = None
        self._spool(payload, rows)
        return 0

    def _send_loop(self) -> None:
        while (item := self._handoff.get()) is not None:
            payload, rows = item
            try:
                accepted = self._ship(payload, rows)
                if accepted and self.on_accepted is not None:
                    self.on_accepted(accepted)
            except RowsDropped as exc:
                if self.on_dropped is not None:
                    self.on_dropped(exc.reason, exc.count)
            except Exception:  # whatever fails, the rows are counted and the sender goes on
                log.exception("shipping a request-log batch failed; %d rows dropped", rows)
                if self.on_dropped is not None:
                    self.on_dropped("db_error", rows)
            finally:
                with self._idle:
                    self._unfinished -= 1
                    self._idle.notify_all()

    # --- sending ---------------------------------------------------------------------------------
    def _post(self, client: httpx.Client, payload: bytes, content_type: str) -> bool:
        """One attempt: True accepted, False retry later; raises _Rejected when resending is useless."""
        import httpx  # lazily: only a process that ships rows loads it (~5 MiB with its CLI deps)

        try:
            response = client.post(self.ingest_url, content=payload, headers={"Content-Type": content_type})
        except httpx.HTTPError as exc:
            log.debug("store unreachable at %s: %s", self.ingest_url, type(exc).__name__)
            return self._store_answered(False)
        if response.status_code == 200:
            return self._store_answered(True)
        if response.status_code in _NOT_YET:
            if self.store_up is not False:
                log.error(
                    "store at %s refused the token (HTTP %s); spooling until it is fixed",
                    self.ingest_url,
                    response.status_code,
                )
            return self._store_answered(False)
        if response.status_code in _RETRYABLE:
            return self._store_answered(False)
        self._store_answered(True)
        raise _Rejected(f"HTTP {response.status_code}")

    def _store_answered(self, up: bool) -> bool:
        """Record the store's state; log the transitions only (one line per outage, not per batch)."""
        if up and self.store_up is False:
            log.warning("store at %s is back; replaying %d spooled rows", self.ingest_url, self.spool.rows())
        elif not up and self.store_up is not False:
            log.warning(
                "store at %s is unreachable; spooling rows to %s (bounded at %d MiB)",
                self.ingest_url,
                self.spool.directory,
                self.spool.max_bytes // 2**20,
            )
        self.store_up = up
        return up

    def _send_with_retry(self, client: httpx.Client, payload: bytes, content_type: str) -> bool:
        delay = self.backoff_initial_s
        for attempt in range(self.max_attempts):
            if self._post(client, payload, content_type):
                return True
            if attempt + 1 < self.max_attempts and self._stop.wait(delay):
                break
            delay = min(delay * 2, self.backoff_max_s)
        return False

    def _spool(self, payload: bytes, rows: int) -> None:
        if not self.spool.put(payload, rows, ARROW):
            raise RowsDropped("spool_full", rows)
        self.spooled_rows += rows
        self._wake.set()

    # --- replay ------------------------------------------------------------------------------------
    def replay(self) -> int:
        """Send the spool oldest first, in merged batches, until it is empty or a send fails.

        Returns the rows the store accepted. A merged batch the store rejects is resent file by
        file, so only a bad file is discarded.
        """
        delivered = 0
        with self._replay_lock:
            while entries := self.spool.take(self.replay_batch_rows, self.replay_batch_bytes):
                accepted = self._replay_entries(entries)
                if accepted is None:
                    break
                delivered += accepted
        return delivered

    def _replay_entries(self, entries: list[SpoolEntry]) -> int | None:
        """Send these entries as one body; rows accepted, or None when the store is not taking any."""
        payloads = [entry.path.read_bytes() for entry in entries]
        merged = _merged(entries, payloads)
        if merged is not None:
            try:
                if not self._post(self._backlog, *merged):
                    return None
                return self._accepted(entries)
            except _Rejected:
                pass  # one of them is bad: find it below
        accepted = 0
        for entry, payload in zip(entries, payloads):
            try:
                if not self._post(self._backlog, payload, _CONTENT_TYPES[entry.kind]):
                    return accepted or None
                accepted += self._accepted([entry])
            except _Rejected as exc:
                log.error("store rejected spooled batch %s (%s); discarding it", entry.path.name, exc)
                self.spool.remove([entry])
        return accepted

    def _accepted(self, entries: list[SpoolEntry]) -> int:
        rows = sum(entry.rows for entry in entries)
        self.spool.remove(entries)
        self.replayed_rows += rows
        if self.on_accepted is not None:
            self.on_accepted(rows)
        return rows

    def _replay_loop(self) -> None:
        delay = self.backoff_initial_s
        while not self._stop.is_set():
            if not len(self.spool):
                self._wake.wait(5.0)
                self._wake.clear()
                delay = self.backoff_initial_s
                continue
            self.replay()
            if not len(self.spool):
                continue
            if self._stop.wait(delay):
                break
            delay = min(delay * 2, self.backoff_max_s)

    # --- metrics ----------------------------------------------------------------------------------
    def collect(self) -> Iterable[Metric]:
        """The shipping-health families (a prometheus_client collector; see the module docstring)."""
        now_ns = time.time_ns()
        oldest = self.spool.oldest_ns()
        sending = self._sending_since_ns
        waiting = [t for t in (oldest, sending) if t is not None]
        yield _gauge("headroom_log_spool_files", len(self.spool))
        yield _gauge("headroom_log_spool_bytes", self.spool.size_bytes())
        yield _gauge(
            "headroom_log_spool_oldest_age_seconds",
            0.0 if oldest is None else max(0.0, (now_ns - oldest) / 1e9),
        )
        yield _gauge(
            "headroom_log_ship_lag_seconds", max(0.0, (now_ns - min(waiting)) / 1e9) if waiting else 0.0
        )
        spooled = spec("headroom_log_rows_spooled_total")
        counter = CounterMetricFamily(spooled.name, spooled.help)
        counter.add_metric([], self.spooled_rows)
        yield counter
        if self.store_up is not None:
            yield _gauge("headroom_store_up", 1.0 if self.store_up else 0.0)


def _gauge(name: str, value: float) -> GaugeMetricFamily:
    entry = spec(name)
    return GaugeMetricFamily(entry.name, entry.help, value=value)
