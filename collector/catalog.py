"""The one metric catalog: every metric llm-headroom exports is declared here, once.

Sources, the tracker, dashboards, alert rules and tests import these specs and never retype a
name. The names are a contract (docs/design.md §4.4): alert rules and dashboards in
other deployments depend on them.
"""

from __future__ import annotations

from dataclasses import dataclass, field

__all__ = [
    "MetricSpec",
    "CATALOG",
    "BY_NAME",
    "TTFT_BUCKETS_SECONDS",
    "TPOT_BUCKETS_SECONDS",
    "DURATION_BUCKETS_SECONDS",
    "ENGINE_SPLIT_BUCKETS_SECONDS",
    "OVERHEAD_BUCKETS_SECONDS",
    "INFLIGHT_AGE_BOUNDS",
    "SIGNAL_REASONS",
    "SINK_REASONS",
    "spec",
    "EXTERNAL_SERIES",
]

# LLM latency is long-tailed: TTFT under load reaches tens of seconds and a long generation runs
# for minutes, so the default prometheus_client cap of 10 s would hide exactly the tail we alert on.
TTFT_BUCKETS_SECONDS = (
    0.025,
    0.05,
    0.1,
    0.2,
    0.3,
    0.5,
    0.75,
    1.0,
    1.5,
    2.0,
    3.0,
    5.0,
    7.5,
    10.0,
    15.0,
    20.0,
    30.0,
    60.0,
    120.0,
)
# Decode steps are tens of milliseconds; above ~0.5 s per token a stream is unusable.
TPOT_BUCKETS_SECONDS = (
    0.005,
    0.01,
    0.015,
    0.02,
    0.03,
    0.04,
    0.05,
    0.075,
    0.1,
    0.15,
    0.2,
    0.3,
    0.5,
    0.75,
    1.0,
    2.0,
)
# The sidecar's own time per request: admission to upstream send plus relaying every chunk;
# tens of microseconds for a short answer, milliseconds for thousands of chunks.
OVERHEAD_BUCKETS_SECONDS = (
    0.0001,
    0.00025,
    0.0005,
    0.001,
    0.0025,
    0.005,
    0.01,
    0.025,
    0.05,
    0.1,
    0.25,
    0.5,
    1.0,
)
DURATION_BUCKETS_SECONDS = (
    0.1,
    0.25,
    0.5,
    1.0,
    2.0,
    3.0,
    5.0,
    7.5,
    10.0,
    15.0,
    20.0,
    30.0,
    45.0,
    60.0,
    90.0,
    120.0,
    180.0,
    300.0,
    600.0,
)

# The engine's split of a request (queue, prefill, decode): coarse on purpose, three histograms per
# model inside the series budget (collector.sidecar.series); the request log has the exact values.
ENGINE_SPLIT_BUCKETS_SECONDS = (0.005, 0.025, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 120.0)

# headroom_inflight_older_than_requests{older_than}: bounded, from a quick answer to a stuck one.
INFLIGHT_AGE_BOUNDS: tuple[tuple[str, float], ...] = (
    ("1s", 1.0),
    ("5s", 5.0),
    ("30s", 30.0),
    ("2m", 120.0),
    ("10m", 600.0),
)
# headroom_signal_valid{reason}: the fixed vocabulary, valid ones first (docs/engines.md).
SIGNAL_REASONS: dict[str, bool] = {
    "ok": True,
    "idle": True,
    "renamed": True,
    "missing": False,
    "stale": False,
    "stuck": False,
    "scrape_failing": False,
}
# headroom_log_sink_up{reason}: why the log sink is up (1) or down (0); one series at a time.
# The lake's side: unreachable (its store did not answer: network, DNS, timeout), unwritable (it
# answered no: permissions, not a folder, read-only, full, access denied), lake_error (anything
# else); the spool's volume, as in headroom_log_rows_dropped_total{reason}: disk_full, spool_error.
SINK_REASONS: dict[str, bool] = {
    "ok": True,
    "unreachable": False,
    "unwritable": False,
    "lake_error": False,
    "disk_full": False,
    "spool_error": False,
}


