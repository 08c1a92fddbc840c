"""Alerting rules: pages on what users feel, warnings (tickets) on the causes that lead there.

Pages (`severity="critical"`): SLO burn (availability, TTFT, end-to-end), the KV cache full with
requests queueing behind it, the capacity forecast (load climbing to the knee: the one page before
users are hurt), the any-two composite (a latency signal and a saturation signal at once), and a
sidecar that cannot be scraped or whose job vanished. Everything else warns: the scale-out signals
(docs/domain.md §5), near knee, KV nearly full, an engine preempting with it nearly full,
token-caliber divergence, load shedding, a slow replica, and the request log's pipeline. Every
alert has a summary, a templated description and an absolute `runbook_url`; capacity thresholds
compare live values with the published `headroom_capacity_*` gauges through recording rules, so no
alert carries a concurrency number and an alert is silent while no estimate exists. Rules are split by concern: signals here, SLO burn
in collector.alerts.slo_alerts, the pipeline in collector.alerts.pipeline_alerts, a stuck request
and a dead capacity input in collector.alerts.integrity_alerts (whose `trusted` keeps the KV and
queue rules silent while their engine signal is invalid).
"""

from __future__ import annotations

from typing import Any

from collector.alerts.adapter_alerts import adapter_alerts
from collector.alerts.alert import Alert, number
from collector.alerts.integrity_alerts import integrity_alerts, trusted
from collector.alerts.pipeline_alerts import pipeline_alerts
from collector.alerts.slo_alerts import latency_matcher, requests_in, slo_alerts
from collector.alerts.slo_classes import selector, slo_classes
from collector.rules.config import RulesConfig, seconds
from collector.rules.naming import sample
from collector.rules.records import R

__all__ = ["Alert", "alerts", "alerting_groups", "SIGNALS", "SIGNAL_KINDS"]

# label `signal` of the scale-out signals (docs/domain.md §5) and `signal_kind`: the composite
# pages when a latency signal and a saturation signal fire together for a model.
SIGNALS = ("ttft_rising", "tail_latency", "queue_not_draining", "gpu_saturated_flat", "near_knee")
SIGNAL_KINDS = {
    "ttft_rising": "latency",
    "tail_latency": "latency",
    "queue_not_draining": "saturation",
    "gpu_saturated_flat": "saturation",
    "near_knee": "saturation",
}


def _signal(name: str) -> dict[str, str]:
    return {"signal": name, "signal_kind": SIGNAL_KINDS[name]}


def _latency_signals(c: RulesConfig) -> list[Alert]:
    found, trend, classes = [], c.ttft_trend_window, slo_classes(c, "ttft")
    for slo_class in classes:
        p95 = R.TTFT_QUANTILE + selector('quantile="0.95"', slo_class.matcher)
        target = slo_class.target
        found.append(
            Alert(
                "HeadroomTTFTRising",
                "headroom-capacity-signals",
                f"{p95} > {number(c.ttft_soft_bound_seconds)}\nand deriv({p95}[{trend}]) > 0\n"
                f"and predict_linear({p95}[{trend}], 3600) > {number(target)}\n"
                f"and on (model) {requests_in('ttft', slo_class.matcher)} >= {c.slo_min_requests}",
                "warning",
                "TTFT is rising on <model>",
                f"p95 time to first token of <model> is <value:humanizeDuration>, still climbing, and on "
                f"the {trend} trend it crosses the {target:g}s SLO within the hour: prefill is queueing.",
                _signal("ttft_rising") | slo_class.labels(classes),
            )
        )
    p99 = R.TTFT_QUANTILE + selector('quantile="0.99"', latency_matcher(c))
    if slo_classes(c, "ttft"):
        found.append(
            Alert(
                "HeadroomTailLatencyOverSLO",
                "headroom-capacity-signals",
                f"{p99} > {number(c.ttft_p99_tolerance_seconds)}\n"
                f"and on (model) {requests_in('ttft', latency_matcher(c))} >= {c.slo_min_requests}",
                "warning",
                "Tail TTFT of <model> beyond tolerance",
                f"p99 time to first token of <model> is <value:humanizeDuration> (tolerance "
                f"{c.ttft_p99_tolerance_seconds:g}s): a few long requests are holding the batch.",
                _signal("tail_latency"),
            )
        )
    return found


