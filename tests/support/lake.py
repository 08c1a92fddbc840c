"""Staging rows into a lake as the sidecar's LakeWriter does, for the lake's tests."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from collector.lake.stage import LakeWriter
from collector.record import RequestRecord

__all__ = ["stage"]


def stage(lake: Path, writer: str, rows: list[dict[str, Any]], per_file: int) -> str:
    """Stage `rows` as one writer's files of `per_file` rows each (its spool beside the lake);
    returns the writer's name. The same `writer` again continues its sequence (same spool)."""
    w = LakeWriter(lake, writer, lake.parent / f"spool-{writer}", roll_seconds=3600)
    try:
        for at in range(0, len(rows), per_file):
            w.write_batch([RequestRecord.from_row(row) for row in rows[at : at + per_file]])
            assert w.flush(30)
    finally:
        w.close()
    return w.writer
