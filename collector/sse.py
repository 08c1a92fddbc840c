"""Server-sent events on the hot path: split a byte stream into events, read each chunk (proxy and probe).

Why not an SSE library: the proxy must forward the upstream's bytes unchanged (re-serialising an
event would change them), and the per-chunk path must stay allocation-light. The SSE grammar we
need is one rule: an event ends at a blank line (WHATWG HTML §9.2.6); engines use "\\n\\n", and
"\\r\\n\\r\\n" is handled. Everything else about an event (its `data:` payload) is read by
`inspect_event`, which only looks and never rewrites.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import msgspec
import orjson

from collector.tokens import CHARS_PER_TOKEN, tokens_for_characters

__all__ = [
    "EventSplitter",
    "EventTooLarge",
    "ChunkInfo",
    "inspect_event",
    "openai_usage",
    "plain_read",
    "DONE",
    "MALFORMED",
    "ERROR",
]


class EventTooLarge(ValueError):
    """An event grew past the splitter's limit without ending; the message names the limit."""


_CR = 13  # b"\r"[0]


class EventSplitter:
    """Feed raw bytes; get back the complete events they finish, and the exact bytes of those.

    The bytes are returned so that the proxy can forward what it received without rebuilding it
    (no copy in the common case of whole events per read); the events, without their blank-line
    terminators, are for reading.

    Linear in the bytes fed: while an event is incomplete its parts are kept in a list and only
    the new bytes (with the 3 before them) are searched for a terminator, so an 8 MB event read
    4 KB at a time is joined once, not 2,000 times. An incomplete event past `max_event_bytes`
    raises EventTooLarge, which bounds the memory one stream can hold.

    >>> s = EventSplitter(); s.feed(b"data: a\\n\\nda"); s.feed(b"ta: b\\n\\n")
    (b'data: a\\n\\n', [b'data: a'])
    (b'data: b\\n\\n', [b'data: b'])
    """

    __slots__ = ("_parts", "_pending", "_tail", "separator", "max_event_bytes")

    def __init__(self, max_event_bytes: int = 2**20) -> None:
        self._parts: list[bytes] = []
        self._pending = 0
        self._tail = b""  # the last 3 bytes held: a terminator may start there
        self.separator = b"\n\n"
        self.max_event_bytes = max_event_bytes

    def feed(self, data: bytes) -> tuple[bytes, list[bytes]]:
        """Append `data`; return (bytes of the completed events, the events), possibly empty."""
        complete = self.take(data)
        return complete, self.events(complete)

    def take(self, data: bytes) -> bytes:
        """Append `data`; return the bytes of the events it completes (b"" when none), unsplit.

        What the proxy calls: a read of plain chunks is read whole (`plain_read`), and split
        into events (`events`) only when it holds something else.
        """
        if self._parts:
            window = self._tail + data
            if b"\n\n" not in window and b"\r\n\r\n" not in window:
                self._hold(data)
                return b""
            buffer = b"".join(self._parts) + data
            self._parts, self._pending, self._tail = [], 0, b""
        else:
            buffer = data
        # a one-byte search for CR (an int: memchr) spares most reads the four-byte one
        separator = b"\r\n\r\n" if _CR in buffer and b"\r\n\r\n" in buffer else b"\n\n"
        end = buffer.rfind(separator)
        if end < 0:
            self._hold(buffer)
            return b""
        end += len(separator)
        if end == len(buffer):
            complete = buffer
        else:
            complete = buffer[:end]
            self._hold(buffer[end:])
        self.separator = separator
        return complete

    def events(self, complete: bytes) -> list[bytes]:
        """The events in what `take` returned, without their terminators."""
        if not complete:
            return []
        events = complete.split(self.separator)
        events.pop()  # the empty string after the last terminator
        return events

    def _hold(self, data: bytes) -> None:
        if not data:
            return
        self._parts.append(data)
        self._pending += len(data)
        self._tail = (self._tail + data)[-3:]
        if self._pending > self.max_event_bytes:
            raise EventTooLarge(
                f"an SSE event passed {self.max_event_bytes} bytes without ending (--max-sse-event-bytes)"
            )

    def join(self, events: list[bytes]) -> bytes:
        """Bytes of `events` with their terminators, as they would have been received."""
        return self.separator.join(events) + self.separator if events else b""

    def remainder(self) -> bytes:
        """Bytes received after the last complete event (a truncated stream leaves some)."""
        return b"".join(self._parts)


