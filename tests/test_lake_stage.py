"""The sidecar's lake writer (collector.lake.stage): spool as write-ahead, staged Parquet files,
a crash mid-roll repaired with the same names and bytes, and `headroom run --lake` end to end."""

from __future__ import annotations

import json
import subprocess
import sys
from datetime import UTC, datetime, timedelta
from pathlib import Path

import httpx
import pyarrow.parquet as pq
import pytest
from support.sidecar import CHAT, sidecar_rig
from support.waiting import patient

from collector.lake.layout import Lake, parse_staged, safe_writer_part, staged_name
from collector.lake.stage import LakeWriter, day_files, parquet_bytes
from collector.record import RequestRecord
from collector.sidecar.wiring import sidecar_state
from collector.store.db import ARROW_SCHEMA, rows_to_arrow

T0 = datetime(2026, 3, 1, 23, 59, 58, tzinfo=UTC)


def records(count: int, start: datetime = T0, step_s: float = 0.5, prefix: str = "r") -> list[RequestRecord]:
    return [
        RequestRecord(
            request_id=f"{prefix}{i:06d}",
            instance="w",
            model="m1" if i % 2 else "m2",
            admitted_at=start + timedelta(seconds=i * step_s),
            completed_at=start + timedelta(seconds=i * step_s + 1),
            ttft_s=0.1 + i / 1000,
            outcome="ok",
        )
        for i in range(count)
    ]


def staged_rows(lake: Lake) -> list[dict[str, object]]:
    rows: list[dict[str, object]] = []
    for name in lake.staged():
        rows.extend(pq.read_table(name.path).to_pylist())
    return rows


def test_lake_uri_forms(tmp_path: Path) -> None:
    local = Lake.parse(str(tmp_path / "lake"))
    assert local.uri == (tmp_path / "lake").as_uri() and local.local
    assert Lake.parse(local.uri).base == str(tmp_path / "lake")
    with pytest.raises(ValueError, match="--lake"):
        Lake.parse("nosuchscheme://x/y")
    assert safe_writer_part("pod/7 a") == "pod_7_a"
    name = staged_name(local, "w.1a2b", 42)
    assert name.endswith("staged/w.1a2b/w.1a2b-000000000042.parquet")
    parsed = parse_staged(name)
    assert parsed is not None and (parsed.writer, parsed.seq) == ("w.1a2b", 42)
    assert parse_staged(name + ".tmp") is None


def test_one_file_per_day_sorted_and_deterministic() -> None:
    table = rows_to_arrow(list(reversed(records(8))))  # 23:59:58 .. 00:00:01.5: two days
    days = day_files(table)
    assert [d.num_rows for d in days] == [4, 4]
    for day in days:
        stamps = day["admitted_at"].to_pylist()
        assert stamps == sorted(stamps) and len({s.date() for s in stamps}) == 1
    assert parquet_bytes(days[0]) == parquet_bytes(day_files(table)[0])


def test_rows_are_spooled_then_staged_on_flush(tmp_path: Path) -> None:
    writer = LakeWriter(tmp_path / "lake", "pod-1", tmp_path / "spool", roll_seconds=3600)
    try:
        assert writer.write_batch(records(10)) == 0  # spooled: counted once staged
        assert len(writer.spool) == 1 and writer.lake.staged() == []
        assert writer.flush(10)
        names = writer.lake.staged()
        assert [n.seq for n in names] == [0, 1]  # two UTC days, two files, one sequence
        assert len(writer.spool) == 0
        assert sorted(r["request_id"] for r in staged_rows(writer.lake)) == [f"r{i:06d}" for i in range(10)]
        assert pq.read_schema(names[0].path).names == ARROW_SCHEMA.names
    finally:
        writer.close()
    again = LakeWriter(tmp_path / "lake", "pod-1", tmp_path / "spool", roll_seconds=3600)
    try:  # the state is persisted: the same writer id, the next sequence number
        assert (again.writer, again.next_seq) == (writer.writer, 2)
    finally:
        again.close()


