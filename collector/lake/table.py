"""The fleet's Iceberg table: catalog, committer, maintenance and import (pyiceberg; `[lake]` extra).

One table, `headroom.requests` by default, holds every sidecar's rows with the `requests` columns
(collector.store.schema, from collector.record.RequestRecord), partitioned by day(admitted_at).

**Commit** (`commit_staged`). Sidecars stage immutable files (collector.lake.stage) under
`staged/<writer>/<writer>-<seq>.parquet`; each writer's files appear in sequence order. The table
records, per writer, the highest sequence it holds (a table property
`headroom.committed.<writer>`) and the sequences below it that it does not hold (its gaps,
`headroom.gaps.<writer>`), in the same catalog commit as the files themselves: a file is added
exactly when its sequence is above its writer's mark or in one of its gaps. Those properties, not
the list of the table's current files, are what make a commit idempotent: compaction replaces the
staged files in the current snapshot, and the mark still says they were added. Each file is
checked on its own before (collector.lake.admit: name, sequence, Parquet footer, schema); a bad
one is moved to `quarantine/` and named, and every good file is committed in the same pass.
Two committers at once read
the marks from the table they start from; the catalog's compare-and-swap lets one commit win,
the other gets CommitFailedException, reloads and computes again (nothing is ever added twice).
pyiceberg would instead retry a lost commit itself (`commit.retry.num-retries`, 4 by default),
rebasing the append onto the winner's snapshot with the marks it computed before: the winner's
files added again. The table therefore says `commit.retry.num-retries=0` (set on creation, and by
the committer and maintenance on a table that lacks it); every retry is this module's.
A column the committer's own schema (collector.record.RequestRecord) has and the table lacks is
added to the table (`union_by_name`) before the files that carry it; files written before it read
as NULL through the table's name mapping. A file's own columns never change the table: a file
with a column the committer does not know is quarantined.

**Maintain** (`maintain`). Per sealed day (ended more than `seal_hours` ago) with more than one
file: DuckDB reads the day's files in place (collector.lake.scan), drops repeated request_ids,
sorts by model and admitted_at into one new file (spilling to disk past `memory_mb`, so a day
larger than memory compacts), and the day is overwritten in one commit. The overwrite's commit asserts the snapshot it read, so a commit that landed
meanwhile makes it fail and start over: rows committed during maintenance are never lost. Then
snapshots older than `snapshot_age` are expired, days past `retention_days` deleted, and files
no remaining snapshot references (staged files once their writer's mark covers them, compacted
ones replaced a day ago or more) removed from the lake.

**Import** (`import_duckdb`). A one-box DuckDB request log's sealed days become staged files, one
per day, of a writer named by the day's content (`import.` + a hash of its instance names and
sorted request ids: `import_writer`), sequence = the day's number (YYYYMMDD), then are committed.
The same day's rows give the same writer whatever the file's path: importing the same file again
adds nothing, a second box's log at the same path adds its own days. A day whose content changed
since (a late row) is a new writer; only its rows the table does not hold yet are staged.
"""

from __future__ import annotations

import hashlib
import logging
import tempfile
import time
import uuid
from collections.abc import Callable, Iterable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from datetime import UTC, date, datetime, timedelta

import duckdb
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.fs as pafs
from pyiceberg.catalog import Catalog
from pyiceberg.catalog.rest import RestCatalog
from pyiceberg.catalog.sql import SqlCatalog
from pyiceberg.exceptions import (
    CommitFailedException,
    NamespaceAlreadyExistsError,
    NoSuchTableError,
    TableAlreadyExistsError,
)
from pyiceberg.manifest import DataFile
from pyiceberg.partitioning import PartitionField, PartitionSpec
from pyiceberg.schema import Schema
from pyiceberg.table import Table
from pyiceberg.transforms import DayTransform
from pyiceberg.types import (
    BooleanType,
    DoubleType,
    IcebergType,
    IntegerType,
    LongType,
    NestedField,
    StringType,
    TimestamptzType,
)

from collector.lake.admit import (
    GAPS_PREFIX,
    QUARANTINE,
    Ranges,
    Unreadable,
    advance,
    check_file,
    check_name,
    format_ranges,
    gaps_of,
    in_ranges,
    is_import,
    pending,
    quarantine,
)
from collector.lake.layout import Lake, StagedName, parse_staged, staged_name, write_removed_mark
from collector.lake.scan import data_files, duckdb_paths
from collector.lake.stage import conform, parquet_bytes
from collector.store.db import ARROW_SCHEMA
from collector.store.retention import day_bounds

