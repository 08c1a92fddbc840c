"""The notifications Alertmanager would send for a backtest's alerts: grouping and inhibition, simulated.

The alerts a timeline fired go through the generated Alertmanager configuration
(collector.alerts.alertmanager) as Alertmanager 0.25 handles them:

- **routing**: the first child route whose matchers match (page for critical, ticket for
  warning), else the root; `group_by`, `group_wait` and `group_interval` inherited from the root;
- **grouping**: one aggregation group per route and values of its `group_by` labels, created
  when its first alert arrives, flushed `group_wait` later and every `group_interval` after;
- **inhibition** at each flush: an alert is muted while a firing alert matching a rule's source
  has the rule's `equal` labels, and matches its target (an alert matching both sides is muted
  only by sources that do not match the target side; a muted source still mutes);
- **deduplication**: a flush notifies when its firing, unmuted alerts are not a subset of those
  the group last notified (or when everything it notified has resolved).

What counts as **a notification** here is one that brings a firing alert its group had not
notified: what wakes on-call or opens a ticket. Alertmanager's reminders of an unchanged group
(`repeat_interval`) and its resolution messages are left out (`resolved` counts the latter).

A notification **opens an incident** (`opens`) when its group had no firing alert notified
before it, or had notified everything resolved: a pager that keys its incidents on Alertmanager's
group key (the PagerDuty integration's dedup_key and Opsgenie's alias are that key) opens one
there; the group's later notifications update that incident, they do not page again.

    notify(timeline.fired, alertmanager_config(), end)
        -> [Notification("page", (("model", "llama-70b"),), 2100.0, ("HeadroomCapacityForecast",))]
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from collector.backtest.timeline import AlertSpan

__all__ = ["Notification", "Matcher", "notify", "duration_s"]

_MATCHER = re.compile(r'^\s*(?P<name>[a-zA-Z_]\w*)\s*(?P<op>=~|!~|!=|=)\s*"(?P<value>(?:[^"\\]|\\.)*)"\s*$')
_UNITS = {"ms": 0.001, "s": 1, "m": 60, "h": 3600, "d": 86400, "w": 604800}
_DURATION = re.compile(r"(\d+)(ms|s|m|h|d|w)")


def duration_s(text: str) -> float:
    """Seconds of an Alertmanager duration: '1h30m' -> 5400.0."""
    parts = _DURATION.findall(text)
    if not parts or "".join(n + u for n, u in parts) != text:
        raise ValueError(f"{text!r} is not a duration such as 30s, 5m, 1h30m")
    return float(sum(int(n) * _UNITS[u] for n, u in parts))


@dataclass(frozen=True)
class Matcher:
    """One Alertmanager matcher: 'severity="critical"', 'alertname=~"A|B"'; a missing label is ""."""

    name: str
    op: str
    value: str

    @staticmethod
    def parse(text: str) -> Matcher:
        found = _MATCHER.match(text)
        if found is None:
            raise ValueError(f'{text!r} is not a matcher such as severity="critical"')
        return Matcher(found["name"], found["op"], found["value"].replace('\\"', '"'))

    def matches(self, labels: Mapping[str, str]) -> bool:
        value = labels.get(self.name, "")
        if self.op in ("=~", "!~"):
            hit = re.fullmatch(self.value, value) is not None
            return hit if self.op == "=~" else not hit
        return (value == self.value) == (self.op == "=")


def _all(matchers: Sequence[Matcher], labels: Mapping[str, str]) -> bool:
    return all(m.matches(labels) for m in matchers)


@dataclass(frozen=True)
class _Inhibit:
    source: tuple[Matcher, ...]
    target: tuple[Matcher, ...]
    equal: tuple[str, ...]


@dataclass(frozen=True)
class _Route:
    receiver: str
    matchers: tuple[Matcher, ...]
    group_by: tuple[str, ...]
    group_wait_s: float
    group_interval_s: float
    repeat_s: float
    send_resolved: bool


@dataclass(frozen=True)
class Notification:
    """A notification that brought alerts its group had not notified (`new`, by alert name)."""

    receiver: str
    group: tuple[tuple[str, str], ...]  # the group_by labels and their values
    at: float
    new: tuple[str, ...]
    firing: tuple[str, ...]  # every alert the notification carries, by name
    opens: bool = True  # the first of an incident at a pager keyed on the group (module docstring)


@dataclass(frozen=True)
class _Alert:
    labels: tuple[tuple[str, str], ...]  # alertname included; the identity, as a fingerprint
    start: float
    end: float

    @property
    def name(self) -> str:
        return dict(self.labels)["alertname"]

    def active(self, t: float) -> bool:
        return self.start <= t < self.end


def _routes(config: Mapping[str, Any]) -> tuple[list[_Route], _Route]:
    root = config["route"]
    receivers = {r["name"]: r for r in config.get("receivers", ())}

    def route(node: Mapping[str, Any], parent: Mapping[str, Any]) -> _Route:
        def get(key: str) -> Any:
            return node.get(key, parent.get(key))

        return _Route(
            get("receiver"),
            tuple(Matcher.parse(m) for m in node.get("matchers", ())),
            tuple(get("group_by") or ()),
            duration_s(get("group_wait") or "30s"),
            duration_s(get("group_interval") or "5m"),
            duration_s(get("repeat_interval") or "4h"),
            _sends_resolved(receivers.get(get("receiver"), {})),
        )

    return [route(child, root) for child in root.get("routes", ())], route(root, {})


def _sends_resolved(receiver: Mapping[str, Any]) -> bool:
    """Whether a receiver's integrations send resolutions (webhooks do unless told not to)."""
    configs = [c for key, value in receiver.items() if key.endswith("_configs") for c in value]
    return any(c.get("send_resolved", True) for c in configs)


