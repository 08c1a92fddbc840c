"""The capacity panels of the overview: the glance row, concurrency against the knee, GPU, alerts.

The glance row is what on-call reads first: per caliber, how close the busiest selected sidecar
is to its knee; the knee beside the engine's own ceiling (llama.cpp slots, vLLM
kv_cache_max_concurrency: a worst case at max_model_len, so often far above the measured knee);
the pool; the SLO burn rate; how many headroom alerts fire.
"""

from __future__ import annotations

from typing import Any

from collector.catalog import EXTERNAL_SERIES
from collector.dashboards.panels import dashed, right_axis, stat, table, target, thresholds, timeseries
from collector.dashboards.queries import per_class, published, scoped, sel, served, slo_miss_ratio
from collector.rules.config import RulesConfig, seconds
from collector.rules.naming import sample

__all__ = [
    "glance_row",
    "knee_provenance_row",
    "concurrency_panel",
    "gpu_panels",
    "firing_alerts",
    "firing",
    "fleet_panels",
]

_INFLIGHT, _TOKENS = sample("headroom_inflight_requests"), sample("headroom_active_tokens")
_CEILING = sample("headroom_engine_max_concurrency_requests")
_DCGM_UTIL, _DCGM_DRAM = (name for name in EXTERNAL_SERIES if name.startswith("DCGM_"))


def _live_over_knee(live: str, knee: str) -> str:
    """Busiest selected sidecar's live concurrency over its own replica class's knee."""
    per_sidecar = f"sum by (instance, model) ({live}{sel('model')})"
    return f"max({per_class(per_sidecar, '/', knee)})"


def _ceiling_per_model() -> str:
    return served(f"max by (model) ({_CEILING}{sel('model')})")


def firing() -> str:
    """Headroom alerts firing now on the selected models."""
    return served("ALERTS" + scoped('alertstate="firing", alertname=~"Headroom.*", model=~"$model"'))


def glance_row(c: RulesConfig) -> list[dict[str, Any]]:
    """Six stat panels across the top of the overview."""
    near = thresholds((c.knee_warning_ratio, "orange"), (1.0, "red"))
    burn = f"max({slo_miss_ratio(c.ttft_slo_seconds, '1h')}) / {c.error_budget:g}"
    return [
        stat(
            "Requests: live ÷ knee",
            "In-flight requests of the busiest selected sidecar over its measured knee. "
            f"Orange from {c.knee_warning_ratio:.0%} (past the recommended pool), red at the knee.",
            [target(_live_over_knee(_INFLIGHT, "headroom_capacity_knee_requests"), "requests")],
            "percentunit",
            defaults=near,
        ),
        stat(
            "Tokens: live ÷ knee p95",
            "Active tokens of the busiest selected sidecar now over the p95 of its token capacity "
            "(an instantaneous value against a peak-aware figure; the 5-minute rules divide their "
            "averages by the time-weighted mean): the caliber that long contexts exhaust while the "
            "request count looks fine.",
            [target(_live_over_knee(_TOKENS, "headroom_capacity_knee_tokens_p95"), "tokens")],
            "percentunit",
            defaults=near,
        ),
        stat(
            "Knee vs engine ceiling",
            "The measured knee (requests) beside the ceiling the engine itself "
            "publishes: llama.cpp's slots, vLLM's kv_cache_max_concurrency (a worst case at max_model_len). "
            "A knee far below the ceiling is normal: latency, not memory, bounds it.",
            [
                target(f"max({published('headroom_capacity_knee_requests')})", "knee", "A"),
                target(f"max({_ceiling_per_model()})", "engine ceiling", "B"),
            ],
            "short",
            decimals=0,
        ),
        stat(
            "Recommended pool",
            "The concurrency per replica to run in production (requests), from the latest "
            "estimate: 70-80 % of the knee, or the SLO maximum when it is lower.",
            [target(f"max({published('headroom_capacity_recommended_pool_requests')})", "pool")],
            "short",
            decimals=0,
        ),
        stat(
            "TTFT SLO burn (1 h)",
            f"How fast the {c.ttft_slo_objective:.0%} TTFT objective's error budget burns: "
            "1 spends it in exactly 30 days; 14.4 with the 5 m window pages (the red threshold).",
            [target(burn, "burn rate")],
            "short",
            decimals=1,
            defaults=thresholds((1.0, "orange"), (14.4, "red")),
        ),
        stat(
            "Headroom alerts firing",
            "Headroom alerts firing now on the selected models; the table at the bottom "
            "names them, each with its runbook.",
            [target(f"count({firing()}) or vector(0)", "firing")],
            "short",
            decimals=0,
            defaults=thresholds((1, "red")),
        ),
    ]


