"""Autoscaler and gateway settings from a stored capacity estimate: pure functions, dicts out.

Input is one published estimate (collector.capacity.CapacityEstimate; its fields are documented
with its JSON in docs/capacity.md). Each number below is the estimate's, per replica; the live
ones stay in Prometheus:

    estimate: knee 8 requests; active tokens at the knee: mean 9000; pool 6 requests, 9800 tokens
              (p99.9 of 6 in flight); the largest request of the traffic's week 7000 tokens
    keda_scaled_object(...)  -> ScaledObject, triggers
         requests: sum(headroom_inflight_requests{model}) / (pool gauge > 0, or 6, at least 1)   threshold 1
         tokens:   sum(headroom_active_tokens{model}) / (pool tokens gauge, or 9800, at least 1)
      so the replicas KEDA asks for = ceil(live concurrency / what one replica should carry), in
      the caliber that needs more; a re-measured knee changes the gauge and the scaling at once.
    gateway_picker_config(...) -> EndpointPickerConfig with a concurrency-detector:
         maxConcurrency 6, maxTokenConcurrency 9800, headroom 0.33 (bursts up to the knee, 8/6 - 1)
    gateway_comments(...) -> one comment line per threshold: the measured number it comes from,
         the estimate's source, run, when it was measured and how old it is
    llmd_saturation_config(...) -> the WVA saturation ConfigMap entry for the model

Instantaneous values take a peak-aware figure, never the mean (docs/domain.md §12): KEDA polls
the live active tokens and a gateway admits against them, and the time-weighted mean
(`knee_tokens`, the divisor of 5-minute averages in the rules) is exceeded half the time. So the
token budget is the recommended pool in tokens (`recommended_pool_tokens`, gauge
headroom_capacity_recommended_pool_tokens): the p99.9 of the instantaneous active-token sum with
the pool's requests in flight and the traffic's mix, the token counterpart of "at most the pool in
flight" (a p95 scaled from the knee is exceeded by two long prompts at once). The gateway's
maxTokenConcurrency is raised to the largest request the traffic sent (`max_request_tokens`) when
it is below: a lower limit would refuse that request on an idle replica. An estimate without
`recommended_pool_tokens` (its token capacity withheld, one saved before the time-weighted token
capacity among them, or none measured): no token trigger, no token limit, and the annotation,
comment or error says why.

With capacity in rates (μ_slo 9.5 requests/s, V_P 380 prefill tokens/s, `headroom probe --rates`):
    keda_scaled_object(...)  + a third trigger, request-rate-per-replica:
         sum(rate(headroom_requests_total{model, source="traffic"}[2m]))   threshold μ_slo × 0.8 = 7.6
      (KEDA's AverageValue: replicas = ceil(live rate / threshold)), the source and measurement time
      of μ_slo in the annotations; no μ_slo published -> no rate trigger (the concurrency ones stay);
    llmd_saturation_config(...) + V_P per replica as a comment in the model's entry.

Why the pool and not the knee: the knee is where the replica stops getting faster; the pool
(70-80 % of it, docs/domain.md §2.2) leaves the burst room that scaling takes to arrive.
"""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

from collector.capacity import DEFAULT_REPLICA_CLASS, CapacityEstimate
from collector.rules.config import RulesConfig
from collector.rules.naming import sample

__all__ = [
    "DEFAULT_RATE_UTILISATION",
    "EstimateError",
    "per_replica",
    "keda_scaled_object",
    "gateway_picker_config",
    "gateway_comments",
    "GATEWAY_FALLBACK",
    "llmd_saturation_config",
]


# the share of μ_slo a replica is scaled to carry: the rest absorbs bursts until scaling arrives,
# the rate counterpart of the pool's 70-80 % of the knee (docs/domain.md §2.2)
DEFAULT_RATE_UTILISATION = 0.8


class EstimateError(ValueError):
    """The stored estimate cannot drive scaling (no knee reached, no pool); the message says why."""


