"""Give the allocator's free memory back to the system, every minute, on glibc.

The sidecar's threads (the event loop, the log writer, DuckDB's workers) each allocate from their
own glibc arena. Freed memory inside an arena stays mapped until glibc trims it, which it does
only from the top of the main heap: a long run of mixed traffic left the RSS growing by 5-9 MiB
per 10 minutes with no object, malloc byte or DuckDB buffer more at the end than in the middle,
and one `malloc_trim(0)` gave 64-67 MiB back (BENCHMARKS.md §10b). `AllocatorTrim` calls it from
a thread of its own every TRIM_EVERY_S; ctypes drops the GIL for the call, so the event loop keeps
serving while glibc walks its arenas. Elsewhere (musl, macOS) it does nothing.
"""

from __future__ import annotations

import ctypes
import logging
import threading
from collections.abc import Callable

log = logging.getLogger(__name__)

__all__ = ["TRIM_EVERY_S", "AllocatorTrim", "glibc_malloc_trim"]

TRIM_EVERY_S = 60.0


def glibc_malloc_trim() -> Callable[[int], int] | None:
    """glibc's malloc_trim, or None where the C library has none."""
    try:
        trim = ctypes.CDLL(None).malloc_trim  # the process's own symbols: its C library's
    except (OSError, AttributeError):
        return None
    trim.argtypes = [ctypes.c_size_t]
    trim.restype = ctypes.c_int
    return trim


class AllocatorTrim:
    """A daemon thread calling `trim(0)` every `every_s` until stop(); with no trim, no thread."""

    def __init__(self, trim: Callable[[int], int] | None, every_s: float = TRIM_EVERY_S) -> None:
        self._trim = trim
        self._every_s = every_s
        self._stopping = threading.Event()
        self._thread: threading.Thread | None = None
        self.trims = 0  # calls made (the tests read it)

    def start(self) -> None:
        if self._trim is None or self._thread is not None:
            return
        self._thread = threading.Thread(target=self._run, name="headroom-malloc-trim", daemon=True)
        self._thread.start()

    def trim_now(self) -> bool:
        """One trim; True when glibc gave memory back."""
        if self._trim is None:
            return False
        self.trims += 1
        return bool(self._trim(0))

    def _run(self) -> None:
        while not self._stopping.wait(self._every_s):
            try:
                self.trim_now()
            except Exception:  # never take the sidecar down for a housekeeping call
                log.exception("malloc_trim failed; not trimming again")
                return

    def stop(self) -> None:
        self._stopping.set()
        if self._thread is not None:
            self._thread.join(timeout=5)
            self._thread = None
