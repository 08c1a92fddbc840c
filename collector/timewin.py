"""Time windows as people type them: '7d', '24h', '90m', or an ISO-8601 instant (UTC if naive).

Every command's --since/--until takes both (WHEN, the one click type): a duration means that long
before now, anything else an ISO-8601 time.

    @click.option("--since", type=WHEN, default="7d")   # -> a tz-aware datetime
"""

from __future__ import annotations

import re
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from typing import TYPE_CHECKING, TypeAlias

import click

__all__ = ["parse_duration", "parse_instant", "utc_now", "WHEN", "WhenType", "WHEN_HELP"]

_DURATION = re.compile(r"(\d+)(ms|s|m|h|d|w|y)")
_UNIT_MS = {
    "ms": 1,
    "s": 1000,
    "m": 60_000,
    "h": 3_600_000,
    "d": 86_400_000,
    "w": 604_800_000,
    "y": 31_536_000_000,
}


def utc_now() -> datetime:
    """The current time, tz-aware UTC (the default clock everywhere an injected one is allowed)."""
    return datetime.now(UTC)


def parse_duration(text: str) -> timedelta:
    """A Prometheus duration: '7d' -> 7 days, '36h' -> 36 hours, '1h30m' -> 90 minutes, '500ms';
    units ms|s|m|h|d|w|y (a year is 365 days). ValueError naming the input otherwise.

    Read here for the commands' windows and settings, and for the backtest's rule `for` and
    `keep_firing_for` (collector.backtest.evaluate).
    """
    stripped = text.strip()
    parts = _DURATION.findall(stripped)
    if not parts or "".join(number + unit for number, unit in parts) != stripped:
        raise ValueError(
            f"{text!r} is not a Prometheus duration; use a number and a unit ms|s|m|h|d|w|y, "
            "e.g. 7d, 24h or 1h30m"
        )
    try:
        return timedelta(milliseconds=sum(int(number) * _UNIT_MS[unit] for number, unit in parts))
    except OverflowError:
        raise ValueError(f"{text!r} is too long a duration") from None


def parse_instant(text: str, now: datetime) -> datetime:
    """A duration means `now - duration`; otherwise an ISO-8601 instant, UTC when naive.

    Example: parse_instant("24h", 2026-11-30T12:00Z) -> 2026-11-29T12:00Z
    """
    try:
        return now - parse_duration(text)
    except ValueError:
        pass
    try:
        parsed = datetime.fromisoformat(text.strip())
    except ValueError:
        raise ValueError(
            f"{text!r} is neither a duration (7d, 24h) nor an ISO-8601 time (2026-11-30T09:00:00Z)"
        ) from None
    return parsed if parsed.tzinfo else parsed.replace(tzinfo=UTC)


WHEN_HELP = "a duration back from now (7d, 24h, 90m) or an ISO-8601 time (2026-11-30T09:00Z, UTC if naive)"


if TYPE_CHECKING:  # click >= 8.2 types ParamType by its value; 8.1 (allowed) cannot subscript it at run time
    _ParamType: TypeAlias = click.ParamType[datetime]
else:
    _ParamType = click.ParamType


class WhenType(_ParamType):
    """--since/--until: a duration back from now or an ISO-8601 instant -> a tz-aware datetime.

    `now` is read when the value is converted; tests inject a clock with WhenType(clock).
    """

    name = "WHEN"

    def __init__(self, clock: Callable[[], datetime] = utc_now) -> None:
        self._clock = clock

    def convert(self, value: object, param: click.Parameter | None, ctx: click.Context | None) -> datetime:
        if isinstance(value, datetime):
            return value if value.tzinfo else value.replace(tzinfo=UTC)
        try:
            return parse_instant(str(value), self._clock())
        except ValueError as exc:
            self.fail(str(exc), param, ctx)


WHEN = WhenType()