def knee_provenance_row(c: RulesConfig) -> list[dict[str, Any]]:
    """Under the glance row: where the knee every ratio divides by comes from, and how old it is.

    The first of a capacity page's three checks (docs/runbooks.md): a probe or traffic estimate,
    its confidence, its age (orange past the age limit that HeadroomCapacityEstimateStale warns at).
    """
    where = scoped('model=~"$model", task_class="all"')
    knee = sample("headroom_capacity_knee_requests")
    stamp = sample("headroom_capacity_estimate_timestamp_seconds")

    def label_stat(title: str, description: str, label: str) -> dict[str, Any]:
        expr = served(f"max by (model, replica_class, {label}) ({knee}{where})")
        panel = stat(
            title,
            description,
            [target(expr, f"{{{{model}}}} {{{{replica_class}}}}: {{{{{label}}}}}")],
            "none",
        )
        panel["options"]["textMode"] = "name"
        panel["options"]["colorMode"] = "none"
        return panel | {"width": 8}

    age = stat(
        "Knee age",
        "Age of the published estimate per model and replica class. Past "
        f"{c.estimate_max_age} (the probe's age limit) HeadroomCapacityEstimateStale warns: the "
        "model, engine or hardware may have moved the knee; re-measure with `headroom probe`.",
        [
            target(
                served(f"time() - max by (model, replica_class) ({stamp}{where})"),
                "{{model}} {{replica_class}}",
            )
        ],
        "s",
        decimals=0,
        defaults=thresholds((seconds(c.estimate_max_age), "orange")),
    )
    return [
        label_stat(
            "Knee source",
            "Where the published knee comes from, per model and replica class: `probe` (a measured "
            "concurrency gradient) or `traffic` (the passive curve of production requests).",
            "source",
        ),
        label_stat(
            "Knee confidence",
            "The published estimate's confidence (measured, high, medium, low). Low: the capacity "
            "alerts divide by a guess, and HeadroomCapacityEstimateStale warns.",
            "confidence",
        ),
        age | {"width": 8},
    ]


def concurrency_panel() -> dict[str, Any]:
    """Both calibers per sidecar with the knee, the pool and the engine's ceiling as dashed lines."""
    return timeseries(
        "In-flight requests and active tokens, with knee, pool and the engine's ceiling",
        "Both calibers of concurrency per sidecar: requests on the left axis, tokens on the right. Dashed "
        "lines are the measured knee and the recommended pool from the latest capacity estimate, and the "
        "engine's own ceiling (its slots or vLLM's worst-case KV concurrency); live lines approaching the "
        "knee mean the replica is near its boundary in that caliber. In tokens there are two knee lines: "
        "the time-weighted mean of the active tokens at the request knee (what 5-minute averages are "
        "held to) and its p95 (what an instantaneous limit takes: KEDA's token trigger, the gateway's "
        "maxTokenConcurrency).",
        [
            target(
                f"sum by (instance, model) ({_INFLIGHT}{sel('model')})",
                "{{instance}} {{model}} in-flight requests",
                "A",
            ),
            target(
                f"sum by (instance, model) ({_TOKENS}{sel('model')})",
                "{{instance}} {{model}} active tokens",
                "B",
            ),
            target(
                published("headroom_capacity_knee_requests"),
                "{{model}} {{replica_class}} knee (requests)",
                "C",
            ),
            target(
                published("headroom_capacity_knee_tokens"), "{{model}} {{replica_class}} knee (tokens)", "D"
            ),
            target(
                published("headroom_capacity_knee_tokens_p95"),
                "{{model}} {{replica_class}} knee p95 (tokens)",
                "G",
            ),
            target(
                published("headroom_capacity_recommended_pool_requests"),
                "{{model}} {{replica_class}} recommended pool (requests)",
                "E",
            ),
            target(
                f"max by (instance, model) ({_CEILING}{sel('model')})",
                "{{instance}} {{model}} engine ceiling",
                "F",
            ),
        ],
        "short",
        axis_label="requests",
        full=True,
        overrides=(
            right_axis("B", "short", "tokens"),
            right_axis("D", "short", "tokens"),
            right_axis("G", "short", "tokens"),
            *dashed("C", "D", "E", "F", "G"),
        ),
    )


