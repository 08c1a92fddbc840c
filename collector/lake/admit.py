"""Which staged files a commit admits: each checked on its own, a bad one set aside by name.

A staged file is committed when all of these hold (`check_name`, `check_file`):

- its name is well-formed: `staged/<writer>/<writer>-<seq>.parquet`, in its writer's folder;
- its sequence is one the table does not hold and is plausible: above the writer's mark or in a
  gap the table records below it (`pending`), and at most MAX_AHEAD past the writer's next
  sequence (its mark + 1; 0 for a writer the table has not seen). Import writers (`import.*`)
  number their files by day (YYYYMMDD) and need a real date instead;
- it reads as Parquet, holds request_id and admitted_at, has no column the table lacks (a column
  the committer's own schema has is added to the table before; one it does not know never is),
  each column of a type the table's column reads, and one UTC day (pyiceberg's own check).

Otherwise it is quarantined (`quarantine`): moved to `quarantine/<writer>/<file>` with
`<file>.reason.txt` beside it, one WARNING naming it and why, and counted; the pass commits every
other file. A read that fails in the filesystem itself (OSError opening or reading the bytes: the
object store away) leaves the file staged for the next pass, named in a WARNING.

**Sequences.** A writer numbers its files 0, 1, 2... and stages them in order, so a writer's mark
(the highest sequence the table holds) grows one by one. A file committed above a missing
sequence (a listing that saw N+1 before N, a file quarantined or deleted by hand) opens a gap: the
missing numbers are recorded on the table (`headroom.gaps.<writer>`, e.g. "7-9,12") in the same
commit, a file that appears later under one of them is committed then, and `maintain` never
deletes a staged file in a gap. So no sequence, however far ahead, makes the committer skip a
writer's real files. A sequence more than MAX_AHEAD past the writer's next is no writer's (a
sidecar stages a file or two a minute: 10,000 is a week of them) and is quarantined.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Iterable, Sequence
from datetime import date

import pyarrow as pa
import pyarrow.fs as pafs
import pyarrow.parquet as pq
from pyiceberg.io.pyarrow import (
    _check_pyarrow_schema_compatible,
    compute_statistics_plan,
    data_file_statistics_from_parquet_metadata,
    parquet_path_to_id_mapping,
)
from pyiceberg.manifest import DataFile, DataFileContent, FileFormat
from pyiceberg.table.metadata import TableMetadata

from collector.lake.layout import STAGED, Lake, StagedName

__all__ = [
    "GAPS_PREFIX",
    "MAX_AHEAD",
    "QUARANTINE",
    "REQUIRED_COLUMNS",
    "Ranges",
    "parse_ranges",
    "format_ranges",
    "in_ranges",
    "advance",
    "is_import",
    "check_name",
    "check_file",
    "quarantine",
    "Unreadable",
]

log = logging.getLogger(__name__)

GAPS_PREFIX = "headroom.gaps."  # + writer -> sequences at or below its mark the table does not hold
MAX_AHEAD = 10_000
QUARANTINE = "quarantine"
REQUIRED_COLUMNS = ("request_id", "admitted_at")
_IMPORT = "import."
_WRITER_RE = re.compile(r"^[A-Za-z0-9_](?:[A-Za-z0-9._-]{0,198}[A-Za-z0-9_])?$")

Ranges = list[tuple[int, int]]  # inclusive (first, last), sorted, disjoint


def parse_ranges(text: str) -> Ranges:
    """ "7-9,12" -> [(7, 9), (12, 12)]; "" -> []."""
    found: Ranges = []
    for part in filter(None, text.split(",")):
        first, _, last = part.partition("-")
        found.append((int(first), int(last or first)))
    return sorted(found)


def format_ranges(ranges: Ranges) -> str:
    """[(7, 9), (12, 12)] -> "7-9,12"."""
    return ",".join(str(a) if a == b else f"{a}-{b}" for a, b in ranges)


def in_ranges(seq: int, ranges: Ranges) -> bool:
    return any(first <= seq <= last for first, last in ranges)


def advance(mark: int, gaps: Ranges, committed: Iterable[int]) -> tuple[int, Ranges]:
    """The writer's (mark, gaps) once `committed` are added: the mark rises to the highest, every
    number skipped on the way becomes a gap, every committed one leaves the gaps.

    Example: advance(4, [], [5, 8]) -> (8, [(6, 7)]); advance(8, [(6, 7)], [6]) -> (8, [(7, 7)]).
    """
    done = sorted(set(committed))
    top = max([mark, *done])
    missing = gaps + ([(mark + 1, top)] if top > mark else [])
    left: Ranges = []
    for first, last in sorted(missing):
        for seq in (s for s in done if first <= s <= last):
            if seq > first:
                left.append((first, seq - 1))
            first = seq + 1
        if first <= last:
            left.append((first, last))
    return top, left


def is_import(writer: str) -> bool:
    """Writers of `headroom lake import`: one file per day, numbered YYYYMMDD."""
    return writer.startswith(_IMPORT)


def check_name(lake: Lake, name: StagedName, mark: int | None) -> str | None:
    """Why the name cannot be committed (None: it can); `mark` is the writer's, None if it has none."""
    folder = name.path.rsplit("/", 2)[-2]
    if name.path.rsplit("/", 2)[0] != lake.path(STAGED) or folder != name.writer:
        return f"staged in folder {folder!r}, not its writer's {name.writer!r}"
    if not _WRITER_RE.match(name.writer):
        return f"writer name {name.writer!r} is not one a sidecar or an import writes"
    if is_import(name.writer):
        return None if _is_day(name.seq) else f"import sequence {name.seq} is not a day (YYYYMMDD)"
    expected = -1 if mark is None else mark
    if name.seq > expected + 1 + MAX_AHEAD:
        return (
            f"sequence {name.seq} is far ahead of writer {name.writer}'s next, {expected + 1} "
            f"(more than {MAX_AHEAD:,}): no writer stages that many files unseen"
        )
    return None