@dataclass(slots=True, eq=False)
class ChunkInfo:
    """What one event says: tokens it carries (estimated), the usage object, and the parsed chunk
    itself, which tracing reads the response's id, model and finish reasons from (only when on).

    Compared by identity (`eq=False`): the markers DONE, MALFORMED and ERROR hold the same values
    as a chunk without tokens, and must never equal one."""

    tokens_estimate: int = 0
    usage: dict[str, Any] | None = None
    usage_only: bool = False  # `choices: []` with usage: the include_usage chunk
    chunk: dict[str, Any] | None = None


DONE = ChunkInfo()
MALFORMED = ChunkInfo()
ERROR = ChunkInfo()
# the answer for the common chunk (a few tokens, no usage) when its parsed dict is not wanted:
# shared, never changed, so that reading a chunk allocates nothing of ours
_TOKENS_ONLY = tuple(ChunkInfo(tokens) for tokens in range(64))


def _delta_tokens(choice: dict[str, Any]) -> int:
    delta = choice.get("delta")
    if isinstance(delta, dict):
        tool_call = delta.get("tool_calls") or delta.get("function_call")
        return _delta_rule(
            delta.get("content"), delta.get("reasoning_content"), delta.get("reasoning"), tool_call
        )
    text = choice.get("text")  # /v1/completions
    return tokens_for_characters(len(text)) if isinstance(text, str) else 0


def _delta_rule(content: Any, reasoning_content: Any, reasoning: Any, tool_call: Any) -> int:
    """A delta's tokens from its fields, whichever parse read them: its text (content, reasoning,
    and a tool call's name and arguments, which the engine generates like any text), at least 1
    for a tool call. Examples: ("abcd", None, "abcdefgh", None) -> 3; a tool call whose arguments
    are 2,000 characters -> 500 (issue #36 N9: it counted 1); a tool call with only an id -> 1."""
    text_len = len(content) if isinstance(content, str) else 0
    # vLLM >= 0.9 names it `reasoning` (and may send both, synced): count it once
    reasoning = reasoning_content or reasoning
    if isinstance(reasoning, str):
        text_len += len(reasoning)
    if tool_call:
        text_len += _tool_call_characters(tool_call)
    if text_len:
        return tokens_for_characters(text_len)
    return 1 if tool_call else 0


def _tool_call_characters(tool_call: Any) -> int:
    """Characters of generated text in a delta's `tool_calls` (a list) or legacy `function_call`
    (one object): each function's `name` and `arguments` strings."""
    calls = tool_call if type(tool_call) is list else (tool_call,)
    characters = 0
    for call in calls:
        if type(call) is not dict:
            continue
        function = call.get("function", call)  # function_call is the function itself
        if type(function) is dict:
            for field in ("name", "arguments"):
                value = function.get(field)
                if type(value) is str:
                    characters += len(value)
    return characters


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


def _inspect_fields(event: bytes, keep_chunk: bool) -> ChunkInfo | None:
    payload, error = _fields(event)
    if error:
        return ERROR
    if payload is None:
        return None
    if payload.strip() == b"[DONE]":
        return DONE
    try:
        return _read_chunk(orjson.loads(payload), keep_chunk)
    except orjson.JSONDecodeError:
        return MALFORMED


def _read_chunk(chunk: object, keep_chunk: bool) -> ChunkInfo:
    # `type(...) is` rather than isinstance: orjson makes exact dicts and lists, and this runs per chunk
    if type(chunk) is not dict:
        return MALFORMED
    choices = chunk.get("choices")
    tokens = 0
    if type(choices) is list:
        for choice in choices:
            if type(choice) is dict:
                tokens += _delta_tokens(choice)
    elif chunk.get("error") or chunk.get("object") == "error":  # vLLM/SGLang: error mid-stream
        return ERROR
    elif type(kind := chunk.get("type")) is str and (kind.startswith("response.") or kind == "error"):
        return _responses_event(chunk, kind, keep_chunk)  # the Responses API's events
    usage = chunk.get("usage")
    if type(usage) is not dict:
        if (
            not keep_chunk
            and tokens < len(_TOKENS_ONLY)
            and "timings" not in chunk
            and "metrics" not in chunk
        ):
            return _TOKENS_ONLY[tokens]
        return ChunkInfo(tokens, None, False, chunk)
    return ChunkInfo(tokens, usage, not choices, chunk)


