"""Which of the table's data files hold a time window, and how DuckDB opens them where they lie.

pyiceberg plans (`data_files`: the current snapshot's files, pruned by the day partition and each
file's admitted_at bounds); DuckDB reads (`duckdb_paths`: local paths as they are, any other lake
through its own pyarrow filesystem registered with DuckDB, so the same objects and credentials
as the committer's). The readers (collector.lake.read) and compaction (collector.lake.table) both
read this way; nothing is copied first.

The product writes no delete files (compaction replaces whole files). A snapshot that has them
(another engine's row-level deletes) is refused rather than read with the deleted rows in it.
"""

from __future__ import annotations

from datetime import datetime

from fsspec.implementations.arrow import ArrowFSWrapper
from pyiceberg.manifest import DataFile, FileFormat
from pyiceberg.table import Table

from collector.lake.layout import Lake

__all__ = ["data_files", "duckdb_paths", "window_filter", "LakeFileSystem"]


def window_filter(since: datetime | None, until: datetime | None) -> str:
    """pyiceberg's row filter for rows admitted in [since, until) ("True" for no bounds)."""
    bounds = []
    if since is not None:
        bounds.append(f"admitted_at >= '{since.isoformat()}'")  # datetimes, formatted by us
    if until is not None:
        bounds.append(f"admitted_at < '{until.isoformat()}'")
    return " AND ".join(bounds) or "True"


def data_files(
    iceberg: Table, *, since: datetime | None = None, until: datetime | None = None
) -> list[DataFile]:
    """The current snapshot's data files that may hold rows admitted in [since, until).

    ValueError when one of them has delete files or is not Parquet (written by another engine).
    """
    found = []
    for task in iceberg.scan(row_filter=window_filter(since, until)).plan_files():
        if task.delete_files:
            raise ValueError(
                f"{iceberg.name()}: data file {task.file.file_path} has {len(task.delete_files)} delete "
                "file(s) (row-level deletes from another engine); headroom reads data files as they "
                "are and would count deleted rows: rewrite those files first (e.g. Spark's "
                "rewrite_data_files), then read again"
            )
        if task.file.file_format != FileFormat.PARQUET:
            raise ValueError(f"{iceberg.name()}: data file {task.file.file_path} is not Parquet")
        found.append(task.file)
    return found


class LakeFileSystem(ArrowFSWrapper):  # type: ignore[misc]  # fsspec is untyped
    """A lake's pyarrow filesystem as fsspec, for DuckDB: `headroomlake://<path in the lake's fs>`."""

    protocol = "headroomlake"

    @classmethod
    def _strip_protocol(cls, path: str) -> str:
        return path.split("://", 1)[1] if "://" in path else path


def duckdb_paths(lake: Lake, files: list[DataFile]) -> tuple[list[str], LakeFileSystem | None]:
    """The paths DuckDB opens for `files`, and the filesystem to register for them (None: local)."""
    if lake.local:
        return [lake.path_of(f.file_path) for f in files], None
    return [f"{LakeFileSystem.protocol}://{lake.path_of(f.file_path)}" for f in files], LakeFileSystem(
        lake.fs
    )
