"""LakeWriter: `headroom run --lake URI`, the sidecar's rows as immutable Parquet files in a lake.

The LogWriter hands each batch to `write_batch`, which appends it to the spool (collector.store.spool: bounded,
on disk, one Arrow IPC file per batch, written atomically) and
returns: the spool is the write-ahead buffer, so a row is on disk within the writer's 0.5 s of
its request ending, whatever the lake is doing. A roller thread turns the spool into staged
Parquet files when the oldest spooled batch is `roll_seconds` old, or the spool holds
`roll_bytes`, or at shutdown:

    1. plan     `lake-plan.json` (atomic) names the spool files taken and the first sequence number
    2. write    the batches, merged, split by UTC day of admitted_at (an Iceberg day partition
                needs one day per file), sorted by admitted_at: one file per day, numbered from
                the plan's sequence, staged/<writer>/<writer>-<seq>.parquet (a local lake writes
                a temporary name and renames it; an object store's PUT is atomic)
    3. state    `lake-state.json` (atomic): the next sequence number
    4. forget   the spool files, then the plan

A crash anywhere is repaired at the next start from the plan: before step 3 the same spool files
are written again under the same names, and the same input gives the same bytes, so a retried
write replaces an object with an identical one; after it only steps 4 remain. Nothing in a spool
file is lost unless the spool is full (`headroom_log_rows_dropped_total{reason="spool_full"}`).
While the lake cannot be written the rows stay spooled and the roller retries with backoff; the
spool's depth and the age of its oldest batch are on /metrics.

No catalog, no token and no pyiceberg: the committer (`headroom lake commit`) registers the files.
"""

from __future__ import annotations

import io
import json
import logging
import os
import secrets
import threading
import time
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
from prometheus_client.core import GaugeMetricFamily, Metric

from collector.catalog import spec
from collector.lake.layout import Lake, safe_writer_part, staged_name
from collector.record import RequestRecord
from collector.store.db import ARROW_SCHEMA, rows_to_ipc
from collector.store.spool import Spool, SpoolEntry
from collector.store.writer import LogWriter, RowsDropped

__all__ = [
    "LakeWriter",
    "DEFAULT_ROLL_SECONDS",
    "DEFAULT_ROLL_BYTES",
    "DEFAULT_SPOOL_BYTES",
    "DEFAULT_SPOOL_DIR",
    "PARQUET_OPTIONS",
    "day_files",
    "conform",
    "parquet_bytes",
]

log = logging.getLogger(__name__)

DEFAULT_ROLL_SECONDS = 60.0  # freshness: a row is staged at most this long after it was spooled
DEFAULT_ROLL_BYTES = 64 * 2**20  # Arrow IPC spooled before a roll (Parquet with zstd: a fifth of it)
DEFAULT_SPOOL_BYTES = 1024 * 2**20  # the write-ahead buffer, and what an outage of the lake can hold
DEFAULT_SPOOL_DIR = "headroom-spool"  # beside the working directory, like the default headroom.duckdb
# Fixed writer options: the same table gives the same bytes (a retried write is identical).
PARQUET_OPTIONS: dict[str, Any] = {
    "compression": "zstd",
    "row_group_size": 128 * 1024,
    "write_statistics": True,
    "use_dictionary": True,
}
_PLAN, _STATE = "lake-plan.json", "lake-state.json"


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


