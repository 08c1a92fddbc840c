"""What every headroom /metrics page carries besides its own metrics: build info, no `_created`.

registry = new_registry()
-> a CollectorRegistry exporting headroom_build_info{version="0.1.0"} 1, in a process where
   counters and histograms no longer export `_created` series (they double the series count
   and no query of ours reads them; prometheus_client.disable_created_metrics()).
"""

from __future__ import annotations

from collections.abc import Iterable

from prometheus_client import CollectorRegistry, disable_created_metrics
from prometheus_client.core import GaugeMetricFamily, Metric

from collector import __version__
from collector.catalog import spec

__all__ = ["new_registry", "BuildInfo"]


class BuildInfo:
    """headroom_build_info{version} 1: which release is running, for joins and upgrade checks."""

    def collect(self) -> Iterable[Metric]:
        entry = spec("headroom_build_info")
        family = GaugeMetricFamily(entry.name, entry.help, labels=entry.labels)
        family.add_metric((__version__,), 1.0)
        yield family


def new_registry() -> CollectorRegistry:
    """A registry for a served /metrics: build info registered, `_created` series off process-wide."""
    disable_created_metrics()  # type: ignore[no-untyped-call]  # prometheus_client is untyped here
    registry = CollectorRegistry()
    registry.register(BuildInfo())
    return registry
