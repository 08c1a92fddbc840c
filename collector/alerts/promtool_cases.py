"""The promtool cases: for every alert, a firing case checked on both sides of its `for:`, and quiet ones.

`fires()` turns "the condition holds from minute `onset`" into two checks: nothing at onset + for - 1,
the alert (with its exact value text) at onset + for + 1. An onset is a (earliest, latest) pair where
a window's edge makes it uncertain by a minute. Values that move are computed from the inputs (the
ramp cases), everything else is held constant once the condition holds. The table is long because
it is the whole behaviour of the rules; each case names what it shows.

Worked example, HeadroomQueueNotDraining: waiting is 0 for 5 minutes, then 3. `min_over_time` over
the 15-minute queue window is above 0 from minute 19 or 20, so with `for: 5m` nothing fires at 23m
and the alert fires with value 3 at 26m.
"""

from __future__ import annotations

from collector.alerts.pipeline_alerts import absent_labels
from collector.alerts.promtool_support import (
    Case,
    counter,
    humanize,
    humanize_duration,
    humanize_percentage,
    minutes,
    steps,
)
from collector.alerts.slo_classes import slo_classes
from collector.rules.config import RulesConfig, seconds
from collector.rules.naming import le_label
from collector.rules.records import R

__all__ = ["cases"]

M, A = {"model": "m"}, {"instance": "a"}
AM = A | M
_N = 150  # samples per input series: 2.5 h at the 1-minute interval, past every check time
_P95 = f'{R.TTFT_QUANTILE}{{model="m",quantile="0.95"}}'
_P99 = f'{R.TTFT_QUANTILE}{{model="m",quantile="0.99"}}'
_TTFT_COUNT = 'headroom_time_to_first_token_seconds_count{instance="%s",model="%s"}'
_WAITING = 'headroom_engine_requests_waiting{instance="a",engine="vllm",model="m"}'
_KV = 'headroom_engine_kv_cache_usage_ratio{instance="a",engine="vllm",model="m"}'
_PREEMPTIONS = 'headroom_engine_preemptions_total{instance="a",engine="vllm",model="m"}'
_INFLIGHT = 'headroom_inflight_requests{instance="a",model="m",tenant="t"%s}'
_ACTIVE = 'headroom_active_tokens{instance="a",model="m",tenant="t"}'
_KNEE = (
    'headroom_capacity_knee_requests{instance="a",model="m",task_class="%s",source="probe",confidence="high"}'
)
_POOL = (
    "headroom_capacity_recommended_pool_requests"
    '{instance="a",model="m",task_class="all",source="probe",confidence="high"}'
)
_INFLIGHT_B = 'headroom_inflight_requests{instance="b",model="m",tenant="t"}'
_KNEE_B = 'headroom_capacity_knee_requests{instance="b",model="m",task_class="all",source="probe",confidence="high"}'
# The label the knee ratio (and so the forecast) carries once the recording rules join each sidecar
# to its replica class (R.REPLICA_CLASS): "default" for a sidecar that exports none.
_CLASS = {"replica_class": "default"} if hasattr(R, "REPLICA_CLASS") else {}
_ESTIMATE = (
    "headroom_capacity_estimate_timestamp_seconds"
    '{instance="a",model="m",task_class="all",source="probe",confidence="%s"}'
)
_REQUESTS = 'headroom_requests_total{instance="a",model="%s",tenant="t",outcome="%s"}'
_GPU = 'headroom_gpu_utilization_ratio{instance="a",gpu="0",uuid="GPU-0",gpu_name="H100"}'
_TOKENS = {
    'headroom_prompt_tokens_total{instance="a",model="m",tenant="t"}': f"0+600x{_N}",
    'headroom_generated_tokens_total{instance="a",model="m",tenant="t"}': f"0+600x{_N}",
}


def flat(value: float) -> str:
    return f"{value:g}+0x{_N}"


def _traffic(instance: str = "a", model: str = "m") -> dict[str, str]:
    """TTFT observations enough for the minimum-traffic guard (100 a minute)."""
    return {_TTFT_COUNT % (instance, model): f"0+100x{_N}"}


Checks = tuple[tuple[str, tuple[tuple[dict[str, str], str], ...]], ...]


def fires(
    c: RulesConfig, alert: str, onset: tuple[int, int], labels: dict[str, str], value: str, settle: int = 0
) -> Checks:
    """Checks: quiet at earliest onset + for - 1, firing with `value` at latest onset + for + 1 (+ settle)."""
    hold = minutes(c.for_duration(alert))
    before, after = onset[0] + hold - 1, onset[1] + hold + 1 + settle
    firing: tuple[tuple[dict[str, str], str], ...] = ((labels, value),)
    checks: list[tuple[str, tuple[tuple[dict[str, str], str], ...]]] = (
        [(f"{before}m", ())] if before >= 0 else []
    )
    return tuple(checks + [(f"{after}m", firing)])


def after_minute(c: RulesConfig, alert: str, onset: tuple[int, int], settle: int = 0) -> int:
    """The minute of the firing check `fires` makes (to compute a moving value there)."""
    return onset[1] + minutes(c.for_duration(alert)) + 1 + settle


def quiet(at: str) -> Checks:
    return ((at, ()),)


