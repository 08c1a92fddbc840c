"""The SLO maximum: the largest measured concurrency whose latency meets the SLO (docs/domain.md §2.4).

A level meets the SLO when its p95 TTFT and p95 TPOT are within the targets given and its error
ratio is within `max_error_ratio`. The SLO maximum is the top of the run of passing levels that
starts at the lowest level: a level that passes only after a lower one failed is noise, not
capacity. No target given -> None (no SLO); targets given but the lowest level fails -> 0.
"""

from __future__ import annotations

from collections.abc import Sequence

from collector.capacity import LevelStats, Slo

__all__ = ["meets_slo", "slo_max"]


def _within(value: float | None, target: float | None) -> bool:
    return target is None or (value is not None and value <= target)


def meets_slo(level: LevelStats, slo: Slo) -> bool:
    """Whether one level meets every target of the SLO."""
    return (
        _within(level.ttft_p95_s, slo.ttft_p95_s)
        and _within(level.tpot_p95_s, slo.tpot_p95_s)
        and level.error_ratio <= slo.max_error_ratio
    )


def slo_max(levels: Sequence[LevelStats], slo: Slo) -> int | None:
    """Largest concurrency of the passing run from the lowest level; None without targets.

    Example: p95 TTFT 0.2, 0.3, 0.9, 0.4 s at 1, 2, 4, 8 with a 0.5 s target -> 2.
    """
    if not slo.defined:
        return None
    best = 0
    for level in sorted(levels, key=lambda s: s.concurrency):
        if not meets_slo(level, slo):
            break
        best = level.concurrency
    return best
