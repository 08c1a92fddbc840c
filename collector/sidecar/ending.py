"""How an exchange ended (`Ending`), and the Ending of each failure (`describe_failure`).

The relays and the pass-through never finish a request and never send the response's last
message: they return an `Ending`, the proxy finishes the request with its outcome and error, and
`ClientChannel.end` (collector.sidecar.client) sends what the Ending says the client still needs.

Errors are ours: an Ending's `error` (the row's `error` column, the 502 body) is a short
description and an exception *type*, never an exception's text, which for a parser may quote the
upstream's bytes.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass

from collector.sidecar.exchange import UpstreamError
from collector.sidecar.upstream import UpstreamPoolTimeout
from collector.sse import EventTooLarge

__all__ = ["FAILURES", "Ending", "describe_failure", "failed"]


@dataclass(frozen=True, slots=True)
class Ending:
    """How an exchange ended: its outcome, our short reason, and what the client still needs.

    `answer` is the status of our own JSON error, sent only when the response has not started;
    `limit` names the flag a refused request went past; `complete` says the upstream ended its
    answer properly, so ours ends properly too, with `last` as its final bytes. `failure` is the
    failure class of an exchange that failed where no upstream status says so (`reset`,
    `truncated`, `malformed_event`, ...: FAILURES): the row's error starts with it, and it is
    counted once in headroom_upstream_failures_total{reason}.
    """

    outcome: str
    error: str | None = None
    answer: int | None = None
    limit: str | None = None
    complete: bool = False
    last: bytes = b""
    failure: str | None = None


# Every failure class, by the outcome it ends a request with (both in the availability SLO's
# errors). The first group is raised by the upstream client (collector.sidecar.exchange's
# UpstreamError reasons), the second read in a 200 stream (collector.sidecar.relay).
FAILURES: dict[str, str] = {
    "connect_failed": "upstream_error",  # no connection could be made
    "connect_timeout": "timeout",
    "closed_before_headers": "upstream_error",  # the connection ended before a status line
    "bad_headers": "upstream_error",  # the status line or headers are not HTTP
    "read_timeout": "timeout",  # nothing for --read-timeout, before or inside the body
    "reset": "upstream_error",  # the connection was reset inside the body
    "truncated": "upstream_error",  # it closed before the body's framing (or compression) ended
    "bad_framing": "upstream_error",  # the chunked framing is broken
    "bad_encoding": "upstream_error",  # a gzip/deflate body that does not decode
    "truncated_event": "upstream_error",  # the body ended inside an SSE event
    "malformed_event": "upstream_error",  # an event that is not JSON
    "error_event": "upstream_error",  # the engine sent an error inside its 200 stream
    "event_too_large": "upstream_error",  # an event past --max-sse-event-bytes
    "proxy_error": "upstream_error",  # a failure of the sidecar's own
}


def failed(
    failure: str,
    words: str,
    *,
    answer: int | None = None,
    limit: str | None = None,
    complete: bool = False,
    last: bytes = b"",
) -> Ending:
    """The Ending of failure class `failure`: its outcome, and an error that starts with its name,
    e.g. failed("reset", "...") -> Ending("upstream_error", "reset: ...", failure="reset")."""
    return Ending(FAILURES[failure], f"{failure}: {words}", answer, limit, complete, last, failure)


def describe_failure(exc: BaseException, read_timeout_s: float) -> Ending:
    """The Ending of an exchange that raised `exc`: outcome, our words and the exception's type.

    Example: UpstreamBodyBroken("the upstream reset the connection inside the body", "reset") ->
    Ending('upstream_error', "reset: the upstream reset the connection inside the body
    (UpstreamBodyBroken)", answer=502, failure="reset"). The upstream client
    (collector.sidecar.upstream) raises UpstreamErrors whose messages are ours and whose `reason`
    is their failure class; anything else is named by its type only.
    """
    name = type(exc).__name__
    if isinstance(exc, UpstreamPoolTimeout):  # the sidecar sheds the request: its pool is full
        return Ending("overloaded", f"{exc} ({name})", answer=503, limit="--upstream-wait-timeout")
    if isinstance(exc, UpstreamError):
        reason = exc.reason if exc.reason in FAILURES else "proxy_error"
        if reason == "read_timeout":
            return failed(reason, f"{exc} (--read-timeout; {name})", answer=504)
        return failed(reason, f"{exc} ({name})", answer=504 if FAILURES[reason] == "timeout" else 502)
    if isinstance(exc, asyncio.TimeoutError):
        return failed(
            "read_timeout",
            f"the upstream sent nothing for {read_timeout_s:g} s (--read-timeout; {name})",
            answer=504,
        )
    if isinstance(exc, EventTooLarge):
        return failed("event_too_large", str(exc), answer=502, limit="--max-sse-event-bytes")
    return failed("proxy_error", f"proxy error: {name}", answer=502)
