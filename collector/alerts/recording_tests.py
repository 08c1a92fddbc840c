"""promtool checks of the recording rules: worked inputs with the values a person computes by hand.

TTFT buckets per minute: 40 under 0.5 s, 40 more under 1 s, 16 more under the SLO bound, 4 slower.
  p50 = 0.5 + 0.5 * (50 - 40) / 40 = 0.625;  p95 = 1 + (95 - 80) / 16 = 1.9375 (fleet and replica);
  p99 falls in the +Inf bucket -> the highest finite bound, 2;  TTFT SLO misses = 4 %.
Requests per minute: 60 ok, 6 overloaded (503) -> 1.1 requests/s; shed = availability misses =
  6 / 66 = 9.0909 %; 429s 0 (no series: the `or ... * 0` default).
Durations of ok requests per minute: 99 of 100 within the e2e bound -> e2e SLO misses 1 %.
Concurrency: tenants of 3 and 5 requests -> 8 in flight; a knee of 10 (task class all) -> 5-minute
  mean knee ratio 0.8; no token-caliber knee, so that caliber has no ratio. The sidecar exports no
  headroom_replica_info and the knee no replica_class: both read as the "default" class.
Replica classes: one model on an h100 sidecar (knee 16) and an l40s one (knee 8), 8 in flight on
  each -> ratios 0.5 and 1.0; a third sidecar of class a10g, which has no knee of its own, is judged
  against the model's default class knee (10) -> 0.8.
Goodput: sidecar a (class h100) judges per minute 60 met, 10 missed, 20 shed, 10 error, 20 invalid;
  sidecar b (no class: "default") 30 met, 20 missed -> goodput 1.5 requests/s (h100 1, default 0.5),
  attainment 90 / 150 = 0.6 (invalid left out); model n only shed -> goodput 0 and attainment 0 (not
  no series). Good tokens 600 of 1200 generated a minute -> 10 tokens/s, 50 %. The engine computed
  3000 prompt tokens a minute in 6 s of prefill -> V_P 500 tokens/s; it read 1000 from its prefix
  cache -> hit rate 1000 / 4000 = 0.25.
"""

from __future__ import annotations

from typing import Any

from collector.rules.config import RulesConfig
from collector.rules.records import R

__all__ = ["recording_test_groups"]

_PER_TENANT = '{instance="a",model="m",tenant="%s"}'
_KNEE = 'headroom_capacity_knee_requests{instance="a",model="m",task_class="all",source="probe",confidence="high"}'
_M, _I = {"model": "m"}, {"instance": "a", "model": "m"}


def _series(name: str, values: str) -> dict[str, Any]:
    return {"series": name, "values": values}


def _expect(expr: str, *samples: tuple[dict[str, str], float]) -> dict[str, Any]:
    """Check `expr` at 10m, rounded to 1e-4 so float noise in rate() does not hide the hand value."""
    return {
        "eval_time": "10m",
        "expr": f"round({expr}, 0.0001)",
        "exp_samples": [{"labels": _labels(labels), "value": value} for labels, value in samples],
    }


def _labels(labels: dict[str, Any]) -> str:
    return "{" + ",".join(f'{k}="{v}"' for k, v in sorted(labels.items())) + "}"


def _inputs() -> list[dict[str, Any]]:
    bucket = 'headroom_time_to_first_token_seconds_bucket{instance="a",model="m",le="%s"}'
    duration = 'headroom_request_duration_seconds_%s{instance="a",model="m",outcome="ok"%s}'
    return [
        _series(bucket % "0.5", "0+40x10"),
        _series(bucket % "1.0", "0+80x10"),
        _series(bucket % "2.0", "0+96x10"),
        _series(bucket % "+Inf", "0+100x10"),
        _series('headroom_time_to_first_token_seconds_count{instance="a",model="m"}', "0+100x10"),
        _series(duration % ("bucket", ',le="60.0"'), "0+99x10"),
        _series(duration % ("bucket", ',le="+Inf"'), "0+100x10"),
        _series(duration % ("count", ""), "0+100x10"),
        _series("headroom_inflight_requests" + _PER_TENANT % "t1", "3+0x10"),
        _series("headroom_inflight_requests" + _PER_TENANT % "t2", "5+0x10"),
        _series("headroom_active_tokens" + _PER_TENANT % "t1", "300+0x10"),
        _series("headroom_active_tokens" + _PER_TENANT % "t2", "700+0x10"),
        _series(_KNEE, "10+0x10"),
        _series('headroom_requests_total{instance="a",model="m",tenant="t1",outcome="ok"}', "0+60x10"),
        _series('headroom_requests_total{instance="a",model="m",tenant="t1",outcome="overloaded"}', "0+6x10"),
    ]


