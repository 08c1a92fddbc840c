"""Time windows as people type them: '7d', '24h', '90m', or an ISO-8601 instant (UTC if naive)."""

from __future__ import annotations

import re
from datetime import UTC, datetime, timedelta

__all__ = ["parse_duration", "parse_instant", "utc_now"]

_DURATION = re.compile(r"^(\d{1,6})([smhdw])$")
_UNIT_SECONDS = {"s": 1, "m": 60, "h": 3600, "d": 86400, "w": 7 * 86400}


def utc_now() -> datetime:
    """The current time, tz-aware UTC (the default clock everywhere an injected one is allowed)."""
    return datetime.now(UTC)


def parse_duration(text: str) -> timedelta:
    """'7d' -> 7 days, '36h' -> 36 hours; ValueError naming the input otherwise."""
    match = _DURATION.match(text.strip())
    if not match:
        raise ValueError(f"{text!r} is not a duration; use a number and a unit s|m|h|d|w, e.g. 7d or 24h")
    return timedelta(seconds=int(match.group(1)) * _UNIT_SECONDS[match.group(2)])


def parse_instant(text: str, now: datetime) -> datetime:
    """A duration means `now - duration`; otherwise an ISO-8601 instant, UTC when naive.

    Example: parse_instant("24h", 2026-11-30T12:00Z) -> 2026-11-29T12:00Z
    """
    if _DURATION.match(text.strip()):
        return now - parse_duration(text)
    try:
        parsed = datetime.fromisoformat(text.strip())
    except ValueError:
        raise ValueError(
            f"{text!r} is neither a duration (7d, 24h) nor an ISO-8601 time (2026-11-30T09:00:00Z)"
        ) from None
    return parsed if parsed.tzinfo else parsed.replace(tzinfo=UTC)
