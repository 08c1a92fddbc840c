"""The one fake OpenAI-compatible upstream of the suite, on raw sockets so that it can break HTTP.

It runs an asyncio server on 127.0.0.1 in its own thread and writes every byte itself, so besides
well-formed answers it can send what no framework would: broken chunked framing, an event that
never ends, a connection that serves one request and drops the next (llama.cpp's keep-alive
habit). Behaviour is chosen per request by the `x-fake` header, so request bodies stay untouched
and the same request sent directly and through the sidecar gets the same bytes:

    ok (default)    a chat stream of `x-fake-tokens` tokens (5), usage when asked; JSON when not streamed
    usage-null      vLLM style: every chunk carries "usage":null when usage is on
    429 500 400 503 a JSON error with that status
    reset           the connection is reset (RST) after two tokens
    truncated-chunk two tokens, then a chunk whose size line announces more than follows, then a close
    cut-event       two tokens, then half an event, then the body's clean end
    gate-second     the first token, then (after the gate of `x-test-id` opens) the rest
    buffered        every event held until the gate of `x-test-id` opens, then all in one write
    malformed       a chunk that is not JSON
    error-event     vLLM's `data: {"error": ...}` after two tokens, then [DONE]
    error-field     llama.cpp's `error: {...}` line instead
    hang            never answers; stall: one token, then silence
    broken-framing  two good events, an invalid chunk-size line, then the connection closes
    endless-event   one event that never ends (bounded: `x-fake-size` bytes, default 64 MiB)
    huge-event      one complete event of `x-fake-size` bytes (default 4 MiB), then [DONE]
    non-sse         a stream answered as application/x-ndjson: a first line, then (after the
                    gate of `x-test-id` opens, at most 10 s) the rest
    usage-negative, usage-huge, usage-string, usage-float: the usage chunk's counts are wrong
    gate-headers    waits for the gate of `x-test-id` before it sends the headers
    gate-end        every event and [DONE], then the body's end once the gate of `x-test-id` opens
    garbage-head    a status line and a header line no HTTP parser accepts (quoting `x-fake-text`)
    scripted        the body's `x_fake_stream` (base64) as the SSE body, cut where its
                    `x_fake_cuts` say (for fuzzing)

`x-fake-timings: llamacpp` adds llama.cpp's `timings` (on the usage chunk, else on the finish
chunk; in a JSON answer at its top level), `vllm` vLLM's per-request `metrics` the same way, with
`x-fake-prefill-ms` (12.5) and `x-fake-queue-ms` (3, vLLM only) as the engine's own account.
`x-fake-delay` sets the seconds between chunks, `x-fake-text` the text of each token (default
` tok<i>`) and of the bytes a broken answer carries. `x-fake-encoding` compresses an answer
although the sidecar asked for identity (`gzip`, `deflate`; `gzip-unfinished` never ends its
compressed stream, `gzip-bogus` and `br-bogus` are labelled so and are not), `x-fake-framing: close` sends a
stream without framing, ended by the connection's close. Connection habits are constructor flags:
`one_request_per_connection` (answer, keep the socket open without saying `Connection: close`,
then drop it when a second request arrives), `drop_fresh` (read a request, then hang up), and
`status` (every completions answer is that status). Paths: /v1/models, /v1/moved (307),
/v1/slow (ticks until the client leaves), /metrics.
"""

from __future__ import annotations

import asyncio
import base64
import json
import socket
import struct
import threading
import zlib
from typing import Any

from support.waiting import patient

__all__ = ["FakeUpstream", "ID", "CREATED", "MODEL", "prompt_tokens", "sse_chunk"]

ID, CREATED, MODEL = "chatcmpl-fake", 1796035172, "fake-model"
_REASONS = {
    200: "OK",
    307: "Temporary Redirect",
    400: "Bad Request",
    429: "Too Many Requests",
    500: "Internal Server Error",
    503: "Service Unavailable",
}
_BAD_USAGE = {"usage-negative": -5, "usage-huge": 2**40, "usage-string": "7", "usage-float": 7.5}


def sse_chunk(delta: dict[str, Any], finish: str | None = None, usage_null: bool = False) -> bytes:
    """One chat.completion.chunk event, as engines frame it."""
    body: dict[str, Any] = {
        "choices": [{"finish_reason": finish, "index": 0, "delta": delta}],
        "created": CREATED,
        "id": ID,
        "model": MODEL,
        "object": "chat.completion.chunk",
    }
    if usage_null:
        body["usage"] = None
    return b"data: " + json.dumps(body, separators=(",", ":")).encode() + b"\n\n"


