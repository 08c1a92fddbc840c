"""Alertmanager configuration for on-call: page vs ticket routes, grouping, inhibition, receivers.

`severity="critical"` pages, `severity="warning"` opens a ticket. Both group by model (and
cluster), not by alert name: one capacity incident on one model is one group, however many alerts
and sidecars it raises. The page route notifies a group once when it opens and then at most hourly
(`group_interval` = `repeat_interval` = 1 h): alerts that join an open incident ride on its next
notification instead of paging again. Its notifications carry the group key, and a pager that keys
its incidents on it (Alertmanager's PagerDuty integration uses it as the dedup_key, Opsgenie as the
alias) holds the whole incident as one page, whatever order its alerts fire in. Inhibition keeps
what the page says short: the pages of a capacity incident usually come in a known order
(INCIDENT_PAGES: the forecast, the composite, the KV cache, then the SLO burns, goodput last), and
each mutes those after it for the same model; a critical alert mutes the warning of its `family` (the
forecast mutes "rising", KV cache exhausted mutes nearly full, a fast burn mutes the slow one), and
the any-two composite mutes the signals it counts. `headroom alerts backtest` counts the
notifications and the page incidents this produces (collector.backtest.notifications simulates
Alertmanager's grouping and inhibition).

The receivers are webhook placeholders unless the rules config names real ones
(`receivers: {page: {pagerduty_configs: [...]}, ticket: {slack_configs: [...]}}`: Alertmanager's own
receiver syntax, passed through). The rendered file ends with a commented example of both.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

__all__ = [
    "Receivers",
    "PRODUCTION_RECEIVERS",
    "alertmanager_config",
    "RECEIVER_EXAMPLE",
    "INCIDENT_PAGES",
    "GROUP_BY",
]

# The pages one capacity incident on a model raises, in the order they come on a ramp (the
# backtest's `ramp`: forecast, composite, TTFT burn, e2e burn, availability burn): each mutes
# every one after it for the same model and cluster, so the incident pages once. The first is
# the earliest warning of the cause; the later ones are its symptoms. The goodput burn comes last:
# it judges every request against every bound, so any other page's incident burns it too.
INCIDENT_PAGES = (
    "HeadroomCapacityForecast",
    "HeadroomNearCapacityLimit",
    "HeadroomKVCacheExhausted",
    "HeadroomTTFTBudgetBurnFast",
    "HeadroomE2EBudgetBurnFast",
    "HeadroomAvailabilityBudgetBurnFast",
    "HeadroomGoodputBudgetBurnFast",
)
# Labels both routes group by (the cluster label goes before them): one incident, one group.
GROUP_BY = ("model",)


@dataclass(frozen=True)
class Receivers:
    """Webhook URLs for the two routes (placeholders, or a test's receiver) and the route timings."""

    page_url: str
    ticket_url: str
    group_wait: str = "30s"
    group_interval: str = "5m"
    group_interval_page: str = "1h"  # an open incident's later alerts wait for its next notification
    repeat_interval_page: str = "1h"
    repeat_interval_ticket: str = "12h"


# Placeholders for the bridges in front of your pager and ticket tracker; replace them through
# `receivers:` in the rules config (see RECEIVER_EXAMPLE) rather than by editing the file.
PRODUCTION_RECEIVERS = Receivers(
    page_url="http://alert-bridge:9095/page", ticket_url="http://alert-bridge:9095/ticket"
)

# Appended, commented, to alerts/alertmanager.yml: real receiver types, as a config file names them.
RECEIVER_EXAMPLE = """\
# Real receivers: put Alertmanager's own receiver bodies under `receivers:` in the file passed to
# `headroom alerts generate --config FILE` (docs/rules.md, "Configuration file"), for example:
#
#   receivers:
#     page:
#       pagerduty_configs:
#         - routing_key_file: /etc/alertmanager/secrets/pagerduty-routing-key
#           send_resolved: true
#           description: '{{ .CommonAnnotations.summary }}'
#           links:
#             - href: '{{ .CommonAnnotations.runbook_url }}'
#               text: runbook
#     ticket:
#       slack_configs:
#         - api_url_file: /etc/alertmanager/secrets/slack-webhook-url
#           channel: '#llm-capacity'
#           send_resolved: true
#           title: '{{ .CommonAnnotations.summary }}'
#           text: '{{ .CommonAnnotations.description }} Runbook: {{ .CommonAnnotations.runbook_url }}'
"""


def _receiver(name: str, url: str, configured: dict[str, Any] | None) -> dict[str, Any]:
    if configured:
        return {"name": name, **configured}
    return {"name": name, "webhook_configs": [{"url": url, "send_resolved": True}]}


def alertmanager_config(
    receivers: Receivers = PRODUCTION_RECEIVERS,
    configured: dict[str, dict[str, Any]] | None = None,
    cluster_label: str = "cluster",
) -> dict[str, Any]:
    """The Alertmanager configuration document; `configured` maps route -> a real receiver body.

    Grouping and inhibition name `cluster_label` (empty: one cluster), so one cluster's incident
    never joins, or mutes, another's.
    """
    configured = configured or {}
    cluster = [cluster_label] if cluster_label else []
    return {
        "route": {
            "receiver": "ticket",
            "group_by": [*cluster, *GROUP_BY],
            "group_wait": receivers.group_wait,
            "group_interval": receivers.group_interval,
            "repeat_interval": receivers.repeat_interval_ticket,
            "routes": [
                {
                    "receiver": "page",
                    "matchers": ['severity="critical"'],
                    "group_interval": receivers.group_interval_page,
                    "repeat_interval": receivers.repeat_interval_page,
                },
                {"receiver": "ticket", "matchers": ['severity="warning"']},
            ],
        },
        "receivers": [
            _receiver("page", receivers.page_url, configured.get("page")),
            _receiver("ticket", receivers.ticket_url, configured.get("ticket")),
        ],
        "inhibit_rules": [
            {
                "source_matchers": ['severity="critical"', 'family=~".+"'],
                "target_matchers": ['severity="warning"', 'family=~".+"'],
                "equal": ["family", *cluster, "model"],
            },
            {
                "source_matchers": ['alertname="HeadroomNearCapacityLimit"'],
                "target_matchers": ['signal=~".+"'],
                "equal": [*cluster, "model"],
            },
            *_incident_order(cluster),
        ],
    }


def _incident_order(cluster: list[str]) -> list[dict[str, Any]]:
    """Each page of INCIDENT_PAGES mutes the ones after it, for the same model (and cluster)."""
    return [
        {
            "source_matchers": [f'alertname="{page}"'],
            "target_matchers": [f'alertname=~"{"|".join(INCIDENT_PAGES[index + 1 :])}"'],
            "equal": [*cluster, "model"],
        }
        for index, page in enumerate(INCIDENT_PAGES[:-1])
    ]