def _signal_cases(c: RulesConfig) -> list[Case]:
    found, target = [], c.default_slo.ttft_seconds
    if target is not None:
        # p95 = 0.6 + 0.02 t: predict_linear(+1h) passes the target once 0.6 + 0.02 (t + 60) > target
        first = max(1, int((target - 0.6) / 0.02) - 60)
        onset, rising = (first, first + 1), f"0.6+0.02x{_N}"
        at = after_minute(c, "HeadroomTTFTRising", onset)
        found += [
            Case(
                "TTFT p95 climbing towards the SLO",
                "HeadroomTTFTRising",
                {_P95: rising, **_traffic()},
                fires(
                    c,
                    "HeadroomTTFTRising",
                    onset,
                    M | {"quantile": "0.95"},
                    humanize_duration(0.6 + 0.02 * at),
                ),
            ),
            Case(
                "TTFT p95 high but flat is not rising",
                "HeadroomTTFTRising",
                {_P95: flat(0.9), **_traffic()},
                quiet("45m"),
            ),
            Case(
                "a climbing p95 over a handful of requests says nothing",
                "HeadroomTTFTRising",
                {_P95: rising},
                quiet(f"{at}m"),
            ),
            Case(
                "p99 TTFT beyond tolerance",
                "HeadroomTailLatencyOverSLO",
                {_P99: steps((1, 5), (8, _N)), **_traffic()},
                fires(c, "HeadroomTailLatencyOverSLO", (5, 5), M | {"quantile": "0.99"}, "8s"),
            ),
            Case(
                "p99 TTFT inside tolerance",
                "HeadroomTailLatencyOverSLO",
                {_P99: flat(3), **_traffic()},
                quiet("30m"),
            ),
        ]
    window = minutes(c.queue_window)
    found += [
        Case(
            "queue above zero for the whole window",
            "HeadroomQueueNotDraining",
            {_WAITING: steps((0, 5), (3, _N))},
            fires(c, "HeadroomQueueNotDraining", (4 + window, 5 + window), M, "3"),
        ),
        Case(
            "a queue that drains every other minute is healthy",
            "HeadroomQueueNotDraining",
            {_WAITING: steps(*[(3, 1), (0, 1)] * 40)},
            quiet("60m"),
        ),
        Case(
            "GPU saturated, requests waiting, tokens/s flat vs the lookback",
            "HeadroomGPUSaturatedThroughputFlat",
            {**_TOKENS, _GPU: flat(0.95), _WAITING: flat(2)},
            # the rate 30m ago must have had its whole 5-minute window (rate() extrapolates less before)
            fires(
                c,
                "HeadroomGPUSaturatedThroughputFlat",
                (minutes(c.flat_lookback) + 4, minutes(c.flat_lookback) + 6),
                AM,
                "100%",
            ),
        ),
        Case(
            "flat throughput with the GPU half idle is not saturation",
            "HeadroomGPUSaturatedThroughputFlat",
            {**_TOKENS, _GPU: flat(0.5), _WAITING: flat(2)},
            quiet("60m"),
        ),
    ]
    return found


def _knee_cases(c: RulesConfig) -> list[Case]:
    knee, share = 32, c.knee_warning_ratio
    near = int(knee * share) + 1  # in flight just over the warning share
    class_labels = {"caliber": "requests", "task_class": "all"}
    ramp = {_INFLIGHT % "": f"10+0.5x{_N}", _KNEE % "all": flat(knee)}
    # with a pool of 20: 24.75 in flight needs 2 replicas now, ~55 at the 1 h forecast 3
    paged = ramp | {_POOL: flat(20)}
    needed = {R.REPLICAS_NEEDED: "requests 2", R.REPLICAS_NEEDED_FORECAST: "requests 3"}

    def ratio_at(t: int) -> float:  # 5-minute mean of 10 + 0.5 t, over a knee of 32
        return (10 + 0.5 * (t - 2.5)) / knee

    first = next(t for t in range(5, _N) if ratio_at(t) > c.knee_forecast_min_ratio)
    rising_onset = (first - 1, first + 1)
    rising_at = after_minute(c, "HeadroomConcurrencyRising", rising_onset)
    # the lows of three step windows rise once the third starts at minute 0 and the second at 5
    step = minutes(c.knee_forecast_step)
    forecast_onset = (max(first, 2 * step + 4), max(first, 2 * step + 6))
    forecast_at = after_minute(c, "HeadroomCapacityForecast", forecast_onset)
    return [
        Case(
            "5-minute mean concurrency over the warning share of the knee",
            "HeadroomConcurrencyNearKnee",
            {_INFLIGHT % "": steps((2, 5), (near, _N)), _KNEE % "all": flat(knee)},
            fires(
                c,
                "HeadroomConcurrencyNearKnee",
                (9, 10),
                AM | class_labels | _CLASS | {"signal": "near_knee", "signal_kind": "saturation"},
                humanize_percentage(near / knee),
            ),
        ),
        Case(
            "a task class against its own knee, the rest against task_class all",
            "HeadroomConcurrencyNearKnee",
            {
                'headroom_task_inflight_requests{instance="a",model="m",task_class="short"}': steps(
                    (1, 5), (9, _N)
                ),
                _INFLIGHT % "": steps((1, 5), (9, _N)),
                _KNEE % "short": flat(10),
                _KNEE % "all": flat(knee),
            },
            fires(
                c,
                "HeadroomConcurrencyNearKnee",
                (9, 10),
                AM
                | _CLASS
                | {
                    "caliber": "requests",
                    "task_class": "short",
                    "signal": "near_knee",
                    "signal_kind": "saturation",
                },
                humanize_percentage(0.9),
            ),
        ),
        Case(
            "no knee estimate: silent however high the load",
            "HeadroomConcurrencyNearKnee",
            {_INFLIGHT % "": flat(500), _ACTIVE: flat(900000)},
            quiet("25m"),
        ),
        Case(
            "concurrency climbing towards the knee",
            "HeadroomConcurrencyRising",
            ramp,
            fires(
                c,
                "HeadroomConcurrencyRising",
                rising_onset,
                AM | class_labels | _CLASS,
                humanize_percentage(ratio_at(rising_at)),
            ),
        ),
        Case(
            "high but flat concurrency is not rising",
            "HeadroomConcurrencyRising",
            {_INFLIGHT % "": flat(20), _KNEE % "all": flat(knee)},
            quiet("40m"),
        ),
        Case(
            "flat load above the knee is no climb (predict_linear of a flat 2.5 is 2.5)",
            "HeadroomConcurrencyRising",
            {_INFLIGHT % "": flat(2.5 * knee), _KNEE % "all": flat(knee)},
            quiet("40m"),
        ),
        Case(
            "a sustained climb towards the knee pages, once per model, with the replicas needed",
            "HeadroomCapacityForecast",
            paged,
            fires(
                c,
                "HeadroomCapacityForecast",
                forecast_onset,
                M | _CLASS,
                humanize_percentage(ratio_at(forecast_at)),
            ),
            calibers=needed,
        ),
        Case(
            "two replicas climbing together are one page, on the busier one's ratio",
            "HeadroomCapacityForecast",
            paged | {_INFLIGHT_B: f"5+0.5x{_N}", _KNEE_B: flat(knee)},
            fires(
                c,
                "HeadroomCapacityForecast",
                forecast_onset,
                M | _CLASS,
                humanize_percentage(ratio_at(forecast_at)),
            ),
            calibers={R.REPLICAS_NEEDED: "requests 3", R.REPLICAS_NEEDED_FORECAST: "requests 6"},
        ),
        Case(
            "a burst, however tall, is no sustained climb",
            "HeadroomCapacityForecast",
            {_INFLIGHT % "": steps((14, 30), (40, 4), (14, _N - 34)), _KNEE % "all": flat(knee)},
            quiet("33m") + quiet("38m") + quiet("45m"),
        ),
    ]