def per_replica(estimate: CapacityEstimate) -> dict[str, Any]:
    """What one replica should carry, both calibers, from the estimate.

    Example: knee 8, active tokens at the knee mean 9000, pool 6 (9800 tokens), largest request 7000
    -> {"knee_requests": 8, "knee_tokens": 9000, "pool_requests": 6, "pool_tokens": 6750.0,
    "pool_tokens_peak": 9800, "max_request_tokens": 7000, "burst_ratio": 0.3333}

    `pool_tokens` (the mean's) is for 5-minute averages; anything acting on an instantaneous value
    takes `pool_tokens_peak` (module docstring). Token figures are None when withheld, when the
    estimate predates them (`recommended_pool_tokens`), or without traffic (`max_request_tokens`).
    """
    # the token capacity the gauges publish (time-weighted, docs/capacity.md "Token capacity"):
    # None when withheld; never the knee's own `tokens`, an average over admissions
    knee_requests, knee_tokens = estimate.knee.requests, estimate.knee_tokens
    pool = estimate.recommended_pool
    model = estimate.model or "the model"
    if not estimate.knee.reached:
        raise EstimateError(
            f"the estimate for {model} has no knee (the probe never reached it: the highest "
            "level is a lower bound); probe higher levels before scaling on it"
        )
    if not pool or not knee_requests:
        raise EstimateError(
            f"the estimate for {model} has no recommended pool; rerun `headroom probe` with a --profile"
        )
    pool_tokens = round(knee_tokens * pool / knee_requests, 1) if knee_tokens else None
    return {
        "knee_requests": knee_requests,
        "knee_tokens": knee_tokens,
        "pool_requests": pool,
        "pool_tokens": pool_tokens,
        "pool_tokens_peak": estimate.recommended_pool_tokens,
        "max_request_tokens": estimate.max_request_tokens,
        "burst_ratio": round(max(knee_requests / pool - 1.0, 0.0), 4),
    }


def _no_token_limit(estimate: CapacityEstimate, limits: dict[str, Any]) -> str | None:
    """Why no token trigger or token limit may come from the estimate, or None when one may: its
    token capacity withheld (an estimate saved before the time-weighted token capacity is, with
    that reason: collector.capacity.LEGACY_TOKEN_KNEE), or no pool in tokens measured."""
    if limits["pool_tokens_peak"]:
        return None
    if withheld := estimate.token_knee_withheld:
        return f"the token capacity is withheld: {withheld}"
    return "no recommended pool in tokens was measured"


def _token_limit(limits: dict[str, Any]) -> tuple[int, bool]:
    """The gateway's maxTokenConcurrency and whether it was raised to the largest request: the
    pool in tokens, never below one request the traffic sent (else that one is always refused)."""
    pool_peak = int(limits["pool_tokens_peak"])
    largest = int(limits["max_request_tokens"] or 0)
    return max(pool_peak, largest), largest > pool_peak


def _selector(model: str, config: RulesConfig, cluster: str | None) -> str:
    place = f', {config.cluster_label or "cluster"}="{cluster}"' if cluster else ""
    return f'{{job="{config.sidecar_job}", model="{model}"{place}}}'


def _replica_class(estimate: CapacityEstimate) -> str:
    return estimate.replica_class or DEFAULT_REPLICA_CLASS


def _live(name: str, selected: str, replica_class: str, config: RulesConfig, cluster: str | None) -> str:
    """The live series of the class's sidecars: every sidecar of the model for the default class
    (as before classes), else only those whose headroom_replica_info names the class."""
    if replica_class == DEFAULT_REPLICA_CLASS:
        return f"{sample(name)}{selected}"
    label = config.cluster_label or "cluster"
    place = f', {label}="{cluster}"' if cluster else ""
    on = f"{label}, instance" if cluster else "instance"
    info = f'max by ({on}) ({sample("headroom_replica_info")}{{replica_class="{replica_class}"{place}}})'
    return f"({sample(name)}{selected} * on ({on}) group_left () {info})"


def _keda_trigger(query: str, prometheus_url: str, name: str, threshold: str = "1") -> dict[str, Any]:
    return {
        "type": "prometheus",
        "name": name,
        "metadata": {
            "serverAddress": prometheus_url,
            "query": query,
            "threshold": threshold,
            # an empty answer (every sidecar's scrape lost) is an error, so KEDA's fallback holds
            # the replicas, never a silent 0 that scales in
            "ignoreNullValues": "false",
        },
    }