__all__ = [
    "DEFAULT_TABLE",
    "MARK_PREFIX",
    "CommitResult",
    "MaintainResult",
    "open_catalog",
    "iceberg_schema",
    "open_table",
    "commit_staged",
    "maintain",
    "import_duckdb",
]

log = logging.getLogger(__name__)

DEFAULT_TABLE = "headroom.requests"
MARK_PREFIX = "headroom.committed."  # + writer -> the highest sequence the table holds
MAX_FILES_PER_COMMIT = 2_000
COMPACT_MEMORY_MB = 2_048
_RETRIES = 20
_OWN_RETRIES = {"commit.retry.num-retries": "0"}  # a lost commit comes back here (module docstring)

_ICEBERG_TYPES: dict[str, IcebergType] = {
    "string": StringType(),
    "bool": BooleanType(),
    "timestamp[us, tz=UTC]": TimestamptzType(),
    "int32": IntegerType(),
    "int64": LongType(),
    "double": DoubleType(),
}
# Iceberg type (as str()) -> DuckDB's, for a column compaction writes as NULL
_DUCKDB_TYPES = {
    "string": "VARCHAR",
    "boolean": "BOOLEAN",
    "timestamptz": "TIMESTAMPTZ",
    "int": "INTEGER",
    "long": "BIGINT",
    "double": "DOUBLE",
}


def iceberg_schema(arrow: pa.Schema = ARROW_SCHEMA) -> Schema:
    """The table's schema: the `requests` columns in order, every one optional (ids from 1)."""
    return Schema(
        *(
            NestedField(
                field_id=index + 1, name=f.name, field_type=_ICEBERG_TYPES[str(f.type)], required=False
            )
            for index, f in enumerate(arrow)
        )
    )


def open_catalog(uri: str, lake: Lake, *, properties: dict[str, str] | None = None) -> Catalog:
    """pyiceberg's catalog for a URI: `sqlite:///path` or `postgresql://...` (SQL catalog, its
    warehouse in the lake), `http(s)://...` (REST: Polaris, Lakekeeper, Nessie, Glue, S3 Tables).

    ValueError names a URI of any other kind. `properties` go to the catalog as they are (e.g.
    a REST catalog's `credential`, `warehouse`, `s3.region`).
    """
    extra = dict(properties or {})
    if uri.startswith(("sqlite:", "postgresql:", "postgresql+")):
        for attempt in range(5):  # two first users of one database may race to create its tables
            try:
                return SqlCatalog("headroom", uri=uri, warehouse=lake.warehouse, **extra)
            except Exception as exc:  # sqlalchemy's IntegrityError/OperationalError on that race
                if attempt == 4 or "exist" not in str(exc).lower() and "unique" not in str(exc).lower():
                    raise
    if uri.startswith(("http://", "https://")):
        return RestCatalog("headroom", uri=uri, **extra)
    raise ValueError(
        f"--catalog {uri!r} is not a catalog URI; expected sqlite:///path/catalog.db, "
        "postgresql://user@host/db or the http(s):// URL of a REST catalog"
    )


def open_table(catalog: Catalog, identifier: str = DEFAULT_TABLE, *, create: bool = True) -> Table:
    """The table, created (partitioned by day(admitted_at)) on first use when `create`.

    NoSuchTableError when it does not exist and `create` is False.
    """
    try:
        return catalog.load_table(identifier)
    except NoSuchTableError:
        if not create:
            raise
    namespace = identifier.rsplit(".", 1)[0]
    try:
        catalog.create_namespace(namespace)
    except NamespaceAlreadyExistsError:
        pass
    schema = iceberg_schema()
    admitted = schema.find_field("admitted_at").field_id
    spec = PartitionSpec(
        PartitionField(source_id=admitted, field_id=1000, transform=DayTransform(), name="day")
    )
    try:
        table = catalog.create_table(identifier, schema=schema, partition_spec=spec)
    except TableAlreadyExistsError:
        return catalog.load_table(identifier)
    with table.transaction() as txn:  # the name mapping lets files without field ids be read
        txn.set_properties(
            {"schema.name-mapping.default": table.schema().name_mapping.model_dump_json(), **_OWN_RETRIES}
        )
    return catalog.load_table(identifier)