def _capacity_cases(c: RulesConfig) -> list[Case]:
    kv, clear = c.kv_warning_ratio, c.kv_warning_clear_ratio
    high, middle = round(min(1.0, kv + 0.05), 4), round((kv + clear) / 2, 4)
    window = minutes(c.divergence_window)
    tokens_onset = (window, window + 1)
    at = after_minute(c, "HeadroomTokenCaliberDivergence", tokens_onset)
    growth = (1000 + 100 * (at - 2.5)) / (1000 + 100 * (at - window - 2.5))
    flight = c.divergence_min_inflight + 2
    return [
        Case(
            "KV cache warning raises on the 5-minute mean, holds above the clear ratio, clears below",
            "HeadroomKVCacheNearFull",
            {_KV: steps((0.5, 5), (high, 30), (middle, 20), (0.5, 20))},
            fires(c, "HeadroomKVCacheNearFull", (9, 10), AM, humanize_percentage(high))
            + (("50m", ((AM, humanize_percentage(middle)),)), ("70m", ())),
        ),
        Case(
            "KV cache between clear and raise without a prior warning stays quiet",
            "HeadroomKVCacheNearFull",
            {_KV: steps((0.5, 5), (middle, 40))},
            quiet("30m"),
        ),
        Case(
            "KV cache full with requests queueing behind it",
            "HeadroomKVCacheExhausted",
            {_KV: steps((0.5, 5), (high, _N - 5)), _WAITING: steps((0, 5), (2, _N - 5))},
            fires(c, "HeadroomKVCacheExhausted", (9, 10), AM, humanize_percentage(high)),
        ),
        Case(
            "a full KV cache with nothing waiting is healthy batch load",
            "HeadroomKVCacheExhausted",
            {_KV: steps((0.5, 5), (high, 40)), _WAITING: flat(0)},
            quiet("30m"),
        ),
        Case(
            "the engine preempts 2 requests a minute with its KV cache nearly full",
            "HeadroomEnginePreempting",
            {_KV: steps((0.5, 5), (high, _N - 5)), _PREEMPTIONS: counter((0, 5), (2, _N - 6))},
            fires(c, "HeadroomEnginePreempting", (9, 10), AM, humanize(2)),
        ),
        Case(
            "preemptions with the KV cache at 40 % are no saturation (a request too long for it)",
            "HeadroomEnginePreempting",
            {_KV: flat(0.4), _PREEMPTIONS: counter((0, 5), (2, _N - 6))},
            quiet("30m"),
        ),
        Case(
            "a nearly full KV cache without preemptions is the engine using its memory",
            "HeadroomEnginePreempting",
            {_KV: steps((0.5, 5), (high, _N - 5)), _PREEMPTIONS: flat(3)},
            quiet("30m"),
        ),
        Case(
            "active tokens climb while in-flight stays flat",
            "HeadroomTokenCaliberDivergence",
            {_INFLIGHT % "": flat(flight), _ACTIVE: f"1000+100x{_N}"},
            fires(c, "HeadroomTokenCaliberDivergence", tokens_onset, AM, humanize(growth)),
        ),
        Case(
            "tokens and requests growing together are not divergence",
            "HeadroomTokenCaliberDivergence",
            {_INFLIGHT % "": f"{flight}+1x{_N}", _ACTIVE: f"1000+100x{_N}"},
            quiet(f"{window + 10}m"),
        ),
        Case(
            "a few requests in flight: one long one more is no divergence",
            "HeadroomTokenCaliberDivergence",
            {_INFLIGHT % "": flat(2), _ACTIVE: f"1000+100x{_N}"},
            quiet(f"{window + 10}m"),
        ),
        Case(
            "9 % of requests shed with 503",
            "HeadroomLoadShedding",
            {
                _REQUESTS % ("m", "ok"): f"0+60x{_N}",
                _REQUESTS % ("m", "overloaded"): counter((0, 10), (6, _N - 10)),
            },
            fires(c, "HeadroomLoadShedding", (11, 13), M, humanize_percentage(6 / 66), settle=3),
        ),
        Case(
            "no 429 or 503 series at all: ratio is 0, quiet",
            "HeadroomLoadShedding",
            {_REQUESTS % ("m", "ok"): f"0+60x{_N}"},
            quiet("20m"),
        ),
        _slow_replica(c, fast=0.3, slow=3.0),
        Case(
            "every replica slow is not one slow replica",
            "HeadroomSlowReplica",
            {**_replicas(3.0, 3.0)},
            quiet("30m"),
        ),
    ]


