"""A request while it is live (LiveRequest) and the one record it becomes when it finishes.

The tracker (collector.sidecar.tracker) owns the live set and changes a LiveRequest only through
its transitions; `finished_record` turns a finished one into its RequestRecord: times from its
monotonic instants, counts from the upstream's usage where valid, its goodput verdict
(collector.goodput) and the engine's own timings (collector.engine_timings). Never any text.
"""

from __future__ import annotations

import itertools
import time
import uuid
from datetime import UTC, datetime, timedelta
from typing import Any, NamedTuple

from collector.engine_timings import EngineTimings
from collector.goodput import RequestSlo, verdict
from collector.record import RequestRecord, time_per_output_token
from collector.sidecar.tracecontext import Telemetry
from collector.tasks import UNSPECIFIED, classify, classify_finished

__all__ = ["LiveRequest", "ProbeStep", "finished_record"]

# Request IDs: one random 64-bit prefix per process plus a counter. Unique across sidecars and
# restarts like uuid4, without an os.urandom call per request (slow in some sandboxes).
_ID_PREFIX = uuid.uuid4().hex[:16]
_ID_COUNTER = itertools.count()


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
        "slo",
        "engine",
        "sent_mono",
        "second_token_mono",
        "last_token_mono",
        "itl_max",
        "ignore_eos",
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
        ignore_eos: bool = False,
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
        self.slo: RequestSlo | None = None  # its own SLO (headers); None: the tracker's
        self.engine: EngineTimings | None = None  # what the engine said of its time
        self.sent_mono: float | None = None  # written upstream
        self.second_token_mono: float | None = None
        self.last_token_mono: float | None = None
        self.itl_max = 0.0  # the longest gap between two token-carrying reads
        self.ignore_eos = ignore_eos  # it asked for exactly max_tokens (`ignore_eos`)

    @property
    def active_tokens(self) -> int:
        """This request's token-caliber weight now: prompt + generated so far."""
        return self.prompt_tokens + self.generated_tokens


def _wall(admitted_at: datetime, request: LiveRequest, mono: float | None) -> datetime | None:
    """The wall time of monotonic instant `mono`: the admission's wall time plus the interval."""
    if mono is None:
        return None
    return admitted_at + timedelta(seconds=mono - request.admitted_mono)


def finished_record(
    request: LiveRequest,
    completed_mono: float,
    *,
    source: str,
    run_id: str | None,
    instance: str,
    replica_class: str | None,
    slo: RequestSlo,
) -> RequestRecord:
    """The one record of `request`, finished at `completed_mono`: its times from the monotonic
    instants, its counts from the upstream's usage where valid, its verdict against its own SLO
    (else `slo`, the tracker's) and the engine's timings. `source`, `run_id`: the tracker's, for a
    request that has none of its own."""
    prompt, completion, cached, usage_source = _token_counts(request)
    e2e = completed_mono - request.admitted_mono
    ttft = None if request.first_token_mono is None else request.first_token_mono - request.admitted_mono
    tpot = time_per_output_token(e2e, ttft, completion)
    admitted_at = datetime.fromtimestamp(request.admitted_wall, UTC)  # once: the others add to it
    slo = request.slo or slo
    outcome = request.outcome or ""
    hop = None if request.sent_mono is None else request.sent_mono - request.admitted_mono
    engine = _engine_columns(request.engine, ttft, hop, prompt, cached)
    second = request.second_token_mono
    return RequestRecord(
        request_id=request.request_id,
        source=request.source or source,
        run_id=request.run_id or run_id,
        instance=instance,
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
        tpot_s=tpot,
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
        replica_class=replica_class,
        client_request_id=request.client_request_id,
        failure=request.failure,
        held_prompt_tokens=request.prompt_tokens,
        held_generated_tokens=request.generated_tokens,
        slo_ttft_s=slo.ttft_s,
        slo_tpot_s=slo.tpot_s,
        slo_e2e_s=slo.e2e_s,
        verdict=verdict(outcome, request.stream, ttft_s=ttft, tpot_s=tpot, e2e_s=e2e, slo=slo),
        **engine,
        sidecar_hop_s=hop,
        ttst_s=None if second is None else second - request.admitted_mono,
        itl_max_s=request.itl_max if second is not None else None,
        output_short=_short(request, outcome, completion),
    )


def _short(request: LiveRequest, outcome: str, completion: int) -> bool | None:
    """Whether an answered request that asked for exactly max_tokens (`ignore_eos`) got fewer;
    None where nothing exact was asked (a load tool's check that it measured what it sent)."""
    if not request.ignore_eos or request.max_tokens is None or outcome != "ok":
        return None
    return completion < request.max_tokens


def _engine_columns(
    said: EngineTimings | None, ttft: float | None, hop: float | None, prompt: int, cached: int | None
) -> dict[str, Any]:
    """The row's engine_* columns from what the engine said. llama.cpp reports no queue: it is
    what remains of TTFT once the hop and the prefill are taken out (never below 0). vLLM reports
    no token counts: the prompt tokens it computed are the usage's prompt less the cached."""
    if said is None:
        return {}
    queue, computed, from_cache = said.queue_s, said.prompt_computed, said.prompt_cached
    if queue is None and ttft is not None and hop is not None and said.prefill_s is not None:
        queue = max(ttft - hop - said.prefill_s, 0.0)
    if said.shape == "vllm":
        from_cache = cached
        computed = prompt - (cached or 0) if prompt >= (cached or 0) else None
    return {
        "engine_timings": said.shape,
        "engine_queue_s": queue,
        "engine_prefill_s": said.prefill_s,
        "engine_decode_s": said.decode_s,
        "engine_prompt_computed": computed,
        "engine_prompt_cached": from_cache,
        "engine_generated": said.generated,
    }


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
