"""Alert: one alerting rule before rendering, and how it becomes a Prometheus rule under a config.

Alert("HeadroomX", "group", "up == 0", "critical", "<instance> down", "...").to_rule(DEFAULT)
    -> {"alert": "HeadroomX", "expr": "up == 0", "for": "2m", "labels": {"severity": "critical"},
        "annotations": {"summary": "{{ $labels.instance }} down", ...,
                        "runbook_url": "https://.../runbooks.md#headroomx"}}
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from collector.alerts.templating import to_go
from collector.rules.cluster import keep_cluster
from collector.rules.config import RulesConfig

__all__ = ["Alert", "number"]


def number(value: float) -> str:
    """A threshold as PromQL text without float noise (14.4 * 0.01 -> 0.144)."""
    return repr(round(value, 9))


@dataclass(frozen=True)
class Alert:
    """One alert before rendering; `summary`/`description` use the `<label>`/`<value:fn>` notation."""

    name: str
    group: str
    expr: str
    severity: str
    summary: str
    description: str
    labels: dict[str, str] = field(default_factory=dict)

    @property
    def anchor(self) -> str:
        """The docs/runbooks.md anchor: the heading `## <name>` lower-cased."""
        return self.name.lower()

    def rule_labels(self, config: RulesConfig) -> dict[str, str]:
        """severity, the alert's own labels, then the config's extra labels (e.g. cluster)."""
        return {"severity": self.severity, **self.labels, **config.extra_labels}

    def to_rule(self, config: RulesConfig) -> dict[str, Any]:
        """The Prometheus rule dict for this alert under `config`."""
        keys = (config.cluster_by, "model") if config.cluster_by else ("model",)
        rule: dict[str, Any] = {
            "alert": self.name,
            "expr": keep_cluster(self.expr, config.cluster_by),
            "for": config.for_duration(self.name),
            "labels": self.rule_labels(config),
            "annotations": {
                "summary": to_go(self.summary, keys),
                "description": to_go(self.description, keys),
                "runbook_url": f"{config.runbook_base_url}#{self.anchor}",
            },
        }
        if self.name in config.keeps_firing:
            rule["keep_firing_for"] = config.keeps_firing[self.name]
        return rule
