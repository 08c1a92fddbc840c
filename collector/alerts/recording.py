"""Recording rules: the aggregates that alerts and dashboards read, under the names in rules.records.

Every expression reads catalog metrics through collector.rules.naming.sample, so a renamed metric
breaks generation instead of silently producing an empty query; `recording_groups()` lists them in
evaluation order (a rule may read the ones above it in its group).

Two designs worth knowing:

- **Knee ratio per task class.** Each class's live concurrency (`headroom_task_inflight_requests`,
  `headroom_task_active_tokens`) is compared with its own knee where one is published
  (`task_class!="all"`; silent otherwise), and every request together with the
  `task_class="all"` knee, so a model measured only over all its traffic works unchanged.
- **Each sidecar against its own replica class.** A knee belongs to a replica class (docs/domain.md §14):
  each sidecar's concurrency is joined to its class (`headroom_replica_info`, recorded per
  instance with "default" for a sidecar that exports none), then divided by that class's knee;
  where the class has none, by the model's `default` class knee (estimates saved before classes,
  or gauges without the label). The fleet records take each replica's pool from its class the
  same way.
- **SLOs per model.** Each distinct target is its own expression, selected by a `model` matcher
  (collector.alerts.slo_classes) and `or`ed into the one rule of its record name (promtool
  lints duplicate record names); without per-model SLOs there is one expression.
- **Goodput** (collector.alerts.goodput_records): met requests per second, attainment over the
  SLO windows, token goodput, and the engine's own prefill rate and prefix-cache hit rate.
- **Clients only, where users' experience is judged.** The SLO miss ratios, the latency
  quantiles and the refusal ratios read `source!="probe"`: `headroom probe` runs past the knee
  on purpose, and its requests must not burn the budget or raise a latency signal. Request and
  token rates and concurrency keep the probe's load: it is load the engine carries.
"""

from __future__ import annotations

from typing import Any

from collector.alerts.goodput_records import goodput_rules
from collector.alerts.integrity_alerts import trusted
from collector.alerts.slo_classes import CLIENT_TRAFFIC, selector, slo_classes
from collector.rules.cluster import keep_cluster
from collector.rules.config import RulesConfig, seconds
from collector.rules.naming import le_label, sample
from collector.rules.records import QUANTILES, RATE_WINDOW, SLO_WINDOWS, R

__all__ = ["recording_groups", "ERROR_OUTCOMES", "SHED_OUTCOMES"]

# Outcomes that count against availability: load shedding (429, 503), other upstream failures
# (5xx, resets, the sidecar's own 502s) and timeouts. bad_request is the client's; a client that
# cancelled was never answered.
ERROR_OUTCOMES = ("rate_limited", "overloaded", "upstream_error", "timeout")
SHED_OUTCOMES = ("rate_limited", "overloaded")
# caliber -> (every request, per task class, the knee gauge)
_CALIBERS = (
    (
        "requests",
        "headroom_inflight_requests",
        "headroom_task_inflight_requests",
        "headroom_capacity_knee_requests",
    ),
    ("tokens", "headroom_active_tokens", "headroom_task_active_tokens", "headroom_capacity_knee_tokens"),
)


def _rule(name: str, expr: str, **labels: str) -> dict[str, Any]:
    rule: dict[str, Any] = {"record": name, "expr": expr}
    if labels:
        rule["labels"] = labels
    return rule


def _caliber(expr: str, caliber: str) -> str:
    return f'label_replace({expr}, "caliber", "{caliber}", "", "")'


def _per_caliber(requests: str, tokens: str) -> str:
    """One series per caliber: `requests` labelled caliber="requests", or `tokens` caliber="tokens"."""
    return f"{_caliber(requests, 'requests')}\nor\n{_caliber(tokens, 'tokens')}"


# store.capacity_gauges.DEFAULT_REPLICA_CLASS (the rules may not import the store; a test pins them)
DEFAULT_REPLICA_CLASS = "default"
# The capacity gauges of the model's `default` replica class: an estimate saved before replica
# classes, or a gauge exported without the label, reads as "default".
_DEFAULT_CLASS = f'replica_class=~"|{DEFAULT_REPLICA_CLASS}"'