# Responses API (/v1/responses) stream events whose `delta` string is generated text: the
# answer, reasoning, a refusal, a tool call's arguments
_RESPONSES_TEXT = frozenset(
    {
        "response.output_text.delta",
        "response.reasoning_text.delta",
        "response.reasoning_summary_text.delta",
        "response.refusal.delta",
        "response.function_call_arguments.delta",
    }
)
# the events that end a response and carry its usage (`response.usage`)
_RESPONSES_END = frozenset({"response.completed", "response.incomplete"})


def _responses_event(chunk: dict[str, Any], kind: str, keep_chunk: bool) -> ChunkInfo:
    """One Responses API event: text deltas carry tokens (the same rule as a chat delta's), the
    final event its usage (renamed to the chat names, `openai_usage`), and `error` or
    `response.failed` is an error the engine sent inside the stream."""
    if kind in _RESPONSES_TEXT:
        delta = chunk.get("delta")
        tokens = tokens_for_characters(len(delta)) if type(delta) is str else 0
        if not keep_chunk and tokens < len(_TOKENS_ONLY):
            return _TOKENS_ONLY[tokens]
        return ChunkInfo(tokens, None, False, chunk if keep_chunk else None)
    if kind in _RESPONSES_END:
        response = chunk.get("response")
        usage = response.get("usage") if type(response) is dict else None
        normal = openai_usage(usage) if type(usage) is dict else None
        return ChunkInfo(0, normal, False, response if type(response) is dict else None)
    if kind == "error" or kind == "response.failed":
        return ERROR
    return _TOKENS_ONLY[0] if not keep_chunk else ChunkInfo(0, None, False, chunk)


def openai_usage(usage: dict[str, Any], *, embeddings: bool = False) -> dict[str, Any]:
    """A `usage` object in the chat API's names, which the request log reads.

    The Responses API says `input_tokens`, `output_tokens` and `input_tokens_details`; they are
    renamed (an object that has the chat names already is returned as it is). An embeddings
    answer has only `prompt_tokens`: it generated nothing, so `completion_tokens` is 0.

    >>> openai_usage({"input_tokens": 5, "output_tokens": 7, "input_tokens_details": {"cached_tokens": 2}})
    {'prompt_tokens': 5, 'completion_tokens': 7, 'prompt_tokens_details': {'cached_tokens': 2}}
    >>> openai_usage({"prompt_tokens": 8, "total_tokens": 8}, embeddings=True)
    {'prompt_tokens': 8, 'total_tokens': 8, 'completion_tokens': 0}
    """
    if "prompt_tokens" not in usage and ("input_tokens" in usage or "output_tokens" in usage):
        normal: dict[str, Any] = {
            "prompt_tokens": usage.get("input_tokens"),
            "completion_tokens": usage.get("output_tokens"),
        }
        details = usage.get("input_tokens_details")
        if type(details) is dict:
            normal["prompt_tokens_details"] = details
        return normal
    if embeddings and "completion_tokens" not in usage:
        return {**usage, "completion_tokens": 0}
    return usage


def inspect_event(event: bytes, keep_chunk: bool = True) -> ChunkInfo | None:
    """Read one event; None for comments/keep-alives, DONE for `[DONE]`, MALFORMED for bad JSON,
    ERROR for an error the engine reported inside the stream.

    A chunk's token estimate is collector.tokens' rule (floor(characters / 4), at least 1 for
    non-empty content) over its content, reasoning and tool calls' names and arguments, at least
    1 for a tool call. A role-only chunk carries no token (it must not
    stamp TTFT). The row's completion_tokens come from upstream usage whenever it is sent.
    Without `keep_chunk`, a chunk without usage comes back without its parsed dict (`chunk` is
    None), as a shared ChunkInfo: what the proxy asks for unless it is tracing.
    """
    if event.startswith(b"data:"):  # the common case: one data line
        payload = event[5:]
    else:  # "event:"/"id:" fields first, or a comment-only keep-alive
        return _inspect_fields(event, keep_chunk)
    if b"[DONE]" in payload and payload.strip() == b"[DONE]":  # before the parse: its error is slow
        return DONE
    try:
        chunk = orjson.loads(payload)  # JSON allows the surrounding whitespace
    except orjson.JSONDecodeError:
        # more lines after `data:` (another field, multi-line data) fail here: re-read them slowly,
        # so the hot path never scans an event for newlines
        return _inspect_fields(event, keep_chunk) if b"\n" in payload else MALFORMED
    return _read_chunk(chunk, keep_chunk)


