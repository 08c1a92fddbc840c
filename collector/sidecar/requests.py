"""Reading an OpenAI request body: model, stream flags, max_tokens, and a prompt-token estimate.

Prompt-token estimate: collector.tokens' rule (4 characters per token, rounded down, at least
1) over every text part, plus 3 tokens of framing per chat message (a /v1/completions prompt of
token IDs counts one per ID); the per-message framing matches the chat templates' role markers. It feeds the live token caliber at
admission; the row's `prompt_tokens` is replaced by upstream `usage` when the engine reports it
(`usage_source='upstream'`), so the estimate never reaches the request log when usage exists.
"""

from __future__ import annotations

from dataclasses import dataclass

import orjson

from collector.tokens import estimate_tokens, tokens_for_characters

__all__ = ["ParsedRequest", "parse_request"]

_TOKENS_PER_MESSAGE = 3
_MAX_MODEL_CHARS = 128


@dataclass(slots=True)
class ParsedRequest:
    """What the proxy needs from a request body, and the body to send upstream."""

    body: bytes
    model: str
    stream: bool
    max_tokens: int | None
    prompt_tokens_estimate: int
    usage_injected: bool  # the proxy asked upstream for usage; strip it before the client sees it
    valid_json: bool


def _content_tokens(content: object) -> int:
    if isinstance(content, str):
        return estimate_tokens(content)
    if isinstance(content, list):  # multi-part content: count the text parts
        return sum(estimate_tokens(part["text"]) for part in content
                   if isinstance(part, dict) and isinstance(part.get("text"), str))
    return 0


def _prompt_tokens(prompt: object) -> int:
    """/v1/completions `prompt`: a string, a list of strings, token IDs, or lists of token IDs."""
    if isinstance(prompt, list):
        if prompt and all(isinstance(p, int) for p in prompt):
            return len(prompt)  # already tokens
        return sum(len(p) if isinstance(p, list) and all(isinstance(i, int) for i in p)
                   else _content_tokens(p) for p in prompt)
    return _content_tokens(prompt)


def _estimate_prompt(payload: dict) -> int:
    messages = payload.get("messages")
    if isinstance(messages, list):
        return sum(_TOKENS_PER_MESSAGE + _content_tokens(m.get("content"))
                   for m in messages if isinstance(m, dict))
    return _prompt_tokens(payload.get("prompt"))


def _max_tokens(payload: dict) -> int | None:
    value = payload.get("max_completion_tokens", payload.get("max_tokens"))
    valid = isinstance(value, int) and not isinstance(value, bool) and 0 <= value < 2**31
    return value if valid else None  # beyond the INTEGER column it is no useful limit anyway


def parse_request(body: bytes) -> ParsedRequest:
    """Parse a completions body; inject `stream_options.include_usage` when the client left it unset.

    A body that is not a JSON object is forwarded untouched (the engine answers it), with model
    'unknown' and an estimate from its length, so bad input is still accounted and logged.
    """
    try:
        payload = orjson.loads(body)
    except orjson.JSONDecodeError:
        payload = None
    if not isinstance(payload, dict):
        return ParsedRequest(body, "unknown", False, None, tokens_for_characters(len(body)),
                             False, False)
    model = payload.get("model")
    model = model[:_MAX_MODEL_CHARS] if isinstance(model, str) and model else "unknown"
    stream = payload.get("stream") is True
    injected = False
    if stream:
        options = payload.get("stream_options")
        # a non-object stream_options is the client's error: forward it untouched for the engine
        if options is None or (isinstance(options, dict) and "include_usage" not in options):
            payload["stream_options"] = {**(options or {}), "include_usage": True}
            body = orjson.dumps(payload)
            injected = True
    return ParsedRequest(body, model, stream, _max_tokens(payload), _estimate_prompt(payload),
                         injected, True)
