"""An independent streaming upstream for the proxy benchmarks: asyncio streams, no HTTP framework.

    python benchmarks/sse_upstream.py PORT

It shares no code with the proxies it measures (no uvicorn, no aiohttp), so a change in either
cannot speed up or slow down both sides. It answers every method and path alike (so a path the
sidecar passes through un-accounted streams the same answer); per request, headers choose the stream:

    x-chunks    token chunks per answer (default 64), one token each
    x-pace-ms   gap between chunks (0: flood, yielding to the loop between chunks as an engine
                emitting one decode step at a time does; 20: 50 tokens/s per stream)
    x-style     `plain` (OpenAI: a usage chunk only when the request asks with include_usage),
                `vllm` (with include_usage, `"usage":null` in every chunk plus the final usage chunk,
                as vLLM sends them) or `llamacpp` (llama.cpp's `timings` on the usage chunk, or
                on a finish chunk when usage was not asked for: the sidecar reads them)

Keep-alive HTTP/1.1 with chunked transfer encoding; uvloop when installed (it is cheaper, and the
upstream must never be the bottleneck).
"""

from __future__ import annotations

import asyncio
import sys

_HEAD = b'data: {"id":"b","object":"chat.completion.chunk","created":1,"model":"bench","choices":'
_ROLE = _HEAD + b'[{"index":0,"delta":{"role":"assistant","content":""},"finish_reason":null}]%s}\n\n'
_TOKEN = _HEAD + b'[{"index":0,"delta":{"content":" token"},"finish_reason":null}]%s}\n\n'
_USAGE = _HEAD + b'[],"usage":{"prompt_tokens":40,"completion_tokens":%d,"total_tokens":%d}}\n\n'
_DONE = b"data: [DONE]\n\n"
_TIMINGS = (
    b'"timings":{"cache_n":0,"prompt_n":40,"prompt_ms":12.5,"prompt_per_token_ms":0.3125,'
    b'"prompt_per_second":3200.0,"predicted_n":%d,"predicted_ms":%d.0}'
)
_FINISH = _HEAD + b'[{"index":0,"delta":{},"finish_reason":"length"}],%s}\n\n'
_RESPONSE = b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ntransfer-encoding: chunked\r\n\r\n"


def _chunk(data: bytes) -> bytes:
    return b"%x\r\n%s\r\n" % (len(data), data)


def _events(chunks: int, style: bytes, usage: bool) -> tuple[bytes, bytes, bytes]:
    """(role chunk, token chunk, closing chunks) for one answer, already chunk-encoded."""
    null = b',"usage":null' if usage and style == b"vllm" else b""
    closing = (_USAGE % (chunks, chunks + 40) if usage else b"") + _DONE
    if style == b"llamacpp":  # its timings ride the usage chunk, else a finish chunk
        timings = _TIMINGS % (chunks, chunks * 20)
        last = _USAGE[:-3] % (chunks, chunks + 40) + b"," + timings + b"}\n\n" if usage else _FINISH % timings
        closing = last + _DONE
    return _chunk(_ROLE % null), _chunk(_TOKEN % null), _chunk(closing) + b"0\r\n\r\n"


async def _read_request(reader: asyncio.StreamReader) -> tuple[dict[bytes, bytes], bytes] | None:
    try:
        head = await reader.readuntil(b"\r\n\r\n")
    except (asyncio.IncompleteReadError, ConnectionError):
        return None
    headers = {}
    for line in head.split(b"\r\n")[1:]:
        name, _, value = line.partition(b":")
        headers[name.strip().lower()] = value.strip()
    body = await reader.readexactly(int(headers.get(b"content-length", b"0")))
    return headers, body


async def _serve(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    try:
        while (request := await _read_request(reader)) is not None:
            headers, body = request
            chunks = int(headers.get(b"x-chunks", b"64"))
            pace_s = int(headers.get(b"x-pace-ms", b"0")) / 1000
            role, token, closing = _events(
                chunks, headers.get(b"x-style", b"plain"), b'"include_usage":true' in body
            )
            writer.write(_RESPONSE + role)
            for _ in range(chunks):
                await asyncio.sleep(pace_s)  # 0: yield, so streams interleave like decode steps
                writer.write(token)
                await writer.drain()
            writer.write(closing)
            await writer.drain()
    except (ConnectionError, asyncio.IncompleteReadError):
        pass
    finally:
        writer.close()


async def main(port: int) -> None:
    server = await asyncio.start_server(_serve, "127.0.0.1", port, backlog=4096)
    async with server:
        await server.serve_forever()


if __name__ == "__main__":
    try:
        import uvloop
    except ImportError:
        uvloop = None
    (uvloop.run if uvloop else asyncio.run)(main(int(sys.argv[1])))
