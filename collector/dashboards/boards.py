"""The three Grafana dashboards: capacity overview, tenants, and the weekly capacity review.

Queries read catalog metrics through `dashboards.queries` (raw series, every selector filtered by
the cluster, namespace, job and instance variables); each panel says how to read it. The
overview opens with a stat row for a 30-second glance (headroom per caliber, knee beside the
engine's own ceiling, pool, SLO burn, firing alerts), then one with the knee's provenance
(source, confidence, age: the first check of a capacity page). The capacity-panel helpers are in
`dashboards.capacity`.
"""

from __future__ import annotations

from typing import Any

from collector.dashboards.adapters import adapters_panel
from collector.dashboards.capacity import (
    concurrency_panel,
    firing,
    firing_alerts,
    fleet_panels,
    glance_row,
    gpu_panels,
    knee_provenance_row,
)
from collector.dashboards.goodput import engine_timing_panels, goodput_panels
from collector.dashboards.integrity import integrity_panels
from collector.dashboards.panels import (
    alert_annotation,
    dashboard_links,
    dashed,
    datasource_variable,
    layout,
    query_variable,
    right_axis,
    table,
    target,
    thresholds,
    timeseries,
)
from collector.dashboards.queries import VARIABLES, per_class, published, quantile, rate, sel, slo_miss_ratio
from collector.dashboards.rates import load_vs_mu_panel
from collector.rules.cluster import keep_cluster
from collector.rules.config import RulesConfig
from collector.rules.naming import sample
from collector.rules.render import GENERATED_NOTICE

__all__ = ["dashboards", "overview", "tenants", "review", "TAG"]

TAG = "llm-headroom"
_INFLIGHT = sample("headroom_inflight_requests")


def _variables(with_tenant: bool) -> list[dict[str, Any]]:
    """datasource, then cluster > namespace > job > instance > model (> tenant), each narrowing the next."""
    variables, narrowed = [datasource_variable()], list[str]()
    labels = {
        "cluster": "Cluster",
        "namespace": "Namespace",
        "job": "Job",
        "instance": "Sidecar",
        "model": "Model",
        "tenant": "Tenant",
    }
    for name in (*VARIABLES, "model", *(("tenant",) if with_tenant else ())):
        # before its first request a sidecar exports one series at 0 with model="" and tenant=""
        # (sums read 0, not nothing): the dropdowns leave that placeholder out
        selector = [*narrowed, f'{name}!=""'] if name in ("model", "tenant") else narrowed
        where = "{" + ", ".join(selector) + "}" if selector else ""
        variables.append(query_variable(name, labels[name], f"label_values({_INFLIGHT}{where}, {name})"))
        narrowed.append(f'{name}=~"${name}"')
    return variables


def _dashboard(
    uid: str,
    title: str,
    panels: list[dict[str, Any]],
    c: RulesConfig,
    *,
    time_from: str,
    with_tenant: bool = False,
) -> dict[str, Any]:
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
        "links": dashboard_links(c.runbook_base_url),
        "description": GENERATED_NOTICE.format(command="dashboards generate"),
        "time": {"from": time_from, "to": "now"},
        "annotations": {"list": [alert_annotation(firing())]},
        "templating": {"list": _variables(with_tenant)},
        "panels": layout(panels),
    }


