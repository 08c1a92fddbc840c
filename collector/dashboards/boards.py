"""The three Grafana dashboards: capacity overview, tenants, and the weekly capacity review.

Queries read catalog metrics (through `rules.naming.sample`) or recording rules (`rules.records.R`), never a
retyped name. Variables: datasource, model, instance, tenant. Each panel says how to read it.
"""

from __future__ import annotations

from collector.dashboards.panels import (
    dashed,
    datasource_variable,
    layout,
    query_variable,
    right_axis,
    selector,
    table,
    target,
    thresholds,
    timeseries,
)
from collector.rules.config import RulesConfig
from collector.rules.naming import sample
from collector.rules.records import R
from collector.rules.render import GENERATED_NOTICE

__all__ = ["dashboards", "overview", "tenants", "review", "TAG"]

TAG = "llm-headroom"
MI = selector("model", "instance")
M = selector("model")
REQUESTS_CALIBER = selector("model", extra='caliber="requests"')
TOKENS_CALIBER = selector("model", extra='caliber="tokens"')
P95 = selector("model", extra='quantile="0.95"')


def _variables(with_tenant: bool) -> list[dict]:
    inflight = sample("headroom_inflight_requests")
    variables = [
        datasource_variable(),
        query_variable("model", "Model", f"label_values({inflight}, model)"),
        query_variable("instance", "Sidecar", f'label_values({inflight}{{model=~"$model"}}, instance)'),
    ]
    if with_tenant:
        variables.append(
            query_variable("tenant", "Tenant", f'label_values({inflight}{{model=~"$model"}}, tenant)')
        )
    return variables


def _dashboard(
    uid: str, title: str, panels: list[dict], *, time_from: str, with_tenant: bool = False
) -> dict:
    return {
        "uid": uid,
        "title": title,
        "tags": [TAG],
        "timezone": "utc",
        "schemaVersion": 39,
        "version": 1,
        "editable": False,
        "graphTooltip": 1,
        "refresh": "30s",
        "links": [],
        "description": GENERATED_NOTICE.format(command="dashboards generate"),
        "time": {"from": time_from, "to": "now"},
        "annotations": {"list": []},
        "templating": {"list": _variables(with_tenant)},
        "panels": layout(panels),
    }


def _concurrency_panel() -> dict:
    knee = sample("headroom_capacity_knee")
    pool = sample("headroom_capacity_recommended_pool")
    return timeseries(
        "In-flight requests and active tokens, with knee and recommended pool",
        "Both calibers of concurrency per sidecar: requests on the left axis, tokens on the right. Dashed "
        "lines are the measured knee and the recommended pool from the latest capacity estimate; live "
        "lines approaching them mean the replica is near its boundary in that caliber.",
        [
            target(
                f"sum by (instance, model) ({sample('headroom_inflight_requests')}{MI})",
                "{{instance}} {{model}} in-flight requests",
                "A",
            ),
            target(
                f"sum by (instance, model) ({sample('headroom_active_tokens')}{MI})",
                "{{instance}} {{model}} active tokens",
                "B",
            ),
            target(f"max by (model) ({knee}{REQUESTS_CALIBER})", "{{model}} knee (requests)", "C"),
            target(f"max by (model) ({knee}{TOKENS_CALIBER})", "{{model}} knee (tokens)", "D"),
            target(
                f"max by (model) ({pool}{REQUESTS_CALIBER})", "{{model}} recommended pool (requests)", "E"
            ),
        ],
        "short",
        axis_label="requests",
        overrides=(right_axis(".*tokens.*", "short", "tokens"), dashed(".*(knee|pool).*")),
    )