def _saturation_signals(c: RulesConfig) -> list[Alert]:
    return [
        Alert(
            "HeadroomQueueNotDraining",
            "headroom-capacity-signals",
            f"min_over_time({R.WAITING}[{c.queue_window}]) > 0",
            "warning",
            "Engine queue for <model> never drains",
            f"At least <value> requests for <model> have been waiting in the engine at every scrape "
            f"for {c.queue_window}: supply is saturated.",
            _signal("queue_not_draining"),
        ),
        Alert(
            "HeadroomGPUSaturatedThroughputFlat",
            "headroom-capacity-signals",
            f"{R.TOKENS_RATE_INSTANCE}\n/ ({R.TOKENS_RATE_INSTANCE} offset {c.flat_lookback})\n"
            f"< {number(c.throughput_flat_ratio)}\n"
            f"and on (instance) ({R.GPU_UTILIZATION} > {number(c.gpu_saturated_ratio)})\n"
            f"and on (instance) ({R.WAITING_INSTANCE} > 0)",
            "warning",
            "GPU saturated but throughput flat on <instance>",
            f"The GPU on <instance> is over {c.gpu_saturated_ratio:.0%} busy with requests waiting, yet "
            f"tokens/s for <model> is <value:humanizePercentage> of {c.flat_lookback} ago: the "
            f"bottleneck moved to memory bandwidth or scheduling.",
            _signal("gpu_saturated_flat"),
        ),
        Alert(
            "HeadroomConcurrencyNearKnee",
            "headroom-capacity-signals",
            f"{R.KNEE_RATIO} > {number(c.knee_warning_ratio)}",
            "warning",
            "<model> concurrency near its measured knee (<caliber>, task class <task_class>)",
            f"The 5-minute mean <caliber> concurrency of <model> on <instance> is <value:humanizePercentage> "
            f"of the measured knee for task class <task_class> (warns above {c.knee_warning_ratio:.0%}): "
            f"past this point latency climbs and throughput stops rising.",
            _signal("near_knee"),
        ),
    ]


def _composite() -> Alert:
    def firing(kind: str) -> str:
        return f'count by (model) (ALERTS{{alertstate="firing", signal_kind="{kind}"}})'

    return Alert(
        "HeadroomNearCapacityLimit",
        "headroom-capacity-composite",
        'count by (model) (\n  count by (model, signal) (ALERTS{alertstate="firing", signal!=""})\n)\n'
        f"and on (model) {firing('latency')}\nand on (model) {firing('saturation')}",
        "critical",
        "<model> is near its capacity limit",
        "<value> scale-out signals are firing at once for <model>, latency and saturation together: "
        "users are starting to wait because the deployment is full. Add replicas or shed load.",
        {"component": "capacity"},
    )


