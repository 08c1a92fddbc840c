"""An upstream that answers one request per connection, like llama.cpp's llama-server after a
streamed answer: it keeps the socket open without `Connection: close`, then drops it when the
client sends a second request on it (the client wrote a request the server never read).

With `drop_fresh=True` it also drops the first request of every connection after reading it:
a failure on a *new* connection, which must not be retried (the server saw the request).
"""

from __future__ import annotations

import asyncio
import json
import socket
import threading

__all__ = ["OneShotUpstream"]


def _sse(obj: dict) -> bytes:
    return b"data: " + json.dumps(obj).encode() + b"\n\n"


def _chunked(data: bytes) -> bytes:
    return f"{len(data):x}\r\n".encode() + data + b"\r\n"


class OneShotUpstream:
    """Serve on 127.0.0.1 in a background thread; `.url`, `.requests_read`, `.stop()`."""

    def __init__(self, *, drop_fresh: bool = False, status: int = 200) -> None:
        self.drop_fresh, self.status = drop_fresh, status
        self.requests_read = 0      # completion requests whose body this server read
        self.connections = 0
        self._loop = asyncio.new_event_loop()
        self._ready = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()
        self._ready.wait(10)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def _run(self) -> None:
        asyncio.set_event_loop(self._loop)
        sock = socket.socket()
        sock.bind(("127.0.0.1", 0))
        self.port = sock.getsockname()[1]
        self._server = self._loop.run_until_complete(asyncio.start_server(self._handle, sock=sock))
        self._ready.set()
        self._loop.run_forever()

    def stop(self) -> None:
        """Close the listener and stop the loop."""
        self._loop.call_soon_threadsafe(self._server.close)
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(10)

    async def _read_request(self, reader: asyncio.StreamReader) -> tuple[str, bytes] | None:
        head = await reader.readuntil(b"\r\n\r\n")
        lines = head.decode("latin-1").split("\r\n")
        length = next((int(line.split(":", 1)[1]) for line in lines
                       if line.lower().startswith("content-length:")), 0)
        body = await reader.readexactly(length) if length else b""
        return lines[0], body

    async def _handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.connections += 1
        try:
            request_line, body = await self._read_request(reader)
            if "/v1/models" in request_line:
                payload = json.dumps({"data": [{"id": "one-shot"}]}).encode()
                writer.write(b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\n"
                             b"Content-Length: " + str(len(payload)).encode() + b"\r\n\r\n" + payload)
            else:
                self.requests_read += 1
                if self.drop_fresh:
                    return  # read, then gone: the request reached the server
                await self._answer(writer)
            await writer.drain()
            # keep-alive without saying otherwise; a second request on this socket is dropped
            await reader.read(1)
        except (asyncio.IncompleteReadError, ConnectionError):
            pass
        finally:
            writer.close()

    async def _answer(self, writer: asyncio.StreamWriter) -> None:
        if self.status != 200:
            body = json.dumps({"error": {"message": "busy"}}).encode()
            writer.write(f"HTTP/1.1 {self.status} Busy\r\nContent-Type: application/json\r\n"
                         f"Content-Length: {len(body)}\r\n\r\n".encode() + body)
            return
        writer.write(b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\n"
                     b"Transfer-Encoding: chunked\r\n\r\n")
        for piece in ("Hello", " world", "!"):
            writer.write(_chunked(_sse({"choices": [{"index": 0, "delta": {"content": piece}}]})))
        writer.write(_chunked(_sse({"choices": [], "usage": {"prompt_tokens": 5,
                                                             "completion_tokens": 3}})))
        writer.write(_chunked(b"data: [DONE]\n\n") + b"0\r\n\r\n")
