"""The lifecycle tracker: live request state, its transitions and one row per request (what it
exports at scrape time, gauges, counters and histograms, is collector.sidecar.exported).

Lifecycle (docs/design.md §4.2): admit -> first byte -> first token -> generated chunks -> exactly one
terminal transition. The gauges are not incremented and decremented: they are *computed* at scrape
time from the set of live requests, so a request that leaves the set (by its one idempotent
`finish`) can never leak a gauge. Everything here runs on the event loop thread; the per-read
method `relayed` is a few additions and comparisons. A request's state and the record it becomes
are collector.sidecar.live. Label values come from the SeriesBudget at
admission (collector.sidecar.series), which keeps the whole exposition within --max-series.
`headroom probe`'s load (header x-headroom-source: probe) is counted and timed under
source="probe", everything else under the tracker's source ("traffic"): the generated SLO and
latency rules read `source!="probe"`, so a probe run past the knee never burns the SLO.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from typing import Any

from prometheus_client import CollectorRegistry

from collector.catalog import spec
from collector.engine_timings import engine_timings
from collector.goodput import PRESETS, RequestSlo
from collector.inflight import Inflight
from collector.record import OUTCOMES, RequestRecord
from collector.sidecar.adapters import AdapterMap
from collector.sidecar.exported import TrackerMetrics
from collector.sidecar.exposition import CounterVec, HistogramVec
from collector.sidecar.live import LiveRequest, finished_record
from collector.sidecar.series import SeriesBudget
from collector.sidecar.tracecontext import Telemetry

__all__ = ["Tracker", "OUTCOMES"]

log = logging.getLogger(__name__)


class Tracker:
    """Owns the live set and the per-request metrics; `finish` turns a request into one record."""

    def __init__(
        self,
        registry: CollectorRegistry,
        *,
        instance: str,
        source: str = "traffic",
        run_id: str | None = None,
        budget: SeriesBudget | None = None,
        adapters: AdapterMap | None = None,
        slo: RequestSlo = PRESETS["default"],
    ) -> None:
        self.instance, self.source, self.run_id = instance, source, run_id
        self.slo = slo  # what a request without SLO headers is judged by (collector.goodput)
        # the engine's replica class for the rows, asked until it is decided (the wiring sets it:
        # collector.sidecar.replica)
        self.replica_class_of: Callable[[], str | None] | None = None
        self._replica_class: str | None = None
        self.budget = budget if budget is not None else SeriesBudget()
        self.adapters = adapters if adapters is not None else AdapterMap()
        self.live: dict[str, LiveRequest] = {}
        self.load = Inflight()  # running sums, for the admission snapshot in O(1)
        self._label_sets: set[tuple[str, str]] = set()
        self._task_label_sets: set[tuple[str, str]] = set()
        self._row_sinks: list[Callable[[RequestRecord], None]] = []
        self._span_sinks: list[Callable[[RequestRecord, Telemetry | None], None]] = []
        self.requests = CounterVec(spec("headroom_requests_total"))
        self.prompt_tokens = CounterVec(spec("headroom_prompt_tokens_total"))
        self.generated_tokens = CounterVec(spec("headroom_generated_tokens_total"))
        self.ttft = HistogramVec(spec("headroom_time_to_first_token_seconds"))
        self.tpot = HistogramVec(spec("headroom_time_per_output_token_seconds"))
        self.duration = HistogramVec(spec("headroom_request_duration_seconds"))
        self.retries = CounterVec(spec("headroom_upstream_retries_total"))
        self.failures = CounterVec(spec("headroom_upstream_failures_total"))
        self.probe_marks_ignored = CounterVec(spec("headroom_probe_marks_ignored_total"))
        self.overhead_family = HistogramVec(spec("headroom_proxy_overhead_seconds"))
        self.overhead = self.overhead_family.labels()
        self.slo_requests = CounterVec(spec("headroom_slo_requests_total"))
        self.task_slo_requests = CounterVec(spec("headroom_task_slo_requests_total"))
        self.good_tokens = CounterVec(spec("headroom_slo_good_tokens_total"))
        self.slo_headers_ignored_family = CounterVec(spec("headroom_slo_headers_ignored_total"))
        self.slo_headers_ignored = self.slo_headers_ignored_family.labels()
        self.engine_queue = HistogramVec(spec("headroom_engine_queue_seconds"))
        self.engine_prefill = HistogramVec(spec("headroom_engine_prefill_seconds"))
        self.engine_decode = HistogramVec(spec("headroom_engine_decode_seconds"))
        self.engine_prompt_tokens = CounterVec(spec("headroom_engine_prompt_tokens_total"))
        self.short_family = CounterVec(spec("headroom_output_short_total"))
        self.short = self.short_family.labels()
        self.hop_family = HistogramVec(spec("headroom_sidecar_hop_seconds"))
        self.hop = self.hop_family.labels()
        self.exported = TrackerMetrics(self)  # the /metrics side: collector.sidecar.exported
        registry.register(self.exported)

    @property
    def active_tokens_total(self) -> int:
        """Σ active tokens of the live requests."""
        return self.load.tokens

    def model_tenant_labels(self) -> frozenset[tuple[str, str]]:
        """Every (model, tenant) label pair admitted so far, idle ones included: a copy, so it can
        be read from another thread (the fleet publisher's) while requests are admitted."""
        return frozenset(self._label_sets)

    def model_task_labels(self) -> frozenset[tuple[str, str]]:
        """Every (model, task class) label pair admitted so far, idle ones included (a copy)."""
        return frozenset(self._task_label_sets)

    def models_seen(self) -> set[str]:
        """The model labels of every request admitted so far (none empty)."""
        return {model for model, _ in self.model_tenant_labels() if model}

    def add_row_sink(self, sink: Callable[[RequestRecord], None]) -> None:
        """Call `sink(record)` once per finished request (must not block)."""
        self._row_sinks.append(sink)

    def add_span_sink(self, sink: Callable[[RequestRecord, Telemetry | None], None]) -> None:
        """Call `sink(record, telemetry)` once per finished request: the span exporter, which also
        needs the request's trace context and response facts (never part of the record)."""
        self._span_sinks.append(sink)

    # --- lifecycle ----------------------------------------------------------------------------
    def admit(self, request: LiveRequest) -> None:
        """Admitted: label values from the budget; inflight += 1, active_tokens += prompt estimate;
        snapshot both, self included. A `model` that names a LoRA adapter counts as its base model."""
        request.model, request.adapter = self.adapters.resolve(request.model)
        request.model_label, request.tenant_label = self.budget.labels(request.model, request.tenant)
        if request.adapter is not None:
            request.adapter_label = self.budget.adapter_label(request.model_label, request.adapter)
        request.task_class_label = self.budget.task_label(request.model_label, request.task_class_label)
        request.source_label = self.budget.source_label(
            request.model_label, request.tenant_label, request.source or self.source
        )
        self.live[request.request_id] = request
        request.inflight_at_admit, request.active_tokens_at_admit = self.load.admit(request.prompt_tokens)
        self._label_sets.add((request.model_label, request.tenant_label))
        self._task_label_sets.add((request.model_label, request.task_class_label))

    def responded(self, request: LiveRequest, status_code: int) -> None:
        """The upstream's status line and headers arrived: first byte, and the status."""
        if request.first_byte_mono is None:
            request.first_byte_mono = time.monotonic()
        request.status_code = status_code

    def retried(self, request: LiveRequest, reason: str) -> None:
        """The request was sent again on a fresh connection after a stale pooled one failed."""
        request.upstream_retries += 1
        self.retries.labels(reason).inc()

    def sending(self, request: LiveRequest, read_at: float) -> None:
        """The request is written upstream now; the sidecar worked on it since `read_at` (its body
        read): the end of the sidecar's hop."""
        now = request.sent_mono = time.monotonic()
        request.overhead_s += now - read_at

    def relayed(self, request: LiveRequest, tokens: int, began: float, now: float) -> None:
        """One upstream read was relayed at `now`, carrying `tokens` (the first such read stamps
        TTFT, the second the time to second token), read from `began` on (the sidecar's own
        work): the relay's only call into the tracker per read."""
        if tokens:
            last = request.last_token_mono
            if last is None:
                request.first_token_mono = now
            else:
                if now - last > request.itl_max:
                    request.itl_max = now - last
                if request.second_token_mono is None:
                    request.second_token_mono = now
            request.last_token_mono = now
            request.generated_tokens += tokens
            self.load.tokens += tokens  # Inflight.generated, inlined: this runs at every read
        request.overhead_s += now - began

    def spent(self, request: LiveRequest, seconds: float) -> None:
        """The sidecar itself worked `seconds` on this request (headroom_proxy_overhead_seconds)."""
        request.overhead_s += seconds

    def reported_usage(self, request: LiveRequest, usage: dict[str, Any]) -> None:
        """The upstream's `usage` object (cumulative: the latest replaces any earlier one)."""
        request.usage = usage

    def reported_timings(self, request: LiveRequest, timings: object, metrics: object) -> None:
        """The engine's own timings in its answer: llama.cpp's `timings` or vLLM's `metrics` object
        (the latest replaces any earlier one; anything but an object is ignored)."""
        said = engine_timings(timings, metrics)
        if said is not None:
            request.engine = said

    def judged_by(self, request: LiveRequest, slo: RequestSlo, malformed: bool) -> None:
        """`request` is judged by `slo` (the tracker's narrowed by its headers); `malformed`: a
        header it sent was ignored (counted)."""
        request.slo = slo
        if malformed:
            self.slo_headers_ignored.inc()

    def finish(
        self,
        request: LiveRequest,
        outcome: str,
        *,
        status_code: int | None = None,
        error: str | None = None,
        failure: str | None = None,
    ) -> RequestRecord | None:
        """Terminal transition, exactly once: leave the live set, count, observe, emit the record.

        `failure` is the failure class of an exchange that failed where no upstream status says
        so (collector.sidecar.ending.FAILURES), counted once in headroom_upstream_failures_total.
        Later calls return None and change nothing. Synchronous on purpose: it must complete
        inside a `finally` while the task is being cancelled.
        """
        if request.done:
            return None
        request.done = True
        if failure is not None:
            self.failures.labels(failure).inc()
            request.failure = failure
        completed_mono = time.monotonic()
        if self.live.pop(request.request_id, None) is not None:
            self.load.release(request.active_tokens)
        request.outcome = outcome
        request.status_code = status_code if status_code is not None else request.status_code
        request.error = error or request.error
        record = self._record(request, completed_mono)
        self._observe(request, record)
        for span_sink in self._span_sinks:
            try:
                span_sink(record, request.telemetry)
            except Exception:  # a tracing bug must not cut the client's stream or starve others
                log.exception("span sink %r failed", span_sink)
        for sink in self._row_sinks:
            try:
                sink(record)
            except Exception:  # an exporter's bug must not cut the client's stream or starve others
                log.exception("request-log row sink %r failed", sink)
        return record

    # --- internals ----------------------------------------------------------------------------
    def _record(self, request: LiveRequest, completed_mono: float) -> RequestRecord:
        return finished_record(
            request,
            completed_mono,
            source=self.source,
            run_id=self.run_id,
            instance=self.instance,
            replica_class=self._replica_class or self._decided_class(),
            slo=self.slo,
        )

    def _decided_class(self) -> str | None:
        if self.replica_class_of is not None:
            self._replica_class = self.replica_class_of()
        return self._replica_class

    def _observe(self, request: LiveRequest, record: RequestRecord) -> None:
        model, tenant, outcome = request.model_label, request.tenant_label, record.outcome or ""
        self.prompt_tokens.labels(model, tenant).inc(record.prompt_tokens or 0)
        self.generated_tokens.labels(model, tenant).inc(record.completion_tokens or 0)
        self.overhead.observe(request.overhead_s)
        if record.output_short:
            self.short.inc()
        source = request.source_label  # probe load is source="probe": the SLO rules leave it out
        if source is None:
            return  # probe load past the series budget: never exported as traffic
        self.requests.labels(model, tenant, outcome, source).inc()
        self.duration.labels(model, outcome, source).observe(record.e2e_s or 0.0)
        if record.ttft_s is not None:
            self.ttft.labels(model, source).observe(record.ttft_s)
        if record.tpot_s is not None:
            self.tpot.labels(model, source).observe(record.tpot_s)
        if source == "traffic":
            self._observe_traffic(request, record)

    def _observe_traffic(self, request: LiveRequest, record: RequestRecord) -> None:
        """Goodput and the engine's split, for client traffic only (a probe judges its own load)."""
        model, judged = request.model_label, record.verdict or "error"
        self.slo_requests.labels(model, request.tenant_label, judged).inc()
        self.task_slo_requests.labels(model, request.task_class_label, judged).inc()
        if judged == "met":
            self.good_tokens.labels(model, request.tenant_label).inc(record.completion_tokens or 0)
        if record.sidecar_hop_s is not None:
            self.hop.observe(record.sidecar_hop_s)
        if record.engine_timings is None:
            return
        if record.engine_queue_s is not None:
            self.engine_queue.labels(model).observe(record.engine_queue_s)
        if record.engine_decode_s is not None:
            self.engine_decode.labels(model).observe(record.engine_decode_s)
        prefill, computed = record.engine_prefill_s, record.engine_prompt_computed
        if prefill is not None and computed is not None:  # together: their ratio is V_P
            self.engine_prefill.labels(model).observe(prefill)
            self.engine_prompt_tokens.labels(model, "computed").inc(computed)
            self.engine_prompt_tokens.labels(model, "cached").inc(record.engine_prompt_cached or 0)
