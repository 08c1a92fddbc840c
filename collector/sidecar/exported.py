"""What the lifecycle tracker exports: the live gauges computed at scrape time, the counters and
histograms, for MetricsPage (text kept per series) and for a registry (collector.sidecar.tracker
keeps the state; this module only reads it)."""

from __future__ import annotations

import time
from collections.abc import Iterable
from typing import TYPE_CHECKING

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric

from collector.catalog import INFLIGHT_AGE_BOUNDS, spec
from collector.sidecar.exposition import CounterVec, HistogramVec, MetricsPage, gauge_text, number_text

if TYPE_CHECKING:  # the tracker builds its TrackerMetrics: a runtime import would be circular
    from collector.sidecar.tracker import Tracker

__all__ = ["TrackerMetrics"]


def _ages(
    tasks: Iterable[tuple[str, str]],
    oldest_admitted: dict[tuple[str, str], float],
    admissions: dict[str, list[float]],
) -> tuple[dict[tuple[str, ...], float], dict[tuple[str, ...], float]]:
    """(oldest age per (model, task class), requests older than each bound per model), at now.

    Every (model, task class) pair ever seen exports (0 while none is in flight), and every model
    of those pairs exports each bound, like the other live gauges.
    """
    now = time.monotonic()
    oldest: dict[tuple[str, ...], float] = dict.fromkeys(tasks, 0.0)
    for task, admitted in oldest_admitted.items():
        oldest[task] = max(0.0, now - admitted)
    older: dict[tuple[str, ...], float] = {}
    for model in {model for model, _ in oldest}:
        times = admissions.get(model, ())
        for label, bound in INFLIGHT_AGE_BOUNDS:
            older[(model, label)] = sum(1 for admitted in times if now - admitted > bound)
    return oldest, older


class TrackerMetrics:
    """Everything the tracker exports, for MetricsPage (text kept per series) and for a registry.

    headroom_inflight_requests and headroom_active_tokens (and the per-task-class pair) are summed
    from the live set on each scrape; every label pair ever seen keeps exporting (0 when idle), so
    dashboards show a drop to zero instead of a vanished series, and before the first request one
    series at 0 exports. The age of what is in flight comes from the same pass over the live set:
    the oldest request's age per (model, task class) and the requests older than each of
    INFLIGHT_AGE_BOUNDS per model. Nothing of it is kept per request or per chunk: admission
    already stamps `admitted_mono`. The counters and histograms keep their text per child.
    """

    def __init__(self, tracker: Tracker) -> None:
        self._tracker = tracker
        self._gauges = tuple(
            spec(name)
            for name in (
                "headroom_inflight_requests",
                "headroom_active_tokens",
                "headroom_task_inflight_requests",
                "headroom_task_active_tokens",
                "headroom_inflight_oldest_age_seconds",
                "headroom_inflight_older_than_requests",
            )
        )
        self._folded = spec("headroom_label_values_folded_total")
        # label parts per gauge, kept across scrapes
        self._prefixes: tuple[dict[tuple[str, ...], str], ...] = ({}, {}, {}, {}, {}, {})

    def _live(self) -> tuple[dict[tuple[str, ...], float], ...]:
        """In-flight requests and active tokens per (model, tenant), then per (model, task class),
        the oldest age per (model, task class) and the requests past each age bound per model."""
        tracker = self._tracker
        pairs = tracker.model_tenant_labels() or {("", "")}  # before any request: one series at 0
        tasks = tracker.model_task_labels() or {("", "")}
        inflight: dict[tuple[str, ...], float] = dict.fromkeys(pairs, 0)
        tokens: dict[tuple[str, ...], float] = dict.fromkeys(pairs, 0)
        task_inflight: dict[tuple[str, ...], float] = dict.fromkeys(tasks, 0)
        task_tokens: dict[tuple[str, ...], float] = dict.fromkeys(tasks, 0)
        oldest_admitted: dict[tuple[str, str], float] = {}
        admissions: dict[str, list[float]] = {}
        for request in list(tracker.live.values()):
            key = (request.model_label, request.tenant_label)
            task = (request.model_label, request.task_class_label)
            weight = request.active_tokens
            inflight[key] = inflight.get(key, 0) + 1
            tokens[key] = tokens.get(key, 0) + weight
            task_inflight[task] = task_inflight.get(task, 0) + 1
            task_tokens[task] = task_tokens.get(task, 0) + weight
            admitted = request.admitted_mono
            if admitted < oldest_admitted.get(task, float("inf")):
                oldest_admitted[task] = admitted
            admissions.setdefault(request.model_label, []).append(admitted)
        return inflight, tokens, task_inflight, task_tokens, *_ages(tasks, oldest_admitted, admissions)

    def _vecs(self) -> tuple[CounterVec | HistogramVec, ...]:
        t = self._tracker
        return (
            t.requests,
            t.prompt_tokens,
            t.generated_tokens,
            t.ttft,
            t.tpot,
            t.duration,
            t.retries,
            t.failures,
            t.probe_marks_ignored,
            t.overhead_family,
            t.slo_requests,
            t.task_slo_requests,
            t.good_tokens,
            t.slo_headers_ignored_family,
            t.engine_queue,
            t.engine_prefill,
            t.engine_decode,
            t.engine_prompt_tokens,
            t.hop_family,
            t.short_family,
        )

    def text(self) -> str:
        """The tracker's part of the /metrics page."""
        folded = self._folded
        parts = [
            gauge_text(entry, values, prefixes)
            for entry, values, prefixes in zip(self._gauges, self._live(), self._prefixes, strict=True)
        ]
        parts += [vec.text() for vec in self._vecs()]
        parts.append(
            f"# HELP {folded.name} {folded.help}\n# TYPE {folded.name} counter\n"
            + "".join(
                f'{folded.name}{{label="{label}"}} {number_text(count)}\n'
                for label, count in sorted(self._tracker.budget.folded.items())
            )
        )
        return "".join(parts)

    def collect(self) -> Iterable[Metric]:
        """The same series as metric families (nothing while MetricsPage renders: text() has them)."""
        if MetricsPage.rendering():
            return
        for entry, values in zip(self._gauges, self._live(), strict=True):
            family = GaugeMetricFamily(entry.name, entry.help, labels=entry.labels)
            for key in sorted(values):
                family.add_metric(key, values[key])
            yield family
        for vec in self._vecs():
            yield vec.family()
        counter = CounterMetricFamily(
            self._folded.name.removesuffix("_total"), self._folded.help, labels=self._folded.labels
        )
        for label, count in sorted(self._tracker.budget.folded.items()):
            counter.add_metric([label], count)
        yield counter