def _latency_panels(c: RulesConfig) -> list[dict[str, Any]]:
    """TTFT, TPOT and end-to-end latency per model side by side, then p95 TTFT per sidecar."""

    def quantiles(histogram: str) -> list[dict[str, Any]]:
        return [
            target(quantile(q, histogram), f"{{{{model}}}} p{q * 100:g}", ref)
            for q, ref in ((0.5, "A"), (0.95, "B"), (0.99, "C"))
        ]

    return [
        timeseries(
            "Time to first token p50 / p95 / p99",
            f"TTFT quantiles of the selected sidecars. The red line is the {c.ttft_slo_seconds:g}s p95 "
            "SLO; a p95 climbing towards it is the earliest capacity signal.",
            quantiles("headroom_time_to_first_token_seconds"),
            "s",
            defaults=thresholds((c.ttft_slo_seconds, "red")),
            width=8,
        ),
        timeseries(
            "Time per output token p50 / p95 / p99",
            f"Decode speed per stream. The red line ({c.tpot_slo_seconds:g}s) is the slowest streaming "
            "users accept; rising TPOT with flat TTFT points at memory bandwidth.",
            quantiles("headroom_time_per_output_token_seconds"),
            "s",
            defaults=thresholds((c.tpot_slo_seconds, "red")),
            width=8,
        ),
        timeseries(
            "End-to-end latency p50 / p95 / p99",
            "Admission to the last byte, every outcome: what a non-streaming client waits. Long "
            "generations dominate it; compare with TTFT to tell queueing from long answers.",
            quantiles("headroom_request_duration_seconds"),
            "s",
            width=8,
        ),
        timeseries(
            "p95 TTFT per sidecar",
            "The same p95 per sidecar: one replica far above the others is a hot replica (uneven "
            "routing or a noisy tenant), not a fleet-wide capacity problem.",
            [
                target(
                    quantile(0.95, "headroom_time_to_first_token_seconds", by="instance, model"),
                    "{{instance}} {{model}}",
                )
            ],
            "s",
            defaults=thresholds((c.ttft_slo_seconds, "red")),
        ),
    ]


def overview(c: RulesConfig) -> dict[str, Any]:
    """Capacity overview: the glance row, concurrency against the knee, engine, latency, GPU, outcomes."""
    requests = "headroom_requests_total"
    p = [
        *glance_row(c),
        *knee_provenance_row(c),
        concurrency_panel(),
        *fleet_panels(c),
        load_vs_mu_panel(),
        *goodput_panels(c),
        timeseries(
            "Headroom per caliber (live ÷ knee)",
            "Live concurrency of each sidecar divided by its replica class's knee (else its model's "
            "default class knee), in both calibers. Under "
            f"{c.knee_warning_ratio:.0%} is comfortable; above it the near-knee alert warns; 100 % is "
            "the knee itself. Empty for a model without a capacity estimate.",
            [
                target(
                    per_class(
                        f"sum by (instance, model) ({_INFLIGHT}{sel('model')})",
                        "/",
                        "headroom_capacity_knee_requests",
                    ),
                    "{{instance}} {{model}} requests",
                    "A",
                ),
                target(
                    per_class(
                        f"sum by (instance, model) ({sample('headroom_active_tokens')}{sel('model')})",
                        "/",
                        "headroom_capacity_knee_tokens",
                    ),
                    "{{instance}} {{model}} tokens",
                    "B",
                ),
            ],
            "percentunit",
            defaults=thresholds((c.knee_warning_ratio, "orange"), (1.0, "red")),
        ),
        timeseries(
            "KV-cache usage",
            "Fraction of the engine's KV cache in use. Sustained values above the warning line mean "
            "new long requests will queue or preempt running ones.",
            [
                target(
                    f"max by (instance, model) ({sample('headroom_engine_kv_cache_usage_ratio')}"
                    f"{sel('model')})",
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
                    f"sum by (instance, model) ({sample('headroom_engine_requests_running')}{sel('model')})",
                    "{{instance}} {{model}} running",
                    "A",
                ),
                target(
                    f"sum by (instance, model) ({sample('headroom_engine_requests_waiting')}{sel('model')})",
                    "{{instance}} {{model}} waiting",
                    "B",
                ),
            ],
            "short",
            axis_label="requests",
        ),
        _engine_symptoms_panel(c),
        adapters_panel(),
        *integrity_panels(c),
        *_latency_panels(c),
        *engine_timing_panels(),
        *gpu_panels(),
        timeseries(
            "Outcomes (requests/s)",
            "Terminal requests per second by outcome, stacked. rate_limited (429) and overloaded (503) "
            "are load shedding; upstream_error and timeout are the engine failing under load.",
            [target(f"sum by (model, outcome) ({rate(requests, sel('model'))})", "{{model}} {{outcome}}")],
            "reqps",
            stack=True,
        ),
        timeseries(
            "TTFT SLO misses (1 h and 5 m)",
            f"Share of requests slower than {c.ttft_slo_seconds:g}s. The fast-burn page fires when both "
            f"windows exceed 14.4 × the {c.error_budget:.2%} budget (the line).",
            [
                target(slo_miss_ratio(c.ttft_slo_seconds, "1h"), "{{model}} 1h", "A"),
                target(slo_miss_ratio(c.ttft_slo_seconds, "5m"), "{{model}} 5m", "B"),
            ],
            "percentunit",
            defaults=thresholds((round(14.4 * c.error_budget, 9), "red")),
        ),
        firing_alerts(c),
    ]
    return _dashboard(
        "headroom-capacity-overview", "llm-headroom / Capacity overview", p, c, time_from="now-6h"
    )


