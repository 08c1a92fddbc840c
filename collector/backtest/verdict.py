"""A scenario's verdict: its Expect checked against the backtest timeline, one line per check.

    verdict(timeline, scenario.expect, first_problem_start)
        -> [Check("pages == 0", True, "0 pages"), Check("lead of the first page >= 5m", False, "2m")]

Also the structural check every scenario gets: the any-two composite fired only while a latency
signal and a saturation signal were both firing for its model (in its cluster, when it has one).
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass

from collector.backtest.notifications import Notification
from collector.backtest.scenario import Expect
from collector.backtest.timeline import AlertSpan, Timeline

__all__ = ["Check", "verdict", "matches", "minutes"]

_SELECTOR = re.compile(r"^(?P<name>\w*)(?:\{(?P<labels>.*)\})?$")
_PAIR = re.compile(r'\s*(\w+)\s*=\s*"([^"]*)"\s*,?')
COMPOSITE = "HeadroomNearCapacityLimit"


@dataclass(frozen=True)
class Check:
    """One expectation and whether the timeline met it."""

    what: str
    ok: bool
    detail: str


def minutes(seconds: float | None) -> str:
    """'12.5m' (or 'none')."""
    return "none" if seconds is None else f"{seconds / 60:.1f}m"


def matches(selector: str, span: AlertSpan) -> bool:
    """Whether an alert episode matches 'Name{label="value",...}' (either part may be omitted)."""
    found = _SELECTOR.match(selector.strip())
    if found is None:
        raise ValueError(f'{selector!r} is not an alert selector such as Name{{label="value"}}')
    if found["name"] and found["name"] != span.name:
        return False
    return all(span.labels.get(k) == v for k, v in _PAIR.findall(found["labels"] or ""))


def _count(what: str, expected: int | None, spans: list[AlertSpan]) -> list[Check]:
    if expected is None:
        return []
    names = ", ".join(sorted({s.name for s in spans})) or "-"
    return [Check(f"{what} == {expected}", len(spans) == expected, f"{len(spans)} ({names})")]


def _lead(what: str, minimum: float | None, lead: float | None, span: AlertSpan | None) -> list[Check]:
    if minimum is None:
        return []
    ok = lead is not None and lead >= minimum
    return [
        Check(
            f"lead of the first {what} >= {minimum / 60:g}m",
            ok,
            f"{minutes(lead)} ({span.name if span else 'nothing fired in time'})",
        )
    ]


def _composite_checks(timeline: Timeline) -> list[Check]:
    checks = []
    for span in timeline.firing(COMPOSITE):
        model, cluster = span.labels.get("model"), span.labels.get("cluster")
        at = span.fired_at
        kinds = {
            s.labels.get("signal_kind", "")
            for s in timeline.fired
            if s.labels.get("model") == model
            and s.labels.get("cluster") == cluster
            and s.labels.get("signal")
            and s.fired_at <= at
            and (s.ended_at is None or s.ended_at > at)
        }
        checks.append(
            Check(
                "the composite fires only on a latency and a saturation signal together",
                {"latency", "saturation"} <= kinds,
                f"at {minutes(at - timeline.start)}: {sorted(kinds)}",
            )
        )
    return checks


def verdict(
    timeline: Timeline, expect: Expect, origin: float | None, notifications: Sequence[Notification] = ()
) -> list[Check]:
    """Every check of `expect` (and the composite's) on `timeline`; `origin`: first fault/incident start.

    `notifications`: what Alertmanager would send of the timeline (collector.backtest.notifications).
    """
    checks = _count("pages", expect.pages, timeline.pages) + _count(
        "warnings", expect.warnings, timeline.warnings
    )
    if expect.page_notifications is not None:
        pages = [n for n in notifications if n.receiver == "page"]
        checks.append(
            Check(
                f"page notifications == {expect.page_notifications}",
                len(pages) == expect.page_notifications,
                f"{len(pages)} ("
                + ("; ".join(f"{minutes(n.at - timeline.start)}: {', '.join(n.new)}" for n in pages) or "-")
                + ")",
            )
        )
    checks += _count("false pages", expect.false_pages, timeline.false_pages)
    checks += _count("false warnings", expect.false_warnings, timeline.false_warnings)
    if expect.breach is not None:
        breach = timeline.first_breach
        checks.append(
            Check(
                f"breach {'shown' if expect.breach else 'absent'}",
                (breach is not None) == expect.breach,
                minutes(breach.start - timeline.start) if breach is not None else "no breach",
            )
        )
    checks += _lead("warning", expect.lead_warning_s, timeline.lead_warning_s, timeline.first_warning)
    checks += _lead("page", expect.lead_page_s, timeline.lead_page_s, timeline.first_page)
    for selector, within_s in expect.fires:
        fired = [s for s in timeline.fired if matches(selector, s)]
        first = min((s.fired_at for s in fired), default=None)
        delay = None if first is None or origin is None else first - origin
        checks.append(
            Check(
                f"{selector} fires within {within_s / 60:g}m",
                delay is not None and 0 <= delay <= within_s,
                f"after {minutes(delay)}" if delay is not None else "never fired",
            )
        )
    for selector in expect.fired:
        first = min((s.fired_at for s in timeline.fired if matches(selector, s)), default=None)
        checks.append(
            Check(
                f"{selector} fires",
                first is not None,
                f"first at {minutes(first - timeline.start)}" if first is not None else "never fired",
            )
        )
    for selector in expect.silent:
        fired = [s for s in timeline.fired if matches(selector, s)]
        checks.append(
            Check(
                f"{selector} stays silent",
                not fired,
                ", ".join(f"{s.name} at {minutes(s.fired_at - timeline.start)}" for s in fired) or "silent",
            )
        )
    until = timeline.first_breach.start if timeline.first_breach else timeline.end
    for selector in expect.silent_before_breach:
        early = [s for s in timeline.fired if matches(selector, s) and s.fired_at < until]
        checks.append(
            Check(
                f"{selector} stays silent before the breach",
                not early,
                ", ".join(f"{s.name} at {minutes(s.fired_at - timeline.start)}" for s in early) or "silent",
            )
        )
    for selector in expect.silent_before_problem:
        until = timeline.end if origin is None else origin
        early = [s for s in timeline.fired if matches(selector, s) and s.fired_at < until]
        checks.append(
            Check(
                f"{selector} stays silent before the first problem",
                not early,
                ", ".join(f"{s.name} at {minutes(s.fired_at - timeline.start)}" for s in early) or "silent",
            )
        )
    return checks + _composite_checks(timeline)