class _Delta(msgspec.Struct, gc=False):
    """The fields of a choice's `delta` that carry tokens; every other field is skipped unread."""

    content: Any = None
    reasoning: Any = None  # vLLM >= 0.9 (and it may send both, synced: counted once)
    reasoning_content: Any = None
    tool_calls: Any = None
    function_call: Any = None


class _Choice(msgspec.Struct, gc=False):
    delta: _Delta | None = None
    text: Any = None  # /v1/completions


class _Plain(msgspec.Struct, gc=False):
    """A plain chunk (`choices` a list of objects, `usage` absent or null); these Structs skip the
    garbage collector (`gc=False`) since decoded JSON never makes a reference cycle."""

    choices: list[_Choice]
    usage: msgspec.UnsetType | None = msgspec.UNSET  # None: `"usage":null` (vLLM), UNSET: absent
    # the engine's own timings (llama.cpp `timings`, vLLM `metrics`; collector.engine_timings):
    # a chunk that carries them is not plain, and is read event by event, where they are kept
    timings: msgspec.UnsetType | None = msgspec.UNSET
    metrics: msgspec.UnsetType | None = msgspec.UNSET


_PLAIN = msgspec.json.Decoder(_Plain)


def _plain_tokens(chunks: Sequence[_Plain]) -> tuple[int, bool]:
    """The tokens in decoded plain chunks, and whether one says `"usage":null`."""
    tokens, usage_null = 0, False
    for chunk in chunks:
        if chunk.usage is None:
            usage_null = True
        for choice in chunk.choices:
            delta = choice.delta
            if delta is None:
                text = choice.text
                tokens += tokens_for_characters(len(text)) if type(text) is str else 0
                continue
            content = delta.content
            # the common delta: text content and no reasoning field (`_delta_tokens`'s rule inlined)
            if (
                type(content) is str
                and content
                and delta.reasoning is None
                and delta.reasoning_content is None
            ):
                tokens += len(content) // CHARS_PER_TOKEN or 1
                continue
            tool_call = delta.tool_calls or delta.function_call
            tokens += _delta_rule(content, delta.reasoning_content, delta.reasoning, tool_call)
    return tokens, usage_null


_USAGE_NULL = b',"usage":null'
_NULL_END = b',"usage":null}\n\n'  # a chunk's end once vLLM or SGLang was asked for usage
_NULL_BOUNDARY = _NULL_END + b"data: "


def plain_read(complete: bytes, strip_usage: bool = False) -> tuple[int, bytes] | None:
    """A read of plain chunks: (its tokens, the bytes to forward); None for any other read.

    vLLM and SGLang write `"usage":null` into every chunk once usage was asked for. When the
    client did not ask (`strip_usage`: the sidecar asked for it), the field goes, once per read
    (inside a JSON string its quotes would be escaped, so it is never text). A read whose chunks
    all end with it is read and stripped in one split (`_strip_plain`); any other read of plain
    chunks is parsed by `_parse_plain`, which says whether a chunk's `usage` is null, so OpenAI-
    and llama.cpp-style reads, which never hold it, are not searched for it.

    >>> plain_read(b'data: {"choices":[{"delta":{"content":"abcd"}}],"usage":null}\\n\\n', True)
    (1, b'data: {"choices":[{"delta":{"content":"abcd"}}]}\\n\\n')
    """
    if strip_usage and complete.endswith(_NULL_END):
        stripped = _strip_plain(complete)
        if stripped is not None:
            return stripped
    read = _parse_plain(complete)
    if read is None:
        return None
    tokens, usage_null = read
    if usage_null and strip_usage:
        complete = complete.replace(_USAGE_NULL, b"")
    return tokens, complete


