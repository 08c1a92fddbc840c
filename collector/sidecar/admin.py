"""The sidecar's admin surface: /metrics, /healthz, /readyz and the store's /headroom routes.

Without `--admin-listen` these routes share the proxy's port, where no client can starve them:
reserved slots that answer once and close, keyed by client address, and per-address bounds on
connections and half-sent requests (collector.sidecar.server; docs/sidecar.md says why the flag
stays optional, issue #48). With it they are served only on that address (`AdminListener`, a
second uvicorn server on the same event loop, started and stopped by the sidecar's lifespan), so
the client-facing port exposes no tenant names, no traffic and no request log (issue #40).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import socket
from collections.abc import Awaitable, Callable, Iterator
from typing import Any
from urllib.parse import urlsplit, urlunsplit

import uvicorn
from fastapi import APIRouter, FastAPI
from fastapi.responses import JSONResponse, Response
from prometheus_client import CONTENT_TYPE_LATEST

from collector.sidecar.config import SidecarConfig
from collector.sidecar.exposition import MetricsPage
from collector.sidecar.server import guarded_protocol
from collector.sidecar.tracker import Tracker

__all__ = ["AdminListener", "admin_routes", "STORE_ROUTES_PREFIX", "base_url"]

log = logging.getLogger(__name__)
STORE_ROUTES_PREFIX = "/headroom"  # outside /v1, which belongs to the engine behind the proxy
ADMIN_MAX_CONNECTIONS = 64  # scrapers, probes and readers: a handful at a time
ADMIN_SHUTDOWN_S = 5.0  # a scrape or a snapshot still running when the sidecar stops

Readiness = Callable[[], Awaitable[tuple[bool, str]]]


def _without_credentials(url: str) -> str:
    """'http://user:secret@engine:8000' -> 'http://engine:8000' (never show credentials)."""
    parts = urlsplit(url)
    return urlunsplit(parts._replace(netloc=parts.netloc.rpartition("@")[2]))


def base_url(host: str, port: int) -> str:
    """Where a process on this machine reaches a listener: ('0.0.0.0', 9100) -> http://127.0.0.1:9100."""
    host = "127.0.0.1" if host in ("", "0.0.0.0", "::") else host
    return f"http://{f'[{host}]' if ':' in host else host}:{port}"


def admin_routes(
    config: SidecarConfig,
    tracker: Tracker,
    page: MetricsPage,
    ready: Readiness,
    store_routes: APIRouter | None,
) -> APIRouter:
    """/metrics, /healthz, /readyz and (where given) the store's routes under STORE_ROUTES_PREFIX."""
    router = APIRouter(include_in_schema=False)
    upstream = _without_credentials(config.upstream)

    @router.get("/metrics")
    async def metrics() -> Response:
        return Response(await page.render(), media_type=CONTENT_TYPE_LATEST)

    @router.get("/healthz")
    async def healthz() -> JSONResponse:
        return JSONResponse(
            {
                "status": "ok",
                "inflight_requests": len(tracker.live),
                "upstream": upstream,
                "instance": config.instance,
            }
        )

    @router.get("/readyz")
    async def readyz() -> JSONResponse:
        is_ready, why = await ready()
        return JSONResponse(
            {"status": "ready" if is_ready else "not ready", "reason": why, "upstream": upstream},
            status_code=200 if is_ready else 503,
        )

    if store_routes is not None:
        router.include_router(store_routes, prefix=STORE_ROUTES_PREFIX)
    return router


class _EmbeddedServer(uvicorn.Server):
    """A uvicorn server that leaves the signals to the sidecar's own server."""

    @contextlib.contextmanager
    def capture_signals(self) -> Iterator[None]:
        yield


class AdminListener:
    """The admin routes on their own address, served on the running event loop."""

    def __init__(self, routes: APIRouter, host: str, port: int, config: SidecarConfig) -> None:
        self.host, self.port = host, port
        self.app = app = FastAPI(docs_url=None, redoc_url=None, openapi_url=None)
        app.include_router(routes)
        protocol = guarded_protocol(
            None,
            header_timeout_s=config.header_timeout_s,
            body_timeout_s=config.body_timeout_s,
            max_connections=ADMIN_MAX_CONNECTIONS,
            write_stall_timeout_s=config.write_stall_timeout_s,
        )
        options: dict[str, Any] = {
            "lifespan": "off",  # the sidecar's lifespan starts and stops everything
            "access_log": False,
            "log_level": logging.getLogger("uvicorn.error").getEffectiveLevel(),
            "timeout_keep_alive": config.idle_timeout_s,
            "timeout_graceful_shutdown": ADMIN_SHUTDOWN_S,
            "http": protocol,
        }
        self._server = _EmbeddedServer(uvicorn.Config(app, **options))
        self._task: asyncio.Task[None] | None = None

    def start(self) -> None:
        """Bind and listen now (an address in use raises OSError here), then serve in a task."""
        family = socket.AF_INET6 if ":" in self.host else socket.AF_INET
        sock = socket.socket(family, socket.SOCK_STREAM)
        try:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            sock.bind((self.host, self.port))
            sock.listen(socket.SOMAXCONN)  # connections wait in the backlog until the task serves
        except OSError as exc:
            sock.close()
            raise OSError(exc.errno, f"--admin-listen {self.host}:{self.port}: {exc.strerror}") from None
        self.port = sock.getsockname()[1]
        log.info(
            "admin routes (/metrics, /healthz, /readyz, /headroom) on %s", base_url(self.host, self.port)
        )
        self._task = asyncio.create_task(self._server.serve(sockets=[sock]))

    async def stop(self) -> None:
        """Stop serving; a scrape in progress gets ADMIN_SHUTDOWN_S to finish."""
        if self._task is not None:
            self._server.should_exit = True
            await self._task
            self._task = None