def _fleet_cases(c: RulesConfig) -> list[Case]:
    """Two replicas with a pool of 24 each: 30 in flight leaves (48 - 30) / 24 = 0.75 replicas spare."""
    alert, labels = "HeadroomFleetHeadroomLow", M | {"caliber": "requests"}

    def fleet(inflight: float, replicas: str = "ab") -> dict[str, str]:
        series = {}
        for instance in replicas:
            where = f'instance="{instance}",model="m",task_class="all",source="probe",confidence="high"'
            series[f"headroom_capacity_recommended_pool_requests{{{where}}}"] = flat(24)
            series[f"headroom_capacity_knee_requests{{{where}}}"] = flat(32)
            series[f'headroom_inflight_requests{{instance="{instance}",model="m",tenant="t"}}'] = flat(
                inflight / len(replicas)
            )
        return series

    return [
        Case(
            "two replicas whose forecast load leaves under one pool spare",
            alert,
            fleet(30),
            fires(c, alert, (0, 2), labels, humanize(0.75)),
        ),
        Case("two replicas with more than one pool spare", alert, fleet(20), quiet("30m")),
        Case(
            "one replica never has a spare one: left to the knee alerts",
            alert,
            fleet(20, "a") if c.fleet_min_replicas > 1 else fleet(0, "a"),
            quiet("30m"),
        ),
    ]


def _estimate_cases(c: RulesConfig) -> list[Case]:
    """promtool's clock starts at 0: an estimate stamped -max_age is past it from minute 1."""
    alert, limit = "HeadroomCapacityEstimateStale", seconds(c.estimate_max_age)
    labels = M | {"task_class": "all", "source": "probe"}
    at = after_minute(c, alert, (1, 1))
    return [
        Case(
            "an estimate older than the probe's age limit",
            alert,
            {_ESTIMATE % "high": flat(-limit)},
            fires(c, alert, (1, 1), labels | {"confidence": "high"}, humanize_duration(limit + 60 * at)),
        ),
        Case(
            "a fresh estimate of low confidence",
            alert,
            {_ESTIMATE % "low": flat(0)},
            fires(c, alert, (0, 1), labels | {"confidence": "low"}, humanize_duration(60 * at)),
        ),
        Case("a fresh estimate of high confidence", alert, {_ESTIMATE % "high": flat(0)}, quiet("30m")),
    ]


def _cluster_cases(c: RulesConfig) -> list[Case]:
    """Two clusters, each with a pod `a` of model `m`: neither merges into the other (central rulers)."""
    if not c.cluster_by:
        return []
    knee, label = 32, c.cluster_by
    over, under = knee, int(knee * c.knee_warning_ratio) - 2
    up = 'up{job="%s",instance="a",%s="%s"}'
    series = {
        f'headroom_inflight_requests{{instance="a",model="m",tenant="t",{label}="{name}"}}': flat(value)
        for name, value in (("x", under), ("y", over))
    } | {
        f'headroom_capacity_knee_requests{{instance="a",model="m",task_class="all",{label}="{name}"}}': flat(
            knee
        )
        for name in ("x", "y")
    }
    return [
        Case(
            "two clusters: the one over its knee warns, the other stays quiet",
            "HeadroomConcurrencyNearKnee",
            series,
            fires(
                c,
                "HeadroomConcurrencyNearKnee",
                (0, 0),
                AM
                | {label: "y", "caliber": "requests", "task_class": "all"}
                | _CLASS
                | {"signal": "near_knee", "signal_kind": "saturation"},
                humanize_percentage(1.0),
            ),
        ),
        Case(
            "two clusters: the sidecar job vanishes from one while the other reports",
            "HeadroomSidecarJobAbsent",
            {
                up % (c.sidecar_job, label, "x"): flat(1),
                up % (c.sidecar_job, label, "y"): "1+0x3 stale",
            },
            fires(
                c,
                "HeadroomSidecarJobAbsent",
                (4, 4),
                absent_labels(c.job_selector) | {label: "y"},
                "1",
            ),
        ),
    ]