def _engine_symptoms_panel(c: RulesConfig) -> dict[str, Any]:
    """vLLM's own saturation symptoms: preemptions a minute and the prefix cache's hit rate."""
    by = "sum by (instance, model)"
    hits, queries = "headroom_engine_prefix_cache_hits_total", "headroom_engine_prefix_cache_queries_total"
    return timeseries(
        "Preemptions and prefix-cache hit rate (vLLM)",
        "Requests the engine preempted a minute (left): each is evicted from the batch and "
        "recomputed later, so throughput falls as load rises. With the KV cache over "
        f"{c.kv_warning_ratio:.0%} that warns (HeadroomEnginePreempting). Right: the share of prompt "
        "tokens found in the prefix cache (vLLM 0.7 and later); a falling hit rate at the same "
        "traffic means the cache is evicting prefixes to make room, and prefill work grows. Empty "
        "for engines that do not count them.",
        [
            target(
                f"60 * {by} ({rate('headroom_engine_preemptions_total', sel('model'))})",
                "{{instance}} {{model}} preemptions/min",
                "A",
            ),
            target(
                f"{by} ({rate(hits, sel('model'))})\n/ {by} ({rate(queries, sel('model'))})",
                "{{instance}} {{model}} prefix-cache hit rate",
                "B",
            ),
        ],
        "short",
        axis_label="preemptions/min",
        overrides=(right_axis("B", "percentunit", "hit rate"),),
    )


def _tenant_tokens_rate() -> str:
    st = sel("model", "tenant")
    return (
        f"sum by (tenant) ({rate('headroom_prompt_tokens_total', st)})\n"
        f"+ sum by (tenant) ({rate('headroom_generated_tokens_total', st)})"
    )


def tenants(c: RulesConfig) -> dict[str, Any]:
    """Per-tenant concurrency in both calibers, tokens/s, 429s, and the top-N consumers."""
    st = sel("model", "tenant")
    limited = sel("model", "tenant", extra='outcome="rate_limited"')
    n = c.top_tenants
    requests = "headroom_requests_total"
    p = [
        timeseries(
            "In-flight requests per tenant",
            "Request-caliber concurrency per tenant. One tenant holding most slots starves the others.",
            [target(f"sum by (tenant) ({_INFLIGHT}{st})", "{{tenant}}")],
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
                    f"sum by (tenant) ({rate(requests, limited)})\n"
                    f"or sum by (tenant) ({rate(requests, st)}) * 0",
                    "{{tenant}}",
                )
            ],
            "reqps",
        ),
        table(
            f"Top {n} tenants by tokens/s",
            "The heaviest tenants right now, by prompt plus generated tokens/s.",
            [target(f"topk({n}, {_tenant_tokens_rate()})", "{{tenant}}")],
            "short",
        ),
        table(
            f"Top {n} tenants by active tokens",
            "Tenants holding the most tokens in flight right now.",
            [target(f"topk({n}, sum by (tenant) ({sample('headroom_active_tokens')}{st}))", "{{tenant}}")],
            "short",
        ),
    ]
    return _dashboard(
        "headroom-tenants", "llm-headroom / Tenants", p, c, time_from="now-6h", with_tenant=True
    )


