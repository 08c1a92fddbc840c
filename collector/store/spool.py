"""A bounded on-disk spool of Arrow batches: one file per batch, oldest first, atomic writes.

The lake's writer (collector.lake.stage.LakeWriter) appends every batch here, its write-ahead
buffer, and rolls the spool into staged Parquet files; while the lake cannot be written the rows
wait here. The bound is in bytes; a payload that would cross it is refused (the caller counts the
rows dropped). The directory is created 0700 and each file 0600: the rows carry tenants and timings.
An index of the files is kept in memory, so `put`, `take` and the depth metrics never list the
directory (it may hold thousands of files after a long outage).

One process owns a spool at a time: `spool.lock` in the directory holds an exclusive OS lock
(flock) from the Spool's creation until `close()` or the process's end (a SIGKILL releases it
too), and names the holder's pid; a second Spool on the directory raises SpoolBusy.

File names are `<created ns>-<seq>-<rows>.arrow`, each an Arrow IPC stream, fsynced before the
rename that makes it visible (and the directory after). A crash mid-write leaves a `.tmp` that the
next start removes; a failed write removes its own. A file that cannot be read is set aside under
`quarantine/` (`quarantine`), out of the index.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import threading
import time
from collections import deque
from dataclasses import dataclass
from pathlib import Path

__all__ = [
    "Spool",
    "SpoolBusy",
    "SpoolEntry",
    "QUARANTINE",
    "write_atomic",
    "write_temporary",
    "write_synced",
    "sync_directory",
]

_SUFFIX = ".arrow"
_LOCK = "spool.lock"
QUARANTINE = "quarantine"  # the spool's sub-folder for files it could not read


class SpoolBusy(OSError):
    """Another process owns the spool directory (its lock is held); the message names both."""


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


def write_synced(descriptor: int, payload: bytes) -> None:
    """All of `payload` to an open file, then fsync (the data is on disk before any rename)."""
    view = memoryview(payload)
    while view:
        view = view[os.write(descriptor, view) :]
    os.fsync(descriptor)


def sync_directory(directory: Path) -> None:
    """fsync a directory, so a rename or unlink in it survives a power cut."""
    descriptor = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(descriptor)
    finally:
        os.close(descriptor)


def write_temporary(temporary: Path, payload: bytes) -> None:
    """`payload` in a new file `temporary` (0600), synced to the disk: what write_atomic renames
    and the lake writer hard-links. Raises OSError (a full or read-only volume)."""
    descriptor = os.open(temporary, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    try:
        write_synced(descriptor, payload)
    finally:
        os.close(descriptor)


def write_atomic(path: Path, payload: bytes) -> None:
    """`payload` at `path` (0600) all or nothing: a synced temporary renamed over it, the folder synced.

    Raises OSError (a full or read-only volume) with no temporary left behind.
    """
    temporary = path.with_name(path.name + ".tmp")
    try:
        write_temporary(temporary, payload)
        os.replace(temporary, path)
    except OSError:
        temporary.unlink(missing_ok=True)
        raise
    sync_directory(path.parent)


def _lock(directory: Path) -> int:
    """Hold `spool.lock` in `directory` exclusively; SpoolBusy naming the holder when another does."""
    descriptor = os.open(directory / _LOCK, os.O_RDWR | os.O_CREAT, 0o600)
    try:
        fcntl.flock(descriptor, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        holder = os.pread(descriptor, 64, 0).decode(errors="replace").strip() or "unknown"
        os.close(descriptor)
        raise SpoolBusy(
            f"spool directory {directory} is in use by another process (pid {holder}): "
            "one sidecar per spool; give this one its own --spool-dir"
        ) from None
    with contextlib.suppress(OSError):  # the pid is for the message above; a full disk keeps the lock
        os.ftruncate(descriptor, 0)
        os.pwrite(descriptor, f"{os.getpid()}\n".encode(), 0)
    return descriptor


class Spool:
    """Spooled payloads in one directory, oldest first; thread-safe; one owner per directory."""

    def __init__(self, directory: str | os.PathLike[str], max_bytes: int) -> None:
        """Create (0700) and lock the directory, then index its payloads.

        Raises SpoolBusy when another process holds it, OSError when it cannot be created.
        """
        if max_bytes <= 0:
            raise ValueError(f"spool max_bytes must be positive, got {max_bytes}")
        self.directory = Path(directory)
        if not self.directory.exists():
            self.directory.mkdir(parents=True, mode=0o700)
        self._lock_fd: int | None = _lock(self.directory)  # before anything here is touched
        self.max_bytes = max_bytes
        self._lock = threading.Lock()
        self._seq = 0
        for leftover in self.directory.glob("*.tmp"):  # a crash mid-write left half a file
            leftover.unlink(missing_ok=True)
        found = (_entry(path) for path in self.directory.iterdir() if path.suffix == _SUFFIX)
        entries = sorted((entry for entry in found if entry is not None), key=lambda e: e.path.stem)
        self._entries: deque[SpoolEntry] = deque(entries)  # oldest first
        self._used = sum(entry.size for entry in self._entries)

    def close(self) -> None:
        """Give up the directory's lock (another process may own it from now on)."""
        if self._lock_fd is not None:
            os.close(self._lock_fd)
            self._lock_fd = None

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
        """Store one Arrow IPC payload (0600, synced, atomically); False (nothing written) past max_bytes.

        Raises OSError when the volume refuses it (full, read-only), leaving no file behind.
        """
        with self._lock:
            if self._used + len(payload) > self.max_bytes:
                return False
            self._seq += 1
            created = time.time_ns()
            final = self.directory / f"{created:020d}-{self._seq:06d}-{rows}{_SUFFIX}"
            write_atomic(final, payload)
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

    def quarantine(self, path: Path) -> Path:
        """Move a file this spool cannot read to `quarantine/` (out of the index); its new path.

        Raises OSError when the move fails (the file stays where it was).
        """
        folder = self.directory / QUARANTINE
        folder.mkdir(mode=0o700, exist_ok=True)
        target = folder / path.name
        with self._lock:
            os.replace(path, target)
            kept = deque(entry for entry in self._entries if entry.path != path)
            self._used -= sum(entry.size for entry in self._entries if entry.path == path)
            self._entries = kept
        sync_directory(self.directory)
        return target