def _replicas(first: float, others: float) -> dict[str, str]:
    series = {}
    for index, instance in enumerate("abcd"):
        value = steps((others, 5), (first, _N - 5)) if index == 0 else flat(others)
        series[f'{R.TTFT_QUANTILE_INSTANCE}{{instance="{instance}",model="m",quantile="0.95"}}'] = value
        series |= _traffic(instance)
    return series


def _slow_replica(c: RulesConfig, fast: float, slow: float) -> Case:
    return Case(
        "one replica of four ten times slower",
        "HeadroomSlowReplica",
        _replicas(slow, fast),
        fires(c, "HeadroomSlowReplica", (5, 5), AM | {"quantile": "0.95"}, humanize_duration(slow)),
    )


def _composite_cases(c: RulesConfig) -> list[Case]:
    if c.default_slo.ttft_seconds is None:
        return []
    # the tail-latency signal fires after its for:, the queue (from minute 5) after window and for:
    tail = minutes(c.for_duration("HeadroomTailLatencyOverSLO"))
    queue = minutes(c.queue_window) + minutes(c.for_duration("HeadroomQueueNotDraining"))
    both = (max(tail, 4 + queue), max(tail, 5 + queue))
    latency = {_P99: flat(8), **_traffic()}
    return [
        Case(
            "a latency and a saturation signal at once page",
            "HeadroomNearCapacityLimit",
            latency | {_WAITING: steps((0, 5), (3, _N))},
            fires(c, "HeadroomNearCapacityLimit", both, M, "2"),
        ),
        Case(
            "two latency signals without saturation do not page",
            "HeadroomNearCapacityLimit",
            latency | {_P95: f"0.6+0.02x{_N}"},
            quiet("60m"),
        ),
        Case("one signal alone does not page", "HeadroomNearCapacityLimit", latency, quiet("40m")),
    ]


def _slo_series(kind: str, model: str, target: float, good: float, total: float) -> dict[str, str]:
    """Counters where `good` of `total` requests a minute met `kind`'s SLO (or did not fail)."""
    if kind == "availability":
        return {
            _REQUESTS % (model, "ok"): f"0+{good:g}x{_N}",
            _REQUESTS % (model, "upstream_error"): f"0+{total - good:g}x{_N}",
        }
    if kind == "ttft":
        return {
            f'headroom_time_to_first_token_seconds_bucket{{instance="a",model="{model}",le="{le_label(target)}"}}': f"0+{good:g}x{_N}",
            _TTFT_COUNT % ("a", model): f"0+{total:g}x{_N}",
        }
    outcome = f'instance="a",model="{model}",outcome="ok"'
    return {
        f'headroom_request_duration_seconds_bucket{{{outcome},le="{le_label(target)}"}}': f"0+{good:g}x{_N}",
        f"headroom_request_duration_seconds_count{{{outcome}}}": f"0+{total:g}x{_N}",
    }


def _as_probe(series: dict[str, str]) -> dict[str, str]:
    """The same series as `headroom probe`'s load through a sidecar: labelled source="probe"."""
    return {name.replace('instance="a"', 'instance="a",source="probe"'): v for name, v in series.items()}


def _slo_cases(c: RulesConfig) -> list[Case]:
    found = []
    for kind, title in (("availability", "Availability"), ("ttft", "TTFT"), ("e2e", "E2E")):
        classes = slo_classes(c, kind)
        for index, slo_class in enumerate(classes):
            model = "m" if slo_class.name == "default" else slo_class.name
            target = slo_class.target
            budget = slo_class.slo.budget(kind)
            labels = {"model": model} | slo_class.labels(classes)
            fast, slow = f"Headroom{title}BudgetBurnFast", f"Headroom{title}BudgetBurnSlow"
            found.append(
                Case(
                    f"half the requests missing the {slo_class.name} SLO page",
                    fast,
                    _slo_series(kind, model, target, 50, 100),
                    fires(c, fast, (1, 2), labels, "50%"),
                    rule=index,
                )
            )
            if slo_class.name != "default":
                continue
            slow_misses = round(2 * budget, 9)
            clients = _slo_series(kind, model, target, 50, 100)
            found += [
                Case(
                    "a probe past the SLO is left out: clients' half missing pages at their own 50%",
                    fast,
                    clients | _as_probe(_slo_series(kind, model, target, 0, 400)),
                    fires(c, fast, (1, 2), labels, "50%"),
                ),
                Case(
                    "a probe past the SLO alone does not page while clients are served",
                    fast,
                    _slo_series(kind, model, target, 100, 100)
                    | _as_probe(_slo_series(kind, model, target, 0, 400)),
                    quiet("30m"),
                ),
                Case(
                    "misses at five times the budget burn only slowly: no page",
                    fast,
                    _slo_series(kind, model, target, 1000 * (1 - 5 * budget), 1000),
                    quiet("30m"),
                ),
                Case(
                    "half missing, but only a request a minute: no page",
                    fast,
                    _slo_series(kind, model, target, 0.5, 1),
                    quiet("30m"),
                ),
                Case(
                    "twice the budget over the windows opens a ticket",
                    slow,
                    _slo_series(kind, model, target, 1000 * (1 - slow_misses), 1000),
                    fires(c, slow, (1, 2), labels, humanize_percentage(slow_misses)),
                ),
                Case(
                    "half the budget is inside it",
                    slow,
                    _slo_series(kind, model, target, 1000 * (1 - budget / 2), 1000),
                    quiet("30m"),
                ),
            ]
    return found