def recording_test_groups(config: RulesConfig) -> list[dict[str, Any]]:
    """The recording-rule checks for the rules generated under `config`.

    The SLO-miss checks read the 2 s TTFT and 60 s duration buckets, so they run when the default
    SLO uses those bounds (the defaults) and are left out for other bounds.
    """
    checks = [
        _expect(f'{R.TTFT_QUANTILE}{{quantile="0.5"}}', (_M | {"quantile": "0.5"}, 0.625)),
        _expect(f'{R.TTFT_QUANTILE}{{quantile="0.95"}}', (_M | {"quantile": "0.95"}, 1.9375)),
        _expect(f'{R.TTFT_QUANTILE}{{quantile="0.99"}}', (_M | {"quantile": "0.99"}, 2)),
        _expect(R.TTFT_QUANTILE_INSTANCE, (_I | {"quantile": "0.95"}, 1.9375)),
        _expect(R.CONCURRENCY, (_I | {"caliber": "requests"}, 8), (_I | {"caliber": "tokens"}, 1000)),
        # No tokens-caliber knee: that caliber has no ratio (alerts on it stay silent).
        _expect(R.REPLICA_CLASS, ({"instance": "a", "replica_class": "default"}, 1)),
        _expect(
            R.KNEE_RATIO, (_I | {"caliber": "requests", "task_class": "all", "replica_class": "default"}, 0.8)
        ),
        _expect(R.RATE_LIMITED_RATIO, (_M, 0)),
        _expect(R.SHED_RATIO, (_M, 0.0909)),
        _expect(R.REQUESTS_RATE, (_M, 1.1)),
        _expect(R.slo_misses("5m", "availability"), (_M, 0.0909)),
    ]
    if config.default_slo.ttft_seconds == 2.0:
        checks.append(_expect(R.slo_misses("5m"), (_M, 0.04)))
    if config.default_slo.e2e_seconds == 60.0:
        checks.append(_expect(R.slo_misses("5m", "e2e"), (_M, 0.01)))
    groups = [
        {
            "name": "recording rules: quantiles, SLO misses, calibers, knee ratio, shed and 429 ratios",
            "interval": "1m",
            "input_series": _inputs(),
            "promql_expr_test": checks,
        },
        _fleet_group(),
        _replica_classes_group(),
    ]
    groups.append(_goodput_group())
    return groups + ([_two_clusters(config.cluster_by)] if config.cluster_by else [])


def _goodput_group() -> dict[str, Any]:
    """Goodput on two sidecars (see the module docstring) and a model nothing of which met the SLO."""
    verdict = 'headroom_slo_requests_total{instance="%s",model="%s",tenant="t",verdict="%s"}'
    engine = '{instance="a",model="m"%s}'
    series = [
        _series(verdict % (instance, model, name), f"0+{count}x10")
        for instance, model, name, count in (
            ("a", "m", "met", 60),
            ("a", "m", "missed", 10),
            ("a", "m", "shed", 20),
            ("a", "m", "error", 10),
            ("a", "m", "invalid", 20),
            ("b", "m", "met", 30),
            ("b", "m", "missed", 20),
            ("a", "n", "shed", 10),
        )
    ]
    series += [
        _series('headroom_replica_info{instance="a",replica_class="h100"}', "1+0x10"),
        _series('headroom_inflight_requests{instance="b",model="m",tenant="t"}', "1+0x10"),
        _series('headroom_slo_good_tokens_total{instance="a",model="m",tenant="t"}', "0+600x10"),
        _series('headroom_generated_tokens_total{instance="a",model="m",tenant="t"}', "0+1200x10"),
        _series("headroom_engine_prompt_tokens_total" + engine % ',cache="computed"', "0+3000x10"),
        _series("headroom_engine_prompt_tokens_total" + engine % ',cache="cached"', "0+1000x10"),
        _series("headroom_engine_prefill_seconds_sum" + engine % "", "0+6x10"),
    ]
    n = {"model": "n"}
    return {
        "name": "goodput records: met req/s, attainment, token goodput, V_P and the prefix cache's hit rate",
        "interval": "1m",
        "input_series": series,
        "promql_expr_test": [
            _expect(R.GOODPUT_RATE, (_M, 1.5), (n, 0)),
            _expect(
                R.GOODPUT_RATE_CLASS,
                (_M | {"replica_class": "h100"}, 1),
                (_M | {"replica_class": "default"}, 0.5),
                (n | {"replica_class": "h100"}, 0),
            ),
            _expect(R.attainment("5m"), (_M, 0.6), (n, 0)),
            _expect(R.attainment("1h"), (_M, 0.6), (n, 0)),
            _expect(R.GOOD_TOKENS_RATE, (_M, 10)),
            _expect(R.GOOD_TOKENS_RATIO, (_M, 0.5)),
            _expect(R.PREFILL_RATE_CLASS, (_M | {"replica_class": "h100"}, 500)),
            _expect(R.PROMPT_CACHE_HIT_RATIO, (_M, 0.25)),
        ],
    }


