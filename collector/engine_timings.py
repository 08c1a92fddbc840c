"""The engine's own account of one request's time, read from its answer (docs/engines.md §Timings).

Two shapes exist, and both come out as one `EngineTimings`:

- llama.cpp's server puts `timings` on the final streamed chunk (the usage chunk when usage was
  asked for) and in a non-streamed answer: `cache_n` (prompt tokens read from the cache),
  `prompt_n` (prompt tokens computed), `prompt_ms` (their prefill), `predicted_n`, `predicted_ms`
  (decode). It does not report the wait for a slot: that is what remains of the sidecar's TTFT once
  its own hop and the prefill are taken out.
- vLLM (`--enable-per-request-metrics`, and `"include_metrics": true` in the request; in a stream
  only on the usage chunk) returns `metrics`: `queue_time_ms` (queued to scheduled),
  `time_to_first_token_ms` (scheduled to first token: the prefill, the queue not in it),
  `generation_time_ms` (first token to last), `mean_itl_ms`, `tokens_per_second` (vLLM's
  tests/entrypoints/openai/test_per_request_metrics: queued 1.0, scheduled 1.5, first token 2.0
  give queue 500 ms and TTFT 500 ms). The prompt tokens it computed are the usage's prompt tokens
  less the cached.

A field of another type, negative, not finite or past a day (or a count past 2**31) is dropped,
never trusted: the row then holds None for it. The sidecar's passive prefill rate is
Σ computed prompt tokens / Σ prefill seconds over the rows that carry both (DOMAIN §16).

    >>> t = engine_timings({"cache_n": 1, "prompt_n": 34, "prompt_ms": 88.5, "predicted_n": 300,
    ...                     "predicted_ms": 10653.9}, None)
    >>> (t.shape, t.prefill_s, t.prompt_computed, t.prompt_cached, t.decode_s)
    ('llamacpp', 0.0885, 34, 1, 10.6539)
    >>> engine_timings(None, {"time_to_first_token_ms": 120, "queue_time_ms": 20}).prefill_s
    0.12
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

__all__ = ["EngineTimings", "engine_timings", "SHAPES"]

SHAPES = ("llamacpp", "vllm")
_MAX_MS = 86_400_000.0  # a day


@dataclass(frozen=True, slots=True)
class EngineTimings:
    """What the engine said about one request; None where it did not say (or said nonsense)."""

    shape: str  # one of SHAPES
    queue_s: float | None = None  # reported by vLLM; llama.cpp: None (derived on the row)
    prefill_s: float | None = None
    decode_s: float | None = None
    prompt_computed: int | None = None  # prompt tokens the engine computed (not from its cache)
    prompt_cached: int | None = None
    generated: int | None = None


def _ms(raw: dict[str, Any], key: str) -> float | None:
    value = raw.get(key)
    if not isinstance(value, int | float) or isinstance(value, bool):
        return None
    if not (math.isfinite(value) and 0 <= value <= _MAX_MS):
        return None
    return round(float(value) / 1000, 9)


def _count(raw: dict[str, Any], key: str) -> int | None:
    value = raw.get(key)
    return value if type(value) is int and 0 <= value < 2**31 else None


def engine_timings(timings: object, metrics: object) -> EngineTimings | None:
    """The engine's timings from an answer's `timings` (llama.cpp) or `metrics` (vLLM) object;
    None when neither is an object."""
    if type(timings) is dict:
        return EngineTimings(
            "llamacpp",
            prefill_s=_ms(timings, "prompt_ms"),
            decode_s=_ms(timings, "predicted_ms"),
            prompt_computed=_count(timings, "prompt_n"),
            prompt_cached=_count(timings, "cache_n"),
            generated=_count(timings, "predicted_n"),
        )
    if type(metrics) is dict:
        return EngineTimings(
            "vllm",
            queue_s=_ms(metrics, "queue_time_ms"),
            prefill_s=_ms(metrics, "time_to_first_token_ms"),  # from scheduling: the queue is not in it
            decode_s=_ms(metrics, "generation_time_ms"),
        )
    return None
