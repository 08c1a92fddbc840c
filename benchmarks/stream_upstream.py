"""A fast streaming OpenAI-style upstream for benchmarks: N chunks per request, no model.

Run: python benchmarks/stream_upstream.py PORT. `x-chunks` sets chunks per request, `x-pace-ms` the gap between chunks.
It is deliberately cheap so that the benchmarks measure the proxy, not the engine.
"""

from __future__ import annotations

import asyncio
import sys

_ROLE = (
    b'data: {"id":"b","object":"chat.completion.chunk","created":1,"model":"bench","choices":'
    b'[{"index":0,"delta":{"role":"assistant","content":null},"finish_reason":null}]}\n\n'
)
_TOKEN = (
    b'data: {"id":"b","object":"chat.completion.chunk","created":1,"model":"bench","choices":'
    b'[{"index":0,"delta":{"content":" token"},"finish_reason":null}]}\n\n'
)
_USAGE = (
    b'data: {"id":"b","object":"chat.completion.chunk","created":1,"model":"bench","choices":[],'
    b'"usage":{"prompt_tokens":20,"completion_tokens":%d,"total_tokens":%d}}\n\n'
)
_DONE = b"data: [DONE]\n\n"


async def app(scope, receive, send):
    """ASGI app: streams `x-chunks` token chunks (default 100), then usage and [DONE]."""
    if scope["type"] != "http":
        return
    body = b""
    while True:
        message = await receive()
        body += message.get("body", b"")
        if not message.get("more_body"):
            break
    headers = dict(scope["headers"])
    chunks = int(headers.get(b"x-chunks", b"100"))
    pace_s = int(headers.get(b"x-pace-ms", b"0")) / 1000
    await send(
        {"type": "http.response.start", "status": 200, "headers": [(b"content-type", b"text/event-stream")]}
    )
    await send({"type": "http.response.body", "body": _ROLE, "more_body": True})
    for _ in range(chunks):
        if pace_s:
            await asyncio.sleep(pace_s)
        await send({"type": "http.response.body", "body": _TOKEN, "more_body": True})
    if b'"include_usage":true' in body:
        usage = _USAGE % (chunks, chunks + 20)
        await send({"type": "http.response.body", "body": usage, "more_body": True})
    await send({"type": "http.response.body", "body": _DONE, "more_body": False})


if __name__ == "__main__":
    import uvicorn

    uvicorn.run(
        app, host="127.0.0.1", port=int(sys.argv[1]), log_level="warning", access_log=False, lifespan="off"
    )
