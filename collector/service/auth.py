"""The owner routes' bearer token: where it comes from, where it is kept, how a request proves it.

Order: `HEADROOM_TOKEN`, then a token file beside the database (`<db>.token`, mode 0600),
generated on first start and reused on every restart, so readers on the box keep working.
"""

from __future__ import annotations

import hmac
import os
import secrets
from collections.abc import Callable
from pathlib import Path

from fastapi import HTTPException, Request

from collector.store.owner import TOKEN_ENV, token_file_for

__all__ = ["TOKEN_ENV", "resolve_token", "token_file_for", "require_token"]


def resolve_token(token: str | None, db_path: str | os.PathLike[str] | None) -> tuple[str, Path | None]:
    """Return (token, file it was read from or written to, or None when given or from the environment).

    Example: resolve_token(None, "data/h.duckdb") with HEADROOM_TOKEN unset -> ("k3v…", data/h.duckdb.token)
    """
    if token:
        return token, None
    from_env = os.environ.get(TOKEN_ENV, "").strip()
    if from_env:
        return from_env, None
    path = token_file_for(db_path)
    if path is not None and path.exists():
        existing = path.read_text().strip()
        if existing:
            return existing, path
    generated = secrets.token_urlsafe(32)
    if path is not None:
        _write_private(path, generated)
    return generated, path


def _write_private(path: Path, text: str) -> None:
    """Create `path` readable and writable by the owner only (0600), never world-readable first."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as handle:
        handle.write(text + "\n")
    os.chmod(path, 0o600)


def require_token(expected: str) -> Callable[[Request], None]:
    """A FastAPI dependency that answers 401 unless `Authorization: Bearer <expected>` is sent."""
    expected_bytes = expected.encode()

    def _check(request: Request) -> None:
        header = request.headers.get("authorization", "")
        scheme, _, presented = header.partition(" ")
        if scheme.lower() != "bearer" or not hmac.compare_digest(presented.strip().encode(), expected_bytes):
            raise HTTPException(
                status_code=401,
                detail="missing or wrong bearer token: send 'Authorization: Bearer <token>' "
                "(HEADROOM_TOKEN as the owning sidecar has it, else its <db>.token file)",
                headers={"WWW-Authenticate": "Bearer"},
            )

    return _check
