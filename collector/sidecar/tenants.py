"""Who sent a request: the tenant, as a value safe to keep and to label with.

Tenant (docs/design.md §4.2): the configured header's value, else `key-` + the first 8 hex digits
of sha256(bearer token), else `anonymous`. Which values become label values is the series
budget's decision (collector.sidecar.series). Request IDs are never labels.
"""

from __future__ import annotations

import hashlib

__all__ = ["resolve_tenant"]

_MAX_VALUE_CHARS = 128


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
