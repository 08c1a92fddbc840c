"""Kubernetes objects rendered from the generated files: the PrometheusRule for the Prometheus Operator.

prometheus_rule(rule_files())  -> a monitoring.coreos.com/v1 PrometheusRule whose spec.groups are
the groups of alerts/headroom-recording.rules.yaml and alerts/headroom-alerts.rules.yaml, unchanged
(so promtool's tests of those files cover it), labelled for an operator's ruleSelector.
"""

from __future__ import annotations

from typing import Any

import yaml

__all__ = ["prometheus_rule", "PROMETHEUS_RULE_FILE"]

PROMETHEUS_RULE_FILE = "prometheusrule.yaml"


def prometheus_rule(
    rule_files: dict[str, str], *, name: str = "llm-headroom", namespace: str | None = None
) -> dict[str, Any]:
    """One PrometheusRule holding every group of `rule_files` (file name -> rules YAML), in file order."""
    groups = [group for _, text in sorted(rule_files.items()) for group in yaml.safe_load(text)["groups"]]
    metadata: dict[str, Any] = {
        "name": name,
        "labels": {"app.kubernetes.io/part-of": "llm-headroom", "role": "alert-rules"},
    }
    if namespace:
        metadata["namespace"] = namespace
    return {
        "apiVersion": "monitoring.coreos.com/v1",
        "kind": "PrometheusRule",
        "metadata": metadata,
        "spec": {"groups": groups},
    }
