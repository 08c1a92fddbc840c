"""Quota ceilings: the concurrency an account's RPM and TPM allow (docs/domain.md §2.1).

  by RPM: RPM x mean_e2e_s / 60
  by TPM: TPM x mean_e2e_s / (60 x mean_tokens_per_request)     (tokens = input + output)

The ceiling is the smaller; with long contexts TPM usually binds first. Each follows from Little's
law: a quota is a ceiling on arrival rate, and concurrency = rate x time in system.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass
from typing import Any

__all__ = ["QuotaCeiling", "quota_ceiling"]


@dataclass(frozen=True)
class QuotaCeiling:
    """Concurrency allowed by each quota (None = quota not given) and which one binds."""

    by_rpm: float | None
    by_tpm: float | None
    ceiling: int | None  # floor of the smaller one
    binding: str | None  # "rpm" | "tpm"

    def to_dict(self) -> dict[str, Any]:
        """Plain dict for JSON."""
        return asdict(self)


def _positive(name: str, value: float | None) -> None:
    if value is not None and value <= 0:
        raise ValueError(f"{name} must be positive, got {value!r}")


def quota_ceiling(
    *,
    mean_e2e_s: float,
    rpm: float | None = None,
    tpm: float | None = None,
    mean_tokens_per_request: float | None = None,
) -> QuotaCeiling:
    """Concurrency ceilings from RPM and/or TPM.

    Example: RPM 600, TPM 1 000 000, e2e 10 s, 4 000 tokens/request -> by RPM 100, by TPM 41.7,
    ceiling 41, TPM binds.
    """
    for name, value in (
        ("mean_e2e_s", mean_e2e_s),
        ("rpm", rpm),
        ("tpm", tpm),
        ("mean_tokens_per_request", mean_tokens_per_request),
    ):
        _positive(name, value)
    by_tpm = None
    if tpm is not None:
        if mean_tokens_per_request is None:
            raise ValueError("a TPM ceiling needs mean_tokens_per_request (input + output tokens)")
        by_tpm = tpm * mean_e2e_s / (60.0 * mean_tokens_per_request)
    by_rpm = rpm * mean_e2e_s / 60.0 if rpm is not None else None
    candidates = [(v, name) for v, name in ((by_rpm, "rpm"), (by_tpm, "tpm")) if v is not None]
    if not candidates:
        return QuotaCeiling(None, None, None, None)
    value, binding = min(candidates)
    return QuotaCeiling(by_rpm, by_tpm, math.floor(value + 1e-9), binding)
