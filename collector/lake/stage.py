"""LakeWriter: `headroom run --lake URI`, the sidecar's rows as immutable Parquet files in a lake.

The LogWriter hands each batch to `write_batch`, which appends it to the spool (collector.store.spool: bounded,
on disk, one Arrow IPC file per batch, written atomically and fsynced, one owning process per
directory) and returns: the spool is the write-ahead buffer, so a row is on disk within the
writer's 0.5 s of its request ending, whatever the lake is doing. A roller thread turns the spool
into staged Parquet files when the oldest spooled batch is `roll_seconds` old, or the spool holds
`roll_bytes`, or at shutdown:

    1. plan     `lake-plan.json` (atomic) names the spool files taken and the first sequence number
    2. write    the batches, merged, split by UTC day of admitted_at (an Iceberg day partition
                needs one day per file), sorted by admitted_at: one file per day, numbered from
                the plan's sequence, staged/<writer>/<writer>-<seq>.parquet (a local lake writes
                a synced temporary and links it to its name; an object store's PUT is atomic)
    3. state    `lake-state.json` (atomic): the next sequence number
    4. forget   the spool files, then the plan

A staged name is never written twice: a name that exists already is left as it is, and when it
holds other bytes the file goes to the next free sequence. So a crash anywhere is repaired at the
next roll from the plan (same spool files, same bytes: a file written before the crash is found
identical and kept), and a sequence that went backwards (a state file rolled back) moves forward
past what the lake holds; the first roll of a process also starts past the unbroken run of files
staged for its writer from its saved sequence on (a stray name far ahead never moves it). A spool file that cannot be read is moved to the spool's `quarantine/`
(one WARNING naming it, `headroom_log_spool_quarantined_total`); one of an older or newer
version is read through `conform`.

Serve first: nothing here stops the sidecar from starting except a malformed --lake URI or a
spool another process owns. The lake is opened by the roller: an unreachable store or an
unwritable lake sets `headroom_log_sink_up` to 0 with one WARNING, rows stay spooled, and the
roller retries with backoff. A spool volume that refuses a write (full, read-only) does the same;
its rows wait in memory (up to `max_held_bytes`) until the volume takes them again. The gauge's
`reason` label says why (collector.catalog.SINK_REASONS): ok, or unreachable, unwritable,
lake_error (`lake_reason`), disk_full, spool_error (`drop_reason`); one series at a time. Rows are lost
only past a bound, counted in `headroom_log_rows_dropped_total{reason}`: `spool_full` (the spool's
cap), `disk_full` (the volume is full), `spool_error` (the volume refuses writes otherwise).

No catalog, no token and no pyiceberg: the committer (`headroom lake commit`) registers the files.
"""

from __future__ import annotations

import contextlib
import errno
import io
import json
import logging
import os
import secrets
import threading
import time
from collections import deque
from collections.abc import Callable, Iterable, Iterator, Sequence
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.fs as pafs
import pyarrow.parquet as pq
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric

from collector.catalog import SINK_REASONS, spec
from collector.lake.layout import (
    STAGED,
    Lake,
    check_lake_uri,
    parse_staged,
    read_removed_mark,
    safe_writer_part,
    staged_name,
)
from collector.record import RequestRecord
from collector.store.arrow import ARROW_SCHEMA, rows_to_ipc  # no DuckDB: tests/test_slim_fleet.py
from collector.store.spool import Spool, SpoolEntry, sync_directory, write_atomic, write_temporary
from collector.store.writer import LogWriter, RowsDropped

__all__ = [
    "LakeWriter",
    "SinkFault",
    "DEFAULT_ROLL_SECONDS",
    "DEFAULT_ROLL_BYTES",
    "DEFAULT_SPOOL_BYTES",
    "DEFAULT_HELD_BYTES",
    "DEFAULT_SPOOL_DIR",
    "PARQUET_OPTIONS",
    "day_files",
    "conform",
    "parquet_bytes",
    "drop_reason",
    "lake_reason",
]

log = logging.getLogger(__name__)