@dataclass(frozen=True)
class MetricSpec:
    """One exported metric: name (without the `_total` a counter's sample gets), type, labels, help."""

    name: str
    type: str  # "gauge" | "counter" | "histogram"
    help: str
    labels: tuple[str, ...] = ()
    unit: str = ""  # Grafana unit id for dashboards ("s", "short", "percentunit", "bytes", ...)
    buckets: tuple[float, ...] = field(default=())
    group: str = ""


_PER_REQUEST = ("model", "tenant")
_ENGINE = ("engine", "model")
_GPU = ("gpu", "uuid", "gpu_name")
_PUBLISHED = ("model", "task_class", "replica_class", "source", "confidence")

CATALOG: tuple[MetricSpec, ...] = (
    # --- sidecar, per request -----------------------------------------------------------------
    MetricSpec(
        "headroom_inflight_requests",
        "gauge",
        "Requests admitted by the sidecar and not yet terminal (request caliber).",
        _PER_REQUEST,
        "short",
        group="sidecar",
    ),
    MetricSpec(
        "headroom_active_tokens",
        "gauge",
        "Sum of prompt plus generated-so-far tokens over in-flight requests (token caliber).",
        _PER_REQUEST,
        "short",
        group="sidecar",
    ),
    MetricSpec(
        "headroom_task_inflight_requests",
        "gauge",
        "In-flight requests per task class (by declared max_tokens: short < 200, medium "
        "200-1000, long > 1000, unspecified), for comparing each class with its own knee.",
        ("model", "task_class"),
        "short",
        group="sidecar",
    ),
    MetricSpec(
        "headroom_task_active_tokens",
        "gauge",
        "Active tokens (prompt + generated so far) of in-flight requests per task class.",
        ("model", "task_class"),
        "short",
        group="sidecar",
    ),
    MetricSpec(
        "headroom_inflight_oldest_age_seconds",
        "gauge",
        "Age of the oldest in-flight request (seconds since admission) per model and task class, "
        "computed from the live set at scrape time; 0 while none is in flight. Engines record "
        "latency only when a request ends: this shows a stuck or very long request while it runs.",
        ("model", "task_class"),
        "s",
        group="sidecar",
    ),
    MetricSpec(
        "headroom_inflight_older_than_requests",
        "gauge",
        "In-flight requests admitted longer ago than `older_than` (1s, 5s, 30s, 2m, 10m; each "
        "request counts in every bound it passed), computed from the live set at scrape time.",
        ("model", "older_than"),
        "short",
        group="sidecar",
    ),
    MetricSpec(
        "headroom_adapter_inflight_requests",
        "gauge",
        "In-flight requests per LoRA adapter (the request named the adapter; `model` is its base "
        "model), computed from the live set at scrape time; adapters past the series budget are "
        "`other`.",
        ("model", "adapter"),
        "short",
        group="sidecar",
    ),
    MetricSpec(
        "headroom_adapters_inflight",
        "gauge",
        "Distinct LoRA adapters among the base model's in-flight requests (queued or running), "
        "computed from the live set at scrape time: compare with headroom_adapter_slots.",
        ("model",),
        "short",
        group="sidecar",
    ),
    MetricSpec(
        "headroom_adapter_slots",
        "gauge",
        "Adapters one engine batch can hold: --adapter-slots, else the engine's (vLLM max_lora, "
        "SGLang lora_pool_slots_total); past them adapters are swapped and TTFT climbs.",
        ("model",),
        "short",
        group="sidecar",
    ),
    MetricSpec(
        "headroom_requests_total",
        "counter",
        "Requests that reached a terminal state, by outcome; source is probe for `headroom probe` "
        "load, else traffic.",
        _PER_REQUEST + ("outcome", "source"),
        "short",
        group="sidecar",
    ),
    MetricSpec(
        "headroom_prompt_tokens_total",
        "counter",
        "Prompt tokens of terminal requests (upstream usage, else estimated).",
        _PER_REQUEST,
        "short",
        group="sidecar",
    ),
    MetricSpec(
        "headroom_generated_tokens_total",
        "counter",
        "Generated (completion) tokens of terminal requests (upstream usage, else estimated).",
        _PER_REQUEST,
        "short",
        group="sidecar",
    ),
    MetricSpec(
        "headroom_time_to_first_token_seconds",
        "histogram",
        "Time from admission to the first chunk carrying content or a tool call.",
        ("model", "source"),
        "s",
        TTFT_BUCKETS_SECONDS,
        group="sidecar",
    ),
    MetricSpec(
        "headroom_time_per_output_token_seconds",
        "histogram",
        "(e2e - TTFT) / (completion_tokens - 1), for requests with more than one token.",
        ("model", "source"),
        "s",
        TPOT_BUCKETS_SECONDS,
        group="sidecar",
    ),
    MetricSpec(
        "headroom_request_duration_seconds",
        "histogram",
        "End-to-end request duration from admission to the terminal transition.",
        ("model", "outcome", "source"),
        "s",
        DURATION_BUCKETS_SECONDS,
        group="sidecar",
    ),
    MetricSpec(
        "headroom_proxy_overhead_seconds",
        "histogram",
        "Time the sidecar itself spent on a request: from admission (body read) to sending it "
        "upstream, plus the processing of every relayed chunk (waiting for the engine or the "
        "client excluded).",
        (),
        "s",
        OVERHEAD_BUCKETS_SECONDS,
        group="sidecar",
    ),
    MetricSpec(
        "headroom_label_values_folded_total",
        "counter",
        "Requests whose model, tenant or task-class label value became 'other' because the series "
        "budget (--max-series) or a label cap (--max-models, --max-tenants) was reached.",
        ("label",),
        "short",
        group="sidecar",
    ),
    MetricSpec(
        "headroom_upstream_retries_total",
        "counter",
        "Requests sent to the engine a second time, on a new connection, because a reused "
        "pooled connection failed before any response byte (the engine never saw them).",
        ("reason",),
        "short",
        group="sidecar",
    ),
    MetricSpec(
        "headroom_slo_requests_total",
        "counter",
        "Client traffic's finished requests judged against their SLO (collector.goodput): verdict "
        "met (every bound held), missed (latency), shed (429, 503), aborted (the client left), "
        "error (upstream error, timeout) or invalid (the client's 4xx, left out of attainment). "
        "Goodput = rate of met; attainment = met / all but invalid.",
        _PER_REQUEST + ("verdict",),
        "short",
        group="sidecar",
    ),
    MetricSpec(
        "headroom_task_slo_requests_total",
        "counter",
        "headroom_slo_requests_total per (model, task class) instead of (model, tenant).",
        ("model", "task_class", "verdict"),
        "short",
        group="sidecar",
    ),
    MetricSpec(
        "headroom_slo_good_tokens_total",
        "counter",
        "Generated tokens of client requests that met their SLO: token goodput (its share of "
        "headroom_generated_tokens_total is token goodput %).",
        _PER_REQUEST,
        "short",
        group="sidecar",
    ),
    MetricSpec(
        "headroom_slo_headers_ignored_total",
        "counter",
        "Requests whose SLO headers (x-llm-d-slo-ttft-ms, x-slo-ttft-ms, ...) were malformed or out "
        "of range: judged by the configured SLO instead.",
        (),
        "short",
        group="sidecar",
    ),
    MetricSpec(
        "headroom_engine_queue_seconds",
        "histogram",
        "Client requests' wait in the engine before prefill, by the engine's own timings: reported "
        "(vLLM's per-request metrics) or derived (llama.cpp: TTFT less the sidecar's hop and the prefill).",
        ("model",),
        "s",
        ENGINE_SPLIT_BUCKETS_SECONDS,
        group="sidecar",
    ),
    MetricSpec(
        "headroom_engine_prefill_seconds",
        "histogram",
        "Client requests' prefill time by the engine's own timings (llama.cpp prompt_ms; vLLM "
        "time_to_first_token_ms, counted from scheduling). Passive prefill rate V_P = rate(headroom_engine_prompt_tokens_total"
        '{cache="computed"}) / rate(this _sum).',
        ("model",),
        "s",
        ENGINE_SPLIT_BUCKETS_SECONDS,
        group="sidecar",
    ),
    MetricSpec(
        "headroom_engine_decode_seconds",
        "histogram",
        "Client requests' decode time (first token to last) by the engine's own timings.",
        ("model",),
        "s",
        ENGINE_SPLIT_BUCKETS_SECONDS,
        group="sidecar",
    ),
    MetricSpec(
        "headroom_engine_prompt_tokens_total",
        "counter",
        "Prompt tokens of client requests with engine timings and a prefill time: cache=computed "
        "(prefilled) or cached (read from the prefix cache). Cache hit rate = cached / both.",
        ("model", "cache"),
        "short",
        group="sidecar",
    ),
    MetricSpec(
        "headroom_output_short_total",
        "counter",
        "Answered requests that asked for exactly max_tokens (ignore_eos, as load tools do) and got "
        "fewer: a benchmark that did not measure what it sent.",
        (),
        "short",
        group="sidecar",
    ),
    MetricSpec(
        "headroom_sidecar_hop_seconds",
        "histogram",
        "The sidecar's hop before the engine: admission to the request written upstream.",
        (),
        "s",
        OVERHEAD_BUCKETS_SECONDS,
        group="sidecar",
    ),
    MetricSpec(
        "headroom_probe_marks_ignored_total",
        "counter",
        "Requests that carried headroom probe's marks (X-Headroom-Source: probe) without the "
        "sidecar's token in X-Headroom-Probe-Token: counted, logged and alerted on as ordinary "
        "traffic. reason: no_token (none sent), wrong_token, untrusted (this sidecar has no token).",
        ("reason",),
        "short",
        group="sidecar",
    ),
    MetricSpec(
        "headroom_upstream_failures_total",
        "counter",
        "Accounted requests whose exchange with the engine failed where no upstream status says "
        "so, once each, by failure class: connect_failed, connect_timeout, closed_before_headers, "
        "bad_headers, read_timeout, reset, truncated, bad_framing, bad_encoding, truncated_event, "
        "malformed_event, error_event, event_too_large, proxy_error. Each such request also counts "
        "in headroom_requests_total as upstream_error or timeout (availability SLO errors), and its "
        "row's error starts with the class.",
        ("reason",),
        "short",
        group="sidecar",
    ),
    MetricSpec(
        "headroom_connections_refused_total",
        "counter",
        "Client connections the sidecar refused or cut off: headers not complete within "
        "--header-timeout (header_timeout, 408), a body not complete within --body-timeout "
        "(body_timeout, 408), over --max-client-connections (connection_cap, 503), over "
        "--max-connections-per-source (source_connections, 429) or --max-partial-requests-per-source "
        "(source_partial_requests, 429), or a client that took nothing of its answer for "
        "--write-stall-timeout (write_stall: disconnected, its request client_cancelled).",
        ("reason",),
        "short",
        group="sidecar",
    ),
    MetricSpec(
        "headroom_upstream_wait_timeouts_total",
        "counter",
        "Requests answered 503 (outcome overloaded) because no upstream connection came free "
        "within --upstream-wait-timeout: all --max-upstream-connections were in use.",
        (),
        "short",
        group="sidecar",
    ),
    # --- engine, normalised -------------------------------------------------------------------
    MetricSpec(
        "headroom_engine_up",
        "gauge",
        "1 when the last scrape of the engine's /metrics succeeded, else 0.",
        ("engine",),
        "short",
        group="engine",
    ),
    MetricSpec(
        "headroom_engine_requests_running",
        "gauge",
        "Requests running in the engine's batch, as of the last poll.",
        _ENGINE,
        "short",
        group="engine",
    ),
    MetricSpec(
        "headroom_engine_requests_waiting",
        "gauge",
        "Requests queued in the engine, as of the last poll.",
        _ENGINE,
        "short",
        group="engine",
    ),
    MetricSpec(
        "headroom_engine_kv_cache_usage_ratio",
        "gauge",
        "KV-cache usage 0-1, as of the last poll.",
        _ENGINE,
        "percentunit",
        group="engine",
    ),
    MetricSpec(
        "headroom_engine_kv_cache_capacity_tokens",
        "gauge",
        "KV-cache capacity in tokens when the engine tells it, as of the last poll.",
        _ENGINE,
        "short",
        group="engine",
    ),
    MetricSpec(
        "headroom_engine_max_concurrency_requests",
        "gauge",
        "The engine's own ceiling on concurrent requests, as it publishes it: llama.cpp's "
        "slot count, vLLM's kv_cache_max_concurrency (a worst case at max_model_len).",
        _ENGINE,
        "short",
        group="engine",
    ),
    MetricSpec(
        "headroom_engine_preemptions_total",
        "counter",
        "Requests the engine preempted (evicted from the batch, their KV cache freed, to be "
        "recomputed later), as the engine counts them: vLLM's num_preemptions_total.",
        _ENGINE,
        "short",
        group="engine",
    ),
    MetricSpec(
        "headroom_engine_prefix_cache_queries_total",
        "counter",
        "Prompt tokens the engine looked up in its prefix cache: vLLM's "
        "prefix_cache_queries_total (0.7 and later).",
        _ENGINE,
        "short",
        group="engine",
    ),
    MetricSpec(
        "headroom_engine_prefix_cache_hits_total",
        "counter",
        "Of the prompt tokens looked up, those found in the prefix cache: vLLM's "
        "prefix_cache_hits_total (0.7 and later).",
        _ENGINE,
        "short",
        group="engine",
    ),
    # --- GPU (NVML) ---------------------------------------------------------------------------
    MetricSpec(
        "headroom_gpu_up",
        "gauge",
        "1 when NVML answered for this GPU; 0 (unlabelled) when no GPU or NVML is unavailable.",
        _GPU,
        "short",
        group="gpu",
    ),
    MetricSpec(
        "headroom_gpu_utilization_ratio",
        "gauge",
        "Fraction of the sample period during which a kernel ran on the GPU (NVML .gpu).",
        _GPU,
        "percentunit",
        group="gpu",
    ),
    MetricSpec(
        "headroom_gpu_memory_used_bytes",
        "gauge",
        "GPU framebuffer memory in use.",
        _GPU,
        "bytes",
        group="gpu",
    ),
    MetricSpec(
        "headroom_gpu_memory_total_bytes",
        "gauge",
        "GPU framebuffer memory in total.",
        _GPU,
        "bytes",
        group="gpu",
    ),
    MetricSpec(
        "headroom_gpu_memory_bandwidth_utilization_ratio",
        "gauge",
        "Fraction of the sample period during which device memory was read or written (NVML .memory).",
        _GPU,
        "percentunit",
        group="gpu",
    ),
    MetricSpec("headroom_gpu_power_watts", "gauge", "GPU power draw.", _GPU, "watt", group="gpu"),
    # --- capacity, the published estimate (collector.store.decision) ----------------------
    MetricSpec(
        "headroom_capacity_knee_requests",
        "gauge",
        "Published knee of the concurrency gradient, in concurrent requests.",
        _PUBLISHED,
        "short",
        group="capacity",
    ),
    MetricSpec(
        "headroom_capacity_knee_tokens",
        "gauge",
        "Published token capacity: time-weighted active tokens (prompt + generated so far of the "
        "in-flight requests) at the request knee with the traffic's length mix, capped at the KV "
        "cache; what 5-minute averages of headroom_active_tokens divide by.",
        _PUBLISHED,
        "short",
        group="capacity",
    ),
    MetricSpec(
        "headroom_capacity_knee_tokens_p95",
        "gauge",
        "p95 of the instantaneous active-token sum at the request knee with the traffic's length "
        "mix, capped at the KV cache: what instantaneous readers (KEDA, a gateway limit) compare with.",
        _PUBLISHED,
        "short",
        group="capacity",
    ),
    MetricSpec(
        "headroom_capacity_slo_max_requests",
        "gauge",
        "Largest measured concurrency (requests) meeting the latency SLO.",
        _PUBLISHED,
        "short",
        group="capacity",
    ),
    MetricSpec(
        "headroom_capacity_slo_max_tokens",
        "gauge",
        "Time-weighted active tokens at the SLO maximum with the traffic's length mix (withheld "
        "with the token capacity).",
        _PUBLISHED,
        "short",
        group="capacity",
    ),
    MetricSpec(
        "headroom_capacity_recommended_pool_requests",
        "gauge",
        "Recommended production concurrency pool, in requests.",
        _PUBLISHED,
        "short",
        group="capacity",
    ),
    MetricSpec(
        "headroom_capacity_recommended_pool_tokens",
        "gauge",
        "Recommended pool in tokens: the p99.9 of the instantaneous active-token sum with the "
        "recommended pool of requests in flight and the traffic's length mix, capped at the KV "
        "cache; the token budget of KEDA's trigger and a gateway's token limit.",
        _PUBLISHED,
        "short",
        group="capacity",
    ),
    MetricSpec(
        "headroom_capacity_rate_requests_per_second",
        "gauge",
        "Published open-loop capacity μ_slo: the highest arrival rate one replica serves within the "
        "SLO with no queue drift (headroom probe --rates), in requests/s.",
        _PUBLISHED,
        "reqps",
        group="capacity",
    ),
    MetricSpec(
        "headroom_capacity_prefill_tokens_per_second",
        "gauge",
        "Published prefill capacity V_P: uncached prompt tokens/s one replica prefills at μ_slo "
        "(headroom probe --rates).",
        _PUBLISHED,
        "short",
        group="capacity",
    ),
    MetricSpec(
        "headroom_capacity_estimate_timestamp_seconds",
        "gauge",
        "When the published capacity estimate was made (POSIX seconds).",
        _PUBLISHED,
        "dateTimeAsIso",
        group="capacity",
    ),
    MetricSpec(
        "headroom_replica_info",
        "gauge",
        "Always 1; the replica class this sidecar's engine belongs to (model x hardware x engine "
        "configuration: --replica-class, else derived from the GPU name and the engine's slots), "
        "whose published knee its concurrency is compared with.",
        ("replica_class",),
        "short",
        group="capacity",
    ),
    # --- pipeline health ----------------------------------------------------------------------
    MetricSpec(
        "headroom_log_rows_written_total",
        "counter",
        "Request-log rows the log sink took: inserted into DuckDB (--db), or held by a staged "
        "Parquet file in the lake (--lake; a spooled row counts once staged).",
        (),
        "short",
        group="pipeline",
    ),
    MetricSpec(
        "headroom_log_spool_files",
        "gauge",
        "Batches waiting in the on-disk spool (--lake's write-ahead) for the next roll into the lake.",
        (),
        "short",
        group="pipeline",
    ),
    MetricSpec(
        "headroom_log_spool_bytes",
        "gauge",
        "Bytes waiting in the on-disk spool (--lake's write-ahead; bounded by its cap).",
        (),
        "bytes",
        group="pipeline",
    ),
    MetricSpec(
        "headroom_log_spool_quarantined_total",
        "counter",
        "Spool files (--lake) that could not be read, set aside in the spool's quarantine/ folder "
        "(each named in a WARNING); the rest of the spool is staged.",
        (),
        "short",
        group="pipeline",
    ),
    MetricSpec(
        "headroom_log_spool_oldest_age_seconds",
        "gauge",
        "Age of the oldest batch in the spool; 0 when the spool is empty.",
        (),
        "s",
        group="pipeline",
    ),
    MetricSpec(
        "headroom_log_sink_lag_seconds",
        "gauge",
        "Age of the oldest request-log row the log sink has not taken yet (with --lake: the "
        "oldest spooled row, not yet in a staged file); 0 when caught up.",
        (),
        "s",
        group="pipeline",
    ),
    MetricSpec(
        "headroom_log_sink_up",
        "gauge",
        "1 when the log sink's last write succeeded (with --lake: the last roll staged its files "
        "in the lake), 0 when it failed; absent before the first. One series at a time; `reason` "
        "says why: ok with 1; with 0 the lake's side (unreachable: its store did not answer; "
        "unwritable: it refused the write, e.g. permissions, not a folder, read-only or full; "
        "lake_error: anything else) or the spool's volume (disk_full, spool_error, as in "
        "headroom_log_rows_dropped_total), the spool's first when both fail.",
        ("reason",),
        "short",
        group="pipeline",
    ),
    MetricSpec(
        "headroom_log_rows_dropped_total",
        "counter",
        "Request-log rows dropped, by reason (queue_full, db_error; with --lake: spool_full, the "
        "spool's cap; disk_full, its volume full; spool_error, its volume refusing writes).",
        ("reason",),
        "short",
        group="pipeline",
    ),
    # --- the lake committer (`headroom lake commit --metrics-listen`) ----------------------------
    MetricSpec(
        "headroom_lake_commit_last_success_timestamp_seconds",
        "gauge",
        "Unix time the lake committer last finished a pass without error (the catalog and the lake "
        "answered; a pass with nothing to commit counts); absent before the first.",
        (),
        "dateTimeAsIso",
        group="pipeline",
    ),
    MetricSpec(
        "headroom_lake_commit_files_total",
        "counter",
        "Staged files the lake committer registered in the Iceberg table.",
        (),
        "short",
        group="pipeline",
    ),
    MetricSpec(
        "headroom_lake_commit_rows_total",
        "counter",
        "Rows in the staged files the lake committer registered in the Iceberg table.",
        (),
        "short",
        group="pipeline",
    ),
    MetricSpec(
        "headroom_lake_quarantined_files_total",
        "counter",
        "Staged files the lake committer set aside under quarantine/ (unreadable, a schema the "
        "table does not take, a malformed name or a sequence far ahead), each named in its log.",
        (),
        "short",
        group="pipeline",
    ),
    MetricSpec(
        "headroom_lake_quarantine_files",
        "gauge",
        "Files held under the lake's quarantine/ now, until someone looks at them and deletes or "
        "re-stages them.",
        (),
        "short",
        group="pipeline",
    ),
    MetricSpec(
        "headroom_lake_staged_files_waiting",
        "gauge",
        "Staged files the table does not hold after the committer's last pass (or, when the pass "
        "failed, above the marks it last read).",
        (),
        "short",
        group="pipeline",
    ),
    MetricSpec(
        "headroom_lake_commit_lag_seconds",
        "gauge",
        "Per writer with staged files the table does not hold: the age of the oldest of them "
        "(seconds since it was staged); writers caught up have no series.",
        ("writer",),
        "s",
        group="pipeline",
    ),
    MetricSpec(
        "headroom_source_scrape_success",
        "gauge",
        "1 when the last collection from this source (engine, gpu) succeeded.",
        ("source",),
        "short",
        group="pipeline",
    ),
    MetricSpec(
        "headroom_source_scrape_duration_seconds",
        "gauge",
        "Seconds the last collection from this source took.",
        ("source",),
        "s",
        group="pipeline",
    ),
    MetricSpec(
        "headroom_signal_valid",
        "gauge",
        "1 when a capacity input (source engine: running, waiting, kv_usage, kv_capacity) can be "
        "trusted, 0 when not; `reason` says why: ok, idle, renamed (read under a known older or "
        "newer name) with 1; missing, stale, stuck, scrape_failing with 0. Rules built on a "
        "signal stay silent while it is 0.",
        ("source", "signal", "reason"),
        "short",
        group="pipeline",
    ),
    MetricSpec(
        "headroom_log_queue_rows",
        "gauge",
        "Request-log rows waiting in the writer's in-memory queue.",
        (),
        "short",
        group="pipeline",
    ),
    MetricSpec(
        "headroom_build_info",
        "gauge",
        "Always 1; the version label says which llm-headroom release is running.",
        ("version",),
        "short",
        group="pipeline",
    ),
)

BY_NAME: dict[str, MetricSpec] = {m.name: m for m in CATALOG}

# Series that other exporters publish and the dashboards read (never exported by llm-headroom):
# NVIDIA's DCGM exporter, the alternative GPU source (docs/domain.md §8).
EXTERNAL_SERIES: dict[str, str] = {
    "DCGM_FI_DEV_GPU_UTIL": "DCGM: GPU utilisation in percent (labels gpu, UUID, modelName, Hostname; "
    "pod, namespace on Kubernetes)",
    "DCGM_FI_PROF_DRAM_ACTIVE": "DCGM: fraction of cycles the device memory interface was active (0-1)",
}


def spec(name: str) -> MetricSpec:
    """Return the catalog entry for `name`; raises KeyError naming the unknown metric."""
    try:
        return BY_NAME[name]
    except KeyError:
        raise KeyError(f"metric {name!r} is not in collector.catalog.CATALOG") from None
