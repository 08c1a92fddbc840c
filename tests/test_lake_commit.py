"""The committer checks each staged file on its own (collector.lake.admit): a bad one is quarantined
by name and every good one is committed in the same pass; sequences never make it skip a writer's
real files (gaps are recorded and filled); its own metrics; the import keyed by content."""

from __future__ import annotations

import logging
import shutil
import subprocess
import sys
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import httpx
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from prometheus_client.parser import text_string_to_metric_families
from support.lake import stage
from support.processes import free_port, stop_process
from support.synthetic import synthetic_rows
from support.waiting import patient, wait_until

from collector.lake import admit
from collector.lake import table as lake_table
from collector.lake.layout import Lake
from collector.lake.metrics import CommitterMetrics
from collector.store.db import ARROW_SCHEMA, RequestStore

HEADROOM = Path(sys.executable).parent / "headroom"
DAY0 = (datetime.now(UTC) - timedelta(days=3)).replace(hour=1, minute=0, second=0, microsecond=0)


def put(lake: Path, writer: str, seq: int, payload: bytes | pa.Table, folder: str | None = None) -> Path:
    path = lake / "staged" / (folder or writer) / f"{writer}-{seq:012d}.parquet"
    path.parent.mkdir(parents=True, exist_ok=True)
    if isinstance(payload, bytes):
        path.write_bytes(payload)
    else:
        pq.write_table(payload, path)
    return path


def rows_table(n: int, seed: int, prefix: str) -> pa.Table:
    return pa.Table.from_pylist(synthetic_rows(n, DAY0, seed=seed, prefix=prefix), schema=ARROW_SCHEMA)


def catalog_of(tmp_path: Path) -> tuple[Any, Lake]:
    location = Lake.parse(tmp_path / "lake")
    return lake_table.open_catalog(f"sqlite:///{tmp_path / 'catalog.db'}", location), location


def ids(catalog: Any, location: Lake) -> list[str]:
    read = lake_table.open_table(catalog).scan(selected_fields=("request_id",)).to_arrow()
    return [str(v) for v in read["request_id"].to_pylist()]


