"""KV-cache ceiling from model shape and GPU memory, before measuring anything (docs/domain.md §4).

  usable bytes      = GPU memory x usable fraction - weights - activation reserve
  KV bytes / token  = 2 (K and V) x layers x kv_heads x head_dim x bytes per element
  KV per request    = KV bytes / token x the MAXIMUM context (never the mean)
  ceiling           = floor(usable / KV per request)
  configure         = floor(0.7 x ceiling)   (headroom for bursts and fragmentation)

Worked example: 57 GB usable / 3 GB per request -> ceiling 19, configure 13. Then validate with
latency: if the configured value already breaks the TTFT target, the limit is memory bandwidth,
not memory (more cards, not more memory).
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass
from typing import Any

__all__ = ["KvCeiling", "kv_bytes_per_token", "usable_memory_bytes", "kv_ceiling", "CONFIGURE_FRACTION", "GB"]

GB = 1e9
CONFIGURE_FRACTION = 0.7


@dataclass(frozen=True)
class KvCeiling:
    """How many max-context requests fit in the KV cache, and how many to configure."""

    usable_bytes: float
    kv_bytes_per_request: float
    ceiling: int
    configure: int

    def to_dict(self) -> dict[str, Any]:
        """Plain dict for JSON."""
        return asdict(self)


def _require_positive(**values: float) -> None:
    for name, value in values.items():
        if value is None or value <= 0:
            raise ValueError(f"{name} must be positive, got {value!r}")


def kv_bytes_per_token(*, layers: int, kv_heads: int, head_dim: int, bytes_per_element: float = 2) -> float:
    """2 x layers x kv_heads x head_dim x bytes; Llama-3-8B (32, 8, 128, fp16) -> 131072."""
    _require_positive(
        layers=layers, kv_heads=kv_heads, head_dim=head_dim, bytes_per_element=bytes_per_element
    )
    return 2.0 * layers * kv_heads * head_dim * bytes_per_element


def usable_memory_bytes(
    *, gpu_memory_bytes: float, weights_bytes: float, usable_fraction: float = 0.8, reserve_bytes: float = 0.0
) -> float:
    """GPU memory x usable fraction - weights - reserve; 96 GB, 20 GB, 0.8 -> 56.8 GB."""
    _require_positive(gpu_memory_bytes=gpu_memory_bytes)
    if not 0 < usable_fraction <= 1:
        raise ValueError(f"usable fraction {usable_fraction!r} must be in (0, 1]; typical 0.6-0.9")
    usable = gpu_memory_bytes * usable_fraction - weights_bytes - reserve_bytes
    if usable <= 0:
        raise ValueError(
            f"nothing left for the KV cache: {gpu_memory_bytes / GB:.1f} GB x "
            f"{usable_fraction} - weights {weights_bytes / GB:.1f} GB - reserve "
            f"{reserve_bytes / GB:.1f} GB <= 0; use a bigger GPU or smaller weights"
        )
    return usable


def kv_ceiling(
    *, usable_bytes: float, kv_bytes_per_request: float, configure_fraction: float = CONFIGURE_FRACTION
) -> KvCeiling:
    """Ceiling and configured concurrency; 57 GB usable, 3 GB per request -> 19 and 13."""
    _require_positive(usable_bytes=usable_bytes, kv_bytes_per_request=kv_bytes_per_request)
    ceiling = math.floor(usable_bytes / kv_bytes_per_request + 1e-9)
    return KvCeiling(
        usable_bytes, kv_bytes_per_request, ceiling, math.floor(configure_fraction * ceiling + 1e-9)
    )