def _usage(prompt: int, completion: Any) -> dict[str, Any]:
    total = prompt + completion if isinstance(completion, int) else prompt
    return {
        "completion_tokens": completion,
        "prompt_tokens": prompt,
        "total_tokens": total,
        "prompt_tokens_details": {"cached_tokens": 1},
    }


def prompt_tokens(payload: dict[str, Any]) -> int:
    """The fake's 'tokenizer': one token per whitespace word, plus 2 per message."""
    messages = payload.get("messages") or []
    return sum(2 + len(str(m.get("content", "")).split()) for m in messages) or 1


def _chunked(data: bytes) -> bytes:
    return f"{len(data):x}\r\n".encode() + data + b"\r\n"


class _Body:
    """How a stream's events are written: chunked, or (`x-fake-framing: close`) raw until the
    connection closes; compressed as `x-fake-encoding` says, each write flushed so that it decodes
    at once (gzip, deflate; gzip-unfinished: its compressed stream never ends; gzip-bogus,
    br-bogus: labelled so, sent uncompressed); with `hold`, kept until `end` writes it all at once."""

    _CODINGS = {
        "gzip": "gzip",
        "deflate": "deflate",
        "gzip-unfinished": "gzip",
        "gzip-bogus": "gzip",
        "br-bogus": "br",
    }

    def __init__(self, request: _Request, writer: asyncio.StreamWriter, *, hold: bool = False) -> None:
        self.writer = writer
        self.coding = request.headers.get("x-fake-encoding", "")
        self.chunked = request.headers.get("x-fake-framing") != "close"
        self.compressor = _compressor(self.coding)
        self.held: list[bytes] | None = [] if hold else None

    @classmethod
    def coding_headers(cls, request: _Request) -> list[tuple[str, str]]:
        coding = cls._CODINGS.get(request.headers.get("x-fake-encoding", ""))
        return [("content-encoding", coding)] if coding else []

    @staticmethod
    def compress(request: _Request, data: bytes) -> bytes:
        """`data` coded as a whole, as `x-fake-encoding` says."""
        compressor = _compressor(request.headers.get("x-fake-encoding", ""))
        return data if compressor is None else compressor.compress(data) + compressor.flush()

    def write(self, data: bytes) -> None:
        if self.compressor is not None:
            data = self.compressor.compress(data) + self.compressor.flush(zlib.Z_SYNC_FLUSH)
        self._framed(data)

    def _framed(self, data: bytes) -> None:
        if not data:
            return
        framed = _chunked(data) if self.chunked else data
        if self.held is not None:
            self.held.append(framed)
        else:
            self.writer.write(framed)

    def end(self) -> None:
        """The compressed stream's end, what was held, and the body's end (chunked's last chunk)."""
        if self.compressor is not None and self.coding != "gzip-unfinished":
            self._framed(self.compressor.flush())
        tail = b"0\r\n\r\n" if self.chunked else b""
        held, self.held = self.held, None
        self.writer.write(b"".join(held or ()) + tail)


def _compressor(coding: str) -> Any:
    if coding in ("gzip", "gzip-unfinished"):
        return zlib.compressobj(wbits=31)
    if coding == "deflate":
        return zlib.compressobj(wbits=15)  # HTTP's deflate is the zlib format
    return None


class _Request:
    __slots__ = ("method", "raw_path", "query", "headers", "body")

    def __init__(self, method: str, target: bytes, headers: dict[str, str], body: bytes) -> None:
        path, _, query = target.partition(b"?")
        self.method, self.raw_path, self.query, self.headers, self.body = method, path, query, headers, body


