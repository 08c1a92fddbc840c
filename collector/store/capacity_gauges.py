"""CapacityGauges: the latest capacity estimate per model, exported as headroom_capacity_*.

The sidecar and the store service both export it from their own /metrics.

The store's capacity-refresh job (or a probe) calls `set`; alert rules compare live concurrency
with these values instead of hard-coded numbers. A model with no estimate exports nothing, so
those alerts stay silent until there is evidence.
"""

from __future__ import annotations

import threading
from collections.abc import Iterable

from prometheus_client.core import GaugeMetricFamily, Metric

from collector.catalog import spec

__all__ = ["CapacityGauges", "CALIBERS"]

CALIBERS = ("requests", "tokens")
_FIELDS = {
    "knee": "headroom_capacity_knee",
    "slo_max": "headroom_capacity_slo_max",
    "recommended_pool": "headroom_capacity_recommended_pool",
}


class CapacityGauges:
    """Thread-safe holder of {(model, caliber): {field: value}}; a prometheus-client collector."""

    def __init__(self) -> None:
        self._values: dict[tuple[str, str], dict[str, float]] = {}
        self._lock = threading.Lock()

    def set(self, model: str, caliber: str, *, knee: float | None = None,
            slo_max: float | None = None, recommended_pool: float | None = None) -> None:
        """Replace the estimate for (model, caliber); None leaves that gauge out."""
        if caliber not in CALIBERS:
            raise ValueError(f"caliber {caliber!r} is not one of {CALIBERS}")
        values = {"knee": knee, "slo_max": slo_max, "recommended_pool": recommended_pool}
        with self._lock:
            self._values[(model, caliber)] = {k: float(v) for k, v in values.items() if v is not None}

    def clear(self) -> None:
        """Forget every estimate."""
        with self._lock:
            self._values.clear()

    def get(self, model: str, caliber: str) -> dict[str, float]:
        """The current values for (model, caliber), e.g. {'knee': 8.0, 'recommended_pool': 5.0}."""
        with self._lock:
            return dict(self._values.get((model, caliber), {}))

    def collect(self) -> Iterable[Metric]:
        with self._lock:
            items = sorted(self._values.items())
        for field, name in _FIELDS.items():
            entry = spec(name)
            family = GaugeMetricFamily(name, entry.help, labels=entry.labels)
            for (model, caliber), values in items:
                if field in values:
                    family.add_metric((model, caliber), values[field])
            yield family
