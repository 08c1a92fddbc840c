"""One probe request: send it, read the SSE stream, and return its request record.

The probe is its own client, so it measures what a client sees: TTFT to the first chunk carrying
content or a tool call (a role-only chunk is not a token), TPOT = (e2e - TTFT) / (n - 1) with n
from the upstream `usage` chunk. Its own dual-caliber concurrency is a collector.inflight.Inflight
(the type the sidecar's tracker keeps), which becomes each record's inflight_at_admit /
active_tokens_at_admit, and its time integral feeds the Little's-law check. The stream is parsed
with collector.sse, the same reader the proxy uses.

A failed request's error text (the upstream's error message, or the exception) comes back beside
the record, for the probe's per-level "first error": whitespace collapsed, at most
ERROR_TEXT_CHARS characters, and any run of ERROR_PROMPT_RUN or more characters that also occurs
in the prompt replaced by "[prompt text]" (some servers echo the input). It is printed and kept
in the estimate, never in the request log, whose `error` column holds our own short reason.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

import aiohttp

from collector.inflight import Inflight
from collector.record import RequestRecord, outcome_for_status, time_per_output_token
from collector.sse import DONE, ERROR, MALFORMED, EventSplitter, inspect_event
from collector.upstream import UpstreamClient

__all__ = ["RequestSpec", "Answer", "send_one", "error_text", "ERROR_TEXT_CHARS", "ERROR_PROMPT_RUN"]

ERROR_TEXT_CHARS = 300
ERROR_PROMPT_RUN = 16


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
    prompt: str = ""  # the text sent, only to keep it out of an echoed error message; never stored
    adapter: str | None = None  # the LoRA adapter named in the body's `model` (`model`: its base)
    level: int | None = None  # the closed-loop concurrency level it measures
    rate_per_s: float | None = None  # the open-loop offered rate it measures
    warmup: bool = False  # sent while its level warms up: not measured

    def headers(self) -> dict[str, str]:
        """What the sidecar records of this request (collector.sidecar.proxy): id, class, level."""
        headers = {
            "X-Headroom-Request-Id": self.request_id,
            "X-Headroom-Task-Class": self.task_class,
            "X-Headroom-Probe-Warmup": "1" if self.warmup else "0",
        }
        if self.level is not None:
            headers["X-Headroom-Probe-Level"] = str(self.level)
        if self.rate_per_s is not None:
            headers["X-Headroom-Probe-Rate"] = f"{self.rate_per_s:g}"
        return headers


@dataclass(frozen=True)
class Answer:
    """One request's record and, when it failed, its error text (module docstring)."""

    record: RequestRecord
    error_text: str | None = None


def _redact(message: str, prompt: str) -> str:
    """`message` with every run of >= ERROR_PROMPT_RUN characters that the prompt contains removed."""
    prompt = " ".join(prompt.split())
    if len(prompt) < ERROR_PROMPT_RUN:
        return message.replace(prompt, "[prompt text]") if prompt else message
    out, i = [], 0
    while i < len(message):
        if i + ERROR_PROMPT_RUN <= len(message) and message[i : i + ERROR_PROMPT_RUN] in prompt:
            end = i + ERROR_PROMPT_RUN
            while end < len(message) and message[i : end + 1] in prompt:
                end += 1
            out.append("[prompt text]")
            i = end
        else:
            out.append(message[i])
            i += 1
    return "".join(out)


def _message(body: bytes) -> str:
    """The error message of an OpenAI-style error body ({"error": {"message": ...}}), else the text."""
    text = body.decode("utf-8", "replace")
    try:
        data = json.loads(text)
    except ValueError:
        return text
    if isinstance(data, dict):
        error = data.get("error")
        if isinstance(error, dict) and isinstance(error.get("message"), str):
            return str(error["message"])
        for key in ("error", "message", "detail"):
            if isinstance(data.get(key), str):
                return str(data[key])
    return text


def error_text(prefix: str, body: bytes | str, prompt: str) -> str:
    """'HTTP 400: <message>' for people: one line, truncated, the prompt's text removed.

    Example: error_text("HTTP 400", b'{"error": {"message": "too long"}}', "hi") -> 'HTTP 400: too long'.
    """
    message = _message(body) if isinstance(body, bytes) else body
    message = _redact(" ".join(message.split()), prompt)
    if len(message) > ERROR_TEXT_CHARS:
        message = message[: ERROR_TEXT_CHARS - 1] + "…"
    return f"{prefix}: {message}" if message else prefix


