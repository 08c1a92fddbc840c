"""Recording rules: the aggregates that alerts and dashboards read, under the names in rules.records.

Every expression reads catalog metrics through collector.rules.naming.sample, so a renamed metric
breaks generation instead of silently producing an empty query; `recording_groups()` lists them in
evaluation order (a rule may read the ones above it).
"""

from __future__ import annotations

from collector.rules.config import RulesConfig
from collector.rules.naming import le_label, sample
from collector.rules.records import QUANTILES, RATE_WINDOW, SLO_WINDOWS, R

__all__ = ["recording_groups"]


def _rule(name: str, expr: str, **labels: str) -> dict:
    rule = {"record": name, "expr": expr}
    if labels:
        rule["labels"] = labels
    return rule


def _concurrency_rules() -> list[dict]:
    inflight, tokens = sample("headroom_inflight_requests"), sample("headroom_active_tokens")
    return [
        _rule(R.INFLIGHT_INSTANCE, f"sum by (instance, model) ({inflight})"),
        _rule(R.TOKENS_INSTANCE, f"sum by (instance, model) ({tokens})"),
        _rule(R.INFLIGHT, f"sum by (model) ({inflight})"),
        _rule(R.ACTIVE_TOKENS, f"sum by (model) ({tokens})"),
        _rule(
            R.CONCURRENCY,
            f'label_replace({R.INFLIGHT_INSTANCE}, "caliber", "requests", "", "")\n'
            f'or\nlabel_replace({R.TOKENS_INSTANCE}, "caliber", "tokens", "", "")',
        ),
        # Silent (no series) for a model and caliber without a measured knee.
        _rule(
            R.KNEE_RATIO,
            f"{R.CONCURRENCY}\n/ on (model, caliber) group_left ()\n"
            f"max by (model, caliber) ({sample('headroom_capacity_knee')})",
        ),
    ]


def _rate(metric: str, by: str, window: str, selector: str = "") -> str:
    return f"sum by ({by}) (rate({metric}{selector}[{window}]))"


def _traffic_rules(w: str) -> list[dict]:
    requests = sample("headroom_requests_total")
    prompt, generated = sample("headroom_prompt_tokens_total"), sample("headroom_generated_tokens_total")
    limited = _rate(requests, "model", w, '{outcome="rate_limited"}')
    return [
        _rule(R.REQUESTS_RATE, _rate(requests, "model", w)),
        _rule(R.OUTCOME_RATE, _rate(requests, "model, outcome", w)),
        # `or ... * 0`: 0 instead of no series while no request has been rate limited yet.
        _rule(R.RATE_LIMITED_RATIO, f"(\n  {limited}\n  or {R.REQUESTS_RATE} * 0\n)\n/ {R.REQUESTS_RATE}"),
        _rule(R.GENERATED_RATE, _rate(generated, "model", w)),
        _rule(R.TOKENS_RATE, f"{_rate(prompt, 'model', w)}\n+ {R.GENERATED_RATE}"),
        _rule(
            R.TOKENS_RATE_INSTANCE,
            f"{_rate(prompt, 'instance, model', w)}\n+ {_rate(generated, 'instance, model', w)}",
        ),
    ]


def _latency_rules(w: str) -> list[dict]:
    rules = []
    for name, metric in (
        (R.TTFT_QUANTILE, "headroom_time_to_first_token_seconds"),
        (R.TPOT_QUANTILE, "headroom_time_per_output_token_seconds"),
        (R.E2E_QUANTILE, "headroom_request_duration_seconds"),
    ):
        for quantile in QUANTILES:
            expr = f"histogram_quantile({quantile}, {_rate(sample(metric, 'bucket'), 'model, le', w)})"
            rules.append(_rule(name, expr, quantile=quantile))
    duration = "headroom_request_duration_seconds"
    rules.append(
        _rule(
            R.E2E_MEAN,
            f"{_rate(sample(duration, 'sum'), 'model', w)}\n/ {_rate(sample(duration, 'count'), 'model', w)}",
        )
    )
    return rules


def _slo_rules(config: RulesConfig) -> list[dict]:
    metric = "headroom_time_to_first_token_seconds"
    good = f'{{le="{le_label(config.ttft_slo_seconds)}"}}'
    return [
        _rule(
            R.slo_misses(window),
            f"1 - (\n  {_rate(sample(metric, 'bucket'), 'model', window, good)}\n"
            f"  / {_rate(sample(metric, 'count'), 'model', window)}\n)",
        )
        for window in SLO_WINDOWS
    ]


def _engine_rules() -> list[dict]:
    waiting = sample("headroom_engine_requests_waiting")
    return [
        _rule(R.WAITING, f"sum by (model) ({waiting})"),
        _rule(R.WAITING_INSTANCE, f"sum by (instance) ({waiting})"),
        _rule(R.RUNNING, f"sum by (model) ({sample('headroom_engine_requests_running')})"),
        _rule(R.KV_USAGE, f"max by (model) ({sample('headroom_engine_kv_cache_usage_ratio')})"),
        _rule(R.GPU_UTILIZATION, f"avg by (instance) ({sample('headroom_gpu_utilization_ratio')})"),
    ]


def recording_groups(config: RulesConfig) -> list[dict]:
    """The recording-rule groups, in evaluation order (a rule may read the ones above it)."""
    w = RATE_WINDOW
    return [
        {"name": "headroom-recording-concurrency", "rules": _concurrency_rules()},
        {"name": "headroom-recording-traffic", "rules": _traffic_rules(w)},
        {"name": "headroom-recording-latency", "rules": _latency_rules(w)},
        {"name": "headroom-recording-slo", "rules": _slo_rules(config)},
        {"name": "headroom-recording-engine", "rules": _engine_rules()},
    ]