def _replica_class_rule() -> dict[str, Any]:
    """Each sidecar's replica class; "default" for one that exports no headroom_replica_info."""
    info, inflight = sample("headroom_replica_info"), sample("headroom_inflight_requests")
    return _rule(
        R.REPLICA_CLASS,
        f"max by (instance, replica_class) ({info})\n"
        f"or on (instance)\n"
        f'label_replace(group by (instance) ({inflight}), "replica_class", "{DEFAULT_REPLICA_CLASS}", "", "")',
    )


def _with_class(per_instance: str) -> str:
    """`per_instance` (by instance, ...) carrying its sidecar's replica_class label."""
    return f"(\n{per_instance}\n* on (instance) group_left (replica_class) {R.REPLICA_CLASS}\n)"


def _class_knee(left: str, op: str, on: tuple[str, ...], gauge: str, matcher: str) -> str:
    """`left op` the gauge of left's own replica class, or else the model's default class's.

    `left` carries replica_class; `on` are the other labels the gauge is matched on.
    """
    keys = ", ".join(on)
    own = (
        f"{left}\n{op} on ({keys}, replica_class) group_left ()\n"
        f"max by ({keys}, replica_class) ({gauge}{{{matcher}}})"
    )
    default = (
        f"{left}\n{op} on ({keys}) group_left ()\nmax by ({keys}) ({gauge}{{{matcher}, {_DEFAULT_CLASS}}})"
    )
    return f"(\n(\n{own}\n)\nor\n(\n{default}\n)\n)"


def _knee_ratio_rule() -> dict[str, Any]:
    """One rule (Prometheus lints duplicate record names): per class and for every request, both
    calibers, each sidecar against its own replica class's knee."""
    parts = []
    on = ("model", "task_class")
    for caliber, live, per_task, knee in _CALIBERS:
        live, per_task, knee = sample(live), sample(per_task), sample(knee)
        per_class = _with_class(
            f"sum by (instance, model, task_class) (avg_over_time({per_task}[{RATE_WINDOW}]))"
        )
        every = _with_class(
            f"label_replace(sum by (instance, model) (avg_over_time({live}[{RATE_WINDOW}])), "
            f'"task_class", "all", "", "")'
        )
        own_task = _class_knee(per_class, "/", on, knee, 'task_class!="all"')
        all_tasks = _class_knee(every, "/", on, knee, 'task_class="all"')
        parts += [_caliber(own_task, caliber), _caliber(all_tasks, caliber)]
    return _rule(R.KNEE_RATIO, "\nor\n".join(parts))


def _concurrency_rules() -> list[dict[str, Any]]:
    inflight, tokens = sample("headroom_inflight_requests"), sample("headroom_active_tokens")
    return [
        _replica_class_rule(),
        _rule(R.INFLIGHT_INSTANCE, f"sum by (instance, model) ({inflight})"),
        _rule(R.TOKENS_INSTANCE, f"sum by (instance, model) ({tokens})"),
        _rule(R.INFLIGHT, f"sum by (model) ({inflight})"),
        _rule(R.ACTIVE_TOKENS, f"sum by (model) ({tokens})"),
        _rule(R.CONCURRENCY, _per_caliber(R.INFLIGHT_INSTANCE, R.TOKENS_INSTANCE)),
        # Silent (no series) for a model, class and caliber without a published knee.
        _knee_ratio_rule(),
    ]


