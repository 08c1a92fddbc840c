"""The client's side of one request: its body read (bounded), its leaving watched, its answer sent.

`ClientChannel` holds the server's ASGI `send` and whether the response has started, and ends a
response as an `Ending` says; `read_body` reads the request body up to a limit; `TaskWatch` and
`wait_disconnect` notice a client that leaves on any ASGI server (uvicorn's own cycle is watched
without a task: collector.sidecar.uvicorn_cycle).
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any

import orjson

from collector.sidecar.ending import Ending
from collector.sidecar.headers import with_request_id
from collector.sidecar.uvicorn_cycle import client_closing

__all__ = [
    "BodyTooLarge",
    "ClientChannel",
    "TaskWatch",
    "read_body",
    "send_error",
    "wait_disconnect",
]

Scope = dict[str, Any]


class ClientChannel:
    """The client's side of one request: the ASGI sends, and whether the response has started."""

    __slots__ = ("send", "started", "gone", "answered", "request_id")

    def __init__(self, send: Any) -> None:
        self.send = send  # the server's ASGI send (a relay sends its bodies with it directly)
        self.started = False
        self.gone = False
        self.answered: Ending | None = None  # how it ended, once the client had a whole SSE answer
        self.request_id: bytes | None = None  # returned as X-Request-Id, once the request is admitted

    async def start(self, status: int, headers: list[tuple[bytes, bytes]]) -> None:
        """Send the status and headers (with the X-Request-Id). Marked started *before* the await:
        a cancel inside it must never lead to a second start (uvicorn's "Expected ASGI message")."""
        self.started = True
        if self.request_id is not None:
            headers = with_request_id(headers, self.request_id)
        await self.send({"type": "http.response.start", "status": status, "headers": headers})

    async def body(self, data: bytes) -> None:
        """Forward bytes; more follow."""
        await self.send({"type": "http.response.body", "body": data, "more_body": True})

    async def end_body(self) -> None:
        """End a response whose bytes were all forwarded."""
        await self.send({"type": "http.response.body", "body": b"", "more_body": False})

    async def end(self, ending: Ending) -> None:
        """The last message: our JSON error, the final bytes, or nothing (the break shows)."""
        if self.gone:
            return
        if not self.started:
            if ending.answer is not None:
                self.started = True
                await send_error(
                    self.send,
                    ending.answer,
                    ending.outcome,
                    ending.error or "",
                    ending.limit,
                    self.request_id,
                )
            return
        if ending.complete:
            await self.send({"type": "http.response.body", "body": ending.last, "more_body": False})


async def send_error(
    send: Any, status: int, kind: str, message: str, limit: str | None = None, request_id: bytes | None = None
) -> None:
    """An OpenAI-style JSON error: {"error": {"message", "type", "code"[, "limit"]}}, with the
    request's X-Request-Id where it has one (the accounted routes' answers)."""
    error: dict[str, Any] = {"message": message, "type": kind, "code": status}
    if limit is not None:
        error["limit"] = limit
    headers = [(b"content-type", b"application/json")]
    if request_id is not None:
        headers.append((b"x-request-id", request_id))
    await send({"type": "http.response.start", "status": status, "headers": headers})
    await send({"type": "http.response.body", "body": orjson.dumps({"error": error}), "more_body": False})


class BodyTooLarge(Exception):
    """The request body passed the limit; the message names the limit and the flag."""


async def read_body(receive: Any, scope: Scope, limit: int) -> bytes | None:
    """The whole request body, None when the client left first; BodyTooLarge past `limit` bytes.

    A declared Content-Length over the limit is refused before a byte of the body is read (so a
    client that sent `Expect: 100-continue` never uploads it).
    """
    declared = _content_length(scope)
    if declared is not None and declared > limit:
        raise BodyTooLarge(_too_large(declared, limit))
    chunks, size = [], 0
    while True:
        message = await receive()
        if message["type"] == "http.disconnect":
            return None
        chunk = message.get("body", b"")
        size += len(chunk)
        if size > limit:
            raise BodyTooLarge(_too_large(size, limit))
        chunks.append(chunk)
        if not message.get("more_body"):
            return b"".join(chunks)


def _too_large(size: int, limit: int) -> str:
    return (
        f"request body of {size} bytes or more is over the limit of {limit} bytes (--max-request-body-bytes)"
    )


def _content_length(scope: Scope) -> int | None:
    for key, value in scope["headers"]:
        if key == b"content-length" and value.isdigit():
            return int(value)
    return None


async def wait_disconnect(receive: Any) -> None:
    """Return when the client disconnects."""
    while (await receive())["type"] != "http.disconnect":
        pass


class TaskWatch:
    """A disconnect watch for any ASGI server: a task that waits on `receive` for http.disconnect
    and calls `gone()` when it comes (or when `receive` raises)."""

    __slots__ = ("_receive", "_gone", "_watcher")

    def __init__(self, receive: Any, gone: Callable[[], None]) -> None:
        self._receive, self._gone = receive, gone
        self._watcher = asyncio.ensure_future(wait_disconnect(receive))
        self._watcher.add_done_callback(self._done)

    def _done(self, done: asyncio.Future[None]) -> None:
        if not done.cancelled():  # scheduled before it came off: too late
            done.exception()  # retrieved: a receive that raised counts as the client gone
            self._gone()

    def seen(self) -> bool | None:
        """Whether the client is gone by now; None when neither the watcher nor the transport
        says so yet and the server does not show its transport (then ask again a step later)."""
        closing = client_closing(self._receive)
        if self._watcher.done():  # its callback may not have run yet
            self._watcher.exception()
            return True
        return closing

    def stop(self) -> None:
        """End the watch: `gone` is not called after this."""
        self._watcher.remove_done_callback(self._done)
        self._watcher.cancel()
