"""The lifecycle tracker: live request state, its transitions and one row per request (what it
exports at scrape time, gauges, counters and histograms, is collector.sidecar.exported).

Lifecycle (docs/design.md §4.2): admit -> first byte -> first token -> generated chunks -> exactly one
terminal transition. The gauges are not incremented and decremented: they are *computed* at scrape
time from the set of live requests, so a request that leaves the set (by its one idempotent
`finish`) can never leak a gauge. Everything here runs on the event loop thread; the per-chunk
method `generated` is two integer additions. Label values come from the SeriesBudget at
admission (collector.sidecar.series), which keeps the whole exposition within --max-series.
`headroom probe`'s load (header x-headroom-source: probe) is counted and timed under
source="probe", everything else under the tracker's source ("traffic"): the generated SLO and
latency rules read `source!="probe"`, so a probe run past the knee never burns the SLO.
"""

from __future__ import annotations

import itertools
import logging
import time
import uuid
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from typing import Any, NamedTuple

from prometheus_client import CollectorRegistry

from collector.catalog import spec
from collector.inflight import Inflight
from collector.record import OUTCOMES, RequestRecord, time_per_output_token
from collector.sidecar.adapters import AdapterMap
from collector.sidecar.exported import TrackerMetrics
from collector.sidecar.exposition import CounterVec, HistogramVec
from collector.sidecar.series import SeriesBudget
from collector.sidecar.tracecontext import Telemetry
from collector.tasks import UNSPECIFIED, classify, classify_finished

__all__ = ["LiveRequest", "ProbeStep", "Tracker", "OUTCOMES"]

# Request IDs: one random 64-bit prefix per process plus a counter. Unique across sidecars and
# restarts like uuid4, without an os.urandom call per request (slow in some sandboxes).
_ID_PREFIX = uuid.uuid4().hex[:16]
_ID_COUNTER = itertools.count()

log = logging.getLogger(__name__)


class ProbeStep(NamedTuple):
    """What a `headroom probe` request measures (its X-Headroom-Probe-* headers): one is set."""

    level: int | None  # the closed-loop concurrency level
    rate_per_s: float | None  # the open-loop offered rate
    warmup: bool  # sent while its level warms up: not measured


class LiveRequest:
    """State of one in-flight request, changed only through its Tracker. Never any text."""

    __slots__ = (
        "request_id",
        "model",
        "model_label",
        "tenant",
        "tenant_label",
        "endpoint",
        "stream",
        "max_tokens",
        "admitted_mono",
        "admitted_wall",
        "first_byte_mono",
        "first_token_mono",
        "prompt_tokens",
        "generated_tokens",
        "usage",
        "status_code",
        "outcome",
        "error",
        "inflight_at_admit",
        "active_tokens_at_admit",
        "engine_waiting",
        "kv_usage",
        "done",
        "source",
        "source_label",
        "run_id",
        "upstream_retries",
        "task_class",
        "task_class_label",
        "telemetry",
        "overhead_s",
        "adapter",
        "adapter_label",
        "probe_step",
        "client_request_id",
        "failure",
    )

    def __init__(
        self,
        model: str,
        tenant: str,
        endpoint: str,
        stream: bool,
        max_tokens: int | None,
        prompt_tokens_estimate: int,
        *,
        model_label: str | None = None,
        tenant_label: str | None = None,
        source: str | None = None,
        run_id: str | None = None,
        request_id: str | None = None,
        engine_waiting: int | None = None,
        kv_usage: float | None = None,
        task_class: str | None = None,
        task_class_label: str | None = None,
        telemetry: Telemetry | None = None,
        probe_step: ProbeStep | None = None,
        client_request_id: str | None = None,
    ) -> None:
        self.request_id = request_id or f"{_ID_PREFIX}{next(_ID_COUNTER):016x}"
        self.client_request_id = client_request_id  # the client's X-Request-Id: a correlation id, no key
        self.failure: str | None = None  # the failure class of an exchange that failed (ending.FAILURES)
        self.model, self.tenant = model, tenant
        self.model_label = model_label or model  # capped label values; the row keeps the real ones
        self.tenant_label = tenant_label or tenant
        self.endpoint, self.stream, self.max_tokens = endpoint, stream, max_tokens
        self.admitted_mono = time.monotonic()
        self.admitted_wall = time.time()
        self.first_byte_mono: float | None = None
        self.first_token_mono: float | None = None
        self.prompt_tokens = prompt_tokens_estimate
        self.generated_tokens = 0
        self.usage: dict[str, Any] | None = None
        self.status_code: int | None = None
        self.outcome: str | None = None
        self.error: str | None = None
        self.inflight_at_admit = 0
        self.active_tokens_at_admit = 0
        self.engine_waiting, self.kv_usage = engine_waiting, kv_usage  # the latest engine scrape
        self.done = False
        self.source = source  # None: the tracker's own (traffic); 'probe' for probe load
        # the `source` label, decided at admission (None: probe load past the series budget)
        self.source_label: str | None = source or "traffic"
        self.run_id = run_id
        self.upstream_retries = 0
        # the class it declared (max_tokens), or one the probe named; the label is capped
        self.task_class = task_class or classify(max_tokens)
        self.task_class_label = task_class_label or self.task_class
        self.overhead_s = 0.0  # the sidecar's own time: admission to upstream send + every chunk
        self.telemetry = telemetry  # W3C trace context and response facts, while tracing
        self.adapter: str | None = None  # the LoRA adapter `model` named (then `model` is its base)
        self.adapter_label: str | None = None
        self.probe_step = probe_step

    @property
    def active_tokens(self) -> int:
        """This request's token-caliber weight now: prompt + generated so far."""
        return self.prompt_tokens + self.generated_tokens


