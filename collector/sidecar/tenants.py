"""Who sent a request (the tenant), and LabelCap: a plain cap on the distinct values of a label.

Tenant (docs/design.md §4.2): the configured header's value (decoded as UTF-8, else as Latin-1:
`decode_header_text`), else `key-` + the first 8 hex digits
of sha256(bearer token), else `anonymous`. Which model and tenant values become label values is
the series budget's decision (collector.sidecar.series); LabelCap caps the task classes a probe
may name: at most `limit` distinct values, every later newcomer `other`. Request IDs are never
labels.
"""

from __future__ import annotations

import hashlib

__all__ = ["LabelCap", "resolve_tenant", "OTHER"]

OTHER = "other"
_MAX_VALUE_CHARS = 128


class LabelCap:
    """Admits the first `limit` distinct values as themselves; maps the rest to `other`."""

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self._seen: set[str] = set()

    def __call__(self, value: str) -> str:
        if value in self._seen:
            return value
        if len(self._seen) < self.limit:
            self._seen.add(value)
            return value
        return OTHER

    def __len__(self) -> int:
        return len(self._seen)


def decode_header_text(raw: bytes) -> str:
    """A header value as text: UTF-8 (b'\xc3\xa9quipe' -> 'équipe'), else Latin-1, which decodes
    every byte string, the same way each time (b'\xff-team' -> 'ÿ-team')."""
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError:
        return raw.decode("latin-1")


def resolve_tenant(header_value: str | None, authorization: str | None) -> str:
    """Tenant of one request, e.g. (None, 'Bearer sk-abc') -> 'key-3f2a9c1b'. Never the token itself."""
    if header_value:
        return header_value.strip()[:_MAX_VALUE_CHARS] or "anonymous"
    if authorization:
        scheme, _, token = authorization.partition(" ")
        token = token.strip() if scheme.lower() == "bearer" else authorization.strip()
        if token:
            return "key-" + hashlib.sha256(token.encode()).hexdigest()[:8]
    return "anonymous"