DEFAULT_ROLL_SECONDS = 60.0  # freshness: a row is staged at most this long after it was spooled
DEFAULT_ROLL_BYTES = 64 * 2**20  # Arrow IPC spooled before a roll (Parquet with zstd: a fifth of it)
DEFAULT_SPOOL_BYTES = 1024 * 2**20  # the write-ahead buffer, and what an outage of the lake can hold
DEFAULT_HELD_BYTES = 64 * 2**20  # rows held in memory while the spool's volume refuses writes
DEFAULT_SPOOL_DIR = "headroom-spool"  # beside the working directory, like the default headroom.duckdb
# Fixed writer options: the same table gives the same bytes (a retried write is identical).
PARQUET_OPTIONS: dict[str, Any] = {
    "compression": "zstd",
    "row_group_size": 128 * 1024,
    "write_statistics": True,
    "use_dictionary": True,
}
_PLAN, _STATE = "lake-plan.json", "lake-state.json"
_FULL = (errno.ENOSPC, errno.EDQUOT, errno.EFBIG)
_REFUSED = (errno.EACCES, errno.EPERM, errno.EROFS, errno.ENOTDIR, errno.EISDIR, errno.EEXIST, *_FULL)
_AWAY = (
    errno.ECONNREFUSED,
    errno.ECONNRESET,
    errno.ECONNABORTED,
    errno.EHOSTUNREACH,
    errno.ENETUNREACH,
    errno.ENETDOWN,
    errno.ETIMEDOUT,
)
# What the object stores' clients say (pyarrow raises a bare OSError with the SDK's text), e.g.
# "AWS Error NETWORK_CONNECTION during HeadBucket operation: curlCode: 7, Could not connect to server".
_AWAY_TEXT = (
    "NETWORK_CONNECTION",
    "could not connect",
    "couldn't connect",
    "could not resolve",
    "connection refused",
    "timed out",
    "cannot reach its store",  # Lake.parse
    "UNAVAILABLE",
)
_REFUSED_TEXT = ("ACCESS_DENIED", "AccessDenied", "PERMISSION_DENIED", "permission denied", "forbidden")


def day_files(table: pa.Table) -> list[pa.Table]:
    """Rows split by UTC day of admitted_at, each sorted by admitted_at, days in order (NULLs last).

    Example: rows of 2026-03-01 and 2026-03-02 -> two tables, the 1st's rows then the 2nd's.
    """
    if table.num_rows == 0:
        return []
    days = pc.floor_temporal(table["admitted_at"], unit="day")
    keyed = table.append_column("__day", days)
    keyed = keyed.sort_by([("__day", "ascending"), ("admitted_at", "ascending"), ("request_id", "ascending")])
    found = pc.unique(keyed["__day"]).to_pylist()
    out = []
    for day in found:
        mask = (
            pc.is_null(keyed["__day"])
            if day is None
            else pc.equal(keyed["__day"], pa.scalar(day, keyed["__day"].type))
        )
        out.append(keyed.filter(mask).drop_columns(["__day"]))
    return out


def parquet_bytes(table: pa.Table) -> bytes:
    """A table as one Parquet file's bytes, with the fixed options (deterministic for equal input)."""
    sink = io.BytesIO()
    pq.write_table(table.cast(ARROW_SCHEMA), sink, **PARQUET_OPTIONS)
    return sink.getvalue()


class SinkFault(Exception):
    """One side of the lake's sink failed: `side` is "lake" (the store) or "spool" (its volume)."""

    def __init__(self, side: str, cause: BaseException) -> None:
        super().__init__(f"{side}: {cause}")
        self.side, self.cause = side, cause


@contextlib.contextmanager
def _side(side: str) -> Iterator[None]:
    """Turn what the filesystem raises inside the block into a SinkFault of `side`."""
    try:
        yield
    except SinkFault:
        raise
    except (OSError, ValueError) as exc:
        raise SinkFault(side, exc) from exc


def drop_reason(exc: BaseException) -> str:
    """The dropped-rows reason for a spool write that failed: disk_full or spool_error."""
    return "disk_full" if isinstance(exc, OSError) and exc.errno in _FULL else "spool_error"