def keda_scaled_object(
    estimate: CapacityEstimate,
    *,
    deployment: str,
    namespace: str = "default",
    prometheus_url: str = "http://prometheus-operated.monitoring.svc:9090",
    min_replicas: int = 1,
    max_replicas: int = 10,
    fallback_replicas: int | None = None,
    cluster: str | None = None,
    config: RulesConfig = RulesConfig(),
    rate_utilisation: float = DEFAULT_RATE_UTILISATION,
) -> dict[str, Any]:
    """A KEDA ScaledObject (keda.sh/v1alpha1) scaling `deployment` on live ÷ per-replica concurrency.

    Neither query can yield NaN or +Inf: no in-flight series counts as 0 while a sidecar of the job
    is scraped, a published pool (or knee) of 0 is ignored for the estimate's own number, and the
    divisor is at least 1. When every sidecar's scrape is lost the answer is empty, which the
    trigger treats as an error (`ignoreNullValues: false`), so KEDA's `fallback` holds
    `fallback_replicas` (default `max_replicas`) instead of scaling in on a dead signal. `cluster` keeps both
    the live series and the published gauges to one cluster, for a Prometheus holding several.
    An estimate with μ_slo adds a rate trigger: the traffic's request rate against the threshold
    μ_slo x `rate_utilisation` (module docstring). The token trigger divides by the recommended pool
    in tokens; an estimate without one (withheld, or older than it) gets no token trigger, and the
    annotation `llm-headroom/token-trigger` says why.
    """
    if not 0 < rate_utilisation <= 1:
        raise ValueError(f"rate utilisation {rate_utilisation} must be in (0, 1], e.g. 0.8")
    limits = per_replica(estimate)
    model, replica_class = str(estimate.model), _replica_class(estimate)
    selected = _selector(model, config, cluster)
    place = f', {config.cluster_label or "cluster"}="{cluster}"' if cluster else ""
    # the class's gauges; gauges of a release before classes carry no label and read as "default"
    of_class = (
        f'replica_class=~"|{DEFAULT_REPLICA_CLASS}"'
        if replica_class == DEFAULT_REPLICA_CLASS
        else f'replica_class="{replica_class}"'
    )
    published = f'{{model="{model}", task_class="all", {of_class}{place}}}'
    pool = sample("headroom_capacity_recommended_pool_requests")
    inflight = _live("headroom_inflight_requests", selected, replica_class, config, cluster)
    active = _live("headroom_active_tokens", selected, replica_class, config, cluster)
    # no in-flight series (a sidecar up that has served nothing yet) counts as 0 only while a
    # sidecar of the job is scraped; losing every scrape leaves the answer empty: KEDA's fallback
    idle = f'(vector(0) and on() count(up{{job="{config.sidecar_job}"{place}}} == 1))'
    requests = (
        f"(sum({inflight}) or {idle})\n"
        f"/ on() clamp_min(max({pool}{published} > 0) or vector({limits['pool_requests']}), 1)"
    )
    triggers = [_keda_trigger(requests, prometheus_url, "inflight-requests-per-pool")]
    annotations = {
        "llm-headroom/replica-class": replica_class,
        "llm-headroom/estimate": estimate.created_at.isoformat(),
        "llm-headroom/pool-requests": str(limits["pool_requests"]),
        "llm-headroom/knee-requests": str(limits["knee_requests"]),
    }
    # KEDA polls the live active tokens, an instantaneous value: it is divided by the recommended
    # pool in tokens (a p99.9 with the pool in flight), never the mean's (module docstring)
    no_tokens = _no_token_limit(estimate, limits)
    if no_tokens is None:
        pool_tokens = sample("headroom_capacity_recommended_pool_tokens")
        budget = f"max({pool_tokens}{published} > 0) or vector({limits['pool_tokens_peak']})"
        tokens = f"(sum({active}) or {idle})\n/ on() clamp_min({budget}, 1)"
        triggers.append(_keda_trigger(tokens, prometheus_url, "active-tokens-per-pool"))
        annotations["llm-headroom/pool-tokens"] = (
            f"{limits['pool_tokens_peak']:g} (p99.9 of the active tokens with the pool of "
            f"{limits['pool_requests']:g} in flight; KEDA reads the published gauge first)"
        )
    else:
        annotations["llm-headroom/token-trigger"] = f"none: {no_tokens}"
    mu = estimate.rate_requests_per_s
    if mu:
        threshold = f"{mu * rate_utilisation:.6g}"
        completed = _live(
            "headroom_requests_total", selected[:-1] + ', source="traffic"}', replica_class, config, cluster
        )
        rate = f"sum(rate({completed}[2m])) or vector(0)"
        triggers.append(_keda_trigger(rate, prometheus_url, "request-rate-per-replica", threshold))
        annotations["llm-headroom/rate-requests-per-s"] = (
            f"{mu:.6g} (mu_slo, source {estimate.source}, measured {estimate.created_at.isoformat()}; "
            f"threshold {threshold} = x {rate_utilisation:g} utilisation)"
        )
    return {
        "apiVersion": "keda.sh/v1alpha1",
        "kind": "ScaledObject",
        "metadata": {
            "name": f"{deployment}-headroom",
            "namespace": namespace,
            "labels": {"app.kubernetes.io/part-of": "llm-headroom"},
            "annotations": annotations,
        },
        "spec": {
            "scaleTargetRef": {"apiVersion": "apps/v1", "kind": "Deployment", "name": deployment},
            "minReplicaCount": min_replicas,
            "maxReplicaCount": max_replicas,
            "pollingInterval": 15,
            "cooldownPeriod": 300,
            # Prometheus unreachable or the query failing 3 times in a row: hold the most replicas
            # (a blind autoscaler must not scale a loaded model in); docs/capacity.md.
            "fallback": {"failureThreshold": 3, "replicas": fallback_replicas or max_replicas},
            "triggers": triggers,
        },
    }