def _retries_here(table: Table) -> Table:
    """The table with pyiceberg's own commit retry off (module docstring), set once if it lacks it."""
    for _ in range(_RETRIES):
        if all(table.properties.get(key) == value for key, value in _OWN_RETRIES.items()):
            return table
        try:
            with table.transaction() as txn:
                txn.set_properties(_OWN_RETRIES)
        except CommitFailedException:  # another committer changed the table: look again
            pass
        table = table.refresh()
    raise CommitFailedException(f"could not set {_OWN_RETRIES} on the table: lost the race {_RETRIES} times")


def _evolve(table: Table, arrow: pa.Schema) -> Table:
    """Add the columns of `arrow` the table lacks (union by name); older files read them as NULL.

    Returns `table` itself when nothing was added, else the table as it is now.
    """
    present = {f.name for f in table.schema().fields}
    if all(name in present for name in arrow.names):
        return table
    with table.update_schema() as update:
        update.union_by_name(arrow)
    log.info("table %s: added columns %s", table.name(), [n for n in arrow.names if n not in present])
    return table.refresh()


def marks(table: Table) -> dict[str, int]:
    """{writer: the highest sequence the table holds} from the table's properties."""
    return {
        key[len(MARK_PREFIX) :]: int(value)
        for key, value in table.properties.items()
        if key.startswith(MARK_PREFIX)
    }


@dataclass
class CommitResult:
    """What one `commit_staged` did (filled as it goes: a caller's instance holds what a pass did
    before it raised)."""

    files: int = 0
    rows: int = 0
    commits: int = 0
    conflicts: int = 0  # CommitFailedException, retried
    pending: int = 0  # staged files left for the next pass (past MAX_FILES_PER_COMMIT)
    quarantined: list[tuple[str, str]] = field(default_factory=list)  # (staged path, why)
    unreadable: list[str] = field(default_factory=list)  # staged paths the filesystem failed to read
    table: Table | None = None  # the table as the pass last read it (its marks, for a backlog)


def commit_staged(
    catalog: Catalog,
    lake: Lake,
    identifier: str = DEFAULT_TABLE,
    *,
    writers: Iterable[str] | None = None,
    on_commit: Callable[[CommitResult], None] | None = None,
    result: CommitResult | None = None,
) -> CommitResult:
    """Register every good staged file not yet in the table, set every bad one aside (module
    docstring, collector.lake.admit); safe to run twice at once.

    `writers` limits it to those writers' files (the import's). Raises CommitFailedException
    when 20 attempts in a row lost the race, which only a storm of committers would cause.
    """
    result = result if result is not None else CommitResult()
    only = set(writers) if writers is not None else None
    table = _retries_here(open_table(catalog, identifier))
    lost = 0
    while True:
        table = result.table = table.refresh()
        done, held = marks(table), gaps_of(table.properties)
        left = {path for path, _ in result.quarantined} | set(result.unreadable)
        waiting = [
            name
            for name in pending(lake.staged(), done, held)
            if (only is None or name.writer in only) and name.path not in left
        ]
        if not waiting:
            return result
        batch = _in_sequence(waiting)[:MAX_FILES_PER_COMMIT]
        result.pending = len(waiting) - len(batch)
        evolved = _evolve(table, ARROW_SCHEMA)  # a column this committer knows joins the table first
        if evolved is not table:
            table = evolved
            continue  # the marks may have moved meanwhile: read them again
        files = _admit(lake, table, batch, done, result)
        if not files:
            continue  # the whole batch was set aside: look again
        try:
            _commit(table, files, done, held)
        except CommitFailedException:
            result.conflicts += 1
            lost += 1
            if lost >= _RETRIES:
                raise CommitFailedException(
                    f"{identifier}: {_RETRIES} commits in a row lost the race"
                ) from None
            time.sleep(min(2.0, 0.05 * 2**lost))  # backoff: the other committer's commit is done
            continue
        lost = 0
        result.files += len(files)
        result.commits += 1
        result.rows += _rows_added(table.refresh())
        if on_commit is not None:
            on_commit(result)