def _inhibitions(config: Mapping[str, Any]) -> list[_Inhibit]:
    return [
        _Inhibit(
            tuple(Matcher.parse(m) for m in rule.get("source_matchers", ())),
            tuple(Matcher.parse(m) for m in rule.get("target_matchers", ())),
            tuple(rule.get("equal", ())),
        )
        for rule in config.get("inhibit_rules", ())
    ]


def _muted(alert: _Alert, at: float, alerts: Sequence[_Alert], rules: Sequence[_Inhibit]) -> bool:
    """Alertmanager's Inhibitor.Mutes at time `at`."""
    labels = dict(alert.labels)
    for rule in rules:
        if not _all(rule.target, labels):
            continue
        two_sided = _all(rule.source, labels)
        for source in alerts:
            other = dict(source.labels)
            if not source.active(at) or not _all(rule.source, other):
                continue
            if any(other.get(name, "") != labels.get(name, "") for name in rule.equal):
                continue
            if two_sided and _all(rule.target, other):
                continue
            return True
    return False


def notify(spans: Iterable[AlertSpan], config: Mapping[str, Any], end: float) -> list[Notification]:
    """The notifications `config` makes of the fired `spans` up to `end` (POSIX seconds), in order."""
    alerts = [
        _Alert(
            tuple(sorted((span.labels | {"alertname": span.name}).items())),
            span.fired_at,
            span.ended_at if span.ended_at is not None else float("inf"),
        )
        for span in spans
        if span.firing_at is not None
    ]
    children, root = _routes(config)
    rules = _inhibitions(config)
    groups: dict[tuple[str, tuple[tuple[str, str], ...]], tuple[_Route, list[_Alert]]] = {}
    for alert in sorted(alerts, key=lambda a: a.start):
        labels = dict(alert.labels)
        route = next((r for r in children if _all(r.matchers, labels)), root)
        key = tuple((name, labels.get(name, "")) for name in route.group_by)
        groups.setdefault((route.receiver, key), (route, []))[1].append(alert)
    sent = []
    for (receiver, key), (route, members) in groups.items():
        sent += _flushes(receiver, key, route, members, alerts, rules, end)
    return sorted(sent, key=lambda n: (n.at, n.receiver, n.group))


def _flushes(
    receiver: str,
    key: tuple[tuple[str, str], ...],
    route: _Route,
    members: list[_Alert],
    alerts: Sequence[_Alert],
    rules: Sequence[_Inhibit],
    end: float,
) -> list[Notification]:
    """One aggregation group's flushes, deduplicated as Alertmanager's DedupStage does.

    A group emptied by resolution is deleted and starts again (group_wait) with its next alert;
    the notification log (what it last sent) outlives it, as Alertmanager's does.
    """
    Labels = frozenset[tuple[tuple[str, str], ...]]
    found: list[Notification] = []
    entry: tuple[Labels, Labels, float] | None = None  # firing, resolved, when: the nflog entry
    pending = sorted(members, key=lambda a: a.start)
    at = pending[0].start + route.group_wait_s
    while pending and at <= end:
        present = [a for a in pending if a.start <= at and not _muted(a, at, alerts, rules)]
        firing: Labels = frozenset(a.labels for a in present if a.active(at))
        resolved: Labels = frozenset(a.labels for a in present if not a.active(at))
        if entry is None:
            send = bool(firing)
        elif not firing <= entry[0]:
            send = True
        elif not firing:
            send = bool(entry[0])
        else:
            send = (route.send_resolved and not resolved <= entry[1]) or at - entry[2] >= route.repeat_s
        if send:
            new = firing - entry[0] if entry is not None else firing
            if new:
                found.append(
                    Notification(
                        receiver,
                        key,
                        at,
                        tuple(sorted({dict(a)["alertname"] for a in new})),
                        tuple(sorted(dict(a)["alertname"] for a in firing)),
                        entry is None or not entry[0],
                    )
                )
            entry = (firing, resolved, at)
        # resolved alerts leave the group once flushed; an empty group is deleted
        pending = [a for a in pending if a.start > at or a.active(at)]
        if pending and all(a.start > at for a in pending):
            at = pending[0].start + route.group_wait_s
        else:
            at += route.group_interval_s
    return found
