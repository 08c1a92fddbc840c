"""A bounded on-disk spool of ingest payloads: one file per batch, oldest first, atomic writes.

The shipper writes here while the store is unreachable and replays from here when it is back. The
bound is in bytes; a payload that would cross it is refused (the caller counts the rows dropped).
"""

from __future__ import annotations

import os
import threading
import time
from pathlib import Path

__all__ = ["Spool"]


class Spool:
    """Files `<ns>-<seq>-<rows>.json` in one directory; thread-safe."""

    def __init__(self, directory: str | os.PathLike, max_bytes: int) -> None:
        if max_bytes <= 0:
            raise ValueError(f"spool max_bytes must be positive, got {max_bytes}")
        self.directory = Path(directory)
        self.directory.mkdir(parents=True, exist_ok=True)
        self.max_bytes = max_bytes
        self._lock = threading.Lock()
        self._seq = 0
        for leftover in self.directory.glob("*.tmp"):  # a crash mid-write left half a file
            leftover.unlink(missing_ok=True)
        # kept in memory so put() stays O(1) with thousands of small spooled batches
        self._used = sum(path.stat().st_size for path in self.directory.glob("*.json"))

    def files(self) -> list[Path]:
        """Spooled payloads, oldest first."""
        with self._lock:
            return sorted(self.directory.glob("*.json"))

    def size_bytes(self) -> int:
        """Bytes spooled now."""
        with self._lock:
            return self._used

    def rows(self) -> int:
        """Rows waiting (from the file names, no parsing)."""
        return sum(self.rows_in(path) for path in self.files())

    @staticmethod
    def rows_in(path: Path) -> int:
        """Row count recorded in a spool file's name."""
        return int(path.stem.rsplit("-", 1)[-1])

    def put(self, payload: bytes, rows: int) -> bool:
        """Store one payload; False (nothing written) when it would exceed max_bytes."""
        with self._lock:
            if self._used + len(payload) > self.max_bytes:
                return False
            self._seq += 1
            final = self.directory / f"{time.time_ns():020d}-{self._seq:06d}-{rows}.json"
            temporary = final.with_suffix(".tmp")
            temporary.write_bytes(payload)
            os.replace(temporary, final)
            self._used += len(payload)
            return True

    def remove(self, path: Path) -> None:
        """Forget a payload the store has accepted."""
        with self._lock:
            try:
                size = path.stat().st_size
            except FileNotFoundError:
                return
            path.unlink(missing_ok=True)
            self._used -= size
