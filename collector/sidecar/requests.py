"""Reading an OpenAI request body: model, stream flags, max_tokens, and a prompt-token estimate.

Prompt-token estimate: collector.tokens' rule (4 characters per token, rounded down, at least 1)
over every text part, plus 3 tokens of framing per chat message (a /v1/completions prompt of
token IDs counts one per ID); the per-message framing matches the chat templates' role markers.
It feeds the live token caliber at admission; the row's `prompt_tokens` is replaced by upstream
`usage` when the engine reports it (`usage_source='upstream'`).

The body the engine gets is the client's, byte for byte, except for the one field the sidecar
adds to a streamed request that did not set it: `"include_usage":true` in `stream_options`. It is
spliced into the bytes, never re-serialised, so integers beyond 64 bits, key order, whitespace
and nesting deeper than a serialiser allows reach the engine unchanged:

    {"model":"m","stream":true}  ->  {"stream_options":{"include_usage":true},"model":"m","stream":true}
    {"stream":true,"stream_options":{"x":1}}  ->  {"stream":true,"stream_options":{"include_usage":true,"x":1}}

A body that is not a JSON object we can read (bad UTF-8, not JSON, nested past orjson's 1,024
levels, an array) is refused by the proxy with 400 and a row (`refusal` says why).

The other accounted endpoints read the same way, with their own fields (issue #36 N8):
`/v1/responses` (the Responses API) estimates its prompt from `instructions` and `input` (a
string, or items: messages with their 3 tokens of framing, text parts, tool outputs), takes
`max_output_tokens`, and is never given `stream_options` (its stream always ends with the
usage, in `response.completed`); `/v1/embeddings` estimates `input` as a completions prompt is
(strings, or token IDs one each) and never streams.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

import orjson

from collector.sources.served import MAX_MODEL_CHARS
from collector.tokens import estimate_tokens, tokens_for_characters

__all__ = ["ParsedRequest", "parse_request", "splice_include_usage"]

_TOKENS_PER_MESSAGE = 3
RESPONSES_PATH = "/v1/responses"
EMBEDDINGS_PATH = "/v1/embeddings"
_OPTIONS_KEY = re.compile(rb'"stream_options"\s*:\s*\{')
_INCLUDE_USAGE = b'"include_usage":true'


@dataclass(slots=True)
class ParsedRequest:
    """What the proxy needs from a request body, and the body to send upstream."""

    body: bytes
    model: str
    stream: bool
    max_tokens: int | None
    prompt_tokens_estimate: int
    usage_injected: bool  # the proxy asked upstream for usage; strip it before the client sees it
    refusal: str | None = None  # why the proxy answers 400 itself instead of forwarding
    ignore_eos: bool = False  # vLLM's and llama.cpp's `ignore_eos`: exactly max_tokens are asked for


def _content_tokens(content: object) -> int:
    if isinstance(content, str):
        return estimate_tokens(content)
    if isinstance(content, list):  # multi-part content: count the text parts
        return sum(
            estimate_tokens(part["text"])
            for part in content
            if isinstance(part, dict) and isinstance(part.get("text"), str)
        )
    return 0


def _prompt_tokens(prompt: object) -> int:
    """/v1/completions `prompt`: a string, a list of strings, token IDs, or lists of token IDs."""
    if isinstance(prompt, list):
        if prompt and all(isinstance(p, int) for p in prompt):
            return len(prompt)  # already tokens
        return sum(
            len(p) if isinstance(p, list) and all(isinstance(i, int) for i in p) else _content_tokens(p)
            for p in prompt
        )
    return _content_tokens(prompt)


def _estimate_prompt(payload: dict[str, Any]) -> int:
    messages = payload.get("messages")
    if isinstance(messages, list):
        return sum(
            _TOKENS_PER_MESSAGE + _content_tokens(m.get("content")) for m in messages if isinstance(m, dict)
        )
    return _prompt_tokens(payload.get("prompt"))


def _responses_prompt(payload: dict[str, Any]) -> int:
    """/v1/responses: `instructions` and `input` (a string, or a list of items)."""
    instructions = payload.get("instructions")
    tokens = estimate_tokens(instructions) if isinstance(instructions, str) else 0
    items = payload.get("input")
    if not isinstance(items, list):
        return tokens + _content_tokens(items)
    for item in items:
        if not isinstance(item, dict):
            tokens += _content_tokens(item)
        elif "role" in item:  # a message: its content, and its framing
            tokens += _TOKENS_PER_MESSAGE + _content_tokens(item.get("content"))
        else:  # a part ({"type": "input_text", "text": ...}) or a tool's output
            text = item.get("text", item.get("output"))
            tokens += estimate_tokens(text) if isinstance(text, str) else 0
    return tokens


def _max_tokens(payload: dict[str, Any]) -> int | None:
    value = payload.get("max_completion_tokens", payload.get("max_tokens", payload.get("max_output_tokens")))
    valid = isinstance(value, int) and not isinstance(value, bool) and 0 <= value < 2**31
    return value if valid else None  # beyond the INTEGER column it is no useful limit anyway


def parse_request(body: bytes, endpoint: str = "/v1/chat/completions") -> ParsedRequest:
    """Read an accounted body; splice in `stream_options.include_usage` when a chat or completions
    stream left it unset.

    Never raises: a body we cannot read comes back with `refusal` set (model 'unknown', an
    estimate from its length), so the proxy answers 400 and still writes the request's row.
    """
    try:
        payload = orjson.loads(body)
    except orjson.JSONDecodeError as exc:
        reason = "nested too deeply" if "depth" in str(exc) else "not valid JSON"
        return _refused(body, f"request body is {reason}; send one JSON object")
    if not isinstance(payload, dict):
        return _refused(body, f"request body is a JSON {type(payload).__name__}, not an object")
    model = payload.get("model")
    model = model[:MAX_MODEL_CHARS] if isinstance(model, str) and model else "unknown"
    if endpoint == EMBEDDINGS_PATH:
        return ParsedRequest(body, model, False, None, _prompt_tokens(payload.get("input")), False)
    stream = payload.get("stream") is True
    if endpoint == RESPONSES_PATH:  # its stream ends with usage unasked: nothing to splice
        return ParsedRequest(body, model, stream, _max_tokens(payload), _responses_prompt(payload), False)
    injected = False
    if stream:
        options = payload.get("stream_options")
        # a non-object stream_options is the client's error: forward it untouched for the engine
        if options is None or (isinstance(options, dict) and "include_usage" not in options):
            spliced = splice_include_usage(body, options)
            injected = spliced is not None
            body = spliced if spliced is not None else body
    return ParsedRequest(
        body,
        model,
        stream,
        _max_tokens(payload),
        _estimate_prompt(payload),
        injected,
        ignore_eos=payload.get("ignore_eos") is True,
    )


def _refused(body: bytes, reason: str) -> ParsedRequest:
    return ParsedRequest(body, "unknown", False, None, tokens_for_characters(len(body)), False, reason)


def splice_include_usage(body: bytes, options: dict[str, Any] | None) -> bytes | None:
    """`body` with include_usage added to its top-level stream_options (created when None).

    Works on the bytes: the only change is the inserted text. Returns None when the top-level
    stream_options object cannot be located (the request then goes out unchanged).
    """
    if options is None:
        start = body.index(b"{") + 1  # the top-level object: orjson has read it
        return body[:start] + b'"stream_options":{' + _INCLUDE_USAGE + b"}," + body[start:]
    expected = {"include_usage": True, **options}
    for match in _OPTIONS_KEY.finditer(body):  # a nested object may have the same key: check
        end = match.end()
        separator = b"" if body[end:].lstrip()[:1] == b"}" else b","
        candidate = body[:end] + _INCLUDE_USAGE + separator + body[end:]
        spliced = orjson.loads(candidate).get("stream_options")
        if spliced == expected:
            return candidate
    return None