class LoopServer:
    """A raw-socket asyncio server on 127.0.0.1 in a background thread: `.url`, `.stop()`, a context
    manager. Subclasses set their state, then call `_start(name)`, and implement `_serve`."""

    port: int

    def _start(self, name: str) -> None:
        self.connections = 0
        self._writers: set[asyncio.StreamWriter] = set()
        self._loop = asyncio.new_event_loop()
        self._ready = threading.Event()
        self._thread = threading.Thread(target=self._run, name=name, daemon=True)
        self._thread.start()
        if not self._ready.wait(patient(10)):
            raise RuntimeError(f"{name} did not start")

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def stop(self) -> None:
        """Close the listener and every connection, then stop the loop."""

        def _close() -> None:
            self._server.close()
            for writer in list(self._writers):
                writer.transport.abort()
            self._loop.stop()

        self._loop.call_soon_threadsafe(_close)
        self._thread.join(patient(10))

    def __enter__(self) -> LoopServer:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def _run(self) -> None:
        asyncio.set_event_loop(self._loop)
        sock = socket.socket()
        sock.bind(("127.0.0.1", 0))
        self.port = sock.getsockname()[1]
        self._server = self._loop.run_until_complete(asyncio.start_server(self._serve, sock=sock))
        self._ready.set()
        self._loop.run_forever()
        # stopped: end the connection handlers still waiting, so none is destroyed pending
        pending = asyncio.all_tasks(self._loop)
        for task in pending:
            task.cancel()
        self._loop.run_until_complete(asyncio.gather(*pending, return_exceptions=True))
        self._loop.close()

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        raise NotImplementedError


