"""Recording-rule names: the one namespace dashboards and alerts read them from (`R.INFLIGHT` ...).

Names follow `level:metric:operations` (collector.rules.naming). Levels: `instance_model` (one
sidecar, one model: concurrency is a per-replica quantity compared with the per-replica knee),
`instance_model_task_class_caliber` (the same, per task class and caliber, against that class's
knee), `model` (the fleet serving a model: rates, latency, SLO), `model_replica_class` (a model's
replicas of one replica class: what a class's published capacity compares with), `instance` (one
machine: GPU). The
expressions behind them are in collector.alerts.recording; a dashboard only needs the name.

    R.REQUESTS_RATE             -> "model:headroom_requests:rate5m"
    R.slo_misses("1h")          -> "model:headroom_ttft_slo_misses:ratio_rate1h"
    R.slo_misses("1h", "e2e")   -> "model:headroom_e2e_slo_misses:ratio_rate1h"
    R.attainment("1h")          -> "model:headroom_goodput:ratio_rate1h"
"""

from __future__ import annotations

from collector.rules.naming import record

__all__ = ["R", "QUANTILES", "SLO_WINDOWS", "RATE_WINDOW", "SLO_KINDS"]

QUANTILES = ("0.5", "0.95", "0.99")
# Rate window of every recording rule (it is in the record names): >= 4 scrape intervals.
RATE_WINDOW = "5m"
# Burn-rate windows of the multi-window alerts (SRE Workbook): short and long for each speed.
SLO_WINDOWS = ("5m", "30m", "1h", "6h", "3d")
# The three SLIs, each a share of requests that missed: TTFT over its target, end-to-end over its
# target, or failed (availability).
SLO_KINDS = ("ttft", "e2e", "availability")


class R:
    """Record names, in one namespace: `R.INFLIGHT_INSTANCE` and so on."""

    INFLIGHT_INSTANCE = record("instance_model", "headroom_inflight_requests", "sum")
    TOKENS_INSTANCE = record("instance_model", "headroom_active_tokens", "sum")
    INFLIGHT = record("model", "headroom_inflight_requests", "sum")
    ACTIVE_TOKENS = record("model", "headroom_active_tokens", "sum")
    CONCURRENCY = record("instance_model_caliber", "headroom_concurrency", "sum")
    # Each sidecar's replica class (headroom_replica_info; "default" for a sidecar that exports
    # none). The class is the instance's, so the records joined to it keep their instance level.
    REPLICA_CLASS = record("instance", "headroom_replica_info", "max")
    # 5-minute mean concurrency / the published knee of the sidecar's replica class, per task class
    # (task_class="all": every request against the knee measured over every kind of request).
    KNEE_RATIO = record("instance_model_task_class_caliber", "headroom_concurrency", "avg5m_knee_ratio")
    # The fleet (one cluster's replicas of a model): load and capacity summed over replicas, and
    # the replicas the load needs at each replica's pool: its replica class's (task class "all").
    REPLICA_POOL = record("instance_model_caliber", "headroom_replica_pool", "max")
    POOL_PER_REPLICA = record("model_caliber", "headroom_replica_pool", "avg")
    FLEET_POOL = record("model_caliber", "headroom_fleet_pool", "sum")
    FLEET_KNEE = record("model_caliber", "headroom_fleet_knee", "sum")
    REPLICAS = record("model", "headroom_replicas", "count")
    FLEET_LOAD = record("model_caliber", "headroom_concurrency", "avg5m_sum")
    FLEET_LOAD_FORECAST = record("model_caliber", "headroom_concurrency", "avg5m_sum_forecast")
    FLEET_POOL_RATIO = record("model_caliber", "headroom_concurrency", "avg5m_sum_pool_ratio")
    REPLICAS_NEEDED = record("model_caliber", "headroom_replicas_needed", "ceil")
    REPLICAS_NEEDED_FORECAST = record("model_caliber", "headroom_replicas_needed", "forecast_ceil")
    REQUESTS_RATE = record("model", "headroom_requests_total", "rate5m")
    OUTCOME_RATE = record("model_outcome", "headroom_requests_total", "rate5m")
    RATE_LIMITED_RATIO = record("model", "headroom_requests_rate_limited", "ratio_rate5m")
    SHED_RATIO = record("model", "headroom_requests_shed", "ratio_rate5m")
    TOKENS_RATE = record("model", "headroom_tokens", "rate5m")
    TOKENS_RATE_INSTANCE = record("instance_model", "headroom_tokens", "rate5m")
    GENERATED_RATE = record("model", "headroom_generated_tokens_total", "rate5m")
    TTFT_QUANTILE = record(
        "model_quantile", "headroom_time_to_first_token_seconds", "histogram_quantile_rate5m"
    )
    TPOT_QUANTILE = record(
        "model_quantile", "headroom_time_per_output_token_seconds", "histogram_quantile_rate5m"
    )
    E2E_QUANTILE = record("model_quantile", "headroom_request_duration_seconds", "histogram_quantile_rate5m")
    E2E_MEAN = record("model", "headroom_request_duration_seconds", "mean_rate5m")
    TTFT_QUANTILE_INSTANCE = record(
        "instance_model_quantile", "headroom_time_to_first_token_seconds", "histogram_quantile_rate5m"
    )
    WAITING = record("model", "headroom_engine_requests_waiting", "sum")
    WAITING_INSTANCE = record("instance", "headroom_engine_requests_waiting", "sum")
    RUNNING = record("model", "headroom_engine_requests_running", "sum")
    KV_USAGE = record("model", "headroom_engine_kv_cache_usage_ratio", "max")
    GPU_UTILIZATION = record("instance", "headroom_gpu_utilization_ratio", "avg")
    # Goodput (collector.goodput): requests/s that met their SLO, per model and per replica class
    # (the level μ_slo is published at), and the generated tokens of those requests, per second and
    # as a share of every generated token (token goodput %). Attainment: R.attainment(window).
    GOODPUT_RATE = record("model", "headroom_goodput", "rate5m")
    GOODPUT_RATE_CLASS = record("model_replica_class", "headroom_goodput", "rate5m")
    GOOD_TOKENS_RATE = record("model", "headroom_slo_good_tokens_total", "rate5m")
    GOOD_TOKENS_RATIO = record("model", "headroom_slo_good_tokens_total", "ratio_rate5m")
    # The engine's own timings: the passive prefill rate V_P per replica class (beside the published
    # headroom_capacity_prefill_tokens_per_second) and the prefix cache's share of prompt tokens.
    PREFILL_RATE_CLASS = record("model_replica_class", "headroom_prefill_tokens_per_second", "ratio_rate5m")
    PROMPT_CACHE_HIT_RATIO = record("model", "headroom_prompt_cache_hits", "ratio_rate5m")

    @staticmethod
    def attainment(window: str) -> str:
        """Record name of goodput attainment over `window` (SLO_WINDOWS): met / every verdict but invalid."""
        if window not in SLO_WINDOWS:
            raise ValueError(f"window {window!r} is not one of {SLO_WINDOWS}")
        return record("model", "headroom_goodput", f"ratio_rate{window}")

    @staticmethod
    def slo_misses(window: str, kind: str = "ttft") -> str:
        """Record name of the `kind` SLO miss ratio over `window` (SLO_KINDS, SLO_WINDOWS)."""
        if kind not in SLO_KINDS:
            raise ValueError(f"SLO kind {kind!r} is not one of {SLO_KINDS}")
        return record("model", f"headroom_{kind}_slo_misses", f"ratio_rate{window}")