def review(c: RulesConfig) -> dict[str, Any]:
    """Weekly capacity review: Little's law, p95 by hour of day, headroom trend, week over week."""
    duration, s = "headroom_request_duration_seconds", sel("model")
    completions = f"sum by (model) (rate({sample(duration, 'count')}{s}[1h]))"
    lambda_w = (
        f"{completions}\n* on (model) (\n  sum by (model) (rate({sample(duration, 'sum')}{s}[1h]))\n"
        f"  / {completions}\n)"
    )
    tokens = (
        f"sum by (model) (rate({sample('headroom_prompt_tokens_total')}{s}[5m]))\n"
        f"+ sum by (model) (rate({sample('headroom_generated_tokens_total')}{s}[5m]))"
    )
    peak = f"max_over_time(sum by (instance, model) ({_INFLIGHT}{s})[1h:1m])"
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
                target(
                    f"avg_over_time(sum by (model) ({_INFLIGHT}{s})[1h:1m])",
                    "{{model}} L mean in-flight",
                    "A",
                ),
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
                [target(f"max({quantile(0.95, 'headroom_time_to_first_token_seconds')})", "p95 TTFT")],
                "s",
                defaults=thresholds((c.ttft_slo_seconds, "red")),
                interval="1h",
                transformations=by_hour,
            ),
            type="barchart",
        ),
        timeseries(
            "Headroom trend: peak live ÷ knee per hour",
            "Hourly peak of each sidecar's in-flight requests over its replica class's knee. A rising week means "
            "the knee will be crossed at peak: plan replicas before it does.",
            [target(per_class(peak, "/", "headroom_capacity_knee_requests"), "{{instance}} {{model}}")],
            "percentunit",
            defaults=thresholds((c.knee_warning_ratio, "orange"), (1.0, "red")),
            interval="1h",
        ),
        timeseries(
            "Peak in-flight vs recommended pool",
            "Hourly peak of in-flight requests per sidecar against the recommended pool (dashed).",
            [
                target(peak, "{{instance}} {{model}} peak", "A"),
                target(
                    published("headroom_capacity_recommended_pool_requests"),
                    "{{model}} {{replica_class}} recommended pool",
                    "B",
                ),
            ],
            "short",
            axis_label="requests",
            overrides=dashed("B"),
            interval="1h",
        ),
        timeseries(
            "Tokens/s this week vs last week",
            "Throughput now and 7 days earlier (dashed): growth here is demand growth.",
            [
                target(tokens, "{{model}} this week", "A"),
                target(tokens.replace("[5m]))", "[5m] offset 7d))"), "{{model}} last week", "B"),
            ],
            "short",
            axis_label="tokens/s",
            overrides=dashed("B"),
        ),
        timeseries(
            "TTFT SLO misses over 3 days",
            f"Share of requests slower than {c.ttft_slo_seconds:g}s over a sliding 3 days; above the "
            f"{c.error_budget:.2%} budget line the slow-burn ticket opens.",
            [target(slo_miss_ratio(c.ttft_slo_seconds, "3d"), "{{model}}")],
            "percentunit",
            defaults=thresholds((c.error_budget, "red")),
        ),
    ]
    return _dashboard(
        "headroom-capacity-review", "llm-headroom / Capacity review (7 days)", p, c, time_from="now-7d"
    )


def dashboards(config: RulesConfig) -> list[dict[str, Any]]:
    """All dashboards, in file order, each query keeping the cluster label (collector.rules.cluster)."""
    return [
        _for_cluster(board, config.cluster_label)
        for board in (overview(config), tenants(config), review(config))
    ]


def _for_cluster(board: dict[str, Any], label: str) -> dict[str, Any]:
    """`board` with `label` in every by/on of its queries, and the `$cluster` variable reading `label`.

    With several clusters selected, a panel shows each cluster's series instead of their merge; a
    single-number stat stays one number. An empty label leaves the board as it is.
    """
    if not label:
        return board
    for panel in board["panels"]:
        for query in panel.get("targets", ()):
            query["expr"] = _renamed(keep_cluster(query["expr"], label, bare=False), label)
    for variable in board["templating"]["list"]:
        if variable["type"] == "query":
            definition = _renamed(variable["definition"], label)
            if variable["name"] == "cluster":
                definition = definition.replace(", cluster)", f", {label})")
            variable["definition"] = variable["query"]["query"] = definition
    return board


def _renamed(expr: str, label: str) -> str:
    """The `cluster` matcher of the scope renamed to the configured label (kubernetes-mixin's clusterLabel)."""
    return expr if label == "cluster" else expr.replace('cluster=~"$cluster"', f'{label}=~"$cluster"')