_VERDICT = 'headroom_slo_requests_total{instance="a",model="%s",tenant="t",verdict="%s"}'


def _verdicts(model: str, **per_minute: float) -> dict[str, str]:
    """Goodput counters: requests a minute per verdict (met=66, shed=34, ...)."""
    return {_VERDICT % (model, verdict): f"0+{count:g}x{_N}" for verdict, count in per_minute.items()}


def _shedding(model: str, met: float, shed: float) -> dict[str, str]:
    """An engine refusing `shed` requests a minute with 503 while the `met` it admits all meet the SLO."""
    return _verdicts(model, met=met, shed=shed) | {
        _REQUESTS % (model, "ok"): f"0+{met:g}x{_N}",
        _REQUESTS % (model, "overloaded"): f"0+{shed:g}x{_N}",
    }


def _first_tokens_within(target_s: float, model: str, count: float) -> dict[str, str]:
    """`count` first tokens a minute, every one inside the TTFT target (as the sidecar exports them)."""
    bucket = f'headroom_time_to_first_token_seconds_bucket{{instance="a",model="{model}",le="{le_label(target_s)}"}}'
    return {bucket: f"0+{count:g}x{_N}", _TTFT_COUNT % ("a", model): f"0+{count:g}x{_N}"}


def _goodput_cases(c: RulesConfig) -> list[Case]:
    """Attainment = met / every verdict but invalid: shedding burns it while the admitted requests'
    latency stays inside the SLO, and the TTFT burn (which never sees a shed request) stays quiet."""
    found, fast, slow = [], "HeadroomGoodputBudgetBurnFast", "HeadroomGoodputBudgetBurnSlow"
    classes = slo_classes(c, "goodput")
    for index, slo_class in enumerate(classes):
        model = "m" if slo_class.name == "default" else slo_class.name
        found.append(
            Case(
                f"the engine sheds a third of the {slo_class.name} class's requests, latency fine: pages",
                fast,
                _shedding(model, 66, 34),
                fires(c, fast, (1, 2), {"model": model} | slo_class.labels(classes), "34%"),
                rule=index,
            )
        )
    budget = classes[0].slo.budget("goodput")
    slow_misses = round(2 * budget, 9)
    return found + [
        Case(
            "goodput burning on a third shed, the admitted requests' TTFT fine: the TTFT SLI never sees a shed",
            "HeadroomTTFTBudgetBurnFast",
            _shedding("m", 66, 34) | _first_tokens_within(c.ttft_slo_seconds, "m", 66),
            quiet("30m"),
        ),
        Case("every request met its SLO: full attainment", fast, _verdicts("m", met=100), quiet("30m")),
        Case(
            "the client's own 4xx (invalid) are left out of attainment",
            fast,
            _verdicts("m", met=50, invalid=50),
            quiet("30m"),
        ),
        Case(
            "misses at five times the budget burn only slowly: no page",
            fast,
            _verdicts("m", met=1000 * (1 - 5 * budget), missed=1000 * 5 * budget),
            quiet("30m"),
        ),
        Case(
            "half shed, but only a request a minute: no page",
            fast,
            _verdicts("m", met=0.5, shed=0.5),
            quiet("30m"),
        ),
        Case(
            "twice the budget missed over the windows opens a ticket",
            slow,
            _verdicts("m", met=1000 * (1 - slow_misses), missed=1000 * slow_misses),
            fires(
                c, slow, (1, 2), {"model": "m"} | classes[0].labels(classes), humanize_percentage(slow_misses)
            ),
        ),
        Case(
            "half the budget is inside it",
            slow,
            _verdicts("m", met=1000 * (1 - budget / 2), aborted=1000 * budget / 2),
            quiet("30m"),
        ),
    ]