class FakeUpstream(LoopServer):
    """Serve on 127.0.0.1 in a background thread; `.url`, `.stop()`, usable as a context manager.

    Records: `requests` (completions bodies and headers), `targets` (raw path, query string) of
    every request, `requests_read` and `connections`.
    """

    def __init__(
        self, *, one_request_per_connection: bool = False, drop_fresh: bool = False, status: int | None = None
    ) -> None:
        self.one_request_per_connection, self.drop_fresh, self.status = (
            one_request_per_connection,
            drop_fresh,
            status,
        )
        self.requests: list[dict[str, Any]] = []
        self.targets: list[tuple[bytes, bytes]] = []
        self.requests_read = 0
        self.slow_client_left = threading.Event()  # /v1/slow saw its client (the proxy) leave
        self._arrivals: dict[str, threading.Event] = {}
        self._drained: dict[str, threading.Event] = {}
        self._gates: dict[str, threading.Event] = {}
        self._start("fake-upstream")

    # --- control -------------------------------------------------------------------------------

    def expect(self, test_id: str) -> threading.Event:
        """Set when a completions request with header `x-test-id: test_id` has arrived."""
        return self._arrivals.setdefault(test_id, threading.Event())

    def drained(self, test_id: str) -> threading.Event:
        """Set when every byte of the stream with this `x-test-id` has left for the proxy."""
        return self._drained.setdefault(test_id, threading.Event())

    def gate(self, test_id: str) -> threading.Event:
        """Set it to let a `non-sse`, `gate-headers` or `gate-end` request with this `x-test-id` go on."""
        return self._gates.setdefault(test_id, threading.Event())

    # --- HTTP ----------------------------------------------------------------------------------
    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.connections += 1
        self._writers.add(writer)
        sock = writer.get_extra_info("socket")
        if sock is not None:  # engines answer at once; Nagle would hold a chunk for a delayed ACK
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        try:
            for _ in range(10_000):  # requests per connection: bounded
                request = await _read_request(reader)
                if request is None or not await self._answer(request, reader, writer):
                    break
        except (asyncio.IncompleteReadError, ConnectionError, asyncio.LimitOverrunError):
            pass
        finally:
            self._writers.discard(writer)
            writer.close()

    async def _answer(
        self, request: _Request, reader: asyncio.StreamReader, writer: asyncio.StreamWriter
    ) -> bool:
        """Answer one request; False when the connection must close."""
        self.targets.append((request.raw_path, request.query))
        path = request.raw_path.decode("latin-1")
        if path.startswith("/v1/models"):
            return await _json(writer, 200, {"object": "list", "data": [{"id": MODEL}]})
        if path == "/v1/moved":  # a redirect is the client's to follow, not the proxy's
            return await _send(writer, 307, b"", "text/plain", [("location", "/v1/models")])
        if path == "/v1/slow":
            return await self._slow(reader, writer)
        if path == "/metrics":
            return await _send(writer, 200, b"# no metrics\n", "text/plain")
        self.requests_read += 1
        if self.drop_fresh:
            return False  # read, then gone: the request reached the server
        payload = json.loads(request.body or b"{}")
        self.requests.append({"payload": payload, "headers": request.headers})
        test_id = request.headers.get("x-test-id")
        if test_id:
            self.expect(test_id).set()
        mode = request.headers.get("x-fake", "ok")
        await self._completion(request, payload, mode, reader, writer)
        if self.one_request_per_connection:
            await reader.read(1)  # the next request on this socket is dropped unread
            return False
        broken = ("reset", "broken-framing", "truncated-chunk", "cut-event", "endless-event", "hang", "stall")
        return mode not in (*broken, "garbage-head") and request.headers.get("x-fake-framing") != "close"

    async def _completion(
        self,
        request: _Request,
        payload: dict[str, Any],
        mode: str,
        reader: asyncio.StreamReader,
        writer: asyncio.StreamWriter,
    ) -> None:
        status = self.status or (int(mode) if mode.isdigit() else 200)
        if status == 429:
            await _json(
                writer, 429, {"error": {"message": "slow down", "type": "rate_limit"}}, [("retry-after", "7")]
            )
            return
        if status != 200:
            await _json(writer, status, {"error": {"message": "boom"}})
            return
        if mode == "hang":
            await reader.read()  # until the client gives up
            return
        if mode == "garbage-head":
            text = request.headers.get("x-fake-text", "upstream secret")
            writer.write(f"HTTP/1.1 200 OK\r\nBroken header {text}\r\n\r\n".encode())
            await writer.drain()
            return
        if mode == "scripted":
            await _scripted(writer, payload)
            return
        if mode == "gate-headers":
            await self._wait_gate(request)
        tokens = int(request.headers.get("x-fake-tokens", "5"))
        if not payload.get("stream"):
            coded = _Body.coding_headers(request)
            if coded:  # the whole answer compressed, its length the compressed one
                answer = _Body.compress(
                    request,
                    json.dumps(
                        _completion(payload, tokens) | _engine_timings(request, payload, tokens, 0.0)
                    ).encode(),
                )
                await _send(writer, 200, answer, "application/json", coded)
            else:
                await _json(
                    writer, 200, _completion(payload, tokens) | _engine_timings(request, payload, tokens, 0.0)
                )
            return
        await self._stream(request, payload, mode, tokens, reader, writer)

    async def _wait_gate(self, request: _Request) -> None:
        gate = self.gate(request.headers.get("x-test-id", ""))
        await asyncio.get_running_loop().run_in_executor(None, gate.wait, patient(10))

    async def _stream(
        self,
        request: _Request,
        payload: dict[str, Any],
        mode: str,
        tokens: int,
        reader: asyncio.StreamReader,
        writer: asyncio.StreamWriter,
    ) -> None:
        usage_on = (payload.get("stream_options") or {}).get("include_usage") is True
        null = mode == "usage-null" and usage_on
        delay = float(request.headers.get("x-fake-delay", "0"))
        content_type = "application/x-ndjson" if mode == "non-sse" else "text/event-stream"
        coding = _Body.coding_headers(request)
        close = request.headers.get("x-fake-framing") == "close"
        _head(writer, 200, content_type, [("x-upstream", "fake"), *coding], chunked=not close, close=close)
        if mode == "non-sse":
            writer.write(_chunked(b'{"part":1}\n'))
            await writer.drain()
            await self._wait_gate(request)
            writer.write(_chunked(b'{"part":2}\n') + b"0\r\n\r\n")
            await writer.drain()
            return
        if mode in ("endless-event", "huge-event"):
            await _big_event(writer, mode, int(request.headers.get("x-fake-size", "0")))
            return
        body = _Body(request, writer, hold=mode == "buffered")
        body.write(sse_chunk({"role": "assistant", "content": None}, usage_null=null))
        for i in range(tokens):
            if delay:
                await asyncio.sleep(delay)
            if mode == "malformed" and i == 1:
                body.write(b"data: {not json\n\n")
                continue
            if mode in ("error-event", "error-field") and i == 2:  # the engine fails mid-stream
                body.write(
                    b'data: {"error":{"object":"error","message":"engine died",'
                    b'"type":"InternalServerError","code":500}}\n\n'
                    if mode == "error-event"
                    else b'error: {"code":500,"message":"x"}\n\n'
                )
                body.write(b"data: [DONE]\n\n")
                body.end()
                return
            if mode in ("reset", "broken-framing", "truncated-chunk", "cut-event") and i == 2:
                await self._break(request, mode, body, writer)
                return
            if mode == "stall" and i == 1:
                await writer.drain()
                await reader.read()
                return
            if mode == "gate-second" and i == 1:  # the first token is out; the rest waits for the gate
                await writer.drain()
                await self._wait_gate(request)
            text = request.headers.get("x-fake-text", f" tok{i}")
            body.write(sse_chunk({"content": text}, usage_null=null))
        said = _engine_timings(request, payload, tokens, delay)
        if said and not usage_on:  # the engine's own timings ride the finish chunk then
            finish = json.loads(sse_chunk({}, finish="length", usage_null=null)[6:])
            body.write(b"data: " + json.dumps(finish | said, separators=(",", ":")).encode() + b"\n\n")
        else:
            body.write(sse_chunk({}, finish="length", usage_null=null))
        if usage_on:
            completion = _BAD_USAGE.get(mode, tokens)
            final = {
                "choices": [],
                "created": CREATED,
                "id": ID,
                "model": MODEL,
                "object": "chat.completion.chunk",
                "usage": _usage(prompt_tokens(payload), completion),
                **said,
            }
            body.write(b"data: " + json.dumps(final, separators=(",", ":")).encode() + b"\n\n")
        if mode == "gate-end":  # every event and [DONE] now, the body's end once the gate opens
            body.write(b"data: [DONE]\n\n")
            await writer.drain()
            await self._wait_gate(request)
            body.end()
        else:
            body.write(b"data: [DONE]\n\n")
            if mode == "buffered":  # all of it, held until the gate opens, then in one write
                await self._wait_gate(request)
            body.end()
        await writer.drain()
        self.drained(request.headers.get("x-test-id", "")).set()
        if not body.chunked:
            writer.close()  # a body delimited by the connection's close ends with it

    async def _break(self, request: _Request, mode: str, body: _Body, writer: asyncio.StreamWriter) -> None:
        """End a stream after two tokens the way `mode` breaks it (the connection is not reused)."""
        if mode == "broken-framing":
            await writer.drain()
            await asyncio.sleep(0.05)  # the good events arrive first, on their own
            text = request.headers.get("x-fake-text", "secret completion text").encode()
            writer.write(b"zz-not-a-chunk-size " + text + b"\r\n" + text + b"\r\n")
        event = sse_chunk({"content": request.headers.get("x-fake-text", " cut")})
        if mode == "truncated-chunk":  # the size line announces the whole event; half of it comes
            writer.write(b"%x\r\n%b" % (len(event), event[: len(event) // 2]))
        if mode == "cut-event":  # half an event, then the body's clean end
            body.write(event[: len(event) // 2])
            body.end()
        await writer.drain()
        if mode == "reset":  # a real reset (RST), not a close: linger 0, then abort
            sock = writer.get_extra_info("socket")
            if sock is not None:
                sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        writer.transport.abort()

    async def _slow(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> bool:
        _head(writer, 200, "text/event-stream", [], chunked=True)

        async def tick() -> None:
            for i in range(1000):
                writer.write(_chunked(b"data: %d\n\n" % i))
                await writer.drain()
                await asyncio.sleep(0.01)

        ticker = asyncio.ensure_future(tick())
        try:
            await reader.read()  # until the client (the proxy) leaves
        except ConnectionError:
            pass  # it left with ticks unread in its socket: the kernel answered with a reset
        ticker.cancel()
        self.slow_client_left.set()
        return False


async def _scripted(writer: asyncio.StreamWriter, payload: dict[str, Any]) -> None:
    """Write the payload's base64 `x_fake_stream` as an SSE body, in pieces cut at `x_fake_cuts`."""
    data = base64.b64decode(payload.get("x_fake_stream", ""))
    cuts = sorted({int(c) for c in payload.get("x_fake_cuts", []) if 0 < int(c) < len(data)})
    _head(writer, 200, "text/event-stream", [], chunked=True)
    for start, end in zip([0, *cuts], [*cuts, len(data)]):
        if end > start:
            writer.write(_chunked(data[start:end]))
            await writer.drain()
    writer.write(b"0\r\n\r\n")
    await writer.drain()


async def _big_event(writer: asyncio.StreamWriter, mode: str, size: int) -> None:
    """One event of `size` bytes written 4 KiB at a time; `endless-event` never terminates it."""
    size = size or (64 * 2**20 if mode == "endless-event" else 4 * 2**20)
    writer.write(_chunked(b'data: {"choices":[{"delta":{"content":"'))
    piece = _chunked(b"x" * 4096)
    for _ in range(size // 4096):
        writer.write(piece)
        await writer.drain()  # raises once the reader (the proxy) has hung up
    if mode == "huge-event":
        writer.write(_chunked(b'"}}]}\n\n') + _chunked(b"data: [DONE]\n\n") + b"0\r\n\r\n")
        await writer.drain()


async def _read_request(reader: asyncio.StreamReader) -> _Request | None:
    """One HTTP/1.1 request (Content-Length or chunked body); None at a clean end of connection."""
    try:
        head = await reader.readuntil(b"\r\n\r\n")
    except asyncio.IncompleteReadError:
        return None
    lines = head.decode("latin-1").split("\r\n")
    method, target, _ = lines[0].split(" ", 2)
    headers = {}
    for line in lines[1:]:
        if ":" in line:
            name, _, value = line.partition(":")
            headers[name.strip().lower()] = value.strip()
    if headers.get("transfer-encoding", "").lower() == "chunked":
        body = b""
        while size := int((await reader.readuntil(b"\r\n")).strip() or b"0", 16):
            body += await reader.readexactly(size + 2)
            body = body[:-2]
        await reader.readuntil(b"\r\n")
    else:
        length = int(headers.get("content-length", "0"))
        body = await reader.readexactly(length) if length else b""  # Expect: 100-continue ignored
    return _Request(method, target.encode("latin-1"), headers, body)


def _head(
    writer: asyncio.StreamWriter,
    status: int,
    content_type: str,
    extra: list[tuple[str, str]],
    *,
    chunked: bool = False,
    length: int | None = None,
    body: bytes = b"",
    close: bool = False,
) -> None:
    """Write the status line and headers (and `body`) in one write: one segment, no Nagle wait.
    With `close`, the body has no framing: it ends when the connection closes."""
    lines = [f"HTTP/1.1 {status} {_REASONS.get(status, 'Status')}", f"content-type: {content_type}"]
    lines += [f"{name}: {value}" for name, value in extra]
    if close:
        lines.append("connection: close")
    else:
        lines.append("transfer-encoding: chunked" if chunked else f"content-length: {length or 0}")
    writer.write(("\r\n".join(lines) + "\r\n\r\n").encode("latin-1") + body)


async def _send(
    writer: asyncio.StreamWriter,
    status: int,
    body: bytes,
    content_type: str,
    extra: list[tuple[str, str]] | None = None,
) -> bool:
    _head(writer, status, content_type, extra or [], length=len(body), body=body)
    await writer.drain()
    return True


async def _json(
    writer: asyncio.StreamWriter, status: int, obj: object, extra: list[tuple[str, str]] | None = None
) -> bool:
    return await _send(writer, status, json.dumps(obj).encode(), "application/json", extra)


def _engine_timings(request: _Request, payload: dict[str, Any], tokens: int, delay: float) -> dict[str, Any]:
    """The engine's own account of a request, as `x-fake-timings` asks (empty when it does not)."""
    shape = request.headers.get("x-fake-timings", "")
    prefill_ms = float(request.headers.get("x-fake-prefill-ms", "12.5"))
    decode_ms = tokens * delay * 1000
    if shape == "llamacpp":
        prompt = prompt_tokens(payload)
        return {
            "timings": {
                "cache_n": 1,
                "prompt_n": prompt - 1,
                "prompt_ms": prefill_ms,
                "prompt_per_second": (prompt - 1) / prefill_ms * 1000,
                "predicted_n": tokens,
                "predicted_ms": decode_ms,
            }
        }
    if shape == "vllm":
        queue_ms = float(request.headers.get("x-fake-queue-ms", "3"))
        return {
            "metrics": {
                "time_to_first_token_ms": prefill_ms,  # from scheduling, as vLLM counts it
                "queue_time_ms": queue_ms,
                "generation_time_ms": decode_ms,
                "mean_itl_ms": delay * 1000,
                "tokens_per_second": tokens / decode_ms * 1000 if decode_ms else None,
            }
        }
    return {}


def _completion(payload: dict[str, Any], tokens: int) -> dict[str, Any]:
    return {
        "id": ID,
        "object": "chat.completion",
        "created": CREATED,
        "model": MODEL,
        "choices": [
            {
                "index": 0,
                "finish_reason": "length",
                "message": {"role": "assistant", "content": " tok" * tokens},
            }
        ],
        "usage": _usage(prompt_tokens(payload), tokens),
    }
