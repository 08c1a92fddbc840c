"""Server-sent events on the proxy's hot path: split a byte stream into events, read each chunk.

Why not an SSE library: the proxy must forward the upstream's bytes unchanged (re-serialising an
event would change them), and the per-chunk path must stay allocation-light. The SSE grammar we
need is one rule: an event ends at a blank line (WHATWG HTML §9.2.6); engines use "\\n\\n", and
"\\r\\n\\r\\n" is handled. Everything else about an event (its `data:` payload) is read by
`inspect_event`, which only looks and never rewrites.
"""

from __future__ import annotations

from dataclasses import dataclass

import orjson

__all__ = ["EventSplitter", "ChunkInfo", "inspect_event", "DONE", "MALFORMED"]

_CHARS_PER_TOKEN = 4


class EventSplitter:
    """Feed raw bytes, get back complete events (each with its terminator), in order.

    >>> s = EventSplitter(); s.feed(b"data: a\\n\\nda"); s.feed(b"ta: b\\n\\n")
    [b'data: a\\n\\n']
    [b'data: b\\n\\n']
    """

    __slots__ = ("_buffer",)

    def __init__(self) -> None:
        self._buffer = b""

    def feed(self, data: bytes) -> list[bytes]:
        """Append `data`; return the events it completed (possibly none)."""
        buffer = self._buffer + data if self._buffer else data
        separator = b"\n\n" if b"\r\n\r\n" not in buffer else b"\r\n\r\n"
        end = buffer.rfind(separator)
        if end < 0:
            self._buffer = buffer
            return []
        end += len(separator)
        self._buffer = buffer[end:]
        complete = buffer[:end]
        parts = complete.split(separator)
        parts.pop()  # the empty string after the last separator
        return [part + separator for part in parts]

    def remainder(self) -> bytes:
        """Bytes received after the last complete event (a truncated stream leaves some)."""
        return self._buffer


@dataclass(slots=True)
class ChunkInfo:
    """What one event says: tokens it carries (estimated) and the usage object, if any."""

    has_token: bool = False
    tokens_estimate: int = 0
    usage: dict | None = None
    usage_only: bool = False  # `choices: []` with usage: the include_usage chunk


DONE = ChunkInfo()
MALFORMED = ChunkInfo()


def _delta_tokens(choice: dict) -> int:
    delta = choice.get("delta")
    if isinstance(delta, dict):
        content = delta.get("content")
        text_len = len(content) if isinstance(content, str) else 0
        reasoning = delta.get("reasoning_content")
        if isinstance(reasoning, str):
            text_len += len(reasoning)
        if text_len:
            return max(1, text_len // _CHARS_PER_TOKEN)
        return 1 if delta.get("tool_calls") or delta.get("function_call") else 0
    text = choice.get("text")  # /v1/completions
    return max(1, len(text) // _CHARS_PER_TOKEN) if isinstance(text, str) and text else 0


def inspect_event(event: bytes) -> ChunkInfo | None:
    """Read one event; None for comments/keep-alives, DONE for `[DONE]`, MALFORMED for bad JSON.

    A chunk's token estimate is floor(characters / 4), at least 1 for non-empty content or a tool
    call: engines stream about one token per chunk, and on the llama.cpp capture in
    tests/fixtures this gives 302 for a true 300. A role-only chunk carries no token (it must not
    stamp TTFT). The row's completion_tokens come from upstream usage whenever it is sent.
    """
    start = event.find(b"data:")
    if start < 0:
        return None
    payload = event[start + 5:].strip()
    if payload == b"[DONE]":
        return DONE
    try:
        chunk = orjson.loads(payload)
    except orjson.JSONDecodeError:
        return MALFORMED
    if not isinstance(chunk, dict):
        return MALFORMED
    choices = chunk.get("choices")
    tokens = 0
    if isinstance(choices, list):
        for choice in choices:
            if isinstance(choice, dict):
                tokens += _delta_tokens(choice)
    usage = chunk.get("usage")
    usage = usage if isinstance(usage, dict) else None
    return ChunkInfo(tokens > 0, tokens, usage, usage is not None and not choices)