def _admit(
    lake: Lake, table: Table, batch: list[StagedName], done: dict[str, int], result: CommitResult
) -> list[tuple[StagedName, DataFile]]:
    """The batch's good files with their DataFiles; each bad one quarantined, each unreadable one
    left staged (both noted in `result`). Files are read 8 at a time."""
    metadata = table.metadata

    def verdict(name: StagedName) -> DataFile | str | None:
        reason = check_name(lake, name, done.get(name.writer))
        if reason is not None:
            return reason
        try:
            return check_file(lake, metadata, name)
        except Unreadable as exc:
            log.warning("cannot read staged file %s (%s); it stays staged for the next pass", name.path, exc)
            return None

    good = []
    with ThreadPoolExecutor(max_workers=8) as pool:
        for name, found in zip(batch, pool.map(verdict, batch)):
            if isinstance(found, DataFile):
                good.append((name, found))
            elif found is None:
                result.unreadable.append(name.path)
            else:
                _set_aside(lake, name, found, result)
    return good


def _set_aside(lake: Lake, name: StagedName, reason: str, result: CommitResult) -> None:
    try:
        quarantine(lake, name, reason)
    except OSError as exc:  # the lake refuses the move: leave it staged, say so, go on
        log.warning(
            "cannot quarantine %s (%s: %s); it stays staged: %s", name.path, type(exc).__name__, exc, reason
        )
        result.unreadable.append(name.path)
        return
    result.quarantined.append((name.path, reason))


def _commit(
    table: Table, files: list[tuple[StagedName, DataFile]], done: dict[str, int], held: dict[str, Ranges]
) -> None:
    """One catalog commit: the files, and each writer's new mark and gaps."""
    seqs: dict[str, list[int]] = {}
    for name, _ in files:
        seqs.setdefault(name.writer, []).append(name.seq)
    properties: dict[str, str] = {}
    cleared: list[str] = []
    for writer, added in seqs.items():
        if is_import(writer):  # numbered by day: days without rows are no gap
            properties[f"{MARK_PREFIX}{writer}"] = str(max([done.get(writer, -1), *added]))
            continue
        top, gaps = advance(done.get(writer, -1), held.get(writer, []), added)
        properties[f"{MARK_PREFIX}{writer}"] = str(top)
        if gaps:
            properties[f"{GAPS_PREFIX}{writer}"] = format_ranges(gaps)
        elif writer in held:
            cleared.append(f"{GAPS_PREFIX}{writer}")
    with table.transaction() as txn:
        txn.set_properties(properties)
        if cleared:
            txn.remove_properties(*cleared)
        with txn.update_snapshot().fast_append() as append:
            for _, data_file in files:
                append.append_data_file(data_file)


def backlog(lake: Lake, table: Table) -> dict[str, tuple[int, float]]:
    """{writer: (staged files the table does not hold, the oldest one's mtime in unix seconds)}."""
    waiting = pending(lake.staged(), marks(table), gaps_of(table.properties))
    found: dict[str, tuple[int, float]] = {}
    infos = lake.fs.get_file_info([name.path for name in waiting]) if waiting else []
    for name, info in zip(waiting, infos):
        mtime = info.mtime.timestamp() if info.mtime is not None else time.time()
        count, oldest = found.get(name.writer, (0, mtime))
        found[name.writer] = (count + 1, min(oldest, mtime))
    return found


def quarantined_files(lake: Lake) -> int:
    """Files held in the lake's quarantine/ now (their .reason.txt not counted)."""
    selector = pafs.FileSelector(lake.path(QUARANTINE), allow_not_found=True, recursive=True)
    return sum(
        1
        for info in lake.fs.get_file_info(selector)
        if info.type == pafs.FileType.File and not info.path.endswith(".reason.txt")
    )


def _in_sequence(pending: list[StagedName]) -> list[StagedName]:
    """Oldest first per writer, interleaved so a cap per commit leaves every writer's tail, not one writer."""
    return sorted(pending, key=lambda name: (name.seq, name.writer))


def _rows_added(table: Table) -> int:
    snapshot = table.current_snapshot()
    if snapshot is None or snapshot.summary is None:
        return 0
    return int(snapshot.summary.additional_properties.get("added-records", 0))