def _hysteresis(alert: str, expr: str, raise_at: float, clear_below: float, on: str) -> str:
    firing = f'ALERTS{{alertname="{alert}", alertstate="firing"}}'
    return f"{expr} > {number(raise_at)}\nor\n({expr} > {number(clear_below)} and on ({on}) {firing})"


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
    kv, waiting = sample("headroom_engine_kv_cache_usage_ratio"), sample("headroom_engine_requests_waiting")
    preemptions = sample("headroom_engine_preemptions_total")
    # the engine's values, less those the sidecar marks invalid (headroom_signal_valid == 0)
    kv_mean = trusted(f"max by (instance, model) (avg_over_time({kv}[5m]))", "kv_usage")
    queued = trusted(f"sum by (instance, model) (min_over_time({waiting}[5m]))", "waiting")
    return [*_knee_trend(c), _fleet_headroom(c), _estimate_stale(c)] + [
        Alert(
            "HeadroomKVCacheNearFull",
            "headroom-capacity",
            _hysteresis(
                "HeadroomKVCacheNearFull",
                kv_mean,
                c.kv_warning_ratio,
                c.kv_warning_clear_ratio,
                "instance, model",
            ),
            "warning",
            "KV cache of <model> on <instance> nearly full",
            f"KV-cache usage of <model> on <instance> averaged <value:humanizePercentage> over 5 minutes "
            f"(raised above {c.kv_warning_ratio:.0%}, clears below {c.kv_warning_clear_ratio:.0%}): new long "
            f"requests will queue or preempt running ones.",
            {"family": "kv_cache"},
        ),
        Alert(
            "HeadroomKVCacheExhausted",
            "headroom-capacity",
            f"{kv_mean} > {number(c.kv_warning_ratio)}\nand on (instance, model) {queued} > 0",
            "critical",
            "KV cache of <model> on <instance> full and requests queueing",
            "KV-cache usage of <model> on <instance> averaged <value:humanizePercentage> over 5 minutes "
            "while requests waited in the engine at every scrape: the cache is the bottleneck and users "
            "queue behind it.",
            {"family": "kv_cache"},
        ),
        Alert(
            "HeadroomEnginePreempting",
            "headroom-capacity",
            f"60 * sum by (instance, model) (rate({preemptions}[5m])) > 0\n"
            f"and on (instance, model) {kv_mean} > {number(c.kv_warning_ratio)}",
            "warning",
            "<model> on <instance> is preempting requests with its KV cache nearly full",
            f"The engine behind <instance> preempted <value:humanize> requests a minute of <model> over "
            f"the last 5 minutes while its KV-cache usage averaged over {c.kv_warning_ratio:.0%}: "
            f"running requests are evicted and recomputed, so throughput falls as load rises.",
            {"family": "kv_cache"},
        ),
        Alert(
            "HeadroomTokenCaliberDivergence",
            "headroom-capacity",
            f"{tokens_now}\n/ {tokens_then}\n> {number(c.tokens_growth_ratio)}\n"
            f"and on (instance, model)\nabs({inflight_now} - {inflight_then})\n"
            f"<= {number(c.inflight_flat_tolerance)} * {inflight_then}\n"
            f"and on (instance, model) {inflight_then} >= {c.divergence_min_inflight}",
            "warning",
            "Active tokens climbing while in-flight requests are flat on <instance>",
            f"Active tokens of <model> on <instance> grew <value:humanize>x in {window} while "
            f"in-flight requests stayed flat: long requests are eating the token budget.",
            {"component": "capacity"},
        ),
        Alert(
            "HeadroomLoadShedding",
            "headroom-capacity",
            f"{R.SHED_RATIO} > {number(c.load_shedding_ratio)}",
            "warning",
            "<model> is shedding load (429/503)",
            f"<value:humanizePercentage> of requests to <model> were refused with 429 or 503 over the "
            f"last 5 minutes (threshold {c.load_shedding_ratio:.0%}).",
            {"component": "capacity"},
        ),
        Alert(
            "HeadroomSlowReplica",
            "headroom-capacity",
            f"{R.TTFT_QUANTILE_INSTANCE} > {number(c.ttft_soft_bound_seconds)}\n"
            f"and {R.TTFT_QUANTILE_INSTANCE}\n> on (model) group_left ()\n"
            f"({number(c.slow_replica_ratio)} * quantile by (model) (0.5, {R.TTFT_QUANTILE_INSTANCE}))\n"
            f"and on (instance, model) {requests_in('ttft', by='instance, model')} >= {c.slo_min_requests}",
            "warning",
            "Replica <instance> of <model> is slow",
            f"p95 TTFT of <model> on <instance> is <value:humanizeDuration>, over "
            f"{c.slow_replica_ratio:g}x the median of its replicas: throttling, a noisy neighbour or a "
            f"bad node. Drain it and compare.",
            {"component": "capacity"},
        ),
    ]


