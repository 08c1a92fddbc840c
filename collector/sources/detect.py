"""`--engine auto`: recognise the engine from the names on its /metrics page.

Each engine prefixes its metrics (`vllm:`, `sglang:`, `tgi_`, `llamacpp:`; a headroom sidecar
relays its engine's as `headroom_engine_`); the prefix with the most samples wins. A page with none of them is not recognised (None), and the poller keeps trying.
"""

from __future__ import annotations

from collector.sources.base import Samples

__all__ = ["PREFIXES", "detect_engine"]

PREFIXES = {
    "vllm": "vllm:",
    "sglang": "sglang:",
    "tgi": "tgi_",
    "llamacpp": "llamacpp:",
    "headroom": "headroom_engine_",
}


def detect_engine(samples: Samples) -> str | None:
    """The engine whose prefix most sample names carry, or None when no prefix matches."""
    counts = {
        engine: sum(1 for name in samples if name.startswith(prefix)) for engine, prefix in PREFIXES.items()
    }
    best = max(counts, key=counts.__getitem__)
    return best if counts[best] else None
