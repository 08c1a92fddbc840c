"""The engine's own account of each finished request, in the shape its flavor answers with.

llama.cpp's server always sends `timings` (the fields of its real answers, as in
tests/fixtures/llamacpp/chat_stream_with_usage.sse); vLLM sends `metrics` only when started with
--enable-per-request-metrics (SimConfig.per_request_metrics; vLLM's
docs/features/per_request_metrics.md); SGLang sends neither. Where each one goes:

  non-streamed answer    at the top level
  stream with usage      on the usage chunk (`"choices": []`)
  stream without usage   llama.cpp: on the last chunk, the one with finish_reason; vLLM: nowhere
                         (its metrics ride the usage chunk only)

The numbers are the simulator's own model of the request: its instants on the simulated clock
(SimRequest.arrived_s, scheduled_s, first_token_s, finished_s, stamped by the Engine), in
milliseconds of the client's clock (simulated seconds / --speed, the clock a client measures the
simulator on), so that queue + prefill + decode is the engine's end-to-end time. Built once, when
the request has finished. Example at speed 1: arrived 0.0 s, scheduled 0.5, first token 0.6, last
token 1.6, 34 prompt and 11 generated tokens give

  timings  cache_n 0 (no prefix cache is modelled), prompt_n 34, prompt_ms 100.0 (scheduled to
           first token), predicted_n 11, predicted_ms 1000.0 (first to last token), and the
           per-token milliseconds and per-second rates of both (llama.cpp reports no queue time)
  metrics  time_to_first_token_ms 100.0 (scheduled to first token, as vLLM documents it),
           generation_time_ms 1000.0, queue_time_ms 500.0, mean_itl_ms 100.0 (1000 over 10 gaps),
           tokens_per_second 10.0 (11 tokens over the 1.1 s from scheduled to last token)
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TypedDict

from collector.sim.config import SimConfig
from collector.sim.scheduler import SimRequest

__all__ = ["LlamaCppTimings", "VllmRequestMetrics", "answer_fields", "finish_chunk_fields"]


class LlamaCppTimings(TypedDict):
    """llama.cpp's `timings`: per_second is None where its time is 0 (llama.cpp's inf, sent as null)."""

    cache_n: int
    prompt_n: int
    prompt_ms: float
    prompt_per_token_ms: float
    prompt_per_second: float | None
    predicted_n: int
    predicted_ms: float
    predicted_per_token_ms: float
    predicted_per_second: float | None


class VllmRequestMetrics(TypedDict):
    """vLLM's `metrics`: mean_itl_ms is None for a single token, as vLLM sends it."""

    time_to_first_token_ms: float
    generation_time_ms: float
    queue_time_ms: float
    mean_itl_ms: float | None
    tokens_per_second: float | None


@dataclass(frozen=True)
class _Phases:
    """A finished request's phases in milliseconds of the client's clock."""

    queue_ms: float
    prefill_ms: float
    decode_ms: float


def _phases(request: SimRequest, speed: float) -> _Phases | None:
    scheduled_s, first_s, finished_s = request.scheduled_s, request.first_token_s, request.finished_s
    if scheduled_s is None or first_s is None or finished_s is None:
        return None  # not finished by the engine (the server is stopping)
    return _Phases(
        queue_ms=round((scheduled_s - request.arrived_s) / speed * 1000, 3),
        prefill_ms=round((first_s - scheduled_s) / speed * 1000, 3),
        decode_ms=round((finished_s - first_s) / speed * 1000, 3),
    )


def _per_second(count: int, ms: float) -> float | None:
    return count * 1000 / ms if ms > 0 else None


def _llamacpp(request: SimRequest, phases: _Phases) -> LlamaCppTimings:
    prompt_n, predicted_n = request.prompt_tokens, request.generated
    return {
        "cache_n": 0,
        "prompt_n": prompt_n,
        "prompt_ms": phases.prefill_ms,
        "prompt_per_token_ms": phases.prefill_ms / prompt_n,
        "prompt_per_second": _per_second(prompt_n, phases.prefill_ms),
        "predicted_n": predicted_n,
        "predicted_ms": phases.decode_ms,
        "predicted_per_token_ms": phases.decode_ms / predicted_n,
        "predicted_per_second": _per_second(predicted_n, phases.decode_ms),
    }


def _vllm(request: SimRequest, phases: _Phases) -> VllmRequestMetrics:
    generated = request.generated
    return {
        "time_to_first_token_ms": phases.prefill_ms,
        "generation_time_ms": phases.decode_ms,
        "queue_time_ms": phases.queue_ms,
        "mean_itl_ms": round(phases.decode_ms / (generated - 1), 3) if generated > 1 else None,
        "tokens_per_second": _per_second(generated, phases.prefill_ms + phases.decode_ms),
    }


def answer_fields(config: SimConfig, request: SimRequest) -> dict[str, object]:
    """The fields a finished request's non-streamed answer, or its stream's usage chunk, carries at
    the top level: {"timings": ...} (llamacpp), {"metrics": ...} (vllm with per_request_metrics)
    or {} (any other flavor, or a request the engine did not finish)."""
    phases = _phases(request, config.speed)
    if phases is None:
        return {}
    if config.flavor == "llamacpp":
        return {"timings": _llamacpp(request, phases)}
    if config.flavor == "vllm" and config.per_request_metrics:
        return {"metrics": _vllm(request, phases)}
    return {}


def finish_chunk_fields(config: SimConfig, request: SimRequest) -> dict[str, object]:
    """The fields of a stream's finish_reason chunk when no usage chunk follows it: llama.cpp's
    timings (they ride its last chunk); {} for vLLM, whose metrics ride the usage chunk only."""
    return answer_fields(config, request) if config.flavor == "llamacpp" else {}
