"""A bounded on-disk spool of Arrow batches: one file per batch, oldest first, atomic writes.

The lake's writer (collector.lake.stage.LakeWriter) appends every batch here, its write-ahead
buffer, and rolls the spool into staged Parquet files; while the lake cannot be written the rows
wait here. The bound is in bytes; a payload that would cross it is refused (the caller counts the
rows dropped). The directory is created 0700 and each file 0600: the rows carry tenants and timings.
An index of the files is kept in memory, so `put`, `take` and the depth metrics never list the
directory (it may hold thousands of files after a long outage).

File names are `<created ns>-<seq>-<rows>.arrow`, each an Arrow IPC stream. A crash mid-write
leaves a `.tmp` that the next start removes.
"""

from __future__ import annotations

import os
import threading
import time
from collections import deque
from dataclasses import dataclass
from pathlib import Path

__all__ = ["Spool", "SpoolEntry"]

_SUFFIX = ".arrow"


@dataclass(frozen=True, slots=True)
class SpoolEntry:
    """One spooled payload: its file, rows, bytes and when it was spooled (ns since the epoch)."""

    path: Path
    rows: int
    size: int
    created_ns: int


def _entry(path: Path) -> SpoolEntry | None:
    """The entry of an existing spool file; None for a name this spool did not write."""
    parts = path.stem.split("-")
    if path.suffix != _SUFFIX or len(parts) != 3 or not all(part.isdigit() for part in parts):
        return None
    return SpoolEntry(path, int(parts[2]), path.stat().st_size, int(parts[0]))


class Spool:
    """Spooled payloads in one directory, oldest first; thread-safe."""

    def __init__(self, directory: str | os.PathLike[str], max_bytes: int) -> None:
        if max_bytes <= 0:
            raise ValueError(f"spool max_bytes must be positive, got {max_bytes}")
        self.directory = Path(directory)
        if not self.directory.exists():
            self.directory.mkdir(parents=True, mode=0o700)
        self.max_bytes = max_bytes
        self._lock = threading.Lock()
        self._seq = 0
        for leftover in self.directory.glob("*.tmp"):  # a crash mid-write left half a file
            leftover.unlink(missing_ok=True)
        found = (_entry(path) for path in self.directory.iterdir() if path.suffix == _SUFFIX)
        entries = sorted((entry for entry in found if entry is not None), key=lambda e: e.path.stem)
        self._entries: deque[SpoolEntry] = deque(entries)  # oldest first
        self._used = sum(entry.size for entry in self._entries)

    def files(self) -> list[Path]:
        """Spooled payloads, oldest first."""
        with self._lock:
            return [entry.path for entry in self._entries]

    def __len__(self) -> int:
        return len(self._entries)

    def size_bytes(self) -> int:
        """Bytes spooled now."""
        return self._used

    def rows(self) -> int:
        """Rows waiting."""
        with self._lock:
            return sum(entry.rows for entry in self._entries)

    def oldest_ns(self) -> int | None:
        """When the oldest payload still here was spooled; None when empty."""
        with self._lock:
            return self._entries[0].created_ns if self._entries else None

    @staticmethod
    def rows_in(path: Path) -> int:
        """Row count recorded in a spool file's name."""
        return int(path.stem.rsplit("-", 1)[-1])

    def put(self, payload: bytes, rows: int) -> bool:
        """Store one Arrow IPC payload (0600, atomically); False (nothing written) past max_bytes."""
        with self._lock:
            if self._used + len(payload) > self.max_bytes:
                return False
            self._seq += 1
            created = time.time_ns()
            final = self.directory / f"{created:020d}-{self._seq:06d}-{rows}{_SUFFIX}"
            temporary = final.with_suffix(".tmp")
            descriptor = os.open(temporary, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
            with os.fdopen(descriptor, "wb") as handle:
                handle.write(payload)
            os.replace(temporary, final)
            self._entries.append(SpoolEntry(final, rows, len(payload), created))
            self._used += len(payload)
            return True

    def take(self, max_rows: int, max_bytes: int) -> list[SpoolEntry]:
        """The oldest entries up to `max_rows` rows and `max_bytes` bytes (at least one), kept."""
        with self._lock:
            taken: list[SpoolEntry] = []
            rows = size = 0
            for entry in self._entries:
                if taken and (rows + entry.rows > max_rows or size + entry.size > max_bytes):
                    break
                taken.append(entry)
                rows, size = rows + entry.rows, size + entry.size
            return taken

    def remove(self, entries: list[SpoolEntry]) -> None:
        """Forget payloads that were staged (or given up for good)."""
        gone = {entry.path for entry in entries}
        with self._lock:
            kept = deque(entry for entry in self._entries if entry.path not in gone)
            for entry in entries:
                entry.path.unlink(missing_ok=True)
            self._used -= sum(entry.size for entry in self._entries if entry.path in gone)
            self._entries = kept