def gpu_panels() -> list[dict[str, Any]]:
    """GPU busy ratio from the sidecar's NVML and, as an alternative source, NVIDIA's DCGM exporter."""
    tokens = (
        f"sum by (instance) (rate({sample('headroom_prompt_tokens_total')}{sel('model')}[$__rate_interval]))\n"
        f"+ sum by (instance) (rate({sample('headroom_generated_tokens_total')}{sel('model')}[$__rate_interval]))"
    )
    pods = f"group by (namespace, pod) ({sample('headroom_build_info')}{sel()})"
    return [
        timeseries(
            "GPU utilisation against tokens/s (NVML)",
            "GPU busy ratio from the sidecar's NVML (left) and tokens/s through it (right). They should "
            "move together; utilisation near 100 % with flat tokens/s means batching or bandwidth is the "
            "bottleneck, and more GPUs will not help.",
            [
                target(
                    f"avg by (instance) ({sample('headroom_gpu_utilization_ratio')}{sel()})",
                    "{{instance}} GPU utilisation",
                    "A",
                ),
                target(tokens, "{{instance}} tokens/s", "B"),
            ],
            "percentunit",
            overrides=(right_axis("B", "short", "tokens/s"),),
        ),
        timeseries(
            "GPU utilisation and memory bandwidth (DCGM)",
            "The same GPUs through NVIDIA's DCGM exporter, when it runs (compose profile `dcgm`, or the "
            "GPU operator): SM busy and DRAM activity of the GPUs in the selected sidecars' pods. Empty "
            "without DCGM; the NVML panel needs no exporter.",
            [
                target(
                    f"avg by (Hostname, gpu) ({_DCGM_UTIL}{scoped()} / 100\n"
                    f"* on (namespace, pod) group_left() {pods})",
                    "{{Hostname}} GPU {{gpu}} utilisation",
                    "A",
                ),
                target(
                    f"avg by (Hostname, gpu) ({_DCGM_DRAM}{scoped()}\n"
                    f"* on (namespace, pod) group_left() {pods})",
                    "{{Hostname}} GPU {{gpu}} DRAM active",
                    "B",
                ),
            ],
            "percentunit",
        ),
    ]


def firing_alerts(c: RulesConfig) -> dict[str, Any]:
    """The table of Headroom alerts firing now, each row linking to its runbook."""
    return table(
        "Capacity signals firing",
        "Headroom alerts firing now on the selected models. Two or more of the four scale-out signals at "
        "once raise HeadroomNearCapacityLimit (the page). Click an alert name for its runbook.",
        [target(f"sum by (alertname, model, severity) ({firing()})", "{{alertname}}")],
        "short",
        full=True,
        overrides=(
            {
                "matcher": {"id": "byName", "options": "alertname"},
                "properties": [
                    {
                        "id": "links",
                        "value": [
                            {
                                "title": "Runbook",
                                "targetBlank": True,
                                "url": f"{c.runbook_base_url}#${{__value.raw:lowercase}}",
                            }
                        ],
                    }
                ],
            },
        ),
    )


def _pool_per_replica(caliber: str) -> str:
    """Each selected replica's pool, its replica class's (tokens: knee_tokens x pool / knee),
    averaged per model."""
    serving = f"group by (instance, model) ({_INFLIGHT}{sel('model')})"

    def gauge(name: str) -> str:
        return per_class(serving, "*", name)

    pool = gauge("headroom_capacity_recommended_pool_requests")
    if caliber == "tokens":
        knee_tokens, knee = gauge("headroom_capacity_knee_tokens"), gauge("headroom_capacity_knee_requests")
        pool = f"{knee_tokens} * on (instance, model) ({pool} / on (instance, model) {knee})"
    return f"avg by (model) ({pool})"


def _replicas_needed(live: str, caliber: str, c: RulesConfig, forecast: bool = False) -> str:
    """ceil(the selected replicas' summed 5-minute mean load (or its forecast) / pool per replica)."""
    load = f"sum by (model) (avg_over_time({live}{sel('model')}[5m]))"
    if forecast:
        horizon = seconds(c.knee_forecast_horizon)
        load = f"clamp_min(predict_linear(({load})[{c.knee_forecast_window}:], {horizon}), 0)"
    return f"ceil(\n  {load}\n  / on (model) {_pool_per_replica(caliber)}\n)"


def fleet_panels(c: RulesConfig) -> list[dict[str, Any]]:
    """The fleet row: replicas serving each model against the replicas its load needs, now and ahead."""
    serving = f"count by (model) (group by (instance, model) ({_INFLIGHT}{sel('model')}))"
    return [
        timeseries(
            "Fleet: replicas serving vs replicas needed, per cluster and model",
            "Replicas the selected load needs at each replica's published pool (the measured capacity "
            "per replica under the SLO, summed): ceil(load ÷ pool per replica), in each caliber, now "
            f"and on the {c.knee_forecast_window} trend {c.knee_forecast_horizon} ahead, beside the "
            "replicas serving. Needed above serving: add replicas (or let the autoscaler). The "
            "HeadroomFleetHeadroomLow warning fires when less than one replica's pool is spare at the "
            "forecast.",
            [
                target(serving, "{{model}} serving", "A"),
                target(_replicas_needed(_INFLIGHT, "requests", c), "{{model}} needed (requests)", "B"),
                target(_replicas_needed(_TOKENS, "tokens", c), "{{model}} needed (tokens)", "C"),
                target(
                    _replicas_needed(_INFLIGHT, "requests", c, forecast=True),
                    f"{{{{model}}}} needed in {c.knee_forecast_horizon} (requests)",
                    "D",
                ),
            ],
            "short",
            axis_label="replicas",
            full=True,
        )
    ]
