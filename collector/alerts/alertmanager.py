"""Alertmanager configuration for on-call: page vs ticket routes, grouping, inhibition.

`severity="critical"` pages, `severity="warning"` opens a ticket. Alerts group by alert name and
model, so one overloaded model is one notification, not one per sidecar. Inhibition: a critical
alert mutes the warning of its `family` (KV cache full mutes KV cache nearly full, fast burn mutes
slow burn), and the any-two composite mutes the signals it counts.
"""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["Receivers", "PRODUCTION_RECEIVERS", "alertmanager_config"]


@dataclass(frozen=True)
class Receivers:
    """Webhook URLs for the two routes; production points them at the pager and ticket bridges."""

    page_url: str
    ticket_url: str
    group_wait: str = "30s"
    group_interval: str = "5m"
    repeat_interval_page: str = "1h"
    repeat_interval_ticket: str = "12h"


# Placeholders for the bridges in front of your pager and ticket tracker (e.g. PagerDuty, Jira).
PRODUCTION_RECEIVERS = Receivers(
    page_url="http://alert-bridge:9095/page", ticket_url="http://alert-bridge:9095/ticket"
)


def _receiver(name: str, url: str) -> dict:
    return {"name": name, "webhook_configs": [{"url": url, "send_resolved": True}]}


def alertmanager_config(receivers: Receivers = PRODUCTION_RECEIVERS) -> dict:
    """The Alertmanager configuration document."""
    return {
        "route": {
            "receiver": "ticket",
            "group_by": ["alertname", "model"],
            "group_wait": receivers.group_wait,
            "group_interval": receivers.group_interval,
            "repeat_interval": receivers.repeat_interval_ticket,
            "routes": [
                {
                    "receiver": "page",
                    "matchers": ['severity="critical"'],
                    "repeat_interval": receivers.repeat_interval_page,
                },
                {"receiver": "ticket", "matchers": ['severity="warning"']},
            ],
        },
        "receivers": [_receiver("page", receivers.page_url), _receiver("ticket", receivers.ticket_url)],
        "inhibit_rules": [
            {
                "source_matchers": ['severity="critical"', 'family=~".+"'],
                "target_matchers": ['severity="warning"', 'family=~".+"'],
                "equal": ["family", "model"],
            },
            {
                "source_matchers": ['alertname="HeadroomNearCapacityLimit"'],
                "target_matchers": ['signal=~".+"'],
                "equal": ["model"],
            },
        ],
    }