def overview(c: RulesConfig) -> dict:
    """Capacity overview: live concurrency against the knee, KV cache, queue, latency, GPU, outcomes."""
    p = [
        _concurrency_panel(),
        timeseries(
            "Headroom per caliber (live ÷ knee)",
            "Live concurrency divided by the measured knee, per sidecar and caliber. Under "
            f"{c.knee_warning_ratio:.0%} is comfortable; above it the near-knee alert warns; 100 % is "
            "the knee itself. Empty for a model without a capacity estimate.",
            [target(f"{R.KNEE_RATIO}{MI}", "{{instance}} {{model}} {{caliber}}")],
            "percentunit",
            defaults=thresholds((c.knee_warning_ratio, "orange"), (1.0, "red")),
        ),
        timeseries(
            "KV-cache usage",
            "Fraction of the engine's KV cache in use. Sustained values above the warning line mean "
            "new long requests will queue or preempt running ones.",
            [
                target(
                    f"max by (instance, model) ({sample('headroom_engine_kv_cache_usage_ratio')}{MI})",
                    "{{instance}} {{model}}",
                )
            ],
            "percentunit",
            defaults=thresholds((c.kv_warning_ratio, "orange"), (c.kv_critical_ratio, "red")),
        ),
        timeseries(
            "Running vs waiting in the engine",
            "Requests in the engine's batch and in its queue. Waiting that never returns to zero "
            "means supply is saturated (a scale-out signal).",
            [
                target(
                    f"sum by (instance, model) ({sample('headroom_engine_requests_running')}{MI})",
                    "{{instance}} {{model}} running",
                    "A",
                ),
                target(
                    f"sum by (instance, model) ({sample('headroom_engine_requests_waiting')}{MI})",
                    "{{instance}} {{model}} waiting",
                    "B",
                ),
            ],
            "short",
            axis_label="requests",
        ),
        timeseries(
            "Time to first token p50 / p95 / p99",
            f"TTFT quantiles from the sidecar's histogram (5 min rate). The red line is the "
            f"{c.ttft_slo_seconds:g}s p95 SLO; a p95 climbing towards it is the earliest capacity signal.",
            [target(f"{R.TTFT_QUANTILE}{M}", "{{model}} q{{quantile}}")],
            "s",
            defaults=thresholds((c.ttft_slo_seconds, "red")),
        ),
        timeseries(
            "Time per output token p50 / p95 / p99",
            f"Decode speed per stream. The red line ({c.tpot_slo_seconds:g}s) is the slowest "
            "streaming users accept; rising TPOT with flat TTFT points at memory bandwidth.",
            [target(f"{R.TPOT_QUANTILE}{M}", "{{model}} q{{quantile}}")],
            "s",
            defaults=thresholds((c.tpot_slo_seconds, "red")),
        ),
        timeseries(
            "GPU utilisation against tokens/s",
            "GPU busy ratio (left) and tokens/s through the sidecar (right). They should move "
            "together; utilisation near 100 % with flat tokens/s means batching or bandwidth is the "
            "bottleneck, and more GPUs will not help.",
            [
                target(f"{R.GPU_UTILIZATION}{selector('instance')}", "{{instance}} GPU utilisation", "A"),
                target(f"sum by (instance) ({R.TOKENS_RATE_INSTANCE}{MI})", "{{instance}} tokens/s", "B"),
            ],
            "percentunit",
            overrides=(right_axis(".*tokens/s.*", "short", "tokens/s"),),
        ),
        timeseries(
            "Outcomes (requests/s)",
            "Terminal requests per second by outcome, stacked. rate_limited is the 429 rate; "
            "upstream_error and timeout are the engine failing under load.",
            [target(f"{R.OUTCOME_RATE}{M}", "{{model}} {{outcome}}")],
            "reqps",
            stack=True,
        ),
        timeseries(
            "429 ratio",
            f"Share of requests answered 429. The line is the alert threshold ({c.rate_limited_ratio:.0%}).",
            [target(f"{R.RATE_LIMITED_RATIO}{M}", "{{model}}")],
            "percentunit",
            defaults=thresholds((c.rate_limited_ratio, "red")),
        ),
        timeseries(
            "TTFT SLO misses (1 h and 5 m)",
            f"Share of requests slower than {c.ttft_slo_seconds:g}s. The fast-burn page fires when both "
            f"windows exceed 14.4 × the {c.error_budget:.2%} budget (the line).",
            [
                target(f"{R.slo_misses('1h')}{M}", "{{model}} 1h", "A"),
                target(f"{R.slo_misses('5m')}{M}", "{{model}} 5m", "B"),
            ],
            "percentunit",
            defaults=thresholds((round(14.4 * c.error_budget, 9), "red")),
        ),
        table(
            "Capacity signals firing",
            "Headroom alerts firing now, per model. Two or more of the four scale-out signals at once "
            "raise HeadroomNearCapacityLimit (the page).",
            [
                target(
                    f'sum by (alertname, model, severity) (ALERTS{{alertstate="firing", '
                    f'alertname=~"Headroom.*", {M[1:-1]}}})',
                    "{{alertname}}",
                    instant=True,
                )
            ],
            "short",
            full=True,
        ),
    ]
    return _dashboard("headroom-capacity-overview", "llm-headroom / Capacity overview", p, time_from="now-6h")