def _fleet_group() -> dict[str, Any]:
    """Two replicas of two classes (pools 24 and 16, knees 32 and 20, token knee 40000 for `a`'s
    class) carrying 30 requests; the capacity comes from one exporter (instance "store"), each
    replica takes its own class's."""
    series, where = [], '{instance="store",model="m",task_class="all",replica_class="%s"}'
    for instance, cls, pool, knee, inflight in (("a", "h100", 24, 32, 18), ("b", "l40s", 16, 20, 12)):
        series += [
            _series("headroom_capacity_recommended_pool_requests" + where % cls, f"{pool}+0x10"),
            _series("headroom_capacity_knee_requests" + where % cls, f"{knee}+0x10"),
            _series(f'headroom_replica_info{{instance="{instance}",replica_class="{cls}"}}', "1+0x10"),
            _series(
                "headroom_inflight_requests" + _PER_TENANT.replace('"a"', f'"{instance}"') % "t",
                f"{inflight}+0x10",
            ),
        ]
    series.append(_series("headroom_capacity_knee_tokens" + where % "h100", "40000+0x10"))
    requests, tokens = _M | {"caliber": "requests"}, _M | {"caliber": "tokens"}
    return {
        "name": "fleet records: load and pools summed over replicas, replicas needed = ceil(load / mean pool)",
        "interval": "1m",
        "input_series": series,
        "promql_expr_test": [
            _expect(R.FLEET_POOL, (requests, 40), (tokens, 30000)),
            _expect(R.FLEET_KNEE, (requests, 52), (tokens, 40000)),
            _expect(R.POOL_PER_REPLICA, (requests, 20), (tokens, 30000)),
            _expect(R.REPLICAS, (_M, 2)),
            _expect(R.FLEET_LOAD, (requests, 30)),
            _expect(R.FLEET_POOL_RATIO, (requests, 0.75)),
            _expect(R.REPLICAS_NEEDED, (requests, 2)),
            _expect(R.REPLICAS_NEEDED_FORECAST, (requests, 2)),
        ],
    }


def _replica_classes_group() -> dict[str, Any]:
    """One model, sidecars of three classes: each knee ratio against its own class's knee, and a
    class without a knee against the model's default class knee (see the module docstring)."""
    knee = 'headroom_capacity_knee_requests{model="m",task_class="all",replica_class="%s"}'
    series = [
        _series(knee % cls, f"{value}+0x10") for cls, value in (("h100", 16), ("l40s", 8), ("default", 10))
    ]
    for instance, cls in (("a", "h100"), ("b", "l40s"), ("c", "a10g")):
        series += [
            _series(f'headroom_replica_info{{instance="{instance}",replica_class="{cls}"}}', "1+0x10"),
            _series(f'headroom_inflight_requests{{instance="{instance}",model="m",tenant="t"}}', "8+0x10"),
        ]
    every = {"model": "m", "caliber": "requests", "task_class": "all"}
    return {
        "name": "replica classes: each sidecar against its own class's knee, else the default class's",
        "interval": "1m",
        "input_series": series,
        "promql_expr_test": [
            _expect(
                R.KNEE_RATIO,
                (every | {"instance": "a", "replica_class": "h100"}, 0.5),
                (every | {"instance": "b", "replica_class": "l40s"}, 1.0),
                (every | {"instance": "c", "replica_class": "a10g"}, 0.8),
            ),
        ],
    }


def _two_clusters(label: str) -> dict[str, Any]:
    """The pitfall of central evaluation: pod `p1` of model `m` in two clusters, 5 and 7 in flight."""
    inflight = 'headroom_inflight_requests{instance="p1",model="m",tenant="t",%s="%s"}'
    per_cluster = [({label: name} | _M, value) for name, value in (("a", 5), ("b", 7))]
    return {
        "name": "two clusters: every aggregate keeps them apart (5 and 7, never 12)",
        "interval": "1m",
        "input_series": [
            _series(inflight % (label, "a"), "5+0x10"),
            _series(inflight % (label, "b"), "7+0x10"),
        ],
        "promql_expr_test": [
            _expect(R.INFLIGHT, *per_cluster),
            _expect(
                R.INFLIGHT_INSTANCE, *[(labels | {"instance": "p1"}, value) for labels, value in per_cluster]
            ),
        ],
    }