def gateway_picker_config(estimate: CapacityEstimate, *, mode: str = "requests") -> dict[str, Any]:
    """The Gateway API Inference Extension's EndpointPickerConfig with a concurrency detector set from
    the estimate: the pool as the ideal per-endpoint load, bursts up to the knee (`headroom`).

    maxTokenConcurrency, an admission limit on the instantaneous active tokens, is the recommended
    pool in tokens (`pool_tokens_peak`), raised to the largest request the traffic sent when below
    it; without one (withheld, or an estimate that predates it) it is left out, and --mode tokens
    is refused with the reason.
    """
    if mode not in ("requests", "tokens"):
        raise ValueError(f"mode {mode!r} is not requests or tokens")
    limits = per_replica(estimate)
    no_tokens = _no_token_limit(estimate, limits)
    if mode == "tokens" and no_tokens is not None:
        raise EstimateError(
            f"the estimate for {estimate.model} gives no token limit ({no_tokens}); "
            "use --mode requests, or probe with --workload from-log"
        )
    parameters = {
        "concurrencyMode": mode,
        "maxConcurrency": int(limits["pool_requests"]),
        "headroom": limits["burst_ratio"],
    }
    if no_tokens is None:
        parameters["maxTokenConcurrency"] = _token_limit(limits)[0]
    return {
        "apiVersion": "inference.networking.x-k8s.io/v1alpha1",
        "kind": "EndpointPickerConfig",
        "plugins": [{"type": "concurrency-detector", "parameters": parameters}],
        "saturationDetector": {"pluginRef": "concurrency-detector"},
    }


# what the gateway does when no estimate passes the publication gate: nothing is rendered, and
# its own saturation detector (hand-set queue-depth and KV-cache thresholds) stays in charge
GATEWAY_FALLBACK = (
    "nothing rendered: the gateway keeps its own saturation detector (its default queue-depth "
    "and KV-cache thresholds) until a measured estimate passes the gate; run `headroom probe`"
)


def _age(at: datetime, now: datetime) -> str:
    """'3 h old' (minutes under an hour, days past two)."""
    seconds = (now - (at if at.tzinfo else at.replace(tzinfo=UTC))).total_seconds()
    if seconds < 3600:
        return f"{max(seconds, 0) / 60:.0f} min old"
    if seconds < 2 * 86400:
        return f"{seconds / 3600:.1f} h old"
    return f"{seconds / 86400:.1f} days old"


def _confidence(estimate: CapacityEstimate) -> str:
    """The estimate's confidence in the one vocabulary (a legacy probe's "measured" is "high")."""
    found = estimate.confidence or "unknown"
    return "high" if found == "measured" else found


