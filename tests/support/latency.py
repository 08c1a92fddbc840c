"""Latency limits measured against the process's own pace on this machine, not against a timer.

A latency acceptance ("within 100 ms p99") holds on a quiet host. Beside CPU hogs the kernel alone
can hold a process off the CPU for 100 ms, so the limit becomes RATIO times the p99 of the same
requests to the same process without the load under test (measured in the same run), and a few
windows are measured: the best window must pass, as `timeit` keeps the best of its repeats. A
process that really starves its clients fails every window, and past `starved_s` it fails however
busy the host is.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import TypeVar

__all__ = ["RATIO", "WINDOWS", "best_window", "bound", "p50", "p99"]

T = TypeVar("T")

RATIO = 4.0
WINDOWS = 3


def p99(took: Sequence[float]) -> float:
    """The 99th percentile of `took` (nearest rank, lower)."""
    ranked = sorted(took)
    return ranked[max(int(len(ranked) * 0.99) - 1, 0)]


def p50(took: Sequence[float]) -> float:
    ranked = sorted(took)
    return ranked[len(ranked) // 2]


def bound(absolute_s: float, baseline_s: float, starved_s: float) -> float:
    """`absolute_s`, or RATIO times the same process's unloaded figure on this host, never past
    `starved_s`."""
    return min(max(absolute_s, RATIO * baseline_s), starved_s)


def best_window(measure: Callable[[], T], passes: Callable[[T], bool], windows: int = WINDOWS) -> list[T]:
    """Measure up to `windows` windows, stopping at the first that passes; every window measured is
    returned (the caller asserts that the best one passes and that none was starved)."""
    measured = [measure()]
    while not passes(measured[-1]) and len(measured) < windows:
        measured.append(measure())
    return measured