# --- reading a day (bounds: collector.store.retention.day_bounds) ------------------------------------
def _day_filter(day: date) -> str:
    start, end = day_bounds(day)
    return f"admitted_at >= '{start.isoformat()}' AND admitted_at < '{end.isoformat()}'"  # dates we made


def _files_per_day(table: Table) -> dict[date, int]:
    """{day: data files} in the current snapshot (from the partition of each file)."""
    if table.current_snapshot() is None:
        return {}
    files = table.inspect.files()
    counts: dict[date, int] = {}
    epoch = date(1970, 1, 1)
    for partition in files["partition"].to_pylist():
        value = partition.get("day") if partition else None
        if value is None:
            continue
        day = value if isinstance(value, date) else epoch + timedelta(days=int(value))
        counts[day] = counts.get(day, 0) + 1
    return counts


@dataclass
class MaintainResult:
    """What one `maintain` did."""

    days_compacted: list[date] = field(default_factory=list)
    files_before: int = 0
    files_after: int = 0
    duplicates_dropped: int = 0
    snapshots_expired: int = 0
    days_deleted: int = 0
    files_removed: int = 0
    conflicts: int = 0


def maintain(
    catalog: Catalog,
    lake: Lake,
    identifier: str = DEFAULT_TABLE,
    *,
    seal_hours: float = 2.0,
    min_files: int = 2,
    snapshot_age: timedelta = timedelta(hours=6),
    retention_days: int | None = None,
    orphan_age: timedelta = timedelta(days=1),
    now: datetime | None = None,
    on_day: Callable[[date, int, int], None] | None = None,
    memory_mb: int = COMPACT_MEMORY_MB,
) -> MaintainResult:
    """Compact sealed days, drop days past retention, expire snapshots, remove unreferenced files.

    `memory_mb`: DuckDB's memory for compacting a day (past it, the sort spills to disk).
    """
    now = now or datetime.now(UTC)
    result = MaintainResult()
    table = _retries_here(open_table(catalog, identifier))
    sealed_before = (now - timedelta(hours=seal_hours)).date()  # days < this one are sealed
    for day, count in sorted(_files_per_day(table).items()):
        if day >= sealed_before or count < min_files:
            continue
        table = _compact_day(table, lake, day, result, memory_mb)
        if on_day is not None:
            on_day(day, count, result.files_after)
    if retention_days is not None:
        table = _drop_past(table, (now - timedelta(days=retention_days)).date(), result)
    table = _expire(table, now - snapshot_age, result)
    _remove_unreferenced(table, lake, now - orphan_age, result)
    return result


def _compacted_path(table: Table, lake: Lake, day: date) -> str:
    """A new file in the table's data directory for a compacted day (a failed attempt's is an orphan)."""
    directory = lake.path_of(f"{table.location().rstrip('/')}/data/day={day.isoformat()}")
    lake.fs.create_dir(directory, recursive=True)
    return f"{directory}/compact-{uuid.uuid4().hex}.parquet"


def _rewrite_day(table: Table, lake: Lake, day: date, path: str, memory_mb: int) -> tuple[int, int, int]:
    """Write the day's rows to `path` with DuckDB: each request_id once (the first admitted), sorted
    by model, admitted_at and request_id; the table's columns, NULL where no file has one. DuckDB
    reads the day's files in place and spills past `memory_mb` to a temporary directory, so a day
    larger than memory compacts. Returns (files read, rows read, rows written)."""
    start, end = day_bounds(day)
    files = data_files(table, since=start, until=end)
    if not files:
        return 0, 0, 0
    paths, filesystem = duckdb_paths(lake, files)
    with tempfile.TemporaryDirectory(prefix="headroom-compact-") as spill:
        con = duckdb.connect()
        try:
            con.execute("SET memory_limit = ?", [f"{int(memory_mb)}MB"])
            con.execute("SET temp_directory = ?", [spill])
            if filesystem is not None:
                con.register_filesystem(filesystem)
            source = "read_parquet([" + ", ".join(_sql_text(p) for p in paths) + "], union_by_name = true)"
            present = {row[0] for row in con.execute(f"DESCRIBE SELECT * FROM {source}").fetchall()}
            columns = ", ".join(
                f.name
                if f.name in present
                else f"CAST(NULL AS {_DUCKDB_TYPES[str(f.field_type)]}) AS {f.name}"
                for f in table.schema().fields
            )
            target = path if lake.local else f"{spill}/compacted.parquet"
            window = (
                f"WHERE admitted_at >= TIMESTAMPTZ {_sql_text(start.isoformat())} "
                f"AND admitted_at < TIMESTAMPTZ {_sql_text(end.isoformat())}"
            )
            # a repeated request_id is rare: finding none (a hash aggregate) costs less than the
            # window that would keep the first of each (BENCHMARKS.md §9)
            repeated = con.execute(
                f"SELECT count(*) FROM (SELECT request_id FROM {source} {window} "
                "GROUP BY request_id HAVING count(*) > 1)"
            ).fetchall()[0][0]
            first = (
                "QUALIFY row_number() OVER (PARTITION BY request_id ORDER BY admitted_at) = 1 "
                if repeated
                else ""
            )
            written = con.execute(
                f"COPY (SELECT {columns} FROM {source} {window} {first}"
                "ORDER BY model, admitted_at, request_id) "
                "TO ? (FORMAT parquet, COMPRESSION zstd, ROW_GROUP_SIZE 131072)",
                [target],
            ).fetchall()[0][0]
        finally:
            con.close()
        if not lake.local:
            pafs.copy_files(target, path, destination_filesystem=lake.fs)
    return len(files), sum(f.record_count for f in files), int(written)


