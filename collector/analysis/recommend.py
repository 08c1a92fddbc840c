"""The recommended production pool, by profile (docs/domain.md §2.4).

  interactive  min(SLO max, floor(0.7 x knee))   largest concurrency meeting p95, with headroom
  semi         floor(0.8 x knee)                 throughput first, p95 relaxed
  batch        knee                              throughput and failure rate only

A pool is at least 1 unless the SLO maximum is 0 (no level met the SLO: recommend nothing).
"""

from __future__ import annotations

import math
from typing import Any

__all__ = ["PROFILES", "recommended_pool"]

PROFILES: dict[str, float] = {"interactive": 0.7, "semi": 0.8, "batch": 1.0}


def _knee_requests(knee: Any) -> int:
    value = getattr(knee, "requests", knee)
    if not isinstance(value, int) or value < 1:
        raise ValueError(f"knee {value!r} is not a positive concurrency; measure the knee first")
    return value


def recommended_pool(knee: Any, slo_max: int | None, profile: str = "interactive") -> int:
    """Pool size for `profile` from the knee (int or KneeResult) and the SLO maximum.

    Examples: (knee 16, SLO max 12, interactive) -> 11; (16, None, semi) -> 12; (16, 4, batch) -> 16.
    """
    if profile not in PROFILES:
        raise ValueError(f"profile {profile!r} is unknown; use one of {', '.join(PROFILES)}")
    knee_requests = _knee_requests(knee)
    pool = max(1, math.floor(PROFILES[profile] * knee_requests + 1e-9))
    if profile == "interactive" and slo_max is not None:
        pool = min(pool, slo_max)
    return pool