def _tenant_tokens_rate() -> str:
    st = selector("model", "instance", "tenant")
    return (
        f"sum by (tenant) (rate({sample('headroom_prompt_tokens_total')}{st}[$__rate_interval]))\n"
        f"+ sum by (tenant) (rate({sample('headroom_generated_tokens_total')}{st}[$__rate_interval]))"
    )


def tenants(c: RulesConfig) -> dict:
    """Per-tenant concurrency in both calibers, tokens/s, 429s, and the top-N consumers."""
    st = selector("model", "instance", "tenant")
    requests = sample("headroom_requests_total")
    limited = selector("model", "instance", "tenant", extra='outcome="rate_limited"')
    n = c.top_tenants
    p = [
        timeseries(
            "In-flight requests per tenant",
            "Request-caliber concurrency per tenant. One tenant holding most slots starves the others.",
            [target(f"sum by (tenant) ({sample('headroom_inflight_requests')}{st})", "{{tenant}}")],
            "short",
            axis_label="requests",
        ),
        timeseries(
            "Active tokens per tenant",
            "Token-caliber concurrency per tenant. A tenant high here but not in requests sends long "
            "contexts: it fills the KV cache with few requests.",
            [target(f"sum by (tenant) ({sample('headroom_active_tokens')}{st})", "{{tenant}}")],
            "short",
            axis_label="tokens",
        ),
        timeseries(
            "Tokens/s per tenant",
            "Prompt plus generated tokens per second per tenant: the TPM quota's view of each tenant.",
            [target(_tenant_tokens_rate(), "{{tenant}}")],
            "short",
            axis_label="tokens/s",
        ),
        timeseries(
            "429s per tenant",
            "Requests per second answered 429 per tenant (0 while a tenant has none). Spread across "
            "all tenants means the engine is full; one tenant means its quota is.",
            [
                target(
                    f"sum by (tenant) (rate({requests}{limited}[$__rate_interval]))\n"
                    f"or sum by (tenant) (rate({requests}{st}[$__rate_interval])) * 0",
                    "{{tenant}}",
                )
            ],
            "reqps",
        ),
        table(
            f"Top {n} tenants by tokens/s",
            "The heaviest tenants right now, by prompt plus generated tokens/s.",
            [target(f"topk({n}, {_tenant_tokens_rate()})", "{{tenant}}", instant=True)],
            "short",
        ),
        table(
            f"Top {n} tenants by active tokens",
            "Tenants holding the most tokens in flight right now.",
            [
                target(
                    f"topk({n}, sum by (tenant) ({sample('headroom_active_tokens')}{st}))",
                    "{{tenant}}",
                    instant=True,
                )
            ],
            "short",
        ),
    ]
    return _dashboard("headroom-tenants", "llm-headroom / Tenants", p, time_from="now-6h", with_tenant=True)


