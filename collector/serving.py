"""Serving ASGI apps: read a HOST:PORT listen address, run an app under uvicorn in a thread.

`parse_listen("127.0.0.1:9100")` -> ("127.0.0.1", 9100) for every command's --listen.
`serve_in_thread(app, port=0)` (the demo, tests and benchmarks) returns once the socket is
listening, with the real port, and `handle.stop()` shuts uvicorn down gracefully (lifespan
shutdown runs, so request logs flush).
"""

from __future__ import annotations

import socket
import threading
from dataclasses import dataclass
from typing import Any

import uvicorn

__all__ = ["ServerHandle", "serve_in_thread", "parse_listen"]


@dataclass
class ServerHandle:
    """A uvicorn server running in a thread; `url` is http://host:port."""

    server: uvicorn.Server
    thread: threading.Thread
    host: str
    port: int

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}"

    def stop(self, timeout_s: float = 30.0) -> None:
        """Ask uvicorn to exit (graceful: lifespan shutdown runs) and wait for the thread."""
        self.server.should_exit = True
        self.thread.join(timeout_s)


def serve_in_thread(
    app: Any,
    host: str = "127.0.0.1",
    port: int = 0,
    *,
    startup_timeout_s: float = 30.0,
    **uvicorn_options: Any,
) -> ServerHandle:
    """Start `app` on host:port (0 = any free port) and block until it accepts connections."""
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind((host, port))
    bound_port = sock.getsockname()[1]
    options: dict[str, Any] = {
        "log_level": "warning",
        "access_log": False,
        "lifespan": "on",
    } | uvicorn_options
    server = uvicorn.Server(uvicorn.Config(app, **options))
    thread = threading.Thread(
        target=server.run, kwargs={"sockets": [sock]}, name=f"uvicorn-{bound_port}", daemon=True
    )
    thread.start()
    started = threading.Event()

    def _watch() -> None:
        while thread.is_alive() and not server.started:
            thread.join(0.01)
        started.set()

    threading.Thread(target=_watch, daemon=True).start()
    if not started.wait(startup_timeout_s) or not server.started:
        server.should_exit = True
        raise RuntimeError(f"server on {host}:{bound_port} did not start within {startup_timeout_s} s")
    return ServerHandle(server, thread, host, bound_port)


def parse_listen(value: str, flag: str = "--listen") -> tuple[str, int]:
    """'HOST:PORT' -> (host, port); '[::1]:9100' works too. Raises ValueError naming `flag` and the input."""
    host, sep, port = value.rpartition(":")
    if not sep or not port.isdigit() or not host or not 0 < int(port) < 65536:
        raise ValueError(f"{flag} {value!r} is not HOST:PORT with a port 1-65535 (e.g. 127.0.0.1:9100)")
    return host.strip("[]"), int(port)