def _wall(admitted_at: datetime, request: LiveRequest, mono: float | None) -> datetime | None:
    """The wall time of monotonic instant `mono`: the admission's wall time plus the interval."""
    if mono is None:
        return None
    return admitted_at + timedelta(seconds=mono - request.admitted_mono)


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
    ) -> None:
        self.instance, self.source, self.run_id = instance, source, run_id
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

    def relayed(self, request: LiveRequest, tokens: int, seconds: float) -> None:
        """One upstream read was relayed, carrying `tokens` (the first stamps TTFT), in `seconds`
        of the sidecar's own work: the relay's only call into the tracker per read."""
        if tokens:
            if request.first_token_mono is None:
                request.first_token_mono = time.monotonic()
            request.generated_tokens += tokens
            self.load.tokens += tokens  # Inflight.generated, inlined: this runs at every read
        request.overhead_s += seconds

    def spent(self, request: LiveRequest, seconds: float) -> None:
        """The sidecar itself worked `seconds` on this request (headroom_proxy_overhead_seconds)."""
        request.overhead_s += seconds

    def reported_usage(self, request: LiveRequest, usage: dict[str, Any]) -> None:
        """The upstream's `usage` object (cumulative: the latest replaces any earlier one)."""
        request.usage = usage

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
        prompt, completion, cached, usage_source = _token_counts(request)
        e2e = completed_mono - request.admitted_mono
        ttft = None if request.first_token_mono is None else request.first_token_mono - request.admitted_mono
        admitted_at = datetime.fromtimestamp(request.admitted_wall, UTC)  # once: the others add to it
        return RequestRecord(
            request_id=request.request_id,
            source=request.source or self.source,
            run_id=request.run_id or self.run_id,
            instance=self.instance,
            model=request.model,
            tenant=request.tenant,
            endpoint=request.endpoint,
            stream=request.stream,
            admitted_at=admitted_at,
            first_byte_at=_wall(admitted_at, request, request.first_byte_mono),
            first_token_at=_wall(admitted_at, request, request.first_token_mono),
            completed_at=_wall(admitted_at, request, completed_mono),
            status_code=request.status_code,
            outcome=request.outcome,
            error=request.error,
            prompt_tokens=prompt,
            cached_prompt_tokens=cached,
            completion_tokens=completion,
            max_tokens=request.max_tokens,
            usage_source=usage_source,
            ttft_s=ttft,
            tpot_s=time_per_output_token(e2e, ttft, completion),
            e2e_s=e2e,
            inflight_at_admit=request.inflight_at_admit,
            active_tokens_at_admit=request.active_tokens_at_admit,
            engine_waiting_at_admit=request.engine_waiting,
            kv_usage_at_admit=request.kv_usage,
            upstream_retries=request.upstream_retries,
            task_class=request.task_class
            if request.task_class != UNSPECIFIED
            else classify_finished(request.max_tokens, completion),
            adapter=request.adapter,
            probe_level=step.level if (step := request.probe_step) else None,
            probe_rate_per_s=step.rate_per_s if step else None,
            probe_warmup=step.warmup if step else None,
            replica_class=self._replica_class or self._decided_class(),
            client_request_id=request.client_request_id,
            failure=request.failure,
            held_prompt_tokens=request.prompt_tokens,
            held_generated_tokens=request.generated_tokens,
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
        source = request.source_label  # probe load is source="probe": the SLO rules leave it out
        if source is None:
            return  # probe load past the series budget: never exported as traffic
        self.requests.labels(model, tenant, outcome, source).inc()
        self.duration.labels(model, outcome, source).observe(record.e2e_s or 0.0)
        if record.ttft_s is not None:
            self.ttft.labels(model, source).observe(record.ttft_s)
        if record.tpot_s is not None:
            self.tpot.labels(model, source).observe(record.tpot_s)


def _token_counts(request: LiveRequest) -> tuple[int, int, int | None, str]:
    """(prompt, completion, cached, usage_source): the upstream's usage where every count is valid.

    A count the upstream sent that no INTEGER column holds (negative, beyond 2**31, a string, a
    float) is rejected: that count falls back to the estimate and the row says 'estimated'.
    """
    usage = request.usage
    prompt, completion = request.prompt_tokens, request.generated_tokens
    if usage is None:
        return prompt, completion, None, "estimated"
    upstream_prompt = _count(usage.get("prompt_tokens"))
    upstream_completion = _count(usage.get("completion_tokens"))
    details = usage.get("prompt_tokens_details")
    cached = _count(details.get("cached_tokens")) if isinstance(details, dict) else None
    trusted = upstream_prompt is not None and upstream_completion is not None
    return (
        prompt if upstream_prompt is None else upstream_prompt,
        completion if upstream_completion is None else upstream_completion,
        cached,
        "upstream" if trusted else "estimated",
    )


def _count(value: object) -> int | None:
    """A usage count an INTEGER column holds; an explicit 0 is a value, not a missing field."""
    valid = isinstance(value, int) and not isinstance(value, bool) and 0 <= value < 2**31
    return value if valid and isinstance(value, int) else None
