"""A deterministic OpenAI-compatible upstream for the sidecar's tests, with failure modes.

Behaviour is chosen per request by the `x-fake` header, so request bodies stay untouched:
ok (default), usage-null (vLLM style: every chunk carries "usage":null when usage is on), 429,
500, 400, reset (connection dies mid-stream), malformed (a chunk that is not JSON), error-event
(vLLM's `data: {"error": ...}` then [DONE] after two tokens), error-field (llama.cpp's `error: {...}`
line instead), hang (never answers), stall (one token, then silence). `x-fake-tokens` sets the completion length and
`x-fake-delay` the seconds between chunks. Output depends only on the request, so the same request
sent directly and through the proxy yields the same bytes.
"""

from __future__ import annotations

import asyncio
import json
import threading

ID, CREATED, MODEL = "chatcmpl-fake", 1796035172, "fake-model"


def _chunk(delta: dict, finish=None, usage_null=False) -> bytes:
    body = {"choices": [{"finish_reason": finish, "index": 0, "delta": delta}], "created": CREATED,
            "id": ID, "model": MODEL, "object": "chat.completion.chunk"}
    if usage_null:
        body["usage"] = None
    return b"data: " + json.dumps(body, separators=(",", ":")).encode() + b"\n\n"


def _usage(prompt: int, completion: int) -> dict:
    return {"completion_tokens": completion, "prompt_tokens": prompt,
            "total_tokens": prompt + completion, "prompt_tokens_details": {"cached_tokens": 1}}


def prompt_tokens(payload: dict) -> int:
    """The fake's 'tokenizer': one token per whitespace word, plus 2 per message."""
    messages = payload.get("messages") or []
    return sum(2 + len(str(m.get("content", "")).split()) for m in messages) or 1


class FakeUpstream:
    """ASGI app; `requests` records every completions body received, `targets` every request's
    raw path and query string (for checking what the proxy sent)."""

    def __init__(self) -> None:
        self.requests: list[dict] = []
        self.targets: list[tuple[bytes, bytes]] = []  # (raw path, query string) of every request
        self._arrivals: dict[str, threading.Event] = {}
        self.slow_client_left = threading.Event()  # /v1/slow saw its client (the proxy) disconnect

    def expect(self, test_id: str) -> threading.Event:
        """An event set when a request with header `x-test-id: test_id` reaches this upstream."""
        return self._arrivals.setdefault(test_id, threading.Event())

    async def __call__(self, scope, receive, send):
        if scope["type"] == "lifespan":
            while True:
                message = await receive()
                if message["type"] == "lifespan.startup":
                    await send({"type": "lifespan.startup.complete"})
                elif message["type"] == "lifespan.shutdown":
                    await send({"type": "lifespan.shutdown.complete"})
                    return
        self.targets.append((scope.get("raw_path") or scope["path"].encode(), scope["query_string"]))
        headers = {k.decode(): v.decode() for k, v in scope["headers"]}
        body = b""
        while True:
            message = await receive()
            body += message.get("body", b"")
            if not message.get("more_body"):
                break
        if scope["path"].startswith("/v1/models"):
            return await _json(send, 200, {"object": "list", "data": [{"id": MODEL}]})
        if scope["path"] == "/v1/moved":  # a redirect is the client's to follow, not the proxy's
            return await _send(send, 307, b"", b"text/plain", [(b"location", b"/v1/models")])
        if scope["path"] == "/v1/slow":  # an unaccounted stream that runs until its client leaves
            return await self._slow(receive, send)
        if scope["path"] == "/metrics":
            return await _send(send, 200, b"# no metrics\n", b"text/plain")
        payload = json.loads(body)
        self.requests.append({"payload": payload, "headers": headers})
        if "x-test-id" in headers:
            self.expect(headers["x-test-id"]).set()
        mode = headers.get("x-fake", "ok")
        tokens = int(headers.get("x-fake-tokens", "5"))
        delay = float(headers.get("x-fake-delay", "0"))
        if mode == "429":
            return await _json(send, 429, {"error": {"message": "slow down", "type": "rate_limit"}},
                               [(b"retry-after", b"7")])
        if mode in ("500", "400"):
            return await _json(send, int(mode), {"error": {"message": "boom"}})
        if mode == "hang":
            await asyncio.Event().wait()
        if not payload.get("stream"):
            return await _json(send, 200, _completion(payload, tokens))
        await self._stream(send, payload, mode, tokens, delay)

    async def _slow(self, receive, send):
        await send({"type": "http.response.start", "status": 200,
                    "headers": [(b"content-type", b"text/event-stream")]})

        async def tick():
            for i in range(1000):
                await _body(send, b"data: %d\n\n" % i)
                await asyncio.sleep(0.01)

        ticker = asyncio.ensure_future(tick())
        while (await receive())["type"] != "http.disconnect":
            pass
        ticker.cancel()
        self.slow_client_left.set()

    async def _stream(self, send, payload, mode, tokens, delay):
        usage_on = (payload.get("stream_options") or {}).get("include_usage") is True
        null = mode == "usage-null" and usage_on
        await send({"type": "http.response.start", "status": 200,
                    "headers": [(b"content-type", b"text/event-stream"), (b"x-upstream", b"fake")]})
        await _body(send, _chunk({"role": "assistant", "content": None}, usage_null=null))
        for i in range(tokens):
            if delay:
                await asyncio.sleep(delay)
            if mode == "malformed" and i == 1:
                await _body(send, b"data: {not json\n\n")
                continue
            if mode in ("error-event", "error-field") and i == 2:  # the engine fails mid-stream
                await _body(send, b'data: {"error":{"object":"error","message":"engine died",'
                                  b'"type":"InternalServerError","code":500}}\n\n'
                            if mode == "error-event" else b'error: {"code":500,"message":"x"}\n\n')
                await _body(send, b"data: [DONE]\n\n")
                return await send({"type": "http.response.body", "body": b"", "more_body": False})
            if mode == "reset" and i == 2:
                raise ConnectionResetError("fake upstream dies mid-stream")
            if mode == "stall" and i == 1:
                await asyncio.Event().wait()
            await _body(send, _chunk({"content": f" tok{i}"}, usage_null=null))
        await _body(send, _chunk({}, finish="length", usage_null=null))
        if usage_on:
            final = {"choices": [], "created": CREATED, "id": ID, "model": MODEL,
                     "object": "chat.completion.chunk", "usage": _usage(prompt_tokens(payload), tokens)}
            await _body(send, b"data: " + json.dumps(final, separators=(",", ":")).encode() + b"\n\n")
        await _body(send, b"data: [DONE]\n\n")
        await send({"type": "http.response.body", "body": b"", "more_body": False})


def _completion(payload: dict, tokens: int) -> dict:
    return {"id": ID, "object": "chat.completion", "created": CREATED, "model": MODEL,
            "choices": [{"index": 0, "finish_reason": "length",
                         "message": {"role": "assistant", "content": " tok" * tokens}}],
            "usage": _usage(prompt_tokens(payload), tokens)}


async def _body(send, data: bytes) -> None:
    await send({"type": "http.response.body", "body": data, "more_body": True})


async def _send(send, status, body, content_type, extra=()):
    await send({"type": "http.response.start", "status": status,
                "headers": [(b"content-type", content_type), *extra]})
    await send({"type": "http.response.body", "body": body, "more_body": False})


async def _json(send, status, obj, extra=()):
    await _send(send, status, json.dumps(obj).encode(), b"application/json", extra)
