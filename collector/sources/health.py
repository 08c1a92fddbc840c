"""SourceHealth: one collector over every source, with each source's scrape health beside its metrics.

Every source (the engine poller, the GPU) exports its own families and says how its latest
collection went (`last_scrape`); this wrapper adds, once for all of them,

    headroom_source_scrape_success{source="engine"} 1.0
    headroom_source_scrape_success{source="gpu"} 0.0
    headroom_source_scrape_duration_seconds{source="engine"} 0.004
    headroom_signal_valid{source="engine",signal="kv_usage",reason="ok"} 1.0   (a source's `integrity`)

so the exposition carries one HELP line per family however many sources there are (a repeated
HELP line is invalid exposition, and promtool rejects it).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Protocol

from prometheus_client.core import GaugeMetricFamily, Metric

from collector.catalog import spec

__all__ = ["ScrapeHealth", "Source", "SourceHealth"]


@dataclass(frozen=True)
class ScrapeHealth:
    """How a source's latest collection went; `duration_s` is None before the first one."""

    success: bool
    duration_s: float | None


class Source(Protocol):
    """What SourceHealth wraps: a prometheus-client collector that reports its own scrape."""

    source: str  # the `source` label value, e.g. "engine" or "gpu"

    def collect(self) -> Iterable[Metric]: ...

    @property
    def last_scrape(self) -> ScrapeHealth: ...


class SourceHealth:
    """prometheus-client collector: every source's families, then the two scrape-health families."""

    def __init__(self, sources: Sequence[Source]) -> None:
        self.sources = list(sources)

    def collect(self) -> list[Metric]:
        """Fresh families per scrape: each source's (collected first), then success and duration."""
        families: list[Metric] = []
        success = _gauge("headroom_source_scrape_success")
        duration = _gauge("headroom_source_scrape_duration_seconds")
        valid = _gauge("headroom_signal_valid")
        for source in self.sources:
            families.extend(source.collect())
            health = source.last_scrape
            success.add_metric([source.source], 1.0 if health.success else 0.0)
            if health.duration_s is not None:
                duration.add_metric([source.source], health.duration_s)
            integrity = getattr(source, "integrity", None)  # the engine's (SignalIntegrity)
            for signal, reason, value in integrity.valid() if integrity is not None else ():
                valid.add_metric([source.source, signal, reason], value)
        return families + [family for family in (success, duration, valid) if family.samples]


def _gauge(name: str) -> GaugeMetricFamily:
    entry = spec(name)
    return GaugeMetricFamily(name, entry.help, labels=list(entry.labels))