def gateway_comments(
    estimate: CapacityEstimate, *, mode: str = "requests", now: datetime | None = None
) -> list[str]:
    """Where each threshold of gateway_picker_config comes from, one line each (without '# '):
    the measured number, the estimate's source, run, measurement time and age.

    Example: ['maxConcurrency 6: the recommended pool (interactive) of knee 8 requests',
    'maxTokenConcurrency 9800: the pool in tokens, p99.9 of the active tokens with 6 in flight', ...,
    'measured by probe run probe-2026...-ab12 at 2026-12-01T08:00:00+00:00 (3.0 h old), replica
    class default, confidence high']
    """
    limits = per_replica(estimate)
    lines = [
        f"maxConcurrency {int(limits['pool_requests'])}: the recommended pool "
        f"({estimate.profile or 'interactive'}) of knee {limits['knee_requests']:g} requests",
        f"headroom {limits['burst_ratio']:g}: bursts up to the knee "
        f"({limits['knee_requests']:g} / {limits['pool_requests']:g} - 1)",
    ]
    no_tokens = _no_token_limit(estimate, limits)
    if no_tokens is None:
        limit, raised = _token_limit(limits)
        pool_peak = f"p99.9 of the active tokens with {limits['pool_requests']:g} in flight"
        lines.insert(
            1,
            (
                f"maxTokenConcurrency {limit}: raised to the largest request the traffic sent: "
                f"{limit} tokens (the pool in tokens, {pool_peak} = {limits['pool_tokens_peak']:g}, "
                "would refuse it)"
                if raised
                else f"maxTokenConcurrency {limit}: the pool in tokens, {pool_peak}"
            )
            + (" (the detector's caliber)" if mode == "tokens" else ""),
        )
    else:
        lines.insert(1, f"maxTokenConcurrency not set: {no_tokens}")
    mu = estimate.rate_requests_per_s
    if mu:
        lines.append(
            f"mu_slo {mu:.4g} requests/s per endpoint (headroom probe --rates): not a detector "
            "setting; the KEDA rate trigger scales on it"
        )
    when = estimate.created_at
    lines.append(
        f"measured by {estimate.source or 'an unknown source'} run {estimate.run_id} "
        f"at {when.isoformat()} ({_age(when, now or datetime.now(UTC))}), replica class {_replica_class(estimate)}, "
        f"confidence {_confidence(estimate)}"
    )
    return lines


def llmd_saturation_config(
    estimate: CapacityEstimate, *, namespace: str = "default", kv_cache_threshold: float = 0.80
) -> dict[str, Any]:
    """llm-d's Workload Variant Autoscaler: a per-model entry of its saturation-scaling ConfigMap.

    WVA judges a replica by its queue and KV cache. A replica past the knee queues, and the pool
    leaves `knee - pool` requests of burst, so the queue length that means "saturated" is that
    burst (at least 1), and scaling starts when less than half of it is left.
    """
    limits = per_replica(estimate)
    burst = max(1, int(round(limits["knee_requests"] - limits["pool_requests"])))
    entry = {
        "model_id": estimate.model,
        "namespace": namespace,
        "kvCacheThreshold": kv_cache_threshold,
        "queueLengthThreshold": burst,
        "kvSpareTrigger": 0.1,
        "queueSpareTrigger": max(1, burst // 2),
    }
    return {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": {
            "name": "wva-saturation-scaling-config",
            "namespace": namespace,
            "labels": {"app.kubernetes.io/part-of": "llm-headroom"},
        },
        "data": {_config_key(_entry_name(estimate)): _yaml_block(entry) + _prefill_comment(estimate)},
    }


def _prefill_comment(estimate: CapacityEstimate) -> str:
    """V_P per replica, for llm-d's token-aware scaling, as a comment: WVA's entry has no field."""
    v_p = estimate.prefill_tokens_per_s
    if not v_p:
        return (
            "# V_P (prefill tokens/s per replica): not measured; run headroom probe --rates "
            "(until then, calibrate it as llm-d's guide says, never borrow a figure)\n"
        )
    return (
        f"# V_P {v_p:.6g} prefill tokens/s per replica (uncached, at mu_slo "
        f"{estimate.rate_requests_per_s} requests/s; source {estimate.source}, "
        f"measured {estimate.created_at.isoformat()})\n"
    )


def _entry_name(estimate: CapacityEstimate) -> str:
    """The model's entry, or the model's entry per class where the class is not the default one."""
    replica_class = _replica_class(estimate)
    model = str(estimate.model)
    return model if replica_class == DEFAULT_REPLICA_CLASS else f"{model}-{replica_class}"


def _config_key(model: str) -> str:
    """A ConfigMap data key for a model: 'Qwen/Qwen2.5-1.5B' -> 'qwen-qwen2.5-1.5b'."""
    return "".join(c if c.isalnum() or c in "-._" else "-" for c in model.lower()).strip("-.") or "model"


def _yaml_block(entry: dict[str, Any]) -> str:
    return "".join(
        f"{key}: {value!r}\n" if isinstance(value, str) else f"{key}: {value}\n"
        for key, value in entry.items()
    ).replace("'", '"')