def _fleet_rules(c: RulesConfig) -> list[dict[str, Any]]:
    """Load and capacity summed over a model's replicas (per cluster), and the replicas the load needs.

    A replica is a sidecar serving the model; its capacity is its replica class's (task class
    "all"; the model's default class's where its class has none), wherever the gauge is exported
    (each sidecar, from its own store or the fleet's estimates table). A replica's pool in tokens is its token knee at the
    request pool's share of the request knee (knee_tokens x pool / knee_requests), the conversion
    the KEDA trigger uses.
    """
    serving = _with_class(f"group by (instance, model) ({sample('headroom_inflight_requests')})")

    def per_replica(name: str) -> str:
        return _class_knee(serving, "*", ("model",), sample(name), 'task_class="all"')

    pool, knee = (
        per_replica("headroom_capacity_recommended_pool_requests"),
        per_replica("headroom_capacity_knee_requests"),
    )
    knee_tokens = per_replica("headroom_capacity_knee_tokens")
    inflight, tokens = (
        f"sum by (model) (avg_over_time({sample(live)}[{RATE_WINDOW}]))"
        for live in ("headroom_inflight_requests", "headroom_active_tokens")
    )
    tokens_pool = f"{knee_tokens}\n* on (instance, model) ({pool} / {knee})"
    return [
        _rule(R.REPLICA_POOL, _per_caliber(pool, tokens_pool)),
        _rule(R.POOL_PER_REPLICA, f"avg by (model, caliber) ({R.REPLICA_POOL})"),
        _rule(R.FLEET_POOL, f"sum by (model, caliber) ({R.REPLICA_POOL})"),
        _rule(R.FLEET_KNEE, _per_caliber(f"sum by (model) ({knee})", f"sum by (model) ({knee_tokens})")),
        _rule(R.REPLICAS, f'count by (model) ({R.REPLICA_POOL}{{caliber="requests"}})'),
        _rule(R.FLEET_LOAD, _per_caliber(inflight, tokens)),
        _rule(
            R.FLEET_LOAD_FORECAST,
            f"clamp_min(predict_linear({R.FLEET_LOAD}[{c.knee_forecast_window}], "
            f"{seconds(c.knee_forecast_horizon)}), 0)",
        ),
        _rule(R.FLEET_POOL_RATIO, f"{R.FLEET_LOAD}\n/ on (model, caliber) {R.FLEET_POOL}"),
        _rule(R.REPLICAS_NEEDED, f"ceil({R.FLEET_LOAD}\n/ on (model, caliber) {R.POOL_PER_REPLICA})"),
        _rule(
            R.REPLICAS_NEEDED_FORECAST,
            f"ceil({R.FLEET_LOAD_FORECAST}\n/ on (model, caliber) {R.POOL_PER_REPLICA})",
        ),
    ]


def _rate(metric: str, by: str, window: str, selector_text: str = "") -> str:
    return f"sum by ({by}) (rate({metric}{selector_text}[{window}]))"


def _outcomes(outcomes: tuple[str, ...]) -> str:
    return f'outcome=~"{"|".join(outcomes)}"'


def _traffic_rules(w: str) -> list[dict[str, Any]]:
    requests = sample("headroom_requests_total")
    prompt, generated = sample("headroom_prompt_tokens_total"), sample("headroom_generated_tokens_total")
    # refusals of clients' requests over clients' requests: a probe past the knee is refused on purpose
    limited = _rate(requests, "model", w, selector(CLIENT_TRAFFIC, 'outcome="rate_limited"'))
    shed = _rate(requests, "model", w, selector(CLIENT_TRAFFIC, _outcomes(SHED_OUTCOMES)))
    clients = _rate(requests, "model", w, selector(CLIENT_TRAFFIC))
    return [
        _rule(R.REQUESTS_RATE, _rate(requests, "model", w)),
        _rule(R.OUTCOME_RATE, _rate(requests, "model, outcome", w)),
        # `or ... * 0`: 0 instead of no series while no request has been refused yet.
        _rule(R.RATE_LIMITED_RATIO, f"(\n  {limited}\n  or {clients} * 0\n)\n/ {clients}"),
        _rule(R.SHED_RATIO, f"(\n  {shed}\n  or {clients} * 0\n)\n/ {clients}"),
        _rule(R.GENERATED_RATE, _rate(generated, "model", w)),
        _rule(R.TOKENS_RATE, f"{_rate(prompt, 'model', w)}\n+ {R.GENERATED_RATE}"),
        _rule(
            R.TOKENS_RATE_INSTANCE,
            f"{_rate(prompt, 'instance, model', w)}\n+ {_rate(generated, 'instance, model', w)}",
        ),
    ]


def _latency_rules(w: str) -> list[dict[str, Any]]:
    """Quantiles and the mean of clients' requests (the probe's are its own: `headroom probe`)."""
    rules, clients = [], selector(CLIENT_TRAFFIC)
    for name, metric in (
        (R.TTFT_QUANTILE, "headroom_time_to_first_token_seconds"),
        (R.TPOT_QUANTILE, "headroom_time_per_output_token_seconds"),
        (R.E2E_QUANTILE, "headroom_request_duration_seconds"),
    ):
        for quantile in QUANTILES:
            buckets = _rate(sample(metric, "bucket"), "model, le", w, clients)
            expr = f"histogram_quantile({quantile}, {buckets})"
            rules.append(_rule(name, expr, quantile=quantile))
    # per replica, so one slow replica is not averaged away by its healthy peers
    ttft = _rate(sample("headroom_time_to_first_token_seconds", "bucket"), "instance, model, le", w, clients)
    rules.append(_rule(R.TTFT_QUANTILE_INSTANCE, f"histogram_quantile(0.95, {ttft})", quantile="0.95"))
    duration = "headroom_request_duration_seconds"
    mean = (
        f"{_rate(sample(duration, 'sum'), 'model', w, clients)}\n"
        f"/ {_rate(sample(duration, 'count'), 'model', w, clients)}"
    )
    rules.append(_rule(R.E2E_MEAN, mean))
    return rules