def _knee_trend(c: RulesConfig) -> list[Alert]:
    """Concurrency climbing towards the knee: a ticket per sidecar and caliber, a page per model.

    "Rising" needs the trend to reach the knee within the horizon *and* a slope of at least the
    forecast's climb rate (`knee_forecast_min_rise` of the knee per `knee_forecast_step`):
    `predict_linear` of a flat load above the knee is above 1 too, and that is no climb. The page
    needs the climb sustained (the low of each of the last three steps above the one before) and
    is one alert per model (and replica class, where the knee ratio carries one): a fleet ramping
    together is one incident, not one alert per replica. Its description says how many replicas
    the load needs now and at the forecast, per caliber (the fleet records).
    """
    ratio, step, window = R.KNEE_RATIO, c.knee_forecast_step, c.knee_forecast_window
    horizon = c.knee_forecast_horizon
    trend = (
        f"{ratio} > {number(c.knee_forecast_min_ratio)}\n"
        f"and predict_linear({ratio}[{window}], {seconds(horizon)}) > 1"
    )
    slope = number(c.knee_forecast_min_rise / seconds(step))
    low = [
        f"min_over_time({ratio}[{step}]{'' if k == 0 else f' offset {k * seconds(step)}s'})" for k in range(3)
    ]
    rise = number(c.knee_forecast_min_rise)
    sustained = f"{low[0]} > {low[1]} + {rise}\nand {low[1]} > {low[2]} + {rise}"
    family = {"component": "capacity", "family": "knee_trend"}
    return [
        Alert(
            "HeadroomConcurrencyRising",
            "headroom-capacity",
            f"{trend}\nand deriv({ratio}[{window}]) > {slope}",
            "warning",
            "<model> concurrency is climbing towards its knee (<caliber>, task class <task_class>)",
            f"On the trend of the last {window}, <caliber> concurrency of <model> on <instance> "
            f"climbs by at least {c.knee_forecast_min_rise:.0%} of the knee per {step} and reaches the "
            f"measured knee within {horizon}; it is at <value:humanizePercentage> of it now. Plan "
            f"replicas before the peak.",
            family,
        ),
        Alert(
            "HeadroomCapacityForecast",
            "headroom-capacity",
            f"max by (model, replica_class) (\n{trend}\nand {sustained}\n)",
            "critical",
            "<model> is heading for its knee",
            f"Concurrency of <model> has climbed through the last three {step} windows and on its "
            f"{window} trend reaches the measured knee within {horizon}; the busiest replica is at "
            f"<value:humanizePercentage> of its knee now. Replicas needed now: "
            f"<calibers:{R.REPLICAS_NEEDED}>; at the {horizon} forecast: "
            f"<calibers:{R.REPLICAS_NEEDED_FORECAST}> (the caliber needing more binds). Add replicas "
            f"before users queue.",
            family,
        ),
    ]


def _estimate_stale(c: RulesConfig) -> Alert:
    """The published estimate the capacity alerts divide by is old, or only of low confidence."""
    published = sample("headroom_capacity_estimate_timestamp_seconds")
    by = "model, task_class, replica_class, source, confidence"
    age = f"time() - max by ({by}) ({published})"
    low = f'time() - max by ({by}) ({published}{{confidence="low"}})'
    return Alert(
        "HeadroomCapacityEstimateStale",
        "headroom-capacity",
        f"{age} > {seconds(c.estimate_max_age)}\nor\n{low}",
        "warning",
        "The capacity estimate of <model> is stale or of low confidence (<source>, <confidence>)",
        f"The published knee of <model> (task class <task_class>) is <value:humanizeDuration> old, "
        f"from a <source> estimate of <confidence> confidence (stale past {c.estimate_max_age}, the "
        f"probe's age limit): the knee, forecast and fleet alerts divide by it. Re-measure with "
        f"`headroom probe` or check the store's capacity job.",
        {"component": "capacity"},
    )


def _fleet_headroom(c: RulesConfig) -> Alert:
    """Less than one replica's pool spare at the forecast load, per model, caliber (and cluster)."""
    return Alert(
        "HeadroomFleetHeadroomLow",
        "headroom-capacity",
        f"(\n  {R.FLEET_POOL}\n  - on (model, caliber) {R.FLEET_LOAD_FORECAST}\n)\n"
        f"/ on (model, caliber) {R.POOL_PER_REPLICA}\n< 1\n"
        f"and on (model) {R.REPLICAS} >= {c.fleet_min_replicas}",
        "warning",
        "<model> has less than one replica of headroom at its forecast (<caliber>)",
        f"On the {c.knee_forecast_window} trend, the <caliber> load of <model> {c.knee_forecast_horizon} "
        f"from now leaves <value:humanize> replicas' worth of its summed pool free: losing or draining "
        f"one replica puts the rest past their pool. {R.REPLICAS_NEEDED_FORECAST} says how many "
        f"replicas that load needs.",
        {"component": "capacity"},
    )


def alerts(config: RulesConfig) -> list[Alert]:
    """Every alert, in the order it is rendered (several rules may share a name: one per SLO class)."""
    return (
        _latency_signals(config)
        + _saturation_signals(config)
        + [_composite()]
        + _capacity(config)
        + slo_alerts(config)
        + pipeline_alerts(config)
        + integrity_alerts(config)
        + adapter_alerts(config)
    )


def alerting_groups(config: RulesConfig) -> list[dict[str, Any]]:
    """Alert rule groups in first-appearance order of their group names."""
    groups: dict[str, list[dict[str, Any]]] = {}
    for alert in alerts(config):
        groups.setdefault(alert.group, []).append(alert.to_rule(config))
    return [{"name": name, "rules": rules} for name, rules in groups.items()]
