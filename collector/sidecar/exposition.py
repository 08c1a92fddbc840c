"""The per-request metrics and the /metrics page: text kept per series, rebuilt only when it changed.

prometheus_client builds every sample of every child afresh on each scrape (a namedtuple per
bucket, label names validated and escaped each time), on the event loop; here each series child
keeps its rendered lines, with the label part formatted once when the child is created, and only a
child that was updated since the last scrape formats its numbers again (BENCHMARKS.md §6). The live gauges, which change all the time, are summed
from the live set on each scrape with cached label parts.

`CounterVec` and `HistogramVec` are what the tracker updates (event loop only: no locks);
`collect()` yields the same series as prometheus_client metric families, so a CollectorRegistry
(`get_sample_value`, `generate_latest`) still sees them. `MetricsPage.render()` is the /metrics
body: these families from their cache, then everything else in the registry from prometheus_client.

Example: CounterVec(spec("headroom_requests_total")).labels("m", "t", "ok").inc() renders as
    headroom_requests_total{model="m",tenant="t",outcome="ok"} 1.0
"""

from __future__ import annotations

import asyncio
import bisect
import contextvars
import math
from collections.abc import Iterable
from typing import Any, Generic, TypeVar, cast

from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.core import CounterMetricFamily, HistogramMetricFamily, Metric
from prometheus_client.utils import floatToGoString as _float_to_go_string

from collector.catalog import MetricSpec

__all__ = ["CounterVec", "HistogramVec", "MetricsPage", "label_text", "number_text", "gauge_text"]

_RENDERING = contextvars.ContextVar("headroom_rendering_page", default=False)


def floatToGoString(value: float) -> str:  # noqa: N802 -- prometheus_client's name, typed
    return cast(str, _float_to_go_string(value))  # type: ignore[no-untyped-call]


def _escape(value: str) -> str:
    return value.replace("\\", r"\\").replace("\n", r"\n").replace('"', r"\"")


def label_text(names: Iterable[str], values: Iterable[str]) -> str:
    """'model="m",tenant="a\\"b"' for names (model, tenant) and values (m, a"b): escaped once,
    sorted by label name as prometheus_client writes them (the page reads the same either way)."""
    pairs = sorted(zip(names, values, strict=True))
    return ",".join(f'{name}="{_escape(value)}"' for name, value in pairs)


def number_text(value: float) -> str:
    """A sample value as the text format writes it: 3 -> '3.0', inf -> '+Inf'."""
    value = float(value)
    return repr(value) if math.isfinite(value) else floatToGoString(value)


def _header(entry: MetricSpec, name: str) -> str:
    help_text = entry.help.replace("\\", r"\\").replace("\n", r"\n")
    return f"# HELP {name} {help_text}\n# TYPE {name} {entry.type}\n"


class _Counter:
    __slots__ = ("value", "_prefix", "_text")

    def __init__(self, prefix: str) -> None:
        self.value, self._prefix = 0.0, prefix
        self._text: str | None = None

    def inc(self, amount: float = 1.0) -> None:
        self.value += amount
        self._text = None

    def text(self) -> str:
        if self._text is None:
            self._text = f"{self._prefix} {number_text(self.value)}\n"
        return self._text


class _Histogram:
    __slots__ = ("counts", "sum", "_bounds", "_prefixes", "_text")

    def __init__(self, bounds: tuple[float, ...], prefixes: list[str]) -> None:
        self.counts = [0] * (len(bounds) + 1)  # per bucket (not cumulative); the last is +Inf
        self.sum, self._bounds, self._prefixes = 0.0, bounds, prefixes
        self._text: str | None = None

    def observe(self, value: float) -> None:
        self.counts[bisect.bisect_left(self._bounds, value)] += 1  # le: value <= bound
        self.sum += value
        self._text = None

    def text(self) -> str:
        if self._text is None:
            total, lines = 0, []
            for prefix, count in zip(self._prefixes, self.counts):
                total += count
                lines.append(f"{prefix} {total}.0\n")
            lines.append(f"{self._prefixes[-2]} {total}.0\n{self._prefixes[-1]} {number_text(self.sum)}\n")
            self._text = "".join(lines)
        return self._text


_Child = TypeVar("_Child", _Counter, _Histogram)