def _pipeline_cases(c: RulesConfig) -> list[Case]:
    up = f'up{{job="{c.sidecar_job}",instance="a"}}'
    dropped = 'headroom_log_rows_dropped_total{instance="a",reason="queue_full"}'
    dropped_at = max(after_minute(c, "HeadroomLogRowsDropped", (3, 3)), 13)
    lag = 2000.0
    return [
        Case(
            "sidecar target down",
            "HeadroomSidecarDown",
            {up: steps((1, 3), (0, _N))},
            fires(c, "HeadroomSidecarDown", (3, 3), A | {"job": c.sidecar_job}, "0"),
        ),
        Case("sidecar target up", "HeadroomSidecarDown", {up: flat(1)}, quiet("9m")),
        Case(
            "no up series for the sidecar job at all",
            "HeadroomSidecarJobAbsent",
            {'up{job="some-other-job",instance="x"}': flat(1)},
            fires(c, "HeadroomSidecarJobAbsent", (0, 0), absent_labels(c.job_selector), "1"),
        ),
        Case("the sidecar job is scraped", "HeadroomSidecarJobAbsent", {up: flat(1)}, quiet("10m")),
        Case(
            "engine scrape failing",
            "HeadroomEngineScrapeFailing",
            {'headroom_engine_up{instance="a",engine="vllm"}': steps((1, 2), (0, _N))},
            fires(c, "HeadroomEngineScrapeFailing", (2, 2), A | {"engine": "vllm"}, "0"),
        ),
        Case(
            "engine scrape healthy",
            "HeadroomEngineScrapeFailing",
            {'headroom_engine_up{instance="a",engine="vllm"}': flat(1)},
            quiet("9m"),
        ),
        Case(
            "log rows dropped",
            "HeadroomLogRowsDropped",
            {dropped: counter((0, 2), (5, _N))},
            fires(
                c,
                "HeadroomLogRowsDropped",
                (3, 3),
                A | {"reason": "queue_full"},
                "50",
                settle=dropped_at - after_minute(c, "HeadroomLogRowsDropped", (3, 3)),
            ),
        ),
        Case("no rows dropped", "HeadroomLogRowsDropped", {dropped: flat(5)}, quiet("15m")),
        Case(
            "the lake stops taking writes",
            "HeadroomLogSinkDown",
            {'headroom_log_sink_up{instance="a"}': steps((1, 5), (0, _N))},
            fires(c, "HeadroomLogSinkDown", (5, 5), A, "0"),
        ),
        Case(
            "the lake takes writes",
            "HeadroomLogSinkDown",
            {'headroom_log_sink_up{instance="a"}': flat(1)},
            quiet("15m"),
        ),
        Case(
            "the lake becomes unreachable: the alert carries the sink's reason",
            "HeadroomLogSinkDown",
            {  # one series at a time: reason="ok" goes stale as reason="unreachable" appears
                'headroom_log_sink_up{instance="a",reason="ok"}': "1x4 stale",
                'headroom_log_sink_up{instance="a",reason="unreachable"}': f"_x5 0x{_N - 6}",
            },
            fires(c, "HeadroomLogSinkDown", (5, 5), A | {"reason": "unreachable"}, "0"),
        ),
        Case(
            "the oldest row the sink has not taken gets older than the threshold",
            "HeadroomLogSinkLagging",
            {'headroom_log_sink_lag_seconds{instance="a"}': steps((0, 5), (lag, _N))},
            fires(c, "HeadroomLogSinkLagging", (5, 5), A, humanize_duration(lag)),
        ),
        Case(
            "a spool whose oldest batch is old, from a sidecar without the lag gauge",
            "HeadroomLogSinkLagging",
            {'headroom_log_spool_oldest_age_seconds{instance="a"}': steps((0, 5), (lag, _N))},
            fires(c, "HeadroomLogSinkLagging", (5, 5), A, humanize_duration(lag)),
        ),
        Case(
            "caught up",
            "HeadroomLogSinkLagging",
            {'headroom_log_sink_lag_seconds{instance="a"}': flat(0)},
            quiet("15m"),
        ),
    ] + _lake_committer_cases(c)


