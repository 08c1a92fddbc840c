"""Server-sent events on the hot path: split a byte stream into events, read each chunk (proxy and probe).

Why not an SSE library: the proxy must forward the upstream's bytes unchanged (re-serialising an
event would change them), and the per-chunk path must stay allocation-light. The SSE grammar we
need is one rule: an event ends at a blank line (WHATWG HTML §9.2.6); engines use "\\n\\n", and
"\\r\\n\\r\\n" is handled. Everything else about an event (its `data:` payload) is read by
`inspect_event`, which only looks and never rewrites.
"""

from __future__ import annotations

from dataclasses import dataclass

import orjson

__all__ = ["EventSplitter", "ChunkInfo", "inspect_event", "DONE", "MALFORMED", "ERROR"]

_CHARS_PER_TOKEN = 4


class EventSplitter:
    """Feed raw bytes; get back the complete events they finish, and the exact bytes of those.

    The bytes are returned so that the proxy can forward what it received without rebuilding it
    (no copy in the common case of whole events per read); the events, without their blank-line
    terminators, are for reading.

    >>> s = EventSplitter(); s.feed(b"data: a\\n\\nda"); s.feed(b"ta: b\\n\\n")
    (b'data: a\\n\\n', [b'data: a'])
    (b'data: b\\n\\n', [b'data: b'])
    """

    __slots__ = ("_buffer", "separator")

    def __init__(self) -> None:
        self._buffer = b""
        self.separator = b"\n\n"

    def feed(self, data: bytes) -> tuple[bytes, list[bytes]]:
        """Append `data`; return (bytes of the completed events, the events), possibly empty."""
        buffer = self._buffer + data if self._buffer else data
        separator = b"\r\n\r\n" if b"\r\n\r\n" in buffer else b"\n\n"
        end = buffer.rfind(separator)
        if end < 0:
            self._buffer = buffer
            return b"", []
        end += len(separator)
        if end == len(buffer):
            complete, self._buffer = buffer, b""
        else:
            complete, self._buffer = buffer[:end], buffer[end:]
        self.separator = separator
        events = complete.split(separator)
        events.pop()  # the empty string after the last terminator
        return complete, events

    def join(self, events: list[bytes]) -> bytes:
        """Bytes of `events` with their terminators, as they would have been received."""
        return self.separator.join(events) + self.separator if events else b""

    def remainder(self) -> bytes:
        """Bytes received after the last complete event (a truncated stream leaves some)."""
        return self._buffer


@dataclass(slots=True)
class ChunkInfo:
    """What one event says: tokens it carries (estimated), the usage object, and the parsed chunk
    itself, which tracing reads the response's id, model and finish reasons from (only when on)."""

    tokens_estimate: int = 0
    usage: dict | None = None
    usage_only: bool = False  # `choices: []` with usage: the include_usage chunk
    chunk: dict | None = None


DONE = ChunkInfo()
MALFORMED = ChunkInfo()
ERROR = ChunkInfo()


def _delta_tokens(choice: dict) -> int:
    delta = choice.get("delta")
    if isinstance(delta, dict):
        content = delta.get("content")
        text_len = len(content) if isinstance(content, str) else 0
        # vLLM >= 0.9 names it `reasoning` (and may send both, synced): count it once
        reasoning = delta.get("reasoning_content") or delta.get("reasoning")
        if isinstance(reasoning, str):
            text_len += len(reasoning)
        if text_len:
            return max(1, text_len // _CHARS_PER_TOKEN)
        return 1 if delta.get("tool_calls") or delta.get("function_call") else 0
    text = choice.get("text")  # /v1/completions
    return max(1, len(text) // _CHARS_PER_TOKEN) if isinstance(text, str) and text else 0


def _fields(event: bytes) -> tuple[bytes | None, bool]:
    """Slow path for events that are not one `data:` line: (their data, whether they are errors).

    The SSE grammar (WHATWG HTML §9.2.6): data is every `data:` line without the field name (one
    optional space after the colon dropped), joined by newlines; None when there is none (a comment
    or keep-alive). An `event: error` field, or llama.cpp's non-standard `error:` line, marks an
    error the engine sent inside a 200 stream.
    """
    lines, error = [], False
    for line in event.split(b"\n"):
        line = line.removesuffix(b"\r")
        if line.startswith(b"data:"):
            value = line[5:]
            lines.append(value[1:] if value.startswith(b" ") else value)
        elif line.startswith(b"error:") or (line.startswith(b"event:") and line[6:].strip() == b"error"):
            error = True
    return (b"\n".join(lines) if lines else None), error


def _inspect_fields(event: bytes) -> ChunkInfo | None:
    payload, error = _fields(event)
    if error:
        return ERROR
    if payload is None:
        return None
    if payload.strip() == b"[DONE]":
        return DONE
    try:
        return _read_chunk(orjson.loads(payload))
    except orjson.JSONDecodeError:
        return MALFORMED


def _read_chunk(chunk: object) -> ChunkInfo:
    if not isinstance(chunk, dict):
        return MALFORMED
    choices = chunk.get("choices")
    tokens = 0
    if isinstance(choices, list):
        for choice in choices:
            if isinstance(choice, dict):
                tokens += _delta_tokens(choice)
    elif chunk.get("error") or chunk.get("object") == "error":  # vLLM/SGLang: error mid-stream
        return ERROR
    usage = chunk.get("usage")
    usage = usage if isinstance(usage, dict) else None
    return ChunkInfo(tokens, usage, usage is not None and not choices, chunk)


def inspect_event(event: bytes) -> ChunkInfo | None:
    """Read one event; None for comments/keep-alives, DONE for `[DONE]`, MALFORMED for bad JSON,
    ERROR for an error the engine reported inside the stream.

    A chunk's token estimate is floor(characters / 4), at least 1 for non-empty content or a tool
    call: engines stream about one token per chunk, and on the llama.cpp capture in
    tests/fixtures this gives 302 for a true 300. A role-only chunk carries no token (it must not
    stamp TTFT). The row's completion_tokens come from upstream usage whenever it is sent.
    """
    if event.startswith(b"data:"):  # the common case: one data line
        payload = event[5:]
    else:  # "event:"/"id:" fields first, or a comment-only keep-alive
        return _inspect_fields(event)
    if payload.strip() == b"[DONE]":
        return DONE
    try:
        chunk = orjson.loads(payload)  # JSON allows the surrounding whitespace
    except orjson.JSONDecodeError:
        # more lines after `data:` (another field, multi-line data) fail here: re-read them slowly,
        # so the hot path never scans an event for newlines
        return _inspect_fields(event) if b"\n" in payload else MALFORMED
    return _read_chunk(chunk)
