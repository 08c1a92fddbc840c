"""The one module that reaches into uvicorn's internals: the httptools server's request cycle.

`headroom run` serves on uvicorn's httptools server. The object behind the ASGI `receive` and
`send` it hands an app, its `RequestResponseCycle` (uvicorn 0.29-0.55), holds the client's
transport, its flow control and the event that wakes a waiting `receive`. Only this module reads
or sets them: `client_closing` reads the transport, `CycleWatch` watches for a disconnect without
a task per request, and `ChunkWriter` writes a streamed body without an ASGI message per read. On
any other server each says so (None) and its callers fall back to plain ASGI. A uvicorn release
that changes the cycle breaks this file alone (tests/test_sidecar_units.py drives real cycles).
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any

from uvicorn.protocols.http.httptools_impl import RequestResponseCycle as _UvicornCycle

__all__ = ["ChunkWriter", "CycleWatch", "client_closing"]


def client_closing(receive: Any) -> bool | None:
    """Whether the client's connection is closing, or None where the server does not show it.

    uvicorn's `receive` is a method of its request cycle, which holds the transport; asyncio
    marks a transport closing as soon as it reads the peer's FIN, in the same loop step, while
    the `http.disconnect` message takes a few steps more to reach a waiting `receive`.
    """
    transport = getattr(getattr(receive, "__self__", None), "transport", None)
    is_closing = getattr(transport, "is_closing", None)
    return bool(is_closing()) if callable(is_closing) else None


def _nothing() -> None:
    return None


class CycleWatch(asyncio.Event):
    """A disconnect watch without a task, on uvicorn's request cycle.

    The cycle wakes a waiting `receive` through its `message_event`, which uvicorn's protocol
    sets, among other times, when the connection is lost, with `cycle.disconnected` set first
    (`HttpToolsProtocol.connection_lost`). For the exchange this event stands in for it, and its
    `set` calls `gone()` when the cycle is disconnected: the news arrives in the same loop step
    as uvicorn's own, and no task, coroutine or cancellation is spent on each request. `stop`
    puts the cycle's own event back, set if this one was.
    """

    def __init__(self, cycle: Any, gone: Callable[[], None]) -> None:
        super().__init__()
        self._cycle, self._gone, self._own = cycle, gone, cycle.message_event
        cycle.message_event = self
        cycle.flow.resume_reading()  # as uvicorn's `receive` does before it waits: a FIN is read

    @classmethod
    def on(cls, receive: Any, gone: Callable[[], None]) -> CycleWatch | None:
        """The watch on the uvicorn cycle behind `receive`; None for any other server, or a
        cycle that has already ended."""
        cycle = getattr(receive, "__self__", None)
        if type(cycle) is not _UvicornCycle or cycle.disconnected or cycle.response_complete:
            return None
        return cls(cycle, gone)

    def set(self) -> None:
        super().set()
        if self._cycle.disconnected:
            self._gone()

    def seen(self) -> bool:
        """Whether the client is gone by now: disconnected, or its FIN read (`client_closing`)."""
        return bool(self._cycle.disconnected or self._cycle.transport.is_closing())

    def stop(self) -> None:
        """End the watch: the cycle's own event is back, set if anything set this one."""
        if self._cycle.message_event is self:
            self._cycle.message_event = self._own
            if self.is_set():
                self._own.set()
        self._gone = _nothing


class ChunkWriter:
    """A streamed body's chunks written to the client's transport as uvicorn's `send` writes them.

    The same framing, flow control and disconnected-client check as `RequestResponseCycle.send`,
    without building and dispatching an ASGI message per read, and callable from a protocol
    callback, where no coroutine can await (collector.sidecar.relay's callback relay).
    """

    __slots__ = ("_cycle", "_write", "_flow")

    def __init__(self, cycle: Any) -> None:
        self._cycle, self._write, self._flow = cycle, cycle.transport.write, cycle.flow

    @classmethod
    def on(cls, send: Any) -> ChunkWriter | None:
        """The writer for the uvicorn cycle behind `send`, once its response started with chunked
        encoding and is not complete; None for any other server or response."""
        cycle = getattr(send, "__self__", None)
        if (
            type(cycle) is _UvicornCycle
            and cycle.response_started
            and not cycle.response_complete
            and cycle.chunked_encoding is True
            and cycle.scope["method"] != "HEAD"
        ):
            return cls(cycle)
        return None

    def write(self, body: bytes) -> bool:
        """Write one chunk (nothing once the client is gone); True when the client's transport
        is full: wait for `drain` before writing more."""
        if self._cycle.disconnected:
            return False
        self._write(b"%x\r\n%b\r\n" % (len(body), body))
        return bool(self._flow.write_paused)

    async def drain(self) -> None:
        """Return once the client's transport takes writes again (or the client is gone)."""
        await self._flow.drain()
