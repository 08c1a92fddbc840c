"""promtool unit tests for the generated rules: for every alert, both sides of its `for:` and a quiet case.

Each `Case` gives input series and, per evaluation time, the alerts expected to be firing (labels
and the value as Prometheus formats it). Expected annotations are rendered from the same
`<label>` notation as the rules, so a template that references a missing label or formats the
value differently fails in promtool, not on call. promtool 2.42 pitfalls handled here: every
group sets `interval:`; expected labels and annotations are complete.
"""

from __future__ import annotations

from dataclasses import dataclass

from collector.alerts.alerting import Alert, alerts
from collector.alerts.templating import to_text
from collector.rules.config import RulesConfig

__all__ = ["Case", "unit_test_document", "CASES", "steps"]

M = {"model": "m"}
A = {"instance": "a"}


def steps(*runs: tuple[float, int]) -> str:
    """Expand (value, count) runs into promtool's space-separated values: ((0, 2), (3, 1)) -> "0 0 3"."""
    return " ".join(f"{value:g}" for value, count in runs for _ in range(count))


def counter(*runs: tuple[float, int], start: float = 0) -> str:
    """A counter from (increment per step, steps) runs, starting at `start`."""
    values, total = [start], start
    for increment, count in runs:
        for _ in range(count):
            total += increment
            values.append(total)
    return " ".join(f"{v:g}" for v in values)


@dataclass(frozen=True)
class Case:
    """One promtool test group: input series, then [(eval_time, [(labels, value_text)])] per check."""

    name: str
    alert: str
    series: dict[str, str]
    checks: tuple[tuple[str, tuple[tuple[dict, str], ...]], ...]


_TOKENS = {
    'headroom_prompt_tokens_total{instance="a",model="m",tenant="t"}': "0+600x90",
    'headroom_generated_tokens_total{instance="a",model="m",tenant="t"}': "0+600x90",
}
_GPU = 'headroom_gpu_utilization_ratio{instance="a",gpu="0",uuid="GPU-0",gpu_name="H100"}'
_WAITING = 'headroom_engine_requests_waiting{instance="a",engine="vllm",model="m"}'
_KV = 'headroom_engine_kv_cache_usage_ratio{instance="a",engine="vllm",model="m"}'
_INFLIGHT = 'headroom_inflight_requests{instance="a",model="m",tenant="t"}'
_ACTIVE = 'headroom_active_tokens{instance="a",model="m",tenant="t"}'
_P95 = (
    'model_quantile:headroom_time_to_first_token_seconds:histogram_quantile_rate5m{model="m",quantile="0.95"}'
)
_P99 = (
    'model_quantile:headroom_time_to_first_token_seconds:histogram_quantile_rate5m{model="m",quantile="0.99"}'
)
_TTFT_GOOD = 'headroom_time_to_first_token_seconds_bucket{instance="a",model="m",le="2.0"}'
_TTFT_COUNT = 'headroom_time_to_first_token_seconds_count{instance="a",model="m"}'
_REQUESTS = 'headroom_requests_total{instance="a",model="m",tenant="t",outcome="%s"}'


def _ttft(good_per_step: list[tuple[float, int]], count_per_step: list[tuple[float, int]]) -> dict[str, str]:
    return {_TTFT_GOOD: counter(*good_per_step), _TTFT_COUNT: counter(*count_per_step)}


