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
from collector.sse import EventTooLarge

__all__ = ["Ending", "describe_failure"]


@dataclass(frozen=True, slots=True)
class Ending:
    """How an exchange ended: its outcome, our short reason, and what the client still needs.

    `answer` is the status of our own JSON error, sent only when the response has not started;
    `limit` names the flag a refused request went past; `complete` says the upstream ended its
    answer properly, so ours ends properly too, with `last` as its final bytes.
    """

    outcome: str
    error: str | None = None
    answer: int | None = None
    limit: str | None = None
    complete: bool = False
    last: bytes = b""


def describe_failure(exc: BaseException, read_timeout_s: float) -> Ending:
    """The Ending of an exchange that raised `exc`: outcome, our words and the exception's type.

    Example: UpstreamBodyBroken("the upstream closed the connection inside the body") ->
    Ending('upstream_error', "the upstream closed the connection inside the body
    (UpstreamBodyBroken)", answer=502). The upstream client (collector.sidecar.upstream) raises
    UpstreamErrors whose messages are ours; anything else is named by its type only.
    """
    name = type(exc).__name__
    if isinstance(exc, UpstreamError):
        if isinstance(exc, TimeoutError):
            if "in time" in str(exc):
                return Ending("timeout", f"{exc} ({name})", answer=504)
            return Ending("timeout", f"{exc} (--read-timeout; {name})", answer=504)
        return Ending("upstream_error", f"{exc} ({name})", answer=502)
    if isinstance(exc, asyncio.TimeoutError):
        return Ending(
            "timeout",
            f"the upstream sent nothing for {read_timeout_s:g} s (--read-timeout; {name})",
            answer=504,
        )
    if isinstance(exc, EventTooLarge):
        return Ending("upstream_error", str(exc), answer=502, limit="--max-sse-event-bytes")
    return Ending("upstream_error", f"proxy error: {name}", answer=502)
