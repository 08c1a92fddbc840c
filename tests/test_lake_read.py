"""The readers' file set over the fleet's table (collector.lake.read, collector.lake.scan): DuckDB
reads exactly the current snapshot's files of the window where they lie, so a compacted day's
staged files (still in the lake) are not read again, a window reads its rows and no others, a
file older than a column reads it as NULL, and a lake outside the local filesystem is read through
its own pyarrow filesystem; compaction (DuckDB, in place) drops repeated request_ids and keeps a
column that older files lack."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.fs as pafs
import pyarrow.parquet as pq
from support.lake import stage
from support.synthetic import synthetic_rows

from collector.lake import table as lake_table
from collector.lake.layout import Lake
from collector.lake.read import open_lake_log
from collector.lake.scan import data_files, duckdb_paths
from collector.store.db import ARROW_SCHEMA, RequestStore

DAY_A = (datetime.now(UTC) - timedelta(days=4)).replace(hour=0, minute=0, second=0, microsecond=0)
DAY_B = DAY_A + timedelta(days=1)
SUMMARY = (
    "SELECT model, count(*), count(DISTINCT request_id), quantile_cont(ttft_s, [0.5, 0.95, 0.99]) "
    "FROM requests GROUP BY model ORDER BY model"
)


def commit(catalog: str, lake: Path) -> None:
    location = Lake.parse(lake)
    lake_table.commit_staged(lake_table.open_catalog(catalog, location), location)


def iceberg(catalog: str, lake: Path) -> Any:
    return lake_table.open_table(lake_table.open_catalog(catalog, Lake.parse(lake)), create=False)


def test_a_compacted_day_is_read_once_and_a_window_reads_only_its_rows(tmp_path: Path) -> None:
    catalog, lake = f"sqlite:///{tmp_path / 'catalog.db'}", tmp_path / "lake"
    day_a = synthetic_rows(2_000, DAY_A, span=timedelta(hours=23), models=("a", "b"), seed=1, prefix="a")
    day_b = synthetic_rows(600, DAY_B, span=timedelta(hours=23), models=("a", "b"), seed=2, prefix="b")
    stage(lake, "w", day_a, 200)  # 10 files of day A
    stage(lake, "v", day_b, 600)  # 1 file of day B
    commit(catalog, lake)
    location = Lake.parse(lake)
    result = lake_table.maintain(lake_table.open_catalog(catalog, location), location)
    assert result.days_compacted == [DAY_A.date()] and result.files_before == 10 and result.files_after == 1
    assert len(location.staged()) == 11, "the compacted day's staged files are still in the lake"

    reference = RequestStore()
    reference.insert_rows(day_a + day_b)
    with open_lake_log(catalog, str(lake)) as store:
        assert store.count() == len(day_a) + len(day_b)
        assert store.query(SUMMARY) == reference.query(SUMMARY)

    table = iceberg(catalog, lake)
    b_files = data_files(table, since=DAY_B, until=DAY_B + timedelta(days=1))
    assert [location.path_of(f.file_path) for f in b_files] == [
        n.path for n in location.staged() if n.writer.startswith("v.")
    ]
    with open_lake_log(catalog, str(lake), since=DAY_B, until=DAY_B + timedelta(days=1)) as store:
        assert store.count() == len(day_b)
        assert {r[0] for r in store.query("SELECT DISTINCT left(request_id, 1) FROM requests")} == {"b"}
    since, until = DAY_A + timedelta(hours=6), DAY_A + timedelta(hours=18)  # inside the compacted file
    inside = [r for r in day_a if since <= r["admitted_at"] < until]
    with open_lake_log(catalog, str(lake), since=since, until=until) as store:
        assert store.count() == len(inside) > 0
        assert store.query(
            "SELECT min(admitted_at) >= ?, max(admitted_at) < ? FROM requests", [since, until]
        ) == [(True, True)]


def test_an_older_file_reads_a_newer_column_as_null_and_any_filesystem_reads_the_same(tmp_path: Path) -> None:
    catalog, lake = f"sqlite:///{tmp_path / 'catalog.db'}", tmp_path / "lake"
    newer = synthetic_rows(300, DAY_A, seed=3, prefix="new")
    for row in newer:
        row["task_class"] = "short"
    stage(lake, "new", newer, 300)
    older = pa.Table.from_pylist(synthetic_rows(100, DAY_A, seed=4, prefix="old"), schema=ARROW_SCHEMA)
    older = older.drop_columns(["task_class", "adapter", "probe_level", "probe_rate_per_s", "probe_warmup"])
    (lake / "staged" / "old.1").mkdir(parents=True)
    pq.write_table(older, lake / "staged" / "old.1" / "old.1-000000000000.parquet")  # a version before them
    commit(catalog, lake)
    query = "SELECT left(request_id, 3), count(*), count(task_class), count(DISTINCT task_class) FROM requests GROUP BY 1 ORDER BY 1"
    with open_lake_log(catalog, str(lake)) as store:
        assert store.query(query) == [("new", 300, 300, 1), ("old", 100, 0, 0)]
        local = store.query(SUMMARY)

    # the same files through the lake's pyarrow filesystem registered with DuckDB (as for s3://)
    location = Lake.parse(lake)
    remote = Lake(
        uri=location.uri, fs=pafs.SubTreeFileSystem("/", pafs.LocalFileSystem()), base=location.base
    )
    paths, filesystem = duckdb_paths(remote, data_files(iceberg(catalog, lake)))
    assert filesystem is not None and all(p.startswith("headroomlake://") for p in paths)
    store = RequestStore.over_parquet(paths, filesystem=filesystem)
    assert store.query(SUMMARY) == local
    assert store.query(query) == [("new", 300, 300, 1), ("old", 100, 0, 0)]
    store.close()


def test_compaction_drops_a_repeated_request_and_keeps_a_column_older_files_lack(tmp_path: Path) -> None:
    catalog, lake = f"sqlite:///{tmp_path / 'catalog.db'}", tmp_path / "lake"
    rows = synthetic_rows(500, DAY_A, span=timedelta(hours=20), seed=5)
    for row in rows:
        row["replica_class"] = "h100"
    stage(lake, "w", rows, 100)
    stage(lake, "again", rows[:1], 1)  # the same request staged twice (a second writer)
    older = pa.Table.from_pylist(synthetic_rows(50, DAY_A, seed=6, prefix="old"), schema=ARROW_SCHEMA)
    older = older.drop_columns(["replica_class"])  # a writer from before the column
    (lake / "staged" / "old.1").mkdir(parents=True)
    pq.write_table(older, lake / "staged" / "old.1" / "old.1-000000000000.parquet")
    commit(catalog, lake)
    local = Lake.parse(lake)  # compacted through the lake's pyarrow filesystem, as for s3://
    location = Lake(uri=local.uri, fs=pafs.SubTreeFileSystem("/", pafs.LocalFileSystem()), base=local.base)
    result = lake_table.maintain(lake_table.open_catalog(catalog, location), location)
    assert result.files_before == 7 and result.files_after == 1 and result.duplicates_dropped == 1
    read = iceberg(catalog, lake).scan().to_arrow()
    assert read.num_rows == len(set(read["request_id"].to_pylist())) == 550
    classes = dict(zip(read["request_id"].to_pylist(), read["replica_class"].to_pylist()))
    assert {v for k, v in classes.items() if k.startswith("old")} == {None}
    assert {v for k, v in classes.items() if not k.startswith("old")} == {"h100"}
    models_then_time = list(zip(read["model"].to_pylist(), read["admitted_at"].to_pylist()))
    assert models_then_time == sorted(models_then_time), "compacted rows sorted by model, then admission"


def test_a_data_file_with_delete_files_is_refused_not_read_with_its_deleted_rows(tmp_path: Path) -> None:
    """Another engine's row-level (merge-on-read) deletes leave delete files beside a data file;
    reading the data file where it lies would count the deleted rows, so the readers refuse it
    and say what to do. pyiceberg 0.12 writes no delete files (its deletes rewrite the files), so
    the real table's planned task is given one here, as another engine's snapshot would carry."""
    import pytest
    from pyiceberg.manifest import DataFile, DataFileContent, FileFormat
    from pyiceberg.table import FileScanTask

    catalog, lake = f"sqlite:///{tmp_path / 'catalog.db'}", tmp_path / "lake"
    stage(lake, "w", synthetic_rows(100, DAY_A, span=timedelta(hours=1), seed=3, prefix="d"), 100)
    commit(catalog, lake)
    table = iceberg(catalog, lake)
    assert len(data_files(table)) == 1  # no delete files: read where it lies
    deletes = DataFile.from_args(
        content=DataFileContent.POSITION_DELETES,
        file_path=str(tmp_path / "deletes.parquet"),
        file_format=FileFormat.PARQUET,
        record_count=3,
        file_size_in_bytes=1,
    )
    real_scan = table.scan

    class WithDeletes:
        def __init__(self, scan: Any) -> None:
            self.scan = scan

        def plan_files(self) -> list[Any]:
            return [FileScanTask(task.file, {deletes}, task.residual) for task in self.scan.plan_files()]

    table.scan = lambda **options: WithDeletes(real_scan(**options))  # type: ignore[method-assign]
    with pytest.raises(ValueError, match=r"has 1 delete file\(s\).*rewrite those files first"):
        data_files(table, since=DAY_A)


def test_maintain_takes_the_compaction_memory_from_the_command_line(tmp_path: Path, monkeypatch: Any) -> None:
    """`headroom lake maintain --memory-mb` is the memory a day's compaction sorts in before it
    spills; unset, the library's default."""
    from click.testing import CliRunner

    from collector.lake.cli import lake as lake_command

    passed: list[int] = []

    def maintain(*args: Any, memory_mb: int, **options: Any) -> lake_table.MaintainResult:
        passed.append(memory_mb)
        return lake_table.MaintainResult()

    monkeypatch.setattr(lake_table, "maintain", maintain)
    catalog, lake = f"sqlite:///{tmp_path / 'catalog.db'}", str(tmp_path / "lake")
    for extra in ([], ["--memory-mb", "300"]):
        result = CliRunner().invoke(lake_command, ["maintain", "--catalog", catalog, "--lake", lake, *extra])
        assert result.exit_code == 0, result.output
    assert passed == [lake_table.COMPACT_MEMORY_MB, 300]