CASES: tuple[Case, ...] = (
    Case(
        "TTFT p95 climbing towards the SLO fires after 15m",
        "HeadroomTTFTRising",
        {_P95: "0.6+0.02x60"},
        (("20m", ()), ("30m", ((M | {"quantile": "0.95"}, "1.2s"),))),
    ),
    Case("TTFT p95 high but flat is not rising", "HeadroomTTFTRising", {_P95: "0.9+0x60"}, (("45m", ()),)),
    Case(
        "queue above zero for 15m fires after 5m more",
        "HeadroomQueueNotDraining",
        {_WAITING: steps((0, 5), (3, 40))},
        (("22m", ()), ("27m", ((M, "3"),))),
    ),
    Case(
        "a queue that drains every other minute is healthy",
        "HeadroomQueueNotDraining",
        {_WAITING: steps(*[(3, 1), (0, 1)] * 20)},
        (("35m", ()),),
    ),
    Case(
        "GPU saturated, requests waiting, tokens/s flat vs 30m ago",
        "HeadroomGPUSaturatedThroughputFlat",
        {**_TOKENS, _GPU: "0.95+0x90", _WAITING: "2+0x90"},
        (("36m", ()), ("45m", ((A | M, "100%"),))),
    ),
    Case(
        "flat throughput with the GPU half idle is not saturation",
        "HeadroomGPUSaturatedThroughputFlat",
        {**_TOKENS, _GPU: "0.5+0x90", _WAITING: "2+0x90"},
        (("60m", ()),),
    ),
    Case(
        "p99 TTFT beyond tolerance for 10m",
        "HeadroomTailLatencyOverSLO",
        {_P99: steps((1, 5), (8, 30))},
        (("12m", ()), ("20m", ((M | {"quantile": "0.99"}, "8s"),))),
    ),
    Case("p99 TTFT inside tolerance", "HeadroomTailLatencyOverSLO", {_P99: "3+0x40"}, (("30m", ()),)),
    Case(
        "two signals firing at once page after 2m",
        "HeadroomNearCapacityLimit",
        {_P99: steps((8, 40)), _WAITING: steps((3, 40))},
        (("11m", ()), ("15m", ((M, "2"),))),
    ),
    Case(
        "one signal alone does not page", "HeadroomNearCapacityLimit", {_P99: steps((8, 40))}, (("30m", ()),)
    ),
    Case(
        "KV cache warning raises above 90%, holds above 85%, clears below",
        "HeadroomKVCacheNearFull",
        {_KV: steps((0.5, 5), (0.93, 10), (0.88, 10), (0.8, 10))},
        (("8m", ()), ("12m", ((M, "93%"),)), ("20m", ((M, "88%"),)), ("30m", ())),
    ),
    Case(
        "KV cache at 88% without a prior warning stays quiet",
        "HeadroomKVCacheNearFull",
        {_KV: steps((0.5, 5), (0.88, 30))},
        (("25m", ()),),
    ),
    Case(
        "KV cache critical raises above 97%, holds above 95%, clears below",
        "HeadroomKVCacheFull",
        {_KV: steps((0.5, 5), (0.98, 10), (0.96, 10), (0.9, 10))},
        (("6m", ()), ("10m", ((M, "98%"),)), ("20m", ((M, "96%"),)), ("30m", ())),
    ),
    Case(
        "KV cache at 96% without a prior page stays quiet",
        "HeadroomKVCacheFull",
        {_KV: steps((0.5, 5), (0.96, 30))},
        (("25m", ()),),
    ),
    Case(
        "active tokens climb while in-flight stays flat",
        "HeadroomTokenCaliberDivergence",
        {_INFLIGHT: "8+0x60", _ACTIVE: "1000+100x60"},
        (("20m", ()), ("27m", ((A | M, "1.769"),))),
    ),
    Case(
        "tokens and requests growing together are not divergence",
        "HeadroomTokenCaliberDivergence",
        {_INFLIGHT: "8+1x60", _ACTIVE: "1000+100x60"},
        (("27m", ()),),
    ),
    Case(
        "in-flight at 90% of the measured knee",
        "HeadroomConcurrencyNearKnee",
        {
            _INFLIGHT: steps((2, 5), (9, 30)),
            _ACTIVE: "100+0x35",
            'headroom_capacity_knee{instance="a",model="m",caliber="requests"}': "10+0x35",
        },
        (("12m", ()), ("18m", ((A | M | {"caliber": "requests"}, "90%"),))),
    ),
    Case(
        "no knee estimate: silent however high the load",
        "HeadroomConcurrencyNearKnee",
        {_INFLIGHT: "500+0x30", _ACTIVE: "900000+0x30"},
        (("25m", ()),),
    ),
    Case(
        "9% of requests rate limited for 5m",
        "HeadroomRateLimitedRatioHigh",
        {_REQUESTS % "ok": "0+60x40", _REQUESTS % "rate_limited": counter((0, 10), (6, 30))},
        (("14m", ()), ("20m", ((M, "9.091%"),))),
    ),
    Case(
        "no 429 series at all: ratio is 0, quiet",
        "HeadroomRateLimitedRatioHigh",
        {_REQUESTS % "ok": "0+60x40"},
        (("20m", ()),),
    ),
    Case(
        "half the requests slow: fast burn pages after 2m",
        "HeadroomTTFTBudgetBurnFast",
        _ttft([(50, 40)], [(100, 40)]),
        (("2m", ()), ("6m", ((M, "50%"),))),
    ),
    Case(
        "5% slow burns the budget only slowly: no fast page",
        "HeadroomTTFTBudgetBurnFast",
        _ttft([(95, 40)], [(100, 40)]),
        (("35m", ()),),
    ),
    Case(
        "2% slow for 3 days' windows: ticket after 15m",
        "HeadroomTTFTBudgetBurnSlow",
        _ttft([(98, 40)], [(100, 40)]),
        (("10m", ()), ("20m", ((M, "2%"),))),
    ),
    Case(
        "0.5% slow is inside the budget",
        "HeadroomTTFTBudgetBurnSlow",
        _ttft([(99.5, 40)], [(100, 40)]),
        (("30m", ()),),
    ),
    Case(
        "sidecar target down for 2m",
        "HeadroomSidecarDown",
        {'up{job="headroom-sidecar",instance="a"}': steps((1, 3), (0, 10))},
        (("4m", ()), ("7m", ((A | {"job": "headroom-sidecar"}, "0"),))),
    ),
    Case(
        "sidecar target up",
        "HeadroomSidecarDown",
        {'up{job="headroom-sidecar",instance="a"}': "1+0x10"},
        (("9m", ()),),
    ),
    Case(
        "engine scrape failing for 3m",
        "HeadroomEngineScrapeFailing",
        {'headroom_engine_up{instance="a",engine="vllm"}': steps((1, 2), (0, 10))},
        (("4m", ()), ("7m", ((A | {"engine": "vllm"}, "0"),))),
    ),
    Case(
        "engine scrape healthy",
        "HeadroomEngineScrapeFailing",
        {'headroom_engine_up{instance="a",engine="vllm"}': "1+0x10"},
        (("9m", ()),),
    ),
    Case(
        "log rows dropped for 5m",
        "HeadroomLogRowsDropped",
        {'headroom_log_rows_dropped_total{instance="a",reason="queue_full"}': counter((0, 2), (5, 20))},
        (("6m", ()), ("10m", ((A | {"reason": "queue_full"}, "40"),))),
    ),
    Case(
        "no rows dropped",
        "HeadroomLogRowsDropped",
        {'headroom_log_rows_dropped_total{instance="a",reason="queue_full"}': "5+0x20"},
        (("15m", ()),),
    ),
)


