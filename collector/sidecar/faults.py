"""One WARNING per failure class per interval: what a sidecar says when its upstream misbehaves.

An upstream that breaks streams does it to many requests at once; a line per request buries
everything else (a chaos soak logged 1,186 ERROR lines). Each class (an outcome such as
`upstream_error` or `timeout`, or `proxy_error` for a failure of ours) logs its first failure at
once, then at most one line per `interval_s` that says how many were folded into it. Every
request is still counted in headroom_requests_total{outcome} and has its row. Messages are the
sidecar's own words: never text from a request or an answer.
"""

from __future__ import annotations

import logging
import time
import traceback
from collections.abc import Callable

__all__ = ["FaultLog"]


class FaultLog:
    """Rate-limited WARNINGs keyed by failure class; `warn` is cheap enough for every failure."""

    def __init__(
        self, logger: logging.Logger, interval_s: float = 60.0, clock: Callable[[], float] = time.monotonic
    ) -> None:
        self._logger, self._interval_s, self._clock = logger, interval_s, clock
        self._last: dict[str, float] = {}
        self._folded: dict[str, int] = {}

    def warn(self, kind: str, message: str, *, exc: BaseException | None = None) -> bool:
        """Log `message` unless `kind` was logged within the interval; True when it was logged.

        With `exc`, the line names where it was raised (file:line), never its text.
        """
        now = self._clock()
        last = self._last.get(kind)
        if last is not None and now - last < self._interval_s:
            self._folded[kind] = self._folded.get(kind, 0) + 1
            return False
        self._last[kind] = now
        folded = self._folded.pop(kind, 0)
        where = f" at {_origin(exc)}" if exc is not None else ""
        more = f" (and {folded} more of this kind in the last {self._interval_s:g} s)" if folded else ""
        self._logger.warning("%s%s%s", message, where, more)
        return True


def _origin(exc: BaseException) -> str:
    frames = traceback.extract_tb(exc.__traceback__)
    if not frames:
        return "unknown"
    frame = frames[-1]
    return f"{frame.filename.rsplit('/', 1)[-1]}:{frame.lineno}"
