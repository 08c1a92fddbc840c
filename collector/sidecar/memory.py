"""Give memory back every minute: a full garbage collection, then glibc's malloc_trim.

Two things held what a soak of hostile traffic freed (BENCHMARKS.md §10b). Python's own full
collection almost never runs in a serving sidecar: start-up's objects are frozen and the youngest
generation is collected every 20,000 allocations (collector.sidecar.app), so requests' reference
cycles (an exception, its traceback, the frames and buffers they hold) that outlive two young
collections wait in the oldest generation, and 30 minutes saw none. And glibc keeps freed memory
inside its arenas, trimming only the top of the main heap by itself. The RSS crept by 5-9 MiB per
10 minutes with no more objects, malloc bytes or DuckDB memory at the end than in the middle, and
one collection and trim gave 60-70 MiB back. `MemoryReturn.run`, a task of the sidecar's event loop,
does both every RETURN_EVERY_S: the collection on the loop (finalisers run where the objects
live; ~50,000 unfrozen objects take a few milliseconds), the trim in a worker thread (ctypes drops
the GIL, so the loop serves while glibc walks its arenas). Off glibc (musl, macOS) it only
collects.
"""

from __future__ import annotations

import asyncio
import ctypes
import gc
import logging
from collections.abc import Callable

__all__ = ["RETURN_EVERY_S", "MemoryReturn", "glibc_malloc_trim"]

log = logging.getLogger(__name__)

RETURN_EVERY_S = 60.0


def glibc_malloc_trim() -> Callable[[int], int] | None:
    """glibc's malloc_trim, or None where the C library has none."""
    try:
        trim = ctypes.CDLL(None).malloc_trim  # the process's own symbols: its C library's
    except (OSError, AttributeError):
        return None
    trim.argtypes = [ctypes.c_size_t]
    trim.restype = ctypes.c_int
    return trim


class MemoryReturn:
    """Every `every_s`: `collect()` on the loop, then `trim(0)` in a thread (no trim: collect only)."""

    def __init__(
        self,
        trim: Callable[[int], int] | None,
        every_s: float = RETURN_EVERY_S,
        collect: Callable[[], object] = gc.collect,
    ) -> None:
        self._trim = trim
        self._every_s = every_s
        self._collect = collect
        self.rounds = 0  # rounds done (the tests read it)

    async def once(self) -> bool:
        """One round; True when glibc gave memory back."""
        self._collect()
        gave = False
        if self._trim is not None:
            gave = bool(await asyncio.to_thread(self._trim, 0))
        self.rounds += 1
        return gave

    async def run(self) -> None:
        """Rounds until cancelled; a round that raises is logged and ends them (never the sidecar)."""
        while True:
            await asyncio.sleep(self._every_s)  # the period itself, not a wait for an event
            try:
                await self.once()
            except Exception:
                log.exception("giving memory back failed; not trying again")
                return
