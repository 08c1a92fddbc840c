"""wait_until: the one poll helper. Polling is for state another process or thread owns (a row in
a database, a metric); where an event can be awaited, tests await it instead."""

from __future__ import annotations

import asyncio
import os
import time
from collections.abc import Awaitable, Callable
from typing import TypeVar

__all__ = ["PATIENCE", "patient", "wait_until", "wait_until_async"]

T = TypeVar("T")

# A deadline in a test is a failure detector, not a measurement: it bounds how long a broken build
# hangs. Written for a quiet machine, each is stretched by PATIENCE so that the same suite passes
# on a busy one (two CPU hogs beside it, a faked clock): a passing test never waits for its
# deadline, so the stretch costs nothing unless the test fails. What a test measures (a latency
# limit, a knee) is never stretched.
PATIENCE = float(os.environ.get("HEADROOM_TEST_PATIENCE", "4"))


def patient(seconds: float) -> float:
    """`seconds`, a deadline written for a quiet machine, stretched for a busy one."""
    return seconds * PATIENCE


def wait_until(
    predicate: Callable[[], T],
    timeout_s: float = 10.0,
    *,
    what: str = "the condition",
    interval_s: float = 0.02,
) -> T:
    """Call `predicate` until it returns something truthy (returned); AssertionError at the deadline."""
    timeout_s = patient(timeout_s)
    deadline = time.monotonic() + timeout_s
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"{what}: not reached within {timeout_s} s")
        time.sleep(interval_s)


async def wait_until_async(
    check: Callable[[], Awaitable[T]],
    timeout_s: float = 20.0,
    *,
    what: str = "the condition",
    interval_s: float = 0.05,
) -> T:
    """The same for an async `check` inside a test's event loop."""
    timeout_s = patient(timeout_s)
    deadline = time.monotonic() + timeout_s
    last: T | None = None
    while time.monotonic() < deadline:
        last = await check()
        if last:
            return last
        await asyncio.sleep(interval_s)
    raise AssertionError(f"{what}: not reached within {timeout_s} s (last: {last!r})")