def lake_reason(exc: BaseException) -> str:
    """headroom_log_sink_up's reason for what the lake raised: unreachable, unwritable or lake_error.

    Examples: a refused connection or the S3 client's NETWORK_CONNECTION -> unreachable; EACCES,
    ENOTDIR (a file where the lake's folder goes), EROFS, ENOSPC, S3's ACCESS_DENIED -> unwritable.
    """
    code = exc.errno if isinstance(exc, OSError) else None
    if isinstance(exc, ConnectionError | TimeoutError) or code in _AWAY:
        return "unreachable"
    if code in _REFUSED:
        return "unwritable"
    text = str(exc).lower()
    if any(marker.lower() in text for marker in _AWAY_TEXT):
        return "unreachable"
    if any(marker.lower() in text for marker in _REFUSED_TEXT):
        return "unwritable"
    return "lake_error"


class _Health:
    """Whether each side of the sink works, and why not; one WARNING when a side fails (whatever
    reasons it gives while it stays down), one when it is back."""

    def __init__(self) -> None:
        self._faults: dict[str, str] = {}  # side -> its reason (SINK_REASONS)
        self._known = False
        self._lock = threading.Lock()

    def fail(self, side: str, message: str, reason: str) -> None:
        if SINK_REASONS.get(reason, True):
            raise ValueError(f"{reason!r} is not a failing reason of collector.catalog.SINK_REASONS")
        with self._lock:
            self._known, first = True, side not in self._faults
            self._faults[side] = reason
        if first:
            log.warning("%s", message)

    def ok(self, side: str, message: str) -> None:
        with self._lock:
            self._known, was = True, self._faults.pop(side, None)
        if was is not None:
            log.warning("%s", message)

    @property
    def up(self) -> bool | None:
        """None before the first attempt, else True when no side is failing."""
        return None if not self._known else not self._faults

    @property
    def reason(self) -> str | None:
        """None before the first attempt, "ok" while no side fails, else the failing side's reason:
        the spool's volume first (the rows it refused wait in memory), then the lake's."""
        with self._lock:
            if not self._known:
                return None
            return self._faults.get("spool") or self._faults.get("lake") or "ok"