def test_one_pass_commits_every_good_file_and_quarantines_each_bad_one(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """Garbage, a truncated file, a foreign schema, an extra column, a wrong type, a misplaced file
    and a real writer's name with a sequence far ahead, among good files of three writers: one
    pass commits every good file and quarantines each bad one by name; rows = distinct ids = the
    good files' rows; the schema is unchanged; `maintain` loses nothing; the writer goes on."""
    lake = tmp_path / "lake"
    catalog, location = catalog_of(tmp_path)
    first = synthetic_rows(300, DAY0, seed=1, prefix="w")
    writer = stage(lake, "w", first, 100)  # seq 0-2, committed
    lake_table.commit_staged(catalog, location)
    schema_before = lake_table.open_table(catalog).schema()
    good_file = (lake / "staged" / writer / f"{writer}-000000000000.parquet").read_bytes()
    later = synthetic_rows(200, DAY0 + timedelta(hours=2), seed=2, prefix="later")
    stage(lake, "w", later, 100)  # the real writer's seq 3-4, not yet committed
    extra = rows_table(20, 4, "extra").append_column("gpu_class", pa.array(["h100"] * 20))
    typed = rows_table(20, 5, "typed")
    typed = typed.set_column(typed.schema.get_field_index("ttft_s"), "ttft_s", pa.array(["fast"] * 20))
    bad = {
        put(lake, "junk.1", 0, b"not parquet at all " * 50): "not a readable Parquet file",
        put(lake, "trunc.1", 0, good_file[: len(good_file) // 2]): "not a readable Parquet file",
        put(lake, "torn.1", 0, good_file[:-40] + good_file[-8:]): "not a readable Parquet file",
        put(lake, "foreign.1", 0, pa.table({"a": [1, 2], "b": ["x", "y"]})): "no request_id, admitted_at",
        put(lake, "extra.1", 0, extra): "gpu_class not in the table",
        put(lake, "typed.1", 0, typed): "refused by the table",
        put(lake, "lost.1", 0, rows_table(5, 6, "lost"), folder="other.1"): "not its writer's",
        put(lake, writer, 999_999_999_999, rows_table(30, 7, "ahead")): "far ahead",
    }
    other = synthetic_rows(150, DAY0, seed=3, prefix="other")
    stage(lake, "o", other, 50)
    older = rows_table(40, 8, "older").drop_columns(["task_class", "replica_class"])  # an older writer
    put(lake, "older.1", 0, older)

    with caplog.at_level(logging.WARNING, logger="collector.lake.admit"):
        result = lake_table.commit_staged(catalog, location)
    assert result.files == 2 + 3 + 1 and not result.unreadable
    assert {path: why for path, why in result.quarantined}.keys() == {str(p) for p in bad}
    for path, why in result.quarantined:
        assert bad[Path(path)] in why, (path, why)
        moved = lake / "quarantine" / Path(path).name.rsplit("-", 1)[0] / Path(path).name
        assert moved.exists() and not Path(path).exists() and why in Path(f"{moved}.reason.txt").read_text()
        assert any(path in r.getMessage() and "quarantined" in r.getMessage() for r in caplog.records)
    expected = {r["request_id"] for r in first + later + other} | set(older["request_id"].to_pylist())
    found = ids(catalog, location)
    assert len(found) == len(set(found)) == len(expected) and set(found) == expected
    iceberg = lake_table.open_table(catalog)
    assert iceberg.schema() == schema_before
    assert lake_table.marks(iceberg)[writer] == 4

    lake_table.maintain(catalog, location, seal_hours=0, snapshot_age=timedelta(0), orphan_age=timedelta(0))
    assert sorted(ids(catalog, location)) == sorted(expected)
    more = synthetic_rows(50, DAY0 + timedelta(hours=3), seed=9, prefix="more")
    stage(lake, "w", more, 50)  # seq 5: the mark was never pushed past it (maintain kept it too)
    assert lake_table.commit_staged(catalog, location).files == 1
    assert sorted(ids(catalog, location)) == sorted(expected | {r["request_id"] for r in more})


def test_a_gap_is_recorded_then_filled_and_maintain_keeps_the_late_file(tmp_path: Path) -> None:
    """seq 1 missing while 0, 2 and 3 are staged: 0, 2, 3 committed, the gap "1" recorded; when 1
    appears, maintain (before the next commit) keeps it and the next pass commits it."""
    lake = tmp_path / "lake"
    catalog, location = catalog_of(tmp_path)
    rows = synthetic_rows(400, DAY0, seed=4)
    writer = stage(lake, "w", rows, 100)
    late = lake / "staged" / writer / f"{writer}-000000000001.parquet"
    aside = tmp_path / "late.parquet"
    shutil.move(late, aside)
    assert lake_table.commit_staged(catalog, location).files == 3
    iceberg = lake_table.open_table(catalog)
    assert lake_table.marks(iceberg)[writer] == 3
    assert iceberg.properties[f"{admit.GAPS_PREFIX}{writer}"] == "1"
    shutil.move(aside, late)
    lake_table.maintain(catalog, location, seal_hours=0, snapshot_age=timedelta(0), orphan_age=timedelta(0))
    assert late.exists(), "maintain deleted a staged file in a gap"
    assert lake_table.commit_staged(catalog, location).files == 1
    iceberg = lake_table.open_table(catalog)
    assert f"{admit.GAPS_PREFIX}{writer}" not in iceberg.properties
    assert sorted(ids(catalog, location)) == sorted(r["request_id"] for r in rows)


def test_gap_arithmetic() -> None:
    assert admit.advance(4, [], [5, 8]) == (8, [(6, 7)])
    assert admit.advance(8, [(6, 7)], [6]) == (8, [(7, 7)])
    assert admit.advance(12, [(6, 7), (9, 11)], [7, 10]) == (12, [(6, 6), (9, 9), (11, 11)])
    assert admit.advance(12, [(6, 7)], [6, 7, 15]) == (15, [(13, 14)])
    assert admit.advance(-1, [], [0, 1, 2]) == (2, [])
    assert admit.parse_ranges(admit.format_ranges([(1, 3), (7, 7)])) == [(1, 3), (7, 7)]
    assert admit.format_ranges([(1, 3), (7, 7)]) == "1-3,7"


def test_a_file_the_filesystem_cannot_read_stays_staged_and_the_rest_commit(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    lake = tmp_path / "lake"
    catalog, location = catalog_of(tmp_path)
    stage(lake, "w", synthetic_rows(200, DAY0, seed=5), 100)
    stage(lake, "o", synthetic_rows(100, DAY0, seed=6, prefix="o"), 100)
    footer = admit._footer

    def flaky(where: Lake, path: str) -> Any:
        if "/o." in path:
            raise admit.Unreadable("OSError: the object store is away")
        return footer(where, path)

    monkeypatch.setattr(admit, "_footer", flaky)
    result = lake_table.commit_staged(catalog, location)
    assert result.files == 2 and len(result.unreadable) == 1 and not result.quarantined
    monkeypatch.setattr(admit, "_footer", footer)
    assert lake_table.commit_staged(catalog, location).files == 1


def sample(registry: Any, name: str, labels: dict[str, str] | None = None) -> float | None:
    from prometheus_client import generate_latest

    for family in text_string_to_metric_families(generate_latest(registry).decode()):
        for s in family.samples:
            if s.name == name and (labels is None or s.labels == labels):
                return float(s.value)
    return None


def test_a_commit_pass_exports_files_rows_quarantined_and_last_success(tmp_path: Path) -> None:
    from collector.lake import cli

    lake = tmp_path / "lake"
    catalog, location = catalog_of(tmp_path)
    stage(lake, "w", synthetic_rows(300, DAY0, seed=7), 100)
    put(lake, "junk.1", 0, b"garbage" * 10)
    metrics = CommitterMetrics()
    before = datetime.now(UTC).timestamp()
    quarantined, table = cli._commit_pass(catalog, location, lake_table.DEFAULT_TABLE, metrics, 30.0, None)
    assert quarantined == 1 and table is not None
    assert sample(metrics.registry, "headroom_lake_commit_files_total") == 3
    assert sample(metrics.registry, "headroom_lake_commit_rows_total") == 300
    assert sample(metrics.registry, "headroom_lake_quarantined_files_total") == 1
    assert sample(metrics.registry, "headroom_lake_quarantine_files") == 1
    assert sample(metrics.registry, "headroom_lake_staged_files_waiting") == 0
    last = sample(metrics.registry, "headroom_lake_commit_last_success_timestamp_seconds")
    assert last is not None and last >= before
    # the catalog goes away while a writer stages: the pass fails, files wait, the last success stays
    writer = stage(lake, "v", synthetic_rows(100, DAY0, seed=8, prefix="v"), 50)
    quarantined, _ = cli._commit_pass(
        _FailingCatalog(), location, lake_table.DEFAULT_TABLE, metrics, 30.0, table
    )
    assert quarantined == 0
    assert sample(metrics.registry, "headroom_lake_commit_last_success_timestamp_seconds") == last
    assert sample(metrics.registry, "headroom_lake_staged_files_waiting") == 2
    lag = sample(metrics.registry, "headroom_lake_commit_lag_seconds", {"writer": writer})
    assert lag is not None and 0 <= lag < 600


class _FailingCatalog:
    def load_table(self, identifier: str) -> Any:
        raise ConnectionError("the catalog database is unreachable")


@pytest.mark.subprocess
def test_lake_commit_serves_its_metrics(tmp_path: Path) -> None:
    lake = tmp_path / "lake"
    stage(lake, "w", synthetic_rows(200, DAY0, seed=9), 100)
    port = free_port()
    process = subprocess.Popen(
        [str(HEADROOM), "lake", "commit", "--catalog", f"sqlite:///{tmp_path / 'c.db'}", "--lake", str(lake)]
        + ["--every", "1", "--metrics-listen", f"127.0.0.1:{port}"],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
    )
    try:

        def committed() -> bool:
            try:
                text = httpx.get(f"http://127.0.0.1:{port}/metrics", timeout=patient(2)).text
            except httpx.HTTPError:
                return False
            return "headroom_lake_commit_files_total 2.0" in text and "last_success_timestamp" in text

        wait_until(committed, timeout_s=60, what="the committer's metrics")
    finally:
        stop_process(process)


def _duckdb_log(path: Path, rows: list[dict[str, Any]]) -> None:
    if path.exists():
        path.unlink()
    store = RequestStore(path)
    store.insert_rows(rows)
    store.close()


def _import(tmp_path: Path, db: Path) -> subprocess.CompletedProcess[str]:
    args = [str(HEADROOM), "lake", "import", "--catalog", f"sqlite:///{tmp_path / 'c.db'}"]
    args += ["--lake", str(tmp_path / "lake"), "--db", str(db)]
    return subprocess.run(args, capture_output=True, text=True, timeout=patient(120))


@pytest.mark.subprocess
def test_two_boxes_logs_at_one_path_both_land_and_each_once(tmp_path: Path) -> None:
    """Box a's /data/headroom.duckdb, then box b's at the same path: both land; importing either
    again adds nothing; a day that gained a row adds that row only."""
    db = tmp_path / "data" / "headroom.duckdb"
    db.parent.mkdir()
    start = DAY0 - timedelta(days=1)
    box_a = synthetic_rows(300, start, span=timedelta(days=2), seed=10, prefix="a")
    box_b = synthetic_rows(200, start, span=timedelta(days=2), seed=11, prefix="b")
    for row in box_b:
        row["instance"] = "box-b"
    _duckdb_log(db, box_a)
    assert _import(tmp_path, db).returncode == 0
    _duckdb_log(db, box_b)
    second = _import(tmp_path, db)
    assert second.returncode == 0 and "0 files and 0 rows" not in second.stderr, second.stderr
    again = _import(tmp_path, db)
    assert again.returncode == 0 and "0 files and 0 rows added" in again.stderr, again.stderr
    late = synthetic_rows(1, start + timedelta(hours=3), seed=12, prefix="late")
    _duckdb_log(db, box_b + late)  # a row of a day imported before
    grown = _import(tmp_path, db)
    assert grown.returncode == 0 and "1 files and 1 rows added" in grown.stderr, grown.stderr
    location = Lake.parse(tmp_path / "lake")
    found = ids(lake_table.open_catalog(f"sqlite:///{tmp_path / 'c.db'}", location), location)
    expected = {r["request_id"] for r in box_a + box_b + late}
    assert len(found) == len(set(found)) == len(expected) and set(found) == expected
