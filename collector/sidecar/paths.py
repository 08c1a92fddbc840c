"""One spelling per path: the sidecar routes, accounts and forwards the normalised path.

Clients and attackers spell a path many ways: `/v1/chat/completions/`, `/v1//chat/completions`,
`/v1/./chat/completions`. Unnormalised, those passed through to the engine unaccounted, and
`/v1/../metrics` reached the engine verbatim. The sidecar's dispatcher (collector.sidecar.app)
rewrites every HTTP request's path once, before routing (`normalised_scope`): empty and `.`
segments go, a trailing slash goes, and a request with a `..` segment (also percent-encoded, also
hidden behind an encoded slash) is refused with 400. The engine then gets the normalised raw path, percent-encoding inside segments kept (a model id
`org%2Fname` stays one segment):

    /v1//chat/./completions/  ->  /v1/chat/completions
    /v1/models/org%2Fname     ->  /v1/models/org%2Fname
    /v1/../metrics            ->  400
"""

from __future__ import annotations

from typing import Any
from urllib.parse import unquote, unquote_to_bytes

from collector.sidecar.client import send_error

__all__ = ["normalise_path", "normalised_scope", "refuse_climbing"]


def normalise_path(raw_path: bytes) -> bytes | None:
    """The normalised raw path, or None when it climbs with `..` (see the module docstring)."""
    if (
        raw_path.startswith(b"/")
        and not raw_path.endswith(b"/")
        and b"//" not in raw_path
        and b"/." not in raw_path
        and b"%" not in raw_path
        and b"\\" not in raw_path
    ):
        return raw_path  # nearly every request: no empty, `.` or `..` segment can hide in it
    return _segment_by_segment(raw_path)


def _segment_by_segment(raw_path: bytes) -> bytes | None:
    kept = []
    for segment in raw_path.split(b"/"):
        decoded = unquote_to_bytes(segment) if b"%" in segment else segment
        if decoded in (b"", b"."):
            continue
        if b".." in decoded.replace(b"\\", b"/").split(b"/"):
            return None
        kept.append(segment)
    return b"/" + b"/".join(kept)


def normalised_scope(scope: dict[str, Any]) -> dict[str, Any] | None:
    """An HTTP scope with its path normalised (the same scope when it already was), or None when
    the path climbs with `..` (answer with refuse_climbing)."""
    raw = scope.get("raw_path") or scope["path"].encode("latin-1")
    normal = normalise_path(raw)
    if normal is None:
        return None
    if normal != raw:
        return {**scope, "raw_path": normal, "path": unquote(normal.decode("latin-1"))}
    return scope


async def refuse_climbing(send: Any) -> None:
    """The 400 for a path with a `..` segment."""
    await send_error(send, 400, "bad_request", "the path has a '..' segment; send the path without it")