class LakeWriter:
    """BatchSink for the LogWriter: spool each batch, roll the spool into staged Parquet files."""

    def __init__(
        self,
        lake: str | os.PathLike[str] | Lake,
        instance: str,
        spool_dir: str | os.PathLike[str],
        *,
        roll_seconds: float = DEFAULT_ROLL_SECONDS,
        roll_bytes: int = DEFAULT_ROLL_BYTES,
        max_spool_bytes: int = DEFAULT_SPOOL_BYTES,
        max_held_bytes: int = DEFAULT_HELD_BYTES,
        backoff_max_s: float = 30.0,
    ) -> None:
        """Own the spool and load its state, then start the roller (which opens the lake).

        Raises ValueError for a malformed lake URI (no network is asked), SpoolBusy
        (collector.store.spool) when another process owns the spool, OSError when the spool
        cannot be created. An unreachable or unwritable lake is the roller's to retry.
        """
        if roll_seconds <= 0 or roll_bytes <= 0:
            raise ValueError("--lake-roll-seconds and --lake-roll-mb must be positive")
        self._lake: Lake | None = lake if isinstance(lake, Lake) else None
        self.uri = lake.uri if isinstance(lake, Lake) else check_lake_uri(lake)
        self.roll_seconds, self.roll_bytes = roll_seconds, roll_bytes
        self.backoff_max_s, self.max_held_bytes = backoff_max_s, max_held_bytes
        self.spool = Spool(spool_dir, max_spool_bytes)
        self._state_path = self.spool.directory / _STATE
        self._plan_path = self.spool.directory / _PLAN
        self.writer, self.next_seq, self._state_saved = self._load_state(instance)
        self.on_accepted: Callable[[int], Any] = lambda _count: None
        self.on_dropped: Callable[[str, int], Any] = lambda _reason, _count: None
        self.health = _Health()
        self.files_written = self.quarantined = 0
        self._prepared = False  # the lake opened, its staged folder made, the sequence checked
        self._held: deque[tuple[bytes, int]] = deque()  # payloads the spool's volume refused
        self._held_bytes, self._held_reason = 0, "spool_error"
        self._held_lock = threading.Lock()
        self._lock = threading.Lock()  # one roll at a time
        self._wake = threading.Event()
        self._stop = threading.Event()
        self._kick = threading.Event()  # cuts a backoff short
        self._idle = threading.Condition()
        self._pending_flush = 0
        self._thread = threading.Thread(target=self._run, name="headroom-lake-roller", daemon=True)
        self._thread.start()

    @property
    def lake(self) -> Lake:
        """The lake, opened on first use (Lake.parse: ValueError while its store cannot be reached)."""
        if self._lake is None:
            self._lake = Lake.parse(self.uri)
        return self._lake

    @property
    def lake_up(self) -> bool | None:
        """Whether the sink works (the lake and the spool); None before the roller's first try."""
        return self.health.up

    @property
    def sink_reason(self) -> str | None:
        """headroom_log_sink_up's reason (collector.catalog.SINK_REASONS); None before the first try."""
        return self.health.reason

    # --- the BatchSink ----------------------------------------------------------------------------
    def write_batch(self, rows: Sequence[RequestRecord]) -> int:
        """Spool the batch (the write-ahead); 0 rows count as written now, the rest once staged.

        Raises RowsDropped past the spool's cap (spool_full), or when the spool's volume refuses
        writes and the memory held for it is full (disk_full, spool_error).
        """
        payload = rows_to_ipc(rows)
        with self._held_lock:
            if self._held or not self._spool_put(payload, len(rows)):
                self._hold(payload, len(rows))
        if self._held or self.spool.size_bytes() >= self.roll_bytes:
            self._wake.set()
        return 0

    def _spool_put(self, payload: bytes, rows: int) -> bool:
        """True once spooled; False when the volume refused it (a spool fault); RowsDropped past the cap."""
        try:
            stored = self.spool.put(payload, rows)
        except OSError as exc:
            self._spool_failed(exc)
            return False
        if not stored:
            raise RowsDropped("spool_full", rows)
        return True

    def _hold(self, payload: bytes, rows: int) -> None:
        if self._held_bytes + len(payload) > self.max_held_bytes:
            raise RowsDropped(self._held_reason, rows)
        self._held.append((payload, rows))
        self._held_bytes += len(payload)

    def _spool_failed(self, exc: BaseException) -> None:
        self._held_reason = drop_reason(exc)
        self.health.fail(
            "spool",
            f"cannot write the spool {self.spool.directory} ({exc}); rows wait in memory (up to "
            f"{self.max_held_bytes // 2**20} MiB, then headroom_log_rows_dropped_total"
            f'{{reason="{self._held_reason}"}}) until it takes writes again',
            self._held_reason,
        )

    def _drain_held(self) -> None:
        """Move the rows held in memory into the spool, oldest first (SinkFault while it refuses)."""
        with self._held_lock:
            while self._held:
                payload, rows = self._held[0]
                try:
                    stored = self.spool.put(payload, rows)
                except OSError as exc:
                    self._held_reason = drop_reason(exc)
                    raise SinkFault("spool", exc) from exc
                if not stored:  # the cap: a roll makes room
                    return
                self._held.popleft()
                self._held_bytes -= len(payload)

    def report_to(self, writer: LogWriter) -> None:
        """Count rows in `writer`'s metrics once a staged file holds them."""
        self.on_accepted = writer.written.inc
        self.on_dropped = writer.lost

    def flush(self, timeout_s: float = 30.0) -> bool:
        """Roll everything spooled now into staged files; False when that did not finish in time."""
        deadline = time.monotonic() + timeout_s
        with self._idle:
            self._pending_flush += 1
        self._wake.set()
        self._kick.set()
        with self._idle:
            done = self._idle.wait_for(
                lambda: self._pending_flush == 0, max(0.0, deadline - time.monotonic())
            )
        return done and len(self.spool) == 0 and not self._held

    def close(self, timeout_s: float = 30.0) -> None:
        """Roll what is spooled (once; rows the lake did not take stay spooled for the next start),
        then give up the spool. Rows still held in memory (the volume refused them) are lost."""
        if self._stop.is_set():
            return
        self._stop.set()
        self._wake.set()
        self._kick.set()
        self._thread.join(timeout_s)
        with self._held_lock:
            lost = sum(rows for _, rows in self._held)
            self._held.clear()
        if lost:
            log.error("%d request-log rows the spool %s did not take are lost", lost, self.spool.directory)
            self.on_dropped(self._held_reason, lost)
        if not self._thread.is_alive():  # a roller still writing keeps the spool's lock
            self.spool.close()

    # --- rolling ----------------------------------------------------------------------------------
    def roll(self) -> int:
        """Stage every spooled batch now (in files of up to roll_bytes); returns files written.

        Raises SinkFault naming the side that failed (the lake, or the spool's volume); the spool
        keeps the rows.
        """
        with self._lock:
            written = self._prepare()
            while len(self.spool):
                entries = self.spool.take(max_rows=2**62, max_bytes=self.roll_bytes)
                if not entries:
                    break
                with _side("spool"):
                    self._write_plan(entries)
                written += self._apply_plan()
        return written

    def _prepare(self) -> int:
        """Open the lake, finish a leftover plan, start past the writer's own run of staged files."""
        written = 0
        if not self._prepared:
            with _side("lake"):
                self.lake.fs.create_dir(self.lake.path(STAGED, self.writer), recursive=True)
        if self._plan_path.exists():  # a crash, or a roll the lake or the volume interrupted
            written = self._apply_plan()
        if not self._prepared:
            with _side("lake"):
                # past the writer's own staged run, and past what maintain removed of it (the
                # table holds those names: a state rolled back must not reuse them)
                start = self.next_seq if self._state_saved else 0
                ahead = self._lake_next(max(start, read_removed_mark(self.lake, self.writer) + 1))
            if ahead > self.next_seq or not self._state_saved:
                if ahead > self.next_seq:
                    log.warning(
                        "the lake holds %s's files up to sequence %d, past this spool's %d: going on from %d",
                        self.writer,
                        ahead - 1,
                        self.next_seq,
                        ahead,
                    )
                self.next_seq = max(self.next_seq, ahead)
                with _side("spool"):
                    self._save_state()
            self._prepared = True
        return written

    def _lake_next(self, start: int) -> int:
        """The first sequence from `start` on that the lake holds no file of this writer for.

        Only the writer's own unbroken run counts: a stray name far ahead (another process's, or
        garbage such as seq 999999999999) never moves this writer's sequence, so its next files
        are neither unlisted (past 12 digits) nor refused as "far ahead" by the committer.
        Example: files 0, 1, 2 and 999999999999, start 0 -> 3.
        """
        selector = pafs.FileSelector(self.lake.path(STAGED, self.writer), allow_not_found=True)
        seqs = {
            parsed.seq
            for info in self.lake.fs.get_file_info(selector)
            if (parsed := parse_staged(info.path)) is not None and parsed.writer == self.writer
        }
        while start in seqs:
            start += 1
        return start

    def _due(self) -> bool:
        if not self._prepared or self._held:
            return True
        oldest = self.spool.oldest_ns()
        if oldest is None:
            return False
        return (
            self._pending_flush > 0
            or self.spool.size_bytes() >= self.roll_bytes
            or (time.time_ns() - oldest) / 1e9 >= self.roll_seconds
        )

    def _next_wait(self) -> float:
        oldest = self.spool.oldest_ns()
        if oldest is None:
            return self.roll_seconds
        return max(0.05, self.roll_seconds - (time.time_ns() - oldest) / 1e9)

    def _run(self) -> None:
        delay = 0.5
        while True:
            stopping = self._stop.is_set()
            with self._idle:
                requested = self._pending_flush  # flushes asked before this roll began
            if stopping or requested or self._due():
                ok = self._attempt()
                self._finish_flushes(requested)
                if not ok:  # keep the spool, retry with backoff (a flush or close retries now)
                    if stopping:
                        break
                    self._kick.wait(delay)  # then once more, and a last time if close() came
                    self._kick.clear()
                    delay = min(delay * 2, self.backoff_max_s)
                    continue
                delay = 0.5
            if stopping:
                break
            self._wake.wait(self._next_wait())
            self._wake.clear()
        with self._idle:
            self._pending_flush = 0
            self._idle.notify_all()

    def _attempt(self) -> bool:
        """The held rows into the spool, one roll (which may make room for what is still held);
        the health of each side; True when both worked."""
        spool_fault = self._try_drain()
        try:
            self.roll()
            self._lake_ok()
        except SinkFault as fault:
            if fault.side == "lake":
                self._lake_failed(fault.cause)
            else:
                spool_fault = fault
        except Exception as exc:  # whatever else the lake's filesystem raises
            self._lake_failed(exc)
        if spool_fault is not None and self._held:
            spool_fault = self._try_drain()
        if spool_fault is not None:
            self._spool_failed(spool_fault.cause)
            return False
        self.health.ok("spool", f"the spool {self.spool.directory} takes writes again")
        return self.health.up is True

    def _try_drain(self) -> SinkFault | None:
        try:
            self._drain_held()
        except SinkFault as fault:
            return fault
        return None

    def _lake_failed(self, exc: BaseException) -> None:
        self._prepared = False  # open, make the folder and check the sequence again when it is back
        reason = lake_reason(exc)
        self.health.fail(
            "lake",
            f"cannot write to the lake {self.uri} ({reason}: {exc}); the sidecar keeps serving, rows "
            f"stay spooled in {self.spool.directory} and the roller retries",
            reason,
        )

    def _lake_ok(self) -> None:
        self.health.ok("lake", f"the lake {self.uri} is back; spooled rows staged")

    def _finish_flushes(self, requested: int) -> None:
        if requested:
            with self._idle:
                self._pending_flush -= requested
                self._idle.notify_all()

    def _write_plan(self, entries: list[SpoolEntry]) -> None:
        plan = {"first_seq": self.next_seq, "entries": [entry.path.name for entry in entries]}
        write_atomic(self._plan_path, json.dumps(plan).encode())

    def _read_plan(self) -> tuple[int, list[Path]] | None:
        """The leftover plan's first sequence and spool files; None (and set aside) when unreadable."""
        with _side("spool"):
            text = self._plan_path.read_bytes()
        try:
            plan = json.loads(text)
            return int(plan["first_seq"]), [self.spool.directory / str(name) for name in plan["entries"]]
        except (ValueError, KeyError, TypeError):
            with _side("spool"):
                self._set_aside(self._plan_path, "not a plan")
            return None

    def _apply_plan(self) -> int:
        """Carry out lake-plan.json (steps 2-4 of the module docstring); returns files written."""
        plan = self._read_plan()
        if plan is None:
            return 0
        first, paths = plan
        files = rows = 0
        if self.next_seq <= first:  # not yet written (or partly: those files are found identical)
            table = self._read_spooled([path for path in paths if path.exists()])
            rows, seq = table.num_rows, first
            for day in day_files(table):
                seq = self._stage(seq, parquet_bytes(day)) + 1
                files += 1
            self.next_seq = max(seq, first)
            with _side("spool"):
                self._save_state()
        with _side("spool"):
            self.spool.remove(self._spooled(paths))
            for path in paths:  # entries a crashed process left and this spool's index does not hold
                path.unlink(missing_ok=True)
            self._plan_path.unlink(missing_ok=True)
        self.files_written += files
        if rows:
            self.on_accepted(rows)
        return files

    def _spooled(self, paths: Iterable[Path]) -> list[SpoolEntry]:
        wanted = set(paths)
        return [entry for entry in self.spool.take(2**62, 2**62) if entry.path in wanted]

    def _read_spooled(self, paths: list[Path]) -> pa.Table:
        """The spool files' rows in ARROW_SCHEMA; a file that is not a readable Arrow stream is set aside."""
        tables = []
        for path in paths:
            with _side("spool"):
                data = path.read_bytes()  # an I/O error is the volume's, not the file's
            try:
                tables.append(_conformed(data))
            except Exception as exc:  # truncated, garbage, or columns that cannot be cast
                with _side("spool"):
                    self._set_aside(path, f"{type(exc).__name__}: {exc}")
        if not tables:
            return ARROW_SCHEMA.empty_table()
        return pa.concat_tables(tables).combine_chunks()

    def _set_aside(self, path: Path, why: str) -> None:
        target = self.spool.quarantine(path)
        self.quarantined += 1
        log.warning(
            "spool file %s cannot be read (%s); set aside as %s, the rest is staged", path, why, target
        )

    def _stage(self, seq: int, payload: bytes) -> int:
        """Write `payload` as this writer's file `seq`, or at the next sequence the lake holds no
        file for when that name holds other bytes: a staged name is never written twice. Returns
        the sequence used."""
        while True:
            path = staged_name(self.lake, self.writer, seq)
            with _side("lake"):
                existing = self._put_new(path, payload)
            if existing is None or existing == payload:
                return seq
            with _side("lake"):
                ahead = self._lake_next(seq + 1)
            log.warning(
                "staged file %s exists with other rows; left as it is, writing %d instead", path, ahead
            )
            seq = ahead

    def _put_new(self, path: str, payload: bytes) -> bytes | None:
        """Write a new file at `path`; None when written, else the bytes already there (untouched)."""
        if self.lake.local:
            return _link_new(Path(path), payload)
        if self.lake.fs.get_file_info(path).type != pafs.FileType.NotFound:
            with self.lake.fs.open_input_stream(path) as stream:
                return bytes(stream.read())
        with self.lake.fs.open_output_stream(path) as stream:  # an object store's PUT is atomic
            stream.write(payload)
        return None

    # --- state ------------------------------------------------------------------------------------
    def _load_state(self, instance: str) -> tuple[str, int, bool]:
        """(writer, next sequence, whether that is on disk): a new writer name when there is none."""
        if self._state_path.exists():
            state: dict[str, Any] = json.loads(self._state_path.read_text())
            return str(state["writer"]), int(state["next_seq"]), True
        return f"{safe_writer_part(instance)}.{secrets.token_hex(4)}", 0, False

    def _save_state(self) -> None:
        state = {"writer": self.writer, "next_seq": self.next_seq}
        write_atomic(self._state_path, json.dumps(state).encode())
        self._state_saved = True

    # --- metrics ----------------------------------------------------------------------------------
    def collect(self) -> Iterable[Metric]:
        """Spool depth and age, set-aside files, and whether the sink works and why (a
        prometheus_client collector: families built per scrape, so a reason that changed leaves
        no series behind)."""
        now_ns = time.time_ns()
        oldest = self.spool.oldest_ns()
        age = 0.0 if oldest is None else max(0.0, (now_ns - oldest) / 1e9)
        yield _gauge("headroom_log_spool_files", len(self.spool))
        yield _gauge("headroom_log_spool_bytes", self.spool.size_bytes())
        yield _gauge("headroom_log_spool_oldest_age_seconds", age)
        yield _gauge("headroom_log_sink_lag_seconds", age)
        quarantined = spec("headroom_log_spool_quarantined_total")
        yield CounterMetricFamily(
            quarantined.name.removesuffix("_total"), quarantined.help, value=self.quarantined
        )
        reason = self.sink_reason
        if reason is not None:
            up = spec("headroom_log_sink_up")
            family = GaugeMetricFamily(up.name, up.help, labels=list(up.labels))
            family.add_metric([reason], 1.0 if SINK_REASONS[reason] else 0.0)
            yield family


