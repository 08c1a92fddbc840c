"""Whether a target is met, from paired rounds: a median with a distribution-free interval.

One run's median on this shared 2-vCPU host moves by 10-15 % (BENCHMARKS.md §2), more than a
5 % target: a median alone reads "met" in one run and "missed" in the next. Each round of
proxy_overhead.py gives one ratio (the proxy against the pass-through, measured seconds apart),
so the rounds are samples of that ratio and its median has an interval that assumes nothing
about their distribution: between two order statistics, chosen by the binomial distribution
(the sign test's interval). A target is *met* when the whole interval is on its good side,
*missed* when the whole interval is on the bad side, and *undecided* otherwise: then more
rounds, not another run, are what decide it.

    >>> median_interval([0.90, 0.91, 0.93, 0.94, 0.95, 0.96, 0.97, 0.99, 0.92, 0.93, 0.94, 0.91])
    (0.935, 0.91, 0.96, 0.9614)
    >>> verdict([0.90, 0.91, 0.93, 0.94, 0.95, 0.96, 0.97, 0.99, 0.92, 0.93, 0.94, 0.91], at_least=0.95)
    'undecided'
    >>> verdict([0.90, 0.91, 0.93, 0.94, 0.92, 0.93, 0.94, 0.91, 0.96, 0.92, 0.93, 0.95], at_least=0.95)
    'missed'
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Sequence

__all__ = ["median_interval", "verdict", "describe"]


def median_interval(values: Sequence[float], confidence: float = 0.95) -> tuple[float, float, float, float]:
    """(median, low, high, coverage): the widest-needed order statistics x(k) and x(n+1-k) whose
    interval covers the population median with at least `confidence`, or the whole range when
    there are too few rounds for that (then `coverage` says how much the range covers).

    Coverage of [x(k), x(n+1-k)] is 1 - 2 * P(Binomial(n, 1/2) <= k - 1).
    """
    ordered = sorted(values)
    n = len(ordered)
    if n == 0:
        raise ValueError("no rounds to summarise")
    k = 1  # the range itself, whatever it covers
    for candidate in range(2, (n + 1) // 2 + 1):
        if _coverage(n, candidate) < confidence:
            break
        k = candidate
    return statistics.median(ordered), ordered[k - 1], ordered[n - k], round(_coverage(n, k), 4)


def _coverage(n: int, k: int) -> float:
    """How often [x(k), x(n+1-k)] of n samples holds the median: 1 - 2 P(Binomial(n, 1/2) < k)."""
    return 1 - 2 * sum(math.comb(n, i) for i in range(k)) / 2**n


def verdict(values: Sequence[float], *, at_least: float | None = None, at_most: float | None = None) -> str:
    """'met', 'missed' or 'undecided' for a target on the median of `values` (95 % interval)."""
    _, low, high, _ = median_interval(values)
    if at_least is not None:
        return "met" if low >= at_least else "missed" if high < at_least else "undecided"
    if at_most is not None:
        return "met" if high <= at_most else "missed" if low > at_most else "undecided"
    raise ValueError("give a target: at_least or at_most")


def describe(values: Sequence[float], *, at_least: float | None = None, at_most: float | None = None) -> str:
    """One line for a report, e.g. '0.945 [0.91, 0.97] over 8 rounds (93 %): undecided for >= 0.95'."""
    median, low, high, coverage = median_interval(values)
    target = f">= {at_least}" if at_least is not None else f"<= {at_most}"
    return (
        f"{median:.3f} [{low:.3f}, {high:.3f}] over {len(values)} rounds ({coverage:.0%}): "
        f"{verdict(values, at_least=at_least, at_most=at_most)} for {target}"
    )
