"""CapacityGauges: the published capacity per model, task class and replica class (headroom_capacity_*).

Each sidecar exports it from its own /metrics (in a fleet, from the fleet's estimates table:
collector.lake.estimates). Whatever decides the
published estimate (collector.store.decision) hands it the estimates (collector.capacity); alert rules
compare live concurrency with these values instead of hard-coded numbers. A model with no
published estimate exports nothing, so those alerts stay silent until there is evidence.

A knee belongs to a replica class (model x hardware x engine configuration, docs/domain.md §14): a model
on H100 and L40S replicas publishes two knees, and the rules compare each sidecar with its own
class's (the sidecar says its class in headroom_replica_info). One unit per metric name, and every
series says where its number came from:

    headroom_capacity_knee_requests{model, task_class, replica_class, source, confidence}  8
    headroom_capacity_knee_tokens{...}                                             9000
    headroom_capacity_knee_tokens_p95{...}                                        11200
    headroom_capacity_slo_max_requests{...} / _tokens{...}
    headroom_capacity_recommended_pool_requests{...}                                  5
    headroom_capacity_recommended_pool_tokens{...}                                 9800
    headroom_capacity_rate_requests_per_second{...}                                 9.5
    headroom_capacity_prefill_tokens_per_second{...}                                380
    headroom_capacity_estimate_timestamp_seconds{...}                      1796100000.0
"""

from __future__ import annotations

import re
import threading
from collections.abc import Iterable, Sequence

from prometheus_client.core import GaugeMetricFamily, Metric

from collector.capacity import ALL_TASKS, DEFAULT_REPLICA_CLASS, CapacityEstimate
from collector.catalog import spec

__all__ = [
    "CapacityGauges",
    "CALIBERS",
    "check_replica_class",
]

CALIBERS = ("requests", "tokens")
_CLASS_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,62}$")
_CURRENT = {  # metric name -> CapacityEstimate attribute
    "headroom_capacity_knee_requests": "knee_requests",
    "headroom_capacity_knee_tokens": "knee_tokens",
    "headroom_capacity_knee_tokens_p95": "knee_tokens_p95",
    "headroom_capacity_slo_max_requests": "slo_max_requests",
    "headroom_capacity_slo_max_tokens": "slo_max_tokens",
    "headroom_capacity_recommended_pool_requests": "recommended_pool",
    "headroom_capacity_recommended_pool_tokens": "recommended_pool_tokens",
    "headroom_capacity_rate_requests_per_second": "rate_requests_per_s",
    "headroom_capacity_prefill_tokens_per_second": "prefill_tokens_per_s",
    "headroom_capacity_estimate_timestamp_seconds": "estimated_at",
}


def check_replica_class(value: str) -> str:
    """`value` when it is a usable replica class name (a label value, a Kubernetes-friendly part of
    a name), else ValueError naming the rule."""
    if not _CLASS_NAME.match(value):
        raise ValueError(
            f"--replica-class {value!r} is not a class name: 1 to 63 letters, digits, '.', '_' or "
            "'-', starting with a letter or digit (e.g. h100-tp1, l40s-slots8)"
        )
    return value


class CapacityGauges:
    """Thread-safe holder of the published estimates; a prometheus-client collector."""

    def __init__(self) -> None:
        self._published: dict[tuple[str, str, str], CapacityEstimate] = {}
        self._lock = threading.Lock()

    def replace(self, published: Sequence[CapacityEstimate]) -> None:
        """Publish exactly these estimates (one per model, task class and replica class), dropping the rest."""
        with self._lock:
            self._published = {p.key: p for p in published}

    def clear(self) -> None:
        """Publish nothing (alerts that divide by capacity go silent)."""
        self.replace(())

    def get(
        self, model: str, task_class: str = ALL_TASKS, replica_class: str = DEFAULT_REPLICA_CLASS
    ) -> CapacityEstimate | None:
        """The published estimate for (model, task class, replica class), or None."""
        with self._lock:
            return self._published.get((model, task_class, replica_class))

    def published(self) -> list[CapacityEstimate]:
        """Every published estimate, ordered by model, task class and replica class."""
        with self._lock:
            return [self._published[key] for key in sorted(self._published)]

    def collect(self) -> Iterable[Metric]:
        items = self.published()
        for name, field in _CURRENT.items():
            entry = spec(name)
            family = GaugeMetricFamily(name, entry.help, labels=entry.labels)
            for item in items:
                value = getattr(item, field)
                if value is not None:
                    family.add_metric(item.labels, float(value))
            yield family