def _sql_text(text: str) -> str:
    return "'" + text.replace("'", "''") + "'"


def _compact_day(table: Table, lake: Lake, day: date, result: MaintainResult, memory_mb: int) -> Table:
    for attempt in range(_RETRIES):
        table = table.refresh()
        path = _compacted_path(table, lake, day)
        before, read, written = _rewrite_day(table, lake, day, path, memory_mb)
        if before == 0:  # another maintainer dropped the day meanwhile
            return table
        try:
            # one commit: the day's files dropped (each holds that day only: no rewrite), the new one
            # added; it asserts the snapshot read, so a commit that landed meanwhile fails it
            with table.transaction() as txn:
                txn.delete(_day_filter(day))
                txn.add_files([lake.uri_of(path)], check_duplicate_files=False)
        except CommitFailedException:  # a commit landed meanwhile: read the day again
            result.conflicts += 1
            time.sleep(min(2.0, 0.05 * 2**attempt))
            continue
        table = table.refresh()
        result.days_compacted.append(day)
        result.files_before += before
        result.files_after += _files_per_day(table).get(day, 0)
        result.duplicates_dropped += read - written
        return table
    raise CommitFailedException(f"compacting {day}: {_RETRIES} attempts in a row lost the race")


def _drop_past(table: Table, first_kept: date, result: MaintainResult) -> Table:
    start, _ = day_bounds(first_kept)
    old = [day for day in _files_per_day(table) if day < first_kept]
    if not old:
        return table
    for attempt in range(_RETRIES):
        try:
            table.refresh().delete(f"admitted_at < '{start.isoformat()}'")  # a date we made
        except CommitFailedException:
            result.conflicts += 1
            time.sleep(min(2.0, 0.05 * 2**attempt))
            continue
        result.days_deleted += len(old)
        return table.refresh()
    raise CommitFailedException(f"deleting days before {first_kept}: lost the race {_RETRIES} times")


def _expire(table: Table, older_than: datetime, result: MaintainResult) -> Table:
    table = table.refresh()
    current = table.current_snapshot()
    expired = [
        s.snapshot_id
        for s in table.snapshots()
        if s.timestamp_ms < older_than.timestamp() * 1000
        and (current is None or s.snapshot_id != current.snapshot_id)
    ]
    if not expired:
        return table
    try:
        table.maintenance.expire_snapshots().by_ids(expired).commit()
    except CommitFailedException:
        result.conflicts += 1  # the next run expires them
        return table.refresh()
    result.snapshots_expired += len(expired)
    return table.refresh()