def _parse_plain(complete: bytes) -> tuple[int, bool] | None:
    """(tokens, whether a chunk says `"usage":null`) of a read of plain chunks, in one parse that
    builds only the token fields (`_Plain`); None for any other read, read event by event instead.

    A plain chunk is one `data:` line of a JSON object with a `choices` list and no `usage` (or a
    null one): nearly every event. The payloads are joined by spaces (a JSON string holds no raw
    newline, so a boundary is never inside one) and decoded once. A comment, another field,
    multi-line data, `[DONE]`, a usage or error chunk, a field of another type, bad JSON, bad UTF-8
    (checked first: the decoder skips fields unchecked) or "\\r\\n" gives None, and
    `inspect_event`, the reference, agrees with whatever this returns (tests/test_sidecar_units.py),
    except that `1e400` in a skipped field reads as infinity here and as malformed there. The
    `"usage":null` flag spares OpenAI- and llama.cpp-style reads the search for it. Costs:
    BENCHMARKS.md §2, "One parse that builds only the token fields" and stop 32.

    >>> _parse_plain(b'data: {"choices":[{"delta":{"content":"abcdefgh"}}]}\\n\\n' * 2)
    (4, False)
    >>> _parse_plain(b'data: {"choices":[],"usage":null}\\n\\n')
    (0, True)
    >>> _parse_plain(b'data: {"choices":[],"usage":{"completion_tokens":4}}\\n\\n') is None
    True
    """
    if complete.startswith(b"data: "):
        start, boundary = 6, b"\n\ndata: "
    elif complete.startswith(b"data:"):
        start, boundary = 5, b"\n\ndata:"
    else:
        return None
    if not complete.endswith(b"\n\n") or complete.endswith(b"[DONE]\n\n"):  # "\r\n\r\n"; the end
        return None
    if not complete.isascii():
        try:
            complete.decode()
        except UnicodeDecodeError:
            return None  # inspect_event says MALFORMED
    last = len(complete) - 2  # where the read's last "\n\n" starts
    try:  # (a copy parses faster than a memoryview at these sizes)
        if complete.find(b"\n") == last:  # one event of one line (each read of a paced stream)
            chunks: Sequence[_Plain] = (_PLAIN.decode(complete[start:]),)
        else:  # the payloads, a space between each two
            pieces = complete[start:].split(boundary)
            values = b" ".join(pieces)
            # any newline left before the end was inside an event: one of several lines (a
            # one-byte find, a memchr, not a count)
            if values.find(b"\n") != len(values) - 2:
                return None
            chunks = _PLAIN.decode_lines(values)
            if len(chunks) != len(pieces):
                return None  # payloads that parse only together, or two values in one event
    except msgspec.DecodeError:  # bad JSON, or not a plain chunk (ValidationError is one)
        return None
    return _plain_tokens(chunks)


def _strip_plain(complete: bytes) -> tuple[int, bytes] | None:
    """A read of several plain chunks that each end with `,"usage":null` (vLLM's and SGLang's
    once usage was asked for): (its tokens, the read without those fields); None otherwise.

    `_parse_plain` and a `bytes.replace` of the field in one pass: the read is split once at the
    chunks' ends (`,"usage":null}\\n\\ndata: `), and the pieces are joined twice, into the bytes
    to forward and into the payloads, a space between each two, for the same decoder: less work
    than parsing and then searching the read for the field again (BENCHMARKS.md §2, stop 35).

    Only the field that ends a chunk goes: there it is the chunk's own (the `}` after it closes
    the chunk), never a field of a nested object. A read where some chunk ends otherwise, or
    anything `_parse_plain` would not read, gives None; `plain_read` then takes `_parse_plain`
    and replaces the field.

    >>> _strip_plain(b'data: {"choices":[{"delta":{"content":"abcd"}}],"usage":null}\\n\\n' * 2)
    (2, b'data: {"choices":[{"delta":{"content":"abcd"}}]}\\n\\ndata: {"choices":[{"delta":{"content":"abcd"}}]}\\n\\n')
    """
    if not complete.startswith(b"data: ") or not complete.endswith(_NULL_END):
        return None
    if not complete.isascii():
        try:
            complete.decode()
        except UnicodeDecodeError:
            return None
    try:
        if complete.find(b"\n") == len(complete) - 2:  # one event of one line (a paced stream's read)
            body = complete[: -len(_NULL_END)] + b"}\n\n"
            return _plain_tokens((_PLAIN.decode(body[6:]),))[0], body
        pieces = complete.split(_NULL_BOUNDARY)
        pieces[-1] = pieces[-1][: -len(_NULL_END)] + b"}\n\n"
        body = b"}\n\ndata: ".join(pieces)
        pieces[0] = pieces[0][6:]
        values = b"} ".join(pieces)
        # any newline left before the end was inside an event: one of several lines, or an
        # event that did not end with the field (its "\n\ndata: " is still there)
        if values.find(b"\n") != len(values) - 2:
            return None
        chunks = _PLAIN.decode_lines(values)
    except msgspec.DecodeError:
        return None
    if len(chunks) != len(pieces):
        return None  # payloads that parse only together
    return _plain_tokens(chunks)[0], body