def _miss_ratio(kind: str, window: str, matcher: str, target_s: float) -> str:
    """1 - good / total of one SLI over `window` for clients' requests to the models `matcher` selects."""
    if kind == "availability":
        requests = sample("headroom_requests_total")
        errors = f'outcome=~"{"|".join(ERROR_OUTCOMES)}"'
        failed = _rate(requests, "model", window, selector(matcher, CLIENT_TRAFFIC, errors))
        answered = _rate(
            requests, "model", window, selector(matcher, CLIENT_TRAFFIC, 'outcome!="client_cancelled"')
        )
        return f"(\n  {failed}\n  or {answered} * 0\n)\n/ {answered}"
    metric, extra = (
        ("headroom_time_to_first_token_seconds", "")
        if kind == "ttft"
        else ("headroom_request_duration_seconds", 'outcome="ok"')
    )
    good = _rate(
        sample(metric, "bucket"),
        "model",
        window,
        selector(matcher, CLIENT_TRAFFIC, extra, f'le="{le_label(target_s)}"'),
    )
    total = _rate(sample(metric, "count"), "model", window, selector(matcher, CLIENT_TRAFFIC, extra))
    return f"1 - (\n  {good}\n  / {total}\n)"


def _slo_rules(config: RulesConfig) -> list[dict[str, Any]]:
    """One rule per SLI and window; per-model SLO classes are `or`ed into it (disjoint model matchers)."""
    rules = []
    for kind in ("ttft", "e2e", "availability"):
        classes = slo_classes(config, kind)
        for window in SLO_WINDOWS:
            parts = [_miss_ratio(kind, window, c.matcher, c.target) for c in classes]
            if parts:
                expr = parts[0] if len(parts) == 1 else "\nor\n".join(f"(\n{p}\n)" for p in parts)
                rules.append(_rule(R.slo_misses(window, kind), expr))
    return rules


def _engine_rules() -> list[dict[str, Any]]:
    """The engine's figures, less those its sidecar marks invalid (integrity_alerts.trusted)."""
    waiting = trusted(sample("headroom_engine_requests_waiting"), "waiting")
    running = trusted(sample("headroom_engine_requests_running"), "running")
    kv = trusted(sample("headroom_engine_kv_cache_usage_ratio"), "kv_usage")
    return [
        _rule(R.WAITING, f"sum by (model) {waiting}"),
        _rule(R.WAITING_INSTANCE, f"sum by (instance) {waiting}"),
        _rule(R.RUNNING, f"sum by (model) {running}"),
        _rule(R.KV_USAGE, f"max by (model) {kv}"),
        _rule(R.GPU_UTILIZATION, f"avg by (instance) ({sample('headroom_gpu_utilization_ratio')})"),
    ]


def recording_groups(config: RulesConfig) -> list[dict[str, Any]]:
    """The recording-rule groups, in evaluation order (a rule may read the ones above it).

    Every expression keeps `config.cluster_by` through its aggregations (collector.rules.cluster).
    """
    groups = _groups(config)
    for group in groups:
        for rule in group["rules"]:
            rule["expr"] = keep_cluster(rule["expr"], config.cluster_by)
    return groups


def _groups(config: RulesConfig) -> list[dict[str, Any]]:
    w = RATE_WINDOW
    return [
        {"name": "headroom-recording-concurrency", "rules": _concurrency_rules()},
        {"name": "headroom-recording-fleet", "rules": _fleet_rules(config)},
        {"name": "headroom-recording-traffic", "rules": _traffic_rules(w)},
        {"name": "headroom-recording-latency", "rules": _latency_rules(w)},
        {"name": "headroom-recording-slo", "rules": _slo_rules(config)},
        {"name": "headroom-recording-goodput", "rules": goodput_rules()},
        {"name": "headroom-recording-engine", "rules": _engine_rules()},
    ]
