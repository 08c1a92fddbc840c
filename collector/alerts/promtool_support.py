"""What promtool test cases are made of: Case, promtool's series notation, Prometheus' number formats.

steps((0, 2), (3, 1))        -> "0 0 3"
counter((1, 2), (5, 1))      -> "0 1 2 7"
humanize_duration(2000)      -> "33m 20s"   (what `{{ $value | humanizeDuration }}` prints)
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

__all__ = ["Case", "steps", "counter", "minutes", "humanize", "humanize_duration", "humanize_percentage"]


def steps(*runs: tuple[float, int]) -> str:
    """Expand (value, count) runs into promtool's space-separated values: ((0, 2), (3, 1)) -> "0 0 3"."""
    return " ".join(f"{value:g}" for value, count in runs for _ in range(count))


def counter(*runs: tuple[float, int], start: float = 0) -> str:
    """A counter from (increment per step, steps) runs, starting at `start`."""
    values, total = [start], start
    for increment, count in runs:
        for _ in range(count):
            total += increment
            values.append(total)
    return " ".join(f"{v:g}" for v in values)


def minutes(duration: str) -> int:
    """Whole minutes of a `for:`-style duration: '1h' -> 60, '90s' -> 1 (rounded up), '0s' -> 0."""
    units = {"s": 1 / 60, "m": 1, "h": 60, "d": 1440}
    number, unit = duration[:-1], duration[-1]
    return math.ceil(float(number) * units[unit])


def _go_g(value: float) -> str:
    """Go's %.4g."""
    return f"{value:.4g}"


def humanize(value: float) -> str:
    """Prometheus' `humanize`: 1.769 -> '1.769', 40 -> '40', 2500 -> '2.5k'."""
    if value == 0:
        return _go_g(value)
    prefixes, big = ("k", "M", "G", "T"), abs(value) >= 1
    prefix = ""
    if big:
        for p in prefixes:
            if abs(value) < 1000:
                break
            prefix, value = p, value / 1000
    else:
        for p in ("m", "u", "n"):
            if abs(value) >= 1:
                break
            prefix, value = p, value * 1000
    return _go_g(value) + prefix


def humanize_percentage(value: float) -> str:
    """Prometheus' `humanizePercentage`: 0.0909 -> '9.09%'."""
    return _go_g(value * 100) + "%"


def humanize_duration(seconds: float) -> str:
    """Prometheus' `humanizeDuration`: 0.94 -> '940ms', 8 -> '8s', 2000 -> '33m 20s'."""
    if seconds == 0:
        return "0s"
    if abs(seconds) >= 1:
        whole = int(seconds)
        minutes_, hours, days = whole // 60 % 60, whole // 3600 % 24, whole // 86400
        if days:
            return f"{days}d {hours}h {minutes_}m {whole % 60}s"
        if hours:
            return f"{hours}h {minutes_}m {whole % 60}s"
        if minutes_:
            return f"{minutes_}m {whole % 60}s"
        return _go_g(seconds) + "s"
    prefix = ""
    for p in ("m", "u", "n"):
        if abs(seconds) >= 1:
            break
        prefix, seconds = p, seconds * 1000
    return _go_g(seconds) + prefix + "s"


@dataclass(frozen=True)
class Case:
    """One promtool test group: input series, then [(eval_time, [(labels, value_text)])] per check.

    `rule` picks which rule of the alert's name renders the expected annotations when several share
    it (one per SLO class): the index among the rules of that name, in render order. `calibers`:
    the expected text of each `<calibers:RECORD>` of the annotations ("requests 2").
    """

    name: str
    alert: str
    series: dict[str, str]
    checks: tuple[tuple[str, tuple[tuple[dict[str, str], str], ...]], ...]
    rule: int = 0
    calibers: dict[str, str] = field(default_factory=dict)