class _Vec(Generic[_Child]):
    """A metric family: its spec, and one child per label-value tuple, created on first use."""

    def __init__(self, entry: MetricSpec) -> None:
        self.spec = entry
        self.children: dict[tuple[str, ...], _Child] = {}
        self._head = _header(entry, entry.name)

    def _new(self, values: tuple[str, ...]) -> _Child:
        raise NotImplementedError

    def labels(self, *values: str) -> _Child:
        """The child for these label values (in the spec's label order), created on first use."""
        child = self.children.get(values)
        if child is None:
            child = self.children[values] = self._new(values)
        return child

    def text(self) -> str:
        children = list(self.children.values())  # a copy: a scrape may run beside an update
        if not children:
            return ""
        return self._head + "".join(child.text() for child in children)


class CounterVec(_Vec[_Counter]):
    """A counter family; `labels(...).inc(n)`."""

    def _new(self, values: tuple[str, ...]) -> _Counter:
        labels = label_text(self.spec.labels, values)
        return _Counter(f"{self.spec.name}{{{labels}}}" if labels else self.spec.name)

    def family(self) -> Metric:
        family = CounterMetricFamily(
            self.spec.name.removesuffix("_total"), self.spec.help, labels=self.spec.labels
        )
        for values, child in list(self.children.items()):
            family.add_metric(values, child.value)
        return family


class HistogramVec(_Vec[_Histogram]):
    """A histogram family with the spec's buckets; `labels(...).observe(seconds)`."""

    def __init__(self, entry: MetricSpec) -> None:
        super().__init__(entry)
        self._bounds = tuple(entry.buckets)
        self._le = [floatToGoString(bound) for bound in self._bounds] + ["+Inf"]

    def _new(self, values: tuple[str, ...]) -> _Histogram:
        labels = label_text(self.spec.labels, values)
        braces = f"{{{labels}}}" if labels else ""
        names = (*self.spec.labels, "le")
        prefixes = [f"{self.spec.name}_bucket{{{label_text(names, (*values, le))}}}" for le in self._le]
        prefixes += [f"{self.spec.name}_count{braces}", f"{self.spec.name}_sum{braces}"]
        return _Histogram(self._bounds, prefixes)

    def family(self) -> Metric:
        family = HistogramMetricFamily(self.spec.name, self.spec.help, labels=self.spec.labels)
        for values, child in list(self.children.items()):
            cumulative, buckets = 0, []
            for le, count in zip(self._le, child.counts):
                cumulative += count
                buckets.append((le, cumulative))
            family.add_metric(list(values), buckets, child.sum)
        return family


class MetricsPage:
    """The /metrics body: `fast` collectors from their own text, the rest of `registry` as usual.

    A fast collector has `text() -> str` and a `collect()` that yields nothing while a page is
    being rendered (it checks `rendering()`), so the registry never formats it twice.
    """

    def __init__(self, registry: CollectorRegistry, fast: Iterable[Any]) -> None:
        self.registry, self.fast = registry, list(fast)

    async def render(self) -> bytes:
        """The whole exposition, in the text format (version 0.0.4): the fast collectors' text on
        the event loop, where they are updated (a consistent page), then the rest of the registry
        in a worker thread, so a slow collector holds only the scrape, never the proxy."""
        fast = "".join(collector.text() for collector in self.fast).encode()
        return fast + await asyncio.to_thread(self._rest)

    def _rest(self) -> bytes:
        token = _RENDERING.set(True)
        try:
            return bytes(generate_latest(self.registry))
        finally:
            _RENDERING.reset(token)

    @staticmethod
    def rendering() -> bool:
        """True inside render(): fast collectors then leave their families to text()."""
        return _RENDERING.get()


def gauge_text(
    entry: MetricSpec, values: dict[tuple[str, ...], float], prefix_cache: dict[tuple[str, ...], str]
) -> str:
    """A gauge family from `values`, label parts cached in `prefix_cache` across scrapes."""
    lines = [_header(entry, entry.name)]
    for key in sorted(values):
        prefix = prefix_cache.get(key)
        if prefix is None:
            prefix = prefix_cache[key] = f"{entry.name}{{{label_text(entry.labels, key)}}}"
        lines.append(f"{prefix} {number_text(values[key])}\n")
    return "".join(lines)
