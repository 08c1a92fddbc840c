"""The overview's panels only a proxy can fill: the age of what is in flight, and dead capacity inputs.

- "Age of in-flight requests": the oldest in-flight request per sidecar and model (computed from the
  live set at each scrape) with the stuck-request floor as a line, and how many are older than
  2 minutes and 10 minutes (right axis). A line climbing with the clock is a request nobody's
  latency histogram has seen yet.
- "Capacity inputs the sidecar no longer trusts": headroom_signal_valid == 0 per signal and reason,
  empty while every input is valid.
"""

from __future__ import annotations

from typing import Any

from collector.dashboards.panels import right_axis, target, thresholds, timeseries
from collector.dashboards.queries import sel
from collector.rules.config import RulesConfig
from collector.rules.naming import sample

__all__ = ["integrity_panels"]

_OLD = 'older_than=~"2m|10m"'


def integrity_panels(c: RulesConfig) -> list[dict[str, Any]]:
    """The in-flight age panel and the signal-validity panel."""
    oldest, older = (
        sample("headroom_inflight_oldest_age_seconds"),
        sample("headroom_inflight_older_than_requests"),
    )
    valid = sample("headroom_signal_valid")
    return [
        timeseries(
            "Age of in-flight requests",
            "Seconds since the oldest request still in flight was admitted, per sidecar and model (left), "
            "and how many in-flight requests are older than 2 minutes and 10 minutes (right). Engines "
            "record latency only when a request ends; a line climbing with the clock is a request stuck "
            f"in flight. The stuck-request alert fires past max({c.stuck_request_floor_seconds:g}s, "
            f"{c.stuck_request_p99_multiple:g}x the model's p99 end-to-end time); the line is the floor.",
            [
                target(
                    f"max by (instance, model) ({oldest}{sel('model')})", "{{instance}} {{model}} oldest", "A"
                ),
                target(
                    f"sum by (instance, model, older_than) ({older}{sel('model', extra=_OLD)})",
                    "{{instance}} {{model}} older than {{older_than}}",
                    "B",
                ),
            ],
            "s",
            overrides=(right_axis("B", "short", "requests"),),
            defaults=thresholds((c.stuck_request_floor_seconds, "orange")),
        ),
        timeseries(
            "Capacity inputs the sidecar no longer trusts",
            "Engine signals marked invalid (headroom_signal_valid == 0), by signal and reason: missing "
            "(a rename the sidecar does not know), stale (unchanged while requests finish), stuck (-1, or "
            "0 while requests run), scrape_failing. The KV and queue alerts built on a signal stay "
            "silent while it is listed here. Empty while every input is valid.",
            [
                target(
                    f"count by (instance, signal, reason) ({valid}{sel()} == 0)",
                    "{{instance}} {{signal}}: {{reason}}",
                )
            ],
            "short",
            axis_label="signals",
        ),
    ]
