"""Alerting rules: the four scale-out signals and their composite, KV cache, knee, 429s, SLO burn, pipeline.

Every alert has `severity` (critical pages, warning opens a ticket), a summary, a templated
description, and a `runbook_url` to its anchor in docs/runbooks.md. Capacity thresholds compare
live values with the `headroom_capacity_*` gauges through recording rules, so no alert carries a
concurrency number and an alert is silent while no estimate exists.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from collector.alerts.templating import to_go
from collector.rules.config import RulesConfig
from collector.rules.naming import sample
from collector.rules.records import R

__all__ = ["Alert", "alerts", "alerting_groups", "SIGNALS"]

# label `signal` of the four scale-out signals (docs/domain.md §5); the composite counts distinct values.
SIGNALS = ("ttft_rising", "queue_not_draining", "gpu_saturated_flat", "tail_latency")


@dataclass(frozen=True)
class Alert:
    """One alert before rendering; `summary`/`description` use the `<label>`/`<value:fn>` notation."""

    name: str
    group: str
    expr: str
    severity: str
    summary: str
    description: str
    labels: dict[str, str] = field(default_factory=dict)

    @property
    def anchor(self) -> str:
        """The docs/runbooks.md anchor: the heading `## <name>` lower-cased."""
        return self.name.lower()

    def to_rule(self, config: RulesConfig) -> dict:
        """The Prometheus rule dict for this alert under `config`."""
        return {
            "alert": self.name,
            "expr": self.expr,
            "for": config.for_duration(self.name),
            "labels": {"severity": self.severity, **self.labels},
            "annotations": {
                "summary": to_go(self.summary),
                "description": to_go(self.description),
                "runbook_url": f"{config.runbook_base_url}#{self.anchor}",
            },
        }


def _number(value: float) -> str:
    """A threshold as PromQL text without float noise (14.4 * 0.01 -> 0.144)."""
    return repr(round(value, 9))


def _signals(c: RulesConfig) -> list[Alert]:
    p95, p99 = f'{R.TTFT_QUANTILE}{{quantile="0.95"}}', f'{R.TTFT_QUANTILE}{{quantile="0.99"}}'
    trend = c.ttft_trend_window
    return [
        Alert(
            "HeadroomTTFTRising",
            "headroom-capacity-signals",
            f"{p95} > {_number(c.ttft_soft_bound_seconds)}\nand deriv({p95}[{trend}]) > 0\n"
            f"and predict_linear({p95}[{trend}], 3600) > {_number(c.ttft_slo_seconds)}",
            "warning",
            "TTFT is rising on <model>",
            f"p95 time to first token of <model> is <value:humanizeDuration>, still climbing, and on "
            f"the {trend} trend it crosses the {c.ttft_slo_seconds:g}s SLO within the hour: prefill is queueing.",
            {"signal": "ttft_rising"},
        ),
        Alert(
            "HeadroomQueueNotDraining",
            "headroom-capacity-signals",
            f"min_over_time({R.WAITING}[{c.queue_window}]) > 0",
            "warning",
            "Engine queue for <model> never drains",
            f"At least <value> requests for <model> have been waiting in the engine at every scrape "
            f"for {c.queue_window}: supply is saturated.",
            {"signal": "queue_not_draining"},
        ),
        Alert(
            "HeadroomGPUSaturatedThroughputFlat",
            "headroom-capacity-signals",
            f"{R.TOKENS_RATE_INSTANCE}\n/ ({R.TOKENS_RATE_INSTANCE} offset {c.flat_lookback})\n"
            f"< {_number(c.throughput_flat_ratio)}\n"
            f"and on (instance) ({R.GPU_UTILIZATION} > {_number(c.gpu_saturated_ratio)})\n"
            f"and on (instance) ({R.WAITING_INSTANCE} > 0)",
            "warning",
            "GPU saturated but throughput flat on <instance>",
            f"The GPU on <instance> is over {c.gpu_saturated_ratio:.0%} busy with requests waiting, yet "
            f"tokens/s for <model> is <value:humanizePercentage> of {c.flat_lookback} ago: the "
            f"bottleneck moved to memory bandwidth or scheduling.",
            {"signal": "gpu_saturated_flat"},
        ),
        Alert(
            "HeadroomTailLatencyOverSLO",
            "headroom-capacity-signals",
            f"{p99} > {_number(c.ttft_p99_tolerance_seconds)}",
            "warning",
            "Tail TTFT of <model> beyond tolerance",
            f"p99 time to first token of <model> is <value:humanizeDuration> (tolerance "
            f"{c.ttft_p99_tolerance_seconds:g}s): a few long requests are holding the batch.",
            {"signal": "tail_latency"},
        ),
        Alert(
            "HeadroomNearCapacityLimit",
            "headroom-capacity-signals",
            'count by (model) (\n  count by (model, signal) (ALERTS{alertstate="firing", signal!=""})\n) >= 2',
            "critical",
            "<model> is near its capacity limit",
            "<value> of the four scale-out signals are firing at once for <model>: the current "
            "configuration is close to its limit. Add replicas or shed load.",
            {"component": "capacity"},
        ),
    ]


def _hysteresis(alert: str, raise_at: float, clear_below: float) -> str:
    firing = f'ALERTS{{alertname="{alert}", alertstate="firing"}}'
    return (
        f"{R.KV_USAGE} > {_number(raise_at)}\nor\n"
        f"({R.KV_USAGE} > {_number(clear_below)} and on (model) {firing})"
    )


def _capacity(c: RulesConfig) -> list[Alert]:
    # Raw series, not the instance_model records: a rule reading records of another group sees
    # them one evaluation late or not, and the 5m averages would depend on that race.
    window, tokens, inflight = (
        c.divergence_window,
        sample("headroom_active_tokens"),
        sample("headroom_inflight_requests"),
    )
    tokens_now, tokens_then = (
        f"sum by (instance, model) (avg_over_time({tokens}[5m]))",
        f"sum by (instance, model) (avg_over_time({tokens}[5m] offset {window}))",
    )
    inflight_now, inflight_then = (
        f"sum by (instance, model) (avg_over_time({inflight}[5m]))",
        f"sum by (instance, model) (avg_over_time({inflight}[5m] offset {window}))",
    )
    return [
        Alert(
            "HeadroomKVCacheNearFull",
            "headroom-capacity",
            _hysteresis("HeadroomKVCacheNearFull", c.kv_warning_ratio, c.kv_warning_clear_ratio),
            "warning",
            "KV cache of <model> nearly full",
            f"KV-cache usage of <model> is <value:humanizePercentage> (raised above "
            f"{c.kv_warning_ratio:.0%}, clears below {c.kv_warning_clear_ratio:.0%}): new long requests "
            f"will queue or preempt running ones.",
            {"family": "kv_cache"},
        ),
        Alert(
            "HeadroomKVCacheFull",
            "headroom-capacity",
            _hysteresis("HeadroomKVCacheFull", c.kv_critical_ratio, c.kv_critical_clear_ratio),
            "critical",
            "KV cache of <model> full",
            f"KV-cache usage of <model> is <value:humanizePercentage> (raised above "
            f"{c.kv_critical_ratio:.0%}, clears below {c.kv_critical_clear_ratio:.0%}): the engine is "
            f"preempting or rejecting requests.",
            {"family": "kv_cache"},
        ),
        Alert(
            "HeadroomTokenCaliberDivergence",
            "headroom-capacity",
            f"{tokens_now}\n/ {tokens_then}\n> {_number(c.tokens_growth_ratio)}\n"
            f"and on (instance, model)\nabs({inflight_now} - {inflight_then})\n"
            f"<= {_number(c.inflight_flat_tolerance)} * {inflight_then}\n"
            f"and on (instance, model) {R.INFLIGHT_INSTANCE} > 0",
            "warning",
            "Active tokens climbing while in-flight requests are flat on <instance>",
            f"Active tokens of <model> on <instance> grew <value:humanize>x in {window} while "
            f"in-flight requests stayed flat: long requests are eating the token budget.",
            {"component": "capacity"},
        ),
        Alert(
            "HeadroomConcurrencyNearKnee",
            "headroom-capacity",
            f"{R.KNEE_RATIO} > {_number(c.knee_warning_ratio)}",
            "warning",
            "<model> concurrency near its measured knee (<caliber>)",
            f"<caliber> concurrency of <model> on <instance> is <value:humanizePercentage> of the measured "
            f"knee (warns above {c.knee_warning_ratio:.0%}): past this point latency climbs and "
            f"throughput stops rising.",
            {"component": "capacity"},
        ),
        Alert(
            "HeadroomRateLimitedRatioHigh",
            "headroom-capacity",
            f"{R.RATE_LIMITED_RATIO} > {_number(c.rate_limited_ratio)}",
            "warning",
            "<model> is answering 429s",
            f"<value:humanizePercentage> of requests to <model> were rate limited over the last 5 "
            f"minutes (threshold {c.rate_limited_ratio:.0%}).",
            {"component": "capacity"},
        ),
    ]


def _indent(text: str) -> str:
    return "\n".join("  " + line for line in text.splitlines())


def _slo(c: RulesConfig) -> list[Alert]:
    budget, slo = c.error_budget, f"{c.ttft_slo_seconds:g}s"

    def burn(long: str, short: str, factor: float) -> str:
        limit = _number(factor * budget)
        return f"{R.slo_misses(long)} > {limit}\nand {R.slo_misses(short)} > {limit}"

    return [
        Alert(
            "HeadroomTTFTBudgetBurnFast",
            "headroom-slo",
            f"(\n{_indent(burn('1h', '5m', 14.4))}\n)\nor\n(\n{_indent(burn('6h', '30m', 6))}\n)",
            "critical",
            "<model> is burning its TTFT error budget fast",
            f"<value:humanizePercentage> of requests to <model> missed the {slo} TTFT SLO over the "
            f"long window; at this burn rate the 30-day budget of {budget:.2%} is gone within days.",
            {"family": "ttft_slo"},
        ),
        Alert(
            "HeadroomTTFTBudgetBurnSlow",
            "headroom-slo",
            burn("3d", "6h", 1),
            "warning",
            "<model> is slowly burning its TTFT error budget",
            f"<value:humanizePercentage> of requests to <model> missed the {slo} TTFT SLO over 3 "
            f"days, more than the {budget:.2%} budget allows.",
            {"family": "ttft_slo"},
        ),
    ]


def _pipeline(c: RulesConfig) -> list[Alert]:
    dropped = sample("headroom_log_rows_dropped_total")
    return [
        Alert(
            "HeadroomSidecarDown",
            "headroom-pipeline",
            f'up{{job="{c.sidecar_job}"}} == 0',
            "critical",
            "Sidecar <instance> is down",
            "Prometheus cannot scrape the sidecar <instance>; it proxies traffic, so clients behind it "
            "are failing too.",
            {"component": "pipeline"},
        ),
        Alert(
            "HeadroomEngineScrapeFailing",
            "headroom-pipeline",
            f"{sample('headroom_engine_up')} == 0",
            "warning",
            "Sidecar <instance> cannot read the <engine> engine's metrics",
            "The sidecar on <instance> fails to scrape the <engine> engine's /metrics: KV-cache and "
            "queue signals for it are blind.",
            {"component": "pipeline"},
        ),
        Alert(
            "HeadroomLogRowsDropped",
            "headroom-pipeline",
            f"sum by (instance, reason) (increase({dropped}[10m])) > 0",
            "warning",
            "Request-log rows dropped on <instance> (<reason>)",
            "<value:humanize> request-log rows were dropped on <instance> in 10 minutes (reason "
            "<reason>): capacity curves and the weekly review will miss them.",
            {"component": "pipeline"},
        ),
    ]


def alerts(config: RulesConfig) -> list[Alert]:
    """Every alert, in the order it is rendered."""
    return _signals(config) + _capacity(config) + _slo(config) + _pipeline(config)


def alerting_groups(config: RulesConfig) -> list[dict]:
    """Alert rule groups in first-appearance order of their group names."""
    groups: dict[str, list[dict]] = {}
    for alert in alerts(config):
        groups.setdefault(alert.group, []).append(alert.to_rule(config))
    return [{"name": name, "rules": rules} for name, rules in groups.items()]