def _remove_unreferenced(table: Table, lake: Lake, older_than: datetime, result: MaintainResult) -> None:
    """Delete files no remaining snapshot references: staged files their writer's mark covers
    (never one in a gap below it: the table does not hold that sequence), and data files of the table's own (compaction output) older than `older_than`."""
    table = table.refresh()
    referenced = {lake.path_of(path) for path in table.inspect.all_files()["file_path"].to_pylist()}
    committed, gaps = marks(table), gaps_of(table.properties)
    marked: set[str] = set()
    for name in lake.staged():
        held = name.seq <= committed.get(name.writer, -1) and not in_ranges(
            name.seq, gaps.get(name.writer, [])
        )
        if held and name.path not in referenced:
            if name.writer not in marked:  # first the mark, then the files it stands for
                write_removed_mark(lake, name.writer, committed[name.writer])
                marked.add(name.writer)
            lake.fs.delete_file(name.path)
            result.files_removed += 1
    data_dir = lake.path_of(f"{table.location().rstrip('/')}/data")
    # lazy: the filesystem layer only for the orphan sweep
    from pyarrow import fs as pafs

    infos = lake.fs.get_file_info(pafs.FileSelector(data_dir, allow_not_found=True, recursive=True))
    cutoff_ns = older_than.timestamp() * 1e9
    for info in infos:
        if (
            info.type == pafs.FileType.File
            and info.path.endswith(".parquet")
            and info.path not in referenced
            and info.mtime_ns is not None
            and info.mtime_ns < cutoff_ns
        ):
            lake.fs.delete_file(info.path)
            result.files_removed += 1


# --- import -----------------------------------------------------------------------------------------
def import_writer(rows: pa.Table) -> str:
    """The writer of one imported day: `import.` + 16 hex digits of sha256 over the day's instance
    names and its request ids, sorted: the same rows give the same name, whatever file holds them."""
    digest = hashlib.sha256()
    for column in ("instance", "request_id"):
        values = sorted(str(v) for v in pc.unique(rows[column]).to_pylist() if v is not None)
        digest.update(f"{column}:{len(values)}\n".encode())
        digest.update("\n".join(values).encode())
    return "import." + digest.hexdigest()[:16]


def import_duckdb(
    catalog: Catalog,
    lake: Lake,
    days: Sequence[tuple[date, pa.Table]],
    identifier: str = DEFAULT_TABLE,
) -> CommitResult:
    """Stage each (sealed day, its rows) as the file YYYYMMDD of the day's writer (`import_writer`),
    then commit those files. A day whose writer's mark covers it is skipped (imported before); of
    a day seen for the first time only the rows whose request_id the table lacks are staged."""
    table = open_table(catalog, identifier)
    done = marks(table)
    writers = []
    for day, rows in days:
        writer, seq = import_writer(rows), int(day.strftime("%Y%m%d"))
        if seq <= done.get(writer, -1):
            continue
        fresh = _not_in_table(table, lake, day, conform(rows))
        if fresh.num_rows == 0:
            continue
        lake.fs.create_dir(lake.path("staged", writer), recursive=True)
        with lake.fs.open_output_stream(staged_name(lake, writer, seq)) as stream:
            stream.write(
                parquet_bytes(fresh.sort_by([("admitted_at", "ascending"), ("request_id", "ascending")]))
            )
        writers.append(writer)
    return commit_staged(catalog, lake, identifier, writers=writers)


def _not_in_table(table: Table, lake: Lake, day: date, rows: pa.Table) -> pa.Table:
    """The rows of `day` whose request_id the table does not hold (DuckDB reads its day's files)."""
    start, end = day_bounds(day)
    files = data_files(table, since=start, until=end) if table.current_snapshot() is not None else []
    if not files or rows.num_rows == 0:
        return rows
    paths, filesystem = duckdb_paths(lake, files)
    con = duckdb.connect()
    try:
        if filesystem is not None:
            con.register_filesystem(filesystem)
        con.register("incoming", rows)
        source = "read_parquet([" + ", ".join(_sql_text(p) for p in paths) + "], union_by_name = true)"
        held = con.sql(
            f"SELECT i.request_id FROM incoming i SEMI JOIN (SELECT request_id FROM {source}) t "
            "ON i.request_id = t.request_id"
        ).to_arrow_table()["request_id"]
    finally:
        con.close()
    return rows.filter(pc.invert(pc.is_in(rows["request_id"], value_set=held.combine_chunks())))


def staged_writers(lake: Lake) -> set[str]:
    """Writers with staged files in the lake."""
    return {name.writer for name in lake.staged()}


__all__ += ["marks", "import_writer", "staged_writers", "parse_staged", "backlog", "quarantined_files"]
