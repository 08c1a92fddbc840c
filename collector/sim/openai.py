"""OpenAI wire format for the simulator: parse a request, build chunks and full responses.

Chunks follow what real engines send (tests/fixtures/llamacpp/chat_stream_with_usage.sse): a
role-only first chunk, one chunk per delivered group of tokens, a final chunk carrying
finish_reason, then, when stream_options.include_usage is true, a chunk with "choices": [] and
"usage", then `data: [DONE]`.
"""

from __future__ import annotations

import time
import uuid
from dataclasses import dataclass
from typing import Any

import orjson

from collector.sim.config import SimConfig
from collector.sim.output import OutputPlan, count_chat_tokens, count_text_tokens, message_text, plan_output

__all__ = [
    "BadRequest",
    "ParsedRequest",
    "parse_request",
    "chunk",
    "usage_chunk",
    "full_response",
    "sse",
    "DONE",
]

DONE = b"data: [DONE]\n\n"

Body = dict[str, Any]  # a request body as parsed from JSON
Message = dict[str, object]  # a response or chunk, as serialised to JSON


class BadRequest(ValueError):
    """The request body is not something an OpenAI-compatible engine would accept (HTTP 400)."""


@dataclass(frozen=True)
class ParsedRequest:
    """What the simulator needs from a request body."""

    chat: bool
    stream: bool
    include_usage: bool
    prompt_tokens: int
    plan: OutputPlan
    max_tokens: int
    response_id: str
    created: int


def _prompt(body: Body, chat: bool) -> tuple[str, int]:
    if chat:
        messages = body.get("messages")
        if not isinstance(messages, list) or not messages:
            raise BadRequest("'messages' must be a non-empty list of {role, content} objects")
        return "\n".join(message_text(m) for m in messages), count_chat_tokens(messages)
    prompt = body.get("prompt")
    if isinstance(prompt, list):
        prompt = "".join(str(p) for p in prompt)
    if not isinstance(prompt, str) or not prompt:
        raise BadRequest("'prompt' must be a non-empty string")
    return prompt, count_text_tokens(prompt)


def _stops(body: Body) -> tuple[str, ...]:
    stop = body.get("stop")
    if stop is None:
        return ()
    if isinstance(stop, str):
        return (stop,)
    if isinstance(stop, list) and all(isinstance(s, str) for s in stop):
        return tuple(stop)
    raise BadRequest("'stop' must be a string or a list of strings")


def parse_request(body: object, chat: bool, config: SimConfig) -> ParsedRequest:
    """Validate a completions/chat body and plan its output; raises BadRequest naming the field."""
    if not isinstance(body, dict):
        raise BadRequest("the request body must be a JSON object")
    text, prompt_tokens = _prompt(body, chat)
    limit = min(config.max_model_len, config.num_blocks * config.block_size)
    requested = body.get("max_completion_tokens", body.get("max_tokens"))
    if requested is not None and (not isinstance(requested, int) or requested < 1):
        raise BadRequest(f"'max_tokens' must be a positive integer, got {requested!r}")
    max_tokens = requested if requested is not None else max(1, limit - prompt_tokens)
    if prompt_tokens + max_tokens > limit:
        raise BadRequest(
            f"this model's maximum context length is {limit} tokens; the request has "
            f"{prompt_tokens} prompt tokens and max_tokens={max_tokens}: shorten one of them"
        )
    options = body.get("stream_options") or {}
    plan = plan_output(
        config.seed,
        text,
        body.get("seed"),
        max_tokens,
        bool(body.get("ignore_eos", False)),
        config.mean_output_tokens,
        _stops(body),
    )
    prefix = "chatcmpl-" if chat else "cmpl-"
    return ParsedRequest(
        chat,
        bool(body.get("stream", False)),
        bool(options.get("include_usage")),
        prompt_tokens,
        plan,
        max_tokens,
        prefix + uuid.uuid4().hex,
        int(time.time()),
    )


def sse(obj: Message) -> bytes:
    """One server-sent event carrying `obj` as JSON."""
    return b"data: " + orjson.dumps(obj) + b"\n\n"


def _envelope(req: ParsedRequest, model: str, choices: list[Message]) -> Message:
    kind = "chat.completion.chunk" if req.chat else "text_completion"
    return {"id": req.response_id, "object": kind, "created": req.created, "model": model, "choices": choices}


def chunk(
    req: ParsedRequest, model: str, text: str | None, finish_reason: str | None = None, role: bool = False
) -> Message:
    """A streamed chunk: role-only (role=True), content, or final (finish_reason set)."""
    choice: Message
    if req.chat:
        delta = (
            {"role": "assistant", "content": None} if role else ({} if text is None else {"content": text})
        )
        choice = {"index": 0, "delta": delta, "finish_reason": finish_reason}
    else:
        choice = {"index": 0, "text": text or "", "finish_reason": finish_reason}
    return _envelope(req, model, [choice])


def usage(req: ParsedRequest, completion_tokens: int) -> dict[str, int]:
    """The usage object: prompt, completion and total tokens."""
    return {
        "prompt_tokens": req.prompt_tokens,
        "completion_tokens": completion_tokens,
        "total_tokens": req.prompt_tokens + completion_tokens,
    }


def usage_chunk(req: ParsedRequest, model: str, completion_tokens: int) -> Message:
    """The final usage chunk: empty choices and the usage object."""
    return _envelope(req, model, []) | {"usage": usage(req, completion_tokens)}


def full_response(req: ParsedRequest, model: str, completion_tokens: int) -> Message:
    """A non-streaming completion with usage."""
    text = "".join(req.plan.tokens)
    if req.chat:
        choice = {
            "index": 0,
            "message": {"role": "assistant", "content": text},
            "finish_reason": req.plan.finish_reason,
        }
        kind = "chat.completion"
    else:
        choice = {"index": 0, "text": text, "finish_reason": req.plan.finish_reason}
        kind = "text_completion"
    return {
        "id": req.response_id,
        "object": kind,
        "created": req.created,
        "model": model,
        "choices": [choice],
        "usage": usage(req, completion_tokens),
    }
