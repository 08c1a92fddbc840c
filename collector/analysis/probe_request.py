"""One probe request: send it, read the SSE stream, and return its request-log row.

The probe is its own client, so it measures what a client sees: TTFT to the first chunk carrying
content or a tool call (a role-only chunk is not a token), TPOT = (e2e - TTFT) / (n - 1) with n
from the upstream `usage` chunk. It also keeps the probe's own dual-caliber concurrency
(InflightMeter), which becomes each row's inflight_at_admit / active_tokens_at_admit, and its
time integral, which feeds the Little's-law check. The stream is parsed with
collector.sse, the same reader the proxy uses.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

import aiohttp

from collector.sse import DONE, ERROR, MALFORMED, EventSplitter, inspect_event
from collector.upstream import UpstreamClient

__all__ = ["InflightMeter", "RequestSpec", "send_one", "outcome_for_status", "estimate_tokens"]


def estimate_tokens(text: str) -> int:
    """Tokenizer-free estimate: 4 characters per token, at least 1."""
    return max(1, len(text) // 4)


def outcome_for_status(status: int) -> str:
    """Request-log outcome of a non-200 answer: 429 rate_limited, 503 overloaded, 5xx
    upstream_error, else bad_request."""
    if status == 429:
        return "rate_limited"
    if status == 503:
        return "overloaded"
    return "upstream_error" if status >= 500 else "bad_request"


class InflightMeter:
    """The probe's in-flight requests and active tokens, with the time integral of in-flight."""

    def __init__(self) -> None:
        self.inflight = 0
        self.active_tokens = 0
        self._area = 0.0
        self._last = time.time()

    def _tick(self) -> None:
        now = time.time()
        self._area += self.inflight * (now - self._last)
        self._last = now

    def admit(self, prompt_tokens: int) -> tuple[int, int]:
        """Count a new request; returns (in-flight, active tokens) including it."""
        self._tick()
        self.inflight += 1
        self.active_tokens += prompt_tokens
        return self.inflight, self.active_tokens

    def generated(self, tokens: int) -> None:
        """Tokens streamed by an in-flight request."""
        self.active_tokens += tokens

    def release(self, tokens: int) -> None:
        """A request ended: remove it and every token it added."""
        self._tick()
        self.inflight -= 1
        self.active_tokens -= tokens

    def area(self) -> float:
        """Integral of in-flight over time so far (request-seconds)."""
        self._tick()
        return self._area


@dataclass(frozen=True)
class RequestSpec:
    """Who the request is and what it asks for; `payload` is the JSON body sent."""

    request_id: str
    run_id: str
    url: str
    endpoint: str
    model: str
    max_tokens: int
    payload: dict[str, Any]
    prompt_estimate: int
    task_class: str = "all"  # the workload class this request measures


def _stamp(t: float | None) -> datetime | None:
    return None if t is None else datetime.fromtimestamp(t, tz=UTC)


async def _read_stream(response: aiohttp.ClientResponse, meter: InflightMeter, state: dict) -> None:
    splitter = EventSplitter()
    async for data in response.content.iter_any():
        for event in splitter.feed(data)[1]:
            info = inspect_event(event)
            if info is None or info is DONE:
                continue
            if info is MALFORMED:
                raise ValueError("malformed SSE event")
            if info is ERROR:
                raise ValueError("error event in stream")
            if info.usage is not None:
                state["usage"] = info.usage
            if info.tokens_estimate:
                state.setdefault("first_token", time.time())
                state["chunk_tokens"] += info.tokens_estimate
                meter.generated(info.tokens_estimate)


async def send_one(client: UpstreamClient, spec: RequestSpec, meter: InflightMeter,
                   waiting: Callable[[], int | None] = lambda: None) -> dict[str, Any]:
    """Send one streaming request and return its row (never raises for HTTP or network errors).

    `waiting()` is the engine's queue length as last read (None when unknown); it becomes the
    row's engine_waiting_at_admit, the knee rule's direct evidence of queueing.
    """
    admitted = time.time()
    inflight, active = meter.admit(spec.prompt_estimate)
    state: dict[str, Any] = {"chunk_tokens": 0, "status": None, "outcome": "ok", "error": None,
                             "retries": 0, "waiting": waiting()}
    try:
        upstream = await client.request("POST", spec.url, json=spec.payload,
                                        headers={"X-Headroom-Request-Id": spec.request_id,
                                                 "X-Headroom-Task-Class": spec.task_class})
        state["retries"] = upstream.retries
        async with upstream.response as response:
            state["first_byte"] = time.time()
            state["status"] = response.status
            if response.status != 200:
                state["outcome"] = outcome_for_status(response.status)
                state["error"] = f"HTTP {response.status}"
                await response.read()  # small error body; 429s are never retried
            else:
                await _read_stream(response, meter, state)
    except asyncio.TimeoutError:
        state.update(outcome="timeout", error="request timed out")
    except (aiohttp.ClientError, ValueError) as exc:
        state.update(outcome="upstream_error", error=type(exc).__name__)
    finally:
        meter.release(spec.prompt_estimate + state["chunk_tokens"])
    return _row(spec, state, admitted, time.time(), inflight, active)


def _row(spec: RequestSpec, state: dict, admitted: float, completed: float, inflight: int,
         active: int) -> dict[str, Any]:
    usage = state.get("usage") or {}
    upstream = "completion_tokens" in usage
    completion = int(usage.get("completion_tokens") or 0) if upstream else state["chunk_tokens"]
    prompt = int(usage.get("prompt_tokens") or 0) if upstream else spec.prompt_estimate
    first_token = state.get("first_token")
    ok = state["outcome"] == "ok"
    ttft = first_token - admitted if ok and first_token is not None else None
    e2e = completed - admitted
    tpot = (e2e - ttft) / (completion - 1) if ttft is not None and completion > 1 else None
    details = usage.get("prompt_tokens_details") or {}
    return {
        "request_id": spec.request_id, "source": "probe", "run_id": spec.run_id,
        "instance": "probe", "model": spec.model, "tenant": "probe", "endpoint": spec.endpoint,
        "stream": True, "admitted_at": _stamp(admitted), "first_byte_at": _stamp(state.get("first_byte")),
        "first_token_at": _stamp(first_token), "completed_at": _stamp(completed),
        "status_code": state["status"], "outcome": state["outcome"], "error": state["error"],
        "prompt_tokens": prompt, "cached_prompt_tokens": details.get("cached_tokens"),
        "completion_tokens": completion, "max_tokens": spec.max_tokens,
        "usage_source": "upstream" if upstream else "estimated",
        "ttft_s": ttft, "tpot_s": tpot, "e2e_s": e2e,
        "inflight_at_admit": inflight, "active_tokens_at_admit": active,
        "engine_waiting_at_admit": state["waiting"], "kv_usage_at_admit": None,
        "upstream_retries": state["retries"], "task_class": spec.task_class,
    }
