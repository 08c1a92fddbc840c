"""One spelling per path: the sidecar routes, accounts and forwards the normalised path.

Clients and attackers spell a path many ways: `/v1/chat/completions/`, `/v1//chat/completions`,
`/v1/./chat/completions`. Unnormalised, those passed through to the engine unaccounted, and
`/v1/../metrics` reached the engine verbatim. `PathNormaliser` rewrites every HTTP request's
path once, before routing: empty and `.` segments go, a trailing slash goes, and a request with a
`..` segment (also percent-encoded, also hidden behind an encoded slash) is refused with 400. The
engine then gets the normalised raw path, percent-encoding inside segments kept (a model id
`org%2Fname` stays one segment):

    /v1//chat/./completions/  ->  /v1/chat/completions
    /v1/models/org%2Fname     ->  /v1/models/org%2Fname
    /v1/../metrics            ->  400
"""

from __future__ import annotations

from typing import Any
from urllib.parse import unquote, unquote_to_bytes

from collector.sidecar.relay import send_error

__all__ = ["normalise_path", "PathNormaliser"]


def normalise_path(raw_path: bytes) -> bytes | None:
    """The normalised raw path, or None when it climbs with `..` (see the module docstring)."""
    kept = []
    for segment in raw_path.split(b"/"):
        decoded = unquote_to_bytes(segment) if b"%" in segment else segment
        if decoded in (b"", b"."):
            continue
        if b".." in decoded.replace(b"\\", b"/").split(b"/"):
            return None
        kept.append(segment)
    return b"/" + b"/".join(kept)


class PathNormaliser:
    """ASGI middleware: normalise scope['raw_path'] and scope['path'], refuse traversal."""

    def __init__(self, app: Any) -> None:
        self.app = app

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        raw = scope.get("raw_path") or scope["path"].encode("latin-1")
        normal = normalise_path(raw)
        if normal is None:
            await send_error(
                send, 400, "bad_request", "the path has a '..' segment; send the path without it"
            )
            return
        if normal != raw:
            scope = {**scope, "raw_path": normal, "path": unquote(normal.decode("latin-1"))}
        await self.app(scope, receive, send)