def _stamp(t: float | None) -> datetime | None:
    return None if t is None else datetime.fromtimestamp(t, tz=UTC)


async def _read_stream(response: aiohttp.ClientResponse, meter: Inflight, state: dict[str, Any]) -> None:
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


async def send_one(
    client: UpstreamClient,
    spec: RequestSpec,
    meter: Inflight,
    waiting: Callable[[], int | None] = lambda: None,
) -> Answer:
    """Send one streaming request; its record and error text (never raises for HTTP or network errors).

    `waiting()` is the engine's queue length as last read (None when unknown); it becomes the
    row's engine_waiting_at_admit, the knee rule's direct evidence of queueing.
    """
    admitted = time.time()
    inflight, active = meter.admit(spec.prompt_estimate)
    state: dict[str, Any] = {
        "chunk_tokens": 0,
        "status": None,
        "outcome": "ok",
        "error": None,
        "retries": 0,
        "waiting": waiting(),
        "error_text": None,
    }
    try:
        upstream = await client.request(
            "POST",
            spec.url,
            json=spec.payload,
            headers=spec.headers(),
        )
        state["retries"] = upstream.retries
        async with upstream.response as response:
            state["first_byte"] = time.time()
            state["status"] = response.status
            if response.status != 200:
                state["outcome"] = outcome_for_status(response.status)
                state["error"] = f"HTTP {response.status}"
                body = await response.read()  # a small error body; 429s are never retried
                state["error_text"] = error_text(state["error"], body, spec.prompt)
            else:
                await _read_stream(response, meter, state)
    except TimeoutError:
        state.update(outcome="timeout", error="request timed out")
        state["error_text"] = "timeout: no answer within the request timeout"
    except (aiohttp.ClientError, ValueError) as exc:
        state.update(outcome="upstream_error", error=type(exc).__name__)
        state["error_text"] = error_text(f"{type(exc).__name__}", str(exc), spec.prompt)
    finally:
        meter.release(spec.prompt_estimate + state["chunk_tokens"])
    return Answer(_record(spec, state, admitted, time.time(), inflight, active), state["error_text"])


def _record(
    spec: RequestSpec, state: dict[str, Any], admitted: float, completed: float, inflight: int, active: int
) -> RequestRecord:
    usage = state.get("usage") or {}
    upstream = "completion_tokens" in usage
    completion = int(usage.get("completion_tokens") or 0) if upstream else state["chunk_tokens"]
    prompt = int(usage.get("prompt_tokens") or 0) if upstream else spec.prompt_estimate
    first_token = state.get("first_token")
    ok = state["outcome"] == "ok"
    ttft = first_token - admitted if ok and first_token is not None else None
    e2e = completed - admitted
    details = usage.get("prompt_tokens_details") or {}
    return RequestRecord(
        request_id=spec.request_id,
        source="probe",
        run_id=spec.run_id,
        instance="probe",
        model=spec.model,
        tenant="probe",
        endpoint=spec.endpoint,
        stream=True,
        admitted_at=_stamp(admitted),
        first_byte_at=_stamp(state.get("first_byte")),
        first_token_at=_stamp(first_token),
        completed_at=_stamp(completed),
        status_code=state["status"],
        outcome=state["outcome"],
        error=state["error"],
        prompt_tokens=prompt,
        cached_prompt_tokens=details.get("cached_tokens"),
        completion_tokens=completion,
        max_tokens=spec.max_tokens,
        usage_source="upstream" if upstream else "estimated",
        ttft_s=ttft,
        tpot_s=time_per_output_token(e2e, ttft, completion),
        e2e_s=e2e,
        inflight_at_admit=inflight,
        active_tokens_at_admit=active,
        engine_waiting_at_admit=state["waiting"],
        kv_usage_at_admit=None,
        upstream_retries=state["retries"],
        task_class=spec.task_class,
        adapter=spec.adapter,
        probe_level=spec.level,
        probe_rate_per_s=spec.rate_per_s,
        probe_warmup=spec.warmup,
    )