def _write_atomic_local(path: Path, payload: bytes) -> None:
    temporary = path.with_name(path.name + ".tmp")
    descriptor = os.open(temporary, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(descriptor, "wb") as handle:
        handle.write(payload)
    os.replace(temporary, path)


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
        backoff_max_s: float = 30.0,
    ) -> None:
        """Open (or create) the spool and its state, repair an interrupted roll, start the roller.

        Raises ValueError for a lake URI pyarrow.fs cannot open, OSError when the lake cannot be
        created (a local path without permission).
        """
        if roll_seconds <= 0 or roll_bytes <= 0:
            raise ValueError("--lake-roll-seconds and --lake-roll-mb must be positive")
        self.lake = lake if isinstance(lake, Lake) else Lake.parse(lake)
        self.roll_seconds, self.roll_bytes = roll_seconds, roll_bytes
        self.backoff_max_s = backoff_max_s
        self.spool = Spool(spool_dir, max_spool_bytes)
        self._state_path = self.spool.directory / _STATE
        self._plan_path = self.spool.directory / _PLAN
        state = self._load_state(instance)
        self.writer: str = state["writer"]
        self.next_seq: int = int(state["next_seq"])
        self.lake.fs.create_dir(self.lake.path("staged", self.writer), recursive=True)
        self.on_accepted: Callable[[int], Any] = lambda _count: None
        self.on_dropped: Callable[[str, int], Any] = lambda _reason, _count: None
        self.lake_up: bool | None = None
        self.files_written = 0
        self._lock = threading.Lock()  # one roll at a time
        self._wake = threading.Event()
        self._stop = threading.Event()
        self._idle = threading.Condition()
        self._pending_flush = 0
        self._repair()
        self._thread = threading.Thread(target=self._run, name="headroom-lake-roller", daemon=True)
        self._thread.start()

    # --- the BatchSink ----------------------------------------------------------------------------
    def write_batch(self, rows: Sequence[RequestRecord]) -> int:
        """Spool the batch (the write-ahead); 0 rows count as written now, the rest once staged."""
        payload = rows_to_ipc(rows)
        if not self.spool.put(payload, len(rows)):
            raise RowsDropped("spool_full", len(rows))
        if self.spool.size_bytes() >= self.roll_bytes:
            self._wake.set()
        return 0

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
        with self._idle:
            done = self._idle.wait_for(
                lambda: self._pending_flush == 0, max(0.0, deadline - time.monotonic())
            )
        return done and len(self.spool) == 0

    def close(self, timeout_s: float = 30.0) -> None:
        """Roll what is spooled (once; rows the lake did not take stay spooled for the next start)."""
        if self._stop.is_set():
            return
        self._stop.set()
        self._wake.set()
        self._thread.join(timeout_s)

    # --- rolling ----------------------------------------------------------------------------------
    def roll(self) -> int:
        """Stage every spooled batch now (in files of up to roll_bytes); returns files written.

        Raises what the lake's filesystem raises (OSError and kin); the spool keeps the rows.
        """
        written = 0
        with self._lock:
            while len(self.spool):
                entries = self.spool.take(max_rows=2**62, max_bytes=self.roll_bytes)
                if not entries:
                    break
                self._write_plan(entries)
                written += self._apply_plan()
        return written

    def _due(self) -> bool:
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
                try:
                    self.roll()
                except Exception as exc:  # the lake is away: keep the spool, retry with backoff
                    if self.lake_up is not False:
                        log.warning("cannot write to the lake %s (%s); rows stay spooled", self.lake.uri, exc)
                    self.lake_up = False
                    self._finish_flushes(requested)
                    if stopping or self._stop.wait(delay):
                        break
                    delay = min(delay * 2, self.backoff_max_s)
                    continue
                if self.lake_up is False:
                    log.warning("the lake %s is back; spooled rows staged", self.lake.uri)
                self.lake_up, delay = True, 0.5
                self._finish_flushes(requested)
            if stopping:
                break
            self._wake.wait(self._next_wait())
            self._wake.clear()
        with self._idle:
            self._pending_flush = 0
            self._idle.notify_all()

    def _finish_flushes(self, requested: int) -> None:
        if requested:
            with self._idle:
                self._pending_flush -= requested
                self._idle.notify_all()

    def _write_plan(self, entries: list[SpoolEntry]) -> None:
        plan = {"first_seq": self.next_seq, "entries": [entry.path.name for entry in entries]}
        _write_atomic_local(self._plan_path, json.dumps(plan).encode())

    def _apply_plan(self) -> int:
        """Carry out lake-plan.json (steps 2-4 of the module docstring); returns files written."""
        plan = json.loads(self._plan_path.read_text())
        first = int(plan["first_seq"])
        paths = [self.spool.directory / name for name in plan["entries"]]
        files = 0
        rows = 0
        if self.next_seq == first:  # not yet written (or written, and now written again identically)
            present = [path for path in paths if path.exists()]
            table = _read_spooled(present)
            rows = table.num_rows
            for offset, day in enumerate(day_files(table)):
                self._put(staged_name(self.lake, self.writer, first + offset), parquet_bytes(day))
                files += 1
            self.next_seq = first + files
            self._save_state()
        self.spool.remove([entry for entry in self._spooled(paths)])
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

    def _put(self, path: str, payload: bytes) -> None:
        if self.lake.local:
            _write_atomic_local(Path(path), payload)
            return
        with self.lake.fs.open_output_stream(path) as stream:  # an object store's PUT is atomic
            stream.write(payload)

    def _repair(self) -> None:
        """Finish a roll that a crash interrupted (module docstring)."""
        if self._plan_path.exists():
            with self._lock:
                self._apply_plan()

    # --- state ------------------------------------------------------------------------------------
    def _load_state(self, instance: str) -> dict[str, Any]:
        if self._state_path.exists():
            state: dict[str, Any] = json.loads(self._state_path.read_text())
            return state
        state = {"writer": f"{safe_writer_part(instance)}.{secrets.token_hex(4)}", "next_seq": 0}
        _write_atomic_local(self._state_path, json.dumps(state).encode())
        return state

    def _save_state(self) -> None:
        state = {"writer": self.writer, "next_seq": self.next_seq}
        _write_atomic_local(self._state_path, json.dumps(state).encode())

    # --- metrics ----------------------------------------------------------------------------------
    def collect(self) -> Iterable[Metric]:
        """Spool depth and age, and whether the lake took the last roll (a prometheus_client collector)."""
        now_ns = time.time_ns()
        oldest = self.spool.oldest_ns()
        age = 0.0 if oldest is None else max(0.0, (now_ns - oldest) / 1e9)
        yield _gauge("headroom_log_spool_files", len(self.spool))
        yield _gauge("headroom_log_spool_bytes", self.spool.size_bytes())
        yield _gauge("headroom_log_spool_oldest_age_seconds", age)
        yield _gauge("headroom_log_sink_lag_seconds", age)
        if self.lake_up is not None:
            yield _gauge("headroom_log_sink_up", 1.0 if self.lake_up else 0.0)


def _read_spooled(paths: list[Path]) -> pa.Table:
    tables = []
    for path in paths:
        with pa.ipc.open_stream(pa.memory_map(str(path))) as reader:
            tables.append(reader.read_all().cast(ARROW_SCHEMA))
    if not tables:
        return ARROW_SCHEMA.empty_table()
    return pa.concat_tables(tables).combine_chunks()


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