def review(c: RulesConfig) -> dict:
    """Weekly capacity review: Little's law, p95 by hour of day, headroom trend, week over week."""
    requests, duration = sample("headroom_requests_total"), "headroom_request_duration_seconds"
    lambda_w = (
        f"sum by (model) (rate({requests}{M}[1h]))\n* on (model) (\n"
        f"  sum by (model) (rate({sample(duration, 'sum')}{M}[1h]))\n"
        f"  / sum by (model) (rate({sample(duration, 'count')}{M}[1h]))\n)"
    )
    by_hour = [
        {"id": "formatTime", "options": {"timeField": "Time", "outputFormat": "HH", "useTimezone": True}},
        {
            "id": "groupBy",
            "options": {
                "fields": {
                    "Time": {"aggregations": [], "operation": "groupby"},
                    "p95 TTFT": {"aggregations": ["mean"], "operation": "aggregate"},
                }
            },
        },
        {"id": "sortBy", "options": {"sort": [{"field": "Time"}]}},
    ]
    p = [
        timeseries(
            "Little's law: mean in-flight vs throughput × mean e2e",
            "Per hour, L (mean in-flight) should equal λ·W (requests/s × mean seconds per request). "
            "A persistent gap means lost requests, clock errors or counting bugs, not load.",
            [
                target(f"avg_over_time({R.INFLIGHT}{M}[1h])", "{{model}} L mean in-flight", "A"),
                target(lambda_w, "{{model}} λ·W", "B"),
            ],
            "short",
            axis_label="requests",
            interval="1h",
        ),
        dict(
            timeseries(
                "p95 TTFT by hour of day (UTC)",
                "Hourly p95 TTFT averaged per hour of the day over the range: the busy hours are where "
                "headroom runs out first. Compare with the SLO line.",
                [target(f"max({R.TTFT_QUANTILE}{P95})", "p95 TTFT")],
                "s",
                defaults=thresholds((c.ttft_slo_seconds, "red")),
                interval="1h",
                transformations=by_hour,
            ),
            type="barchart",
        ),
        timeseries(
            "Headroom trend: peak live ÷ knee per hour",
            "Hourly peak of live concurrency over the knee, per caliber. A rising week means the "
            "knee will be crossed at peak: plan replicas before it does.",
            [target(f"max_over_time({R.KNEE_RATIO}{MI}[1h])", "{{instance}} {{model}} {{caliber}}")],
            "percentunit",
            defaults=thresholds((c.knee_warning_ratio, "orange"), (1.0, "red")),
            interval="1h",
        ),
        timeseries(
            "Peak in-flight vs recommended pool",
            "Hourly peak of in-flight requests per sidecar against the recommended pool (dashed).",
            [
                target(f"max_over_time({R.INFLIGHT_INSTANCE}{MI}[1h])", "{{instance}} {{model}} peak", "A"),
                target(
                    f"max by (model) ({sample('headroom_capacity_recommended_pool')}{REQUESTS_CALIBER})",
                    "{{model}} recommended pool",
                    "B",
                ),
            ],
            "short",
            axis_label="requests",
            overrides=(dashed(".*pool.*"),),
            interval="1h",
        ),
        timeseries(
            "Tokens/s this week vs last week",
            "Throughput now and 7 days earlier (dashed): growth here is demand growth.",
            [
                target(f"{R.TOKENS_RATE}{M}", "{{model}} this week", "A"),
                target(f"{R.TOKENS_RATE}{M} offset 7d", "{{model}} last week", "B"),
            ],
            "short",
            axis_label="tokens/s",
            overrides=(dashed(".*last week.*"),),
        ),
        timeseries(
            "TTFT SLO misses over 3 days",
            f"Share of requests slower than {c.ttft_slo_seconds:g}s over a sliding 3 days; above the "
            f"{c.error_budget:.2%} budget line the slow-burn ticket opens.",
            [target(f"{R.slo_misses('3d')}{M}", "{{model}}")],
            "percentunit",
            defaults=thresholds((c.error_budget, "red")),
        ),
    ]
    return _dashboard(
        "headroom-capacity-review", "llm-headroom / Capacity review (7 days)", p, time_from="now-7d"
    )


def dashboards(config: RulesConfig) -> list[dict]:
    """All dashboards, in file order."""
    return [overview(config), tenants(config), review(config)]