def test_close_stages_what_is_spooled_and_a_full_spool_drops(tmp_path: Path) -> None:
    writer = LakeWriter(
        tmp_path / "lake", "pod", tmp_path / "spool", roll_seconds=3600, max_spool_bytes=20_000
    )
    writer.write_batch(records(3, start=T0 + timedelta(hours=1)))
    from collector.store.writer import RowsDropped

    with pytest.raises(RowsDropped) as dropped:
        writer.write_batch(records(2000, prefix="big"))
    assert dropped.value.reason == "spool_full" and dropped.value.count == 2000
    writer.close()
    assert len(staged_rows(writer.lake)) == 3


def test_a_crash_mid_roll_rewrites_the_same_names_with_the_same_bytes(tmp_path: Path) -> None:
    """Plan written and one of two files staged, then the process died: the next start writes
    both files under the same names (the first with identical bytes) and nothing twice."""
    spool, lake_dir = tmp_path / "spool", tmp_path / "lake"
    writer = LakeWriter(lake_dir, "pod", spool, roll_seconds=3600)
    writer.write_batch(records(8))
    writer.close()  # staged normally: remember the bytes, then stage the same rows as a crash would
    first = {n.path: Path(n.path).read_bytes() for n in writer.lake.staged()}
    for path in first:
        Path(path).unlink()
    state = json.loads((spool / "lake-state.json").read_text())
    (spool / "lake-state.json").write_text(json.dumps(state | {"next_seq": 0}))
    crashed = LakeWriter(lake_dir, "pod", spool, roll_seconds=3600)
    crashed.close()  # nothing spooled yet: the roller stops without rolling what follows
    crashed.write_batch(records(8))
    entries = crashed.spool.take(2**62, 2**62)
    crashed._write_plan(entries)
    only = sorted(first)[0]  # "died" after the first of the two files
    Path(only).write_bytes(first[only])
    restarted = LakeWriter(lake_dir, "pod", spool, roll_seconds=3600)
    restarted.close()
    assert {n.path: Path(n.path).read_bytes() for n in restarted.lake.staged()} == first
    assert sorted(r["request_id"] for r in staged_rows(restarted.lake)) == [f"r{i:06d}" for i in range(8)]
    assert not (spool / "lake-plan.json").exists() and len(restarted.spool) == 0


def test_sidecar_with_lake_stages_rows_and_exports_spool_health(tmp_path: Path) -> None:
    with sidecar_rig(
        tmp_path, db_path=None, lake=str(tmp_path / "lake"), spool_dir=str(tmp_path / "spool")
    ) as rig:
        for _ in range(5):
            assert (
                httpx.post(rig.url + "/v1/chat/completions", json=CHAT, timeout=patient(10)).status_code
                == 200
            )
        assert sidecar_state(rig.app).writer.flush(patient(30))
        rows = staged_rows(Lake.parse(str(tmp_path / "lake")))
        assert len(rows) == 5 and {r["instance"] for r in rows} == {"test"}
        assert all(r["model"] == "m1" and r["ttft_s"] is not None for r in rows)
        metrics = rig.metrics()
        assert metrics[("headroom_log_spool_files", ())] == 0
        assert metrics[("headroom_log_rows_written_total", ())] == 5
        assert [(key, value) for key, value in metrics.items() if key[0] == "headroom_log_sink_up"] == [
            (("headroom_log_sink_up", (("reason", "ok"),)), 1)
        ]
    assert not (tmp_path / "log.duckdb").exists()


@pytest.mark.subprocess
def test_the_sidecars_lake_path_imports_no_pyiceberg(tmp_path: Path) -> None:
    """`headroom run --lake` builds without loading pyiceberg or SQLAlchemy (the slim install has
    neither; tests/test_packaging.py runs it there)."""
    code = (
        "import sys\n"
        "from collector.cli import main\n"
        "from collector.sidecar.config import SidecarConfig\n"
        "from collector.sidecar.wiring import build_sidecar, sidecar_state\n"
        f"app = build_sidecar(SidecarConfig(upstream='http://127.0.0.1:9', db_path=None, lake={str(tmp_path / 'lake')!r},"
        f" spool_dir={str(tmp_path / 'spool')!r}, engine='none', jobs=False))\n"
        "assert sidecar_state(app).batch_sink.flush(30)\n"  # the roller opened the lake
        "print(sorted(m for m in sys.modules if m.split('.')[0] in ('pyiceberg', 'sqlalchemy', 'psycopg')))\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=patient(120))
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.strip() == "[]", done.stdout
    assert (tmp_path / "lake" / "staged").is_dir()  # the lake writer was built
