"""What crosses between the client and the upstream: the request target and the headers each way.

Hop-by-hop headers (RFC 9110 §7.6.1) stay on their side; the accounted routes also ask the
upstream for an uncompressed answer, since the proxy reads the stream.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

__all__ = [
    "content_coding",
    "media_type",
    "request_headers",
    "response_headers",
    "upstream_headers",
    "upstream_target",
    "with_request_id",
]

Scope = dict[str, Any]

# Not forwarded: hop-by-hop headers, the length we may change, `Expect` (uvicorn already
# answered the client's 100-continue, and an upstream that ignores it would make the request wait
# for a 100 that never comes) and the probe's credential, which is the sidecar's token.
_HOP_BY_HOP = frozenset(
    {
        b"connection",
        b"keep-alive",
        b"proxy-authenticate",
        b"proxy-authorization",
        b"te",
        b"trailers",
        b"transfer-encoding",
        b"upgrade",
        b"host",
        b"content-length",
        b"expect",
        b"x-headroom-probe-token",
    }
)


def upstream_target(scope: Scope) -> bytes:
    """The request target for the upstream: the (normalised) raw path and the query string."""
    raw: bytes = scope.get("raw_path") or scope["path"].encode("latin-1")
    query: bytes = scope.get("query_string") or b""
    return raw + b"?" + query if query else raw


def request_headers(scope: Scope) -> list[tuple[bytes, bytes]]:
    """The client's headers for the upstream (the pass-through's), less hop-by-hop ones."""
    return [(k, v) for k, v in scope["headers"] if k not in _HOP_BY_HOP]


def upstream_headers(scope: Scope, traceparent: str | None) -> list[tuple[bytes, bytes]]:
    """The client's headers for the upstream, less hop-by-hop ones and compression (the proxy
    reads the stream, so it must arrive as sent), with the sidecar's `traceparent` if tracing."""
    headers = [
        (k, v)
        for k, v in scope["headers"]
        if k not in _HOP_BY_HOP and k != b"accept-encoding" and (traceparent is None or k != b"traceparent")
    ]
    headers.append((b"accept-encoding", b"identity"))
    if traceparent is not None:
        headers.append((b"traceparent", traceparent.encode("latin-1")))
    return headers


def response_headers(
    raw: Iterable[tuple[bytes, bytes]], *, keep_length: bool, decoded: bool = False
) -> list[tuple[bytes, bytes]]:
    """The upstream's headers for the client, less hop-by-hop ones (Content-Length if kept), and
    less Content-Encoding where the sidecar forwards the answer `decoded`."""
    return [
        (k, v)
        for k, v in raw
        if ((k.lower() not in _HOP_BY_HOP) or (keep_length and k.lower() == b"content-length"))
        and not (decoded and k.lower() == b"content-encoding")
    ]


def with_request_id(headers: list[tuple[bytes, bytes]], request_id: bytes) -> list[tuple[bytes, bytes]]:
    """`headers` with the sidecar's X-Request-Id: the id its row holds (the client's own where it
    sent one the sidecar took). An upstream's own, other id (OpenAI's `req_...`) stays as
    X-Upstream-Request-Id; one that repeats ours (an engine echoing the client's) is dropped.
    Once per response, never per chunk."""
    kept = []
    for name, value in headers:
        if name.lower() != b"x-request-id":
            kept.append((name, value))
        elif value != request_id:
            kept.append((b"x-upstream-request-id", value))
    kept.append((b"x-request-id", request_id))
    return kept


def content_coding(headers: list[tuple[bytes, bytes]]) -> str | None:
    """The answer's Content-Encoding, lower case, None for none or `identity` (what the accounted
    routes ask for); several codings come back as one list, e.g. 'gzip, br'."""
    found = None
    for name, value in headers:  # one call per header: this runs once per request
        if name.lower() == b"content-encoding":
            coding = value.strip().lower().decode("latin-1")
            if coding and coding != "identity":
                found = coding if found is None else f"{found}, {coding}"
    return found


def media_type(headers: list[tuple[bytes, bytes]]) -> str:
    """The Content-Type's media type, lower case ('' when there is none)."""
    for name, value in headers:
        if name.lower() == b"content-type":
            return value.split(b";", 1)[0].strip().lower().decode("latin-1")
    return ""