def _expected(alert: Alert, config: RulesConfig, labels: dict, value_text: str) -> dict:
    rule = alert.to_rule(config)
    full = {**rule["labels"], **labels}
    return {
        "exp_labels": full,
        "exp_annotations": {
            "summary": to_text(alert.summary, full, value_text),
            "description": to_text(alert.description, full, value_text),
            "runbook_url": rule["annotations"]["runbook_url"],
        },
    }


def _group(case: Case, by_name: dict[str, Alert], config: RulesConfig) -> dict:
    alert = by_name[case.alert]
    return {
        "name": f"{case.alert}: {case.name}",
        "interval": "1m",
        "input_series": [{"series": s, "values": v} for s, v in case.series.items()],
        "alert_rule_test": [
            {
                "eval_time": at,
                "alertname": case.alert,
                "exp_alerts": [_expected(alert, config, labels, value) for labels, value in firing],
            }
            for at, firing in case.checks
        ],
    }


def unit_test_document(config: RulesConfig, rule_files: list[str], extra_groups: list[dict] = ()) -> dict:
    """The promtool test file: one group per Case, then `extra_groups` (recording-rule checks)."""
    by_name = {alert.name: alert for alert in alerts(config)}
    return {
        "rule_files": rule_files,
        "evaluation_interval": "1m",
        "tests": [_group(case, by_name, config) for case in CASES] + list(extra_groups),
    }