def _lake_committer_cases(c: RulesConfig) -> list[Case]:
    """The committer's last success stays at time 0 while files wait (the threshold passes at
    minute stall/60 + 1), a writer's oldest staged file waits past it, files in quarantine."""
    success = 'headroom_lake_commit_last_success_timestamp_seconds{instance="a"}'
    waiting = 'headroom_lake_staged_files_waiting{instance="a"}'
    lag = 'headroom_lake_commit_lag_seconds{instance="a",writer="w.1a2b"}'
    held = 'headroom_lake_quarantine_files{instance="a"}'
    onset = int(c.lake_commit_stall_seconds // 60) + 1
    stalled_at = after_minute(c, "HeadroomLakeCommitStalled", (onset, onset))
    late = c.lake_commit_stall_seconds + 100
    return [
        Case(
            "no pass has succeeded since time 0 while files wait",
            "HeadroomLakeCommitStalled",
            {success: flat(0), waiting: flat(3)},
            fires(c, "HeadroomLakeCommitStalled", (onset, onset), A, humanize_duration(stalled_at * 60.0)),
        ),
        Case(
            "passes succeed every minute while files wait",
            "HeadroomLakeCommitStalled",
            {success: f"0+60x{_N}", waiting: flat(3)},
            quiet(f"{stalled_at + 10}m"),
        ),
        Case(
            "no pass since time 0, nothing waiting",
            "HeadroomLakeCommitStalled",
            {success: flat(0), waiting: flat(0)},
            quiet(f"{stalled_at + 10}m"),
        ),
        Case(
            "passes succeed but a writer's oldest staged file waits past the threshold",
            "HeadroomLakeCommitStalled",
            {success: f"0+60x{_N}", waiting: flat(1), lag: steps((0, 5), (late, _N))},
            fires(c, "HeadroomLakeCommitStalled", (5, 5), A, humanize_duration(late)),
        ),
        Case(
            "files in quarantine",
            "HeadroomLakeFilesQuarantined",
            {held: steps((0, 5), (2, _N))},
            fires(c, "HeadroomLakeFilesQuarantined", (5, 5), A, "2"),
        ),
        Case("quarantine empty", "HeadroomLakeFilesQuarantined", {held: flat(0)}, quiet("15m")),
    ]


def _integrity_cases(c: RulesConfig) -> list[Case]:
    """A request stuck in flight (against the floor, and against the model's own e2e tail), a dead
    capacity input: the integrity warning fires while the KV and queue alerts built on it stay quiet."""
    oldest = 'headroom_inflight_oldest_age_seconds{instance="a",model="m",task_class="long"}'
    bucket = 'headroom_request_duration_seconds_bucket{instance="a",model="m",outcome="ok",le="%s"}'
    # p99 of 10 requests a minute, all between 90 and 120 s: 90 + 30 x 0.99 = 119.7 s
    tail = {bucket % "90.0": flat(0), bucket % "120.0": f"0+10x{_N}", bucket % "+Inf": f"0+10x{_N}"}
    threshold = max(c.stuck_request_floor_seconds, c.stuck_request_p99_multiple * 119.7)
    floor_onset = int(c.stuck_request_floor_seconds // 60) + 1  # the age grows 60 s a minute from 0
    tail_onset = int(threshold // 60) + 1
    valid = 'headroom_signal_valid{instance="a",source="engine",signal="%s",reason="%s"}'
    dead_kv = {_KV: flat(0.95), valid % ("kv_usage", "stale"): flat(0)}
    dead_queue = {_WAITING: flat(3), valid % ("waiting", "stuck"): flat(0)}
    invalid = A | {"source": "engine", "reason": "stale", "input": "kv_usage"}
    return [
        Case(
            "a request held by a hanging upstream, and nothing completed: the floor",
            "HeadroomRequestStuck",
            {oldest: f"0+60x{_N}"},
            fires(
                c,
                "HeadroomRequestStuck",
                (floor_onset, floor_onset),
                AM,
                humanize_duration(60 * after_minute(c, "HeadroomRequestStuck", (floor_onset, floor_onset))),
            ),
        ),
        Case(
            "a request held past 4x the model's p99 e2e, not before",
            "HeadroomRequestStuck",
            {oldest: f"0+60x{_N}", **tail},
            fires(
                c,
                "HeadroomRequestStuck",
                (tail_onset, tail_onset),
                AM,
                humanize_duration(60 * after_minute(c, "HeadroomRequestStuck", (tail_onset, tail_onset))),
            ),
        ),
        Case("requests in flight for 30 s", "HeadroomRequestStuck", {oldest: flat(30), **tail}, quiet("20m")),
        Case(
            "the KV-usage signal went stale: the integrity warning says which and why",
            "HeadroomSignalInvalid",
            dead_kv,
            fires(c, "HeadroomSignalInvalid", (0, 0), invalid, "0"),
        ),
        Case(
            "a KV cache at 95 % read from a stale signal stays quiet",
            "HeadroomKVCacheNearFull",
            dead_kv,
            quiet("20m"),
        ),
        Case(
            "the same KV usage from a valid signal warns",
            "HeadroomKVCacheNearFull",
            {_KV: flat(0.95), valid % ("kv_usage", "ok"): flat(1)},
            fires(c, "HeadroomKVCacheNearFull", (0, 0), AM, humanize_percentage(0.95)),
        ),
        Case(
            "a full KV cache with a queue read from a stuck signal does not page",
            "HeadroomKVCacheExhausted",
            {**dead_kv, **dead_queue},
            quiet("20m"),
        ),
        Case(
            "a queue read from a stuck signal never drains, yet stays quiet",
            "HeadroomQueueNotDraining",
            dead_queue,
            quiet("30m"),
        ),
        Case(
            "an engine that cannot be scraped is HeadroomEngineScrapeFailing's, not this",
            "HeadroomSignalInvalid",
            {valid % ("kv_usage", "scrape_failing"): flat(0), valid % ("running", "idle"): flat(1)},
            quiet("10m"),
        ),
    ]


def cases(c: RulesConfig) -> list[Case]:
    """Every case for the rules generated under `c`, in the order of the alerts."""
    return (
        _signal_cases(c)
        + _knee_cases(c)
        + _capacity_cases(c)
        + _fleet_cases(c)
        + _estimate_cases(c)
        + _cluster_cases(c)
        + _composite_cases(c)
        + _slo_cases(c)
        + _goodput_cases(c)
        + _pipeline_cases(c)
        + _integrity_cases(c)
        + _adapter_cases(c)
    )


def _adapter_cases(c: RulesConfig) -> list[Case]:
    """8 adapters over 4 slots while mean TTFT goes 0.05 s -> 0.5 s at minute 70: fires; the same
    TTFT rise with 2 adapters, or 8 adapters with TTFT flat: quiet."""
    distinct = 'headroom_adapters_inflight{instance="a",model="m"}'
    slots = 'headroom_adapter_slots{instance="a",model="m"}'
    ttft = 'headroom_time_to_first_token_seconds_%s{instance="a",model="m",source="traffic"}'
    calm = {ttft % "count": f"0+100x{_N}", ttft % "sum": f"0+5x{_N}"}
    rising = calm | {ttft % "sum": counter((5, 70), (50, _N - 70))}
    onset = (71, 72)  # the 5-minute mean passes 2x the 0.05 s of an hour before within 1-2 minutes
    return [
        Case(
            "8 adapters in flight over 4 slots while TTFT climbs",
            "HeadroomAdapterThrash",
            {distinct: flat(8), slots: flat(4), **rising},
            fires(c, "HeadroomAdapterThrash", onset, AM, "8"),
        ),
        Case(
            "2 adapters within 4 slots, TTFT climbing for another reason",
            "HeadroomAdapterThrash",
            {distinct: flat(2), slots: flat(4), **rising},
            quiet("80m"),
        ),
        Case(
            "8 adapters over 4 slots, TTFT flat: swaps are cheap here",
            "HeadroomAdapterThrash",
            {distinct: flat(8), slots: flat(4), **calm},
            quiet("80m"),
        ),
    ]