def _link_new(path: Path, payload: bytes) -> bytes | None:
    """`payload` at `path` unless a file is there (then its bytes): a synced temporary, hard-linked
    to its name (which fails rather than replace), the folder synced."""
    temporary = path.with_name(f"{path.name}.{os.getpid()}.tmp")
    try:
        write_temporary(temporary, payload)
        try:
            os.link(temporary, path)
        except FileExistsError:
            return path.read_bytes()
        except OSError as exc:  # a filesystem without hard links: look, then rename
            if exc.errno not in (errno.EPERM, errno.ENOTSUP, errno.EMLINK):
                raise
            if path.exists():
                return path.read_bytes()
            os.replace(temporary, path)
    finally:
        temporary.unlink(missing_ok=True)
    sync_directory(path.parent)
    return None


def _conformed(data: bytes) -> pa.Table:
    """One spool file's bytes (an Arrow IPC stream) as a table in ARROW_SCHEMA."""
    with pa.ipc.open_stream(data) as reader:
        return conform(reader.read_all())


def conform(table: pa.Table) -> pa.Table:
    """A table in ARROW_SCHEMA: its columns by name, cast safely; a column it lacks is NULL.

    Spool files of an older version (fewer columns) or a newer one (more) still roll.
    """
    columns = [
        table[field.name].cast(field.type)
        if field.name in table.column_names
        else pa.nulls(table.num_rows, field.type)
        for field in ARROW_SCHEMA
    ]
    return pa.Table.from_arrays(columns, schema=ARROW_SCHEMA)


def _gauge(name: str, value: float) -> GaugeMetricFamily:
    entry = spec(name)
    return GaugeMetricFamily(entry.name, entry.help, value=value)