def _is_day(seq: int) -> bool:
    try:
        date(seq // 10_000, seq // 100 % 100, seq % 100)
    except ValueError:
        return False
    return True


class Unreadable(Exception):
    """The filesystem failed reading a staged file (OSError): it stays staged for the next pass."""


def check_file(lake: Lake, metadata: TableMetadata, name: StagedName) -> DataFile | str:
    """The file's DataFile for the table, or why it is bad. Raises Unreadable for a filesystem
    error (FileNotFoundError included: another committer quarantined it meanwhile)."""
    try:
        parquet, size = _footer(lake, name.path)
    except Unreadable:
        raise
    except Exception as exc:
        return f"not a readable Parquet file ({type(exc).__name__}: {exc})"
    schema = parquet.schema.to_arrow_schema()
    reason = _schema_problem(schema, metadata)
    if reason is not None:
        return reason
    try:
        return _data_file(lake.uri_of(name.path), metadata, parquet, schema, size)
    except Exception as exc:  # pyiceberg's own checks: types, one partition per file
        return f"refused by the table ({type(exc).__name__}: {str(exc).splitlines()[0]})"


def _footer(lake: Lake, path: str) -> tuple[pq.FileMetaData, int]:
    """The file's Parquet footer and size. A parse error is the file's; an OSError of the
    filesystem is transient (Unreadable). pyarrow reports some corrupt footers as OSError too:
    those are told apart by reading the whole file into memory and parsing it there."""
    try:
        with lake.fs.open_input_file(path) as handle:
            size = handle.size()
            try:
                return pq.read_metadata(handle), size
            except OSError:
                handle.seek(0)
                data = handle.read()
    except OSError as exc:
        raise Unreadable(f"{type(exc).__name__}: {exc}") from exc
    return pq.read_metadata(pa.BufferReader(data)), size  # fails here: the bytes are bad


def _schema_problem(schema: pa.Schema, metadata: TableMetadata) -> str | None:
    names = set(schema.names)
    missing = [column for column in REQUIRED_COLUMNS if column not in names]
    if missing:
        return f"no {', '.join(missing)} column (not a request log file); columns {schema.names[:8]}"
    table_names = {f.name for f in metadata.schema().fields}
    extra = [column for column in schema.names if column not in table_names]
    if extra:
        return (
            f"column(s) {', '.join(extra)} not in the table (a writer newer than this committer: "
            "upgrade the committers first)"
        )
    return None


def _data_file(
    uri: str, metadata: TableMetadata, parquet: pq.FileMetaData, schema: pa.Schema, size: int
) -> DataFile:
    """What pyiceberg's add_files makes of the file (parquet_file_to_data_file), from its footer."""
    table_schema = metadata.schema()
    _check_pyarrow_schema_compatible(table_schema, schema, format_version=metadata.format_version)
    statistics = data_file_statistics_from_parquet_metadata(
        parquet_metadata=parquet,
        stats_columns=compute_statistics_plan(table_schema, metadata.properties),
        parquet_column_mapping=parquet_path_to_id_mapping(table_schema),
    )
    return DataFile.from_args(
        content=DataFileContent.DATA,
        file_path=uri,
        file_format=FileFormat.PARQUET,
        partition=statistics.partition(metadata.spec(), table_schema),
        file_size_in_bytes=size,
        sort_order_id=None,
        spec_id=metadata.default_spec_id,
        equality_ids=None,
        key_metadata=None,
        **statistics.to_serialized_dict(),
    )


def quarantine(lake: Lake, name: StagedName, reason: str) -> str | None:
    """Move the file to quarantine/<writer>/ with a .reason.txt beside it; one WARNING. Returns
    the new path, None when the file was gone (another committer moved it)."""
    folder = lake.path(QUARANTINE, name.writer)
    target = f"{folder}/{name.path.rsplit('/', 1)[-1]}"
    try:
        lake.fs.create_dir(folder, recursive=True)
        if lake.fs.get_file_info(target).type != pafs.FileType.NotFound:
            target = _free_name(lake, target)
        with lake.fs.open_output_stream(f"{target}.reason.txt") as stream:
            stream.write(f"{name.path}\n{reason}\n".encode())
        lake.fs.move(name.path, target)
    except FileNotFoundError:
        return None
    log.warning("quarantined staged file %s -> %s: %s", name.path, target, reason)
    return target


def _free_name(lake: Lake, target: str) -> str:
    """`x.parquet` -> `x.parquet.1` (then .2...): a name quarantined twice keeps both files."""
    for index in range(1, 10_000):
        candidate = f"{target}.{index}"
        if lake.fs.get_file_info(candidate).type == pafs.FileType.NotFound:
            return candidate
    raise FileExistsError(f"{target}: 10,000 quarantined files of this name")


def gaps_of(properties: dict[str, str]) -> dict[str, Ranges]:
    """{writer: its gaps} from the table's properties."""
    return {
        key[len(GAPS_PREFIX) :]: parse_ranges(value)
        for key, value in properties.items()
        if key.startswith(GAPS_PREFIX)
    }


def pending(names: Sequence[StagedName], marks: dict[str, int], gaps: dict[str, Ranges]) -> list[StagedName]:
    """The staged files the table does not hold: above their writer's mark, or in one of its gaps."""
    return [
        name
        for name in names
        if name.seq > marks.get(name.writer, -1) or in_ranges(name.seq, gaps.get(name.writer, []))
    ]


__all__ += ["gaps_of", "pending"]
