"""ALERTS as literal vectors: how the backtest evaluates a rule that reads other alerts' state.

Alert state is not in the backfilled blocks (it does not exist until the rules are evaluated), so
a rule that reads `ALERTS{...}` is evaluated evaluation by evaluation: each `ALERTS{...}` selector is
replaced by the alerts the state machine holds at that moment that match its label matchers,
written as a vector of label_replace()d constants the real Prometheus can evaluate:

    substitute('count(ALERTS{alertstate="firing"}) >= 2', [{"alertname": "A", "alertstate": "firing"}])
        -> 'count((label_replace(label_replace(vector(1), "alertname", "A", "", ""),
                    "alertstate", "firing", "", ""))) >= 2'

No alert matches -> an empty vector, `(vector(1) < 0)`. A range over ALERTS (`ALERTS[5m]`) cannot be
replayed this way and is refused by name.
"""

from __future__ import annotations

import re
from collections.abc import Iterable

__all__ = ["reads_alerts", "substitute", "matching", "EMPTY_VECTOR", "UnsupportedExpression"]

EMPTY_VECTOR = "(vector(1) < 0)"
_SELECTOR = re.compile(r'(?<![\w:"])ALERTS(?![\w:])\s*(?:\{(?P<matchers>[^}]*)\})?(?P<range>\s*\[)?')
_MATCHER = re.compile(
    r'\s*(?P<name>[a-zA-Z_]\w*)\s*(?P<op>=~|!~|!=|=)\s*"(?P<value>(?:[^"\\]|\\.)*)"\s*(?:,|$)'
)


class UnsupportedExpression(ValueError):
    """A rule reads ALERTS in a way the backtest cannot replay (a range, ALERTS_FOR_STATE)."""


def reads_alerts(expr: str) -> bool:
    """True when `expr` reads the ALERTS series."""
    return _SELECTOR.search(expr) is not None


def _matchers(text: str) -> list[tuple[str, str, str]]:
    found, position = [], 0
    text = text.strip()
    while position < len(text):
        match = _MATCHER.match(text, position)
        if match is None:
            raise UnsupportedExpression(f"cannot read the label matchers {{{text}}} of an ALERTS selector")
        found.append((match["name"], match["op"], bytes(match["value"], "utf-8").decode("unicode_escape")))
        position = match.end()
    return found


def _accepts(labels: dict[str, str], name: str, op: str, value: str) -> bool:
    actual = labels.get(name, "")
    if op == "=":
        return actual == value
    if op == "!=":
        return actual != value
    hit = re.fullmatch(value, actual) is not None  # Prometheus anchors regex matchers
    return hit if op == "=~" else not hit


def matching(selector_matchers: str, alerts: Iterable[dict[str, str]]) -> list[dict[str, str]]:
    """The alerts (label dicts with alertname and alertstate) a selector's matchers accept."""
    rules = _matchers(selector_matchers)
    return [a for a in alerts if all(_accepts(a, name, op, value) for name, op, value in rules)]


def _escape(value: str) -> str:
    return value.replace("\\", "\\\\").replace('"', '\\"')


def _literal(alerts: list[dict[str, str]]) -> str:
    if not alerts:
        return EMPTY_VECTOR
    parts = []
    for labels in alerts:
        expr = "vector(1)"
        for name, value in sorted(labels.items()):
            expr = f'label_replace({expr}, "{name}", "{_escape(value)}", "", "")'
        parts.append(expr)
    return "(" + " or ".join(parts) + ")"


def substitute(expr: str, alerts: Iterable[dict[str, str]]) -> tuple[str, bool]:
    """`expr` with every ALERTS selector replaced by the matching `alerts`; and whether any matched."""
    alerts = list(alerts)
    any_matched = False

    def replace(match: re.Match[str]) -> str:
        nonlocal any_matched
        if match["range"]:
            raise UnsupportedExpression(f"the backtest cannot replay a range over ALERTS: {match.group(0)!r}")
        chosen = matching(match["matchers"] or "", alerts)
        any_matched = any_matched or bool(chosen)
        return _literal(chosen)

    return _SELECTOR.sub(replace, expr), any_matched
