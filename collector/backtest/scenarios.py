"""The built-in backtest scenarios, each the situation an on-call engineer must (not) be paged for.

Every scenario runs on BACKTEST_ENGINE (32 slots, a published knee of 32 requests) unless it says
otherwise, with load given as offered concurrency / knee. `expect` is what the generated rules must
show on it; tests/test_backtest_scenarios.py runs them all and docs/rules.md tabulates the results.

    SCENARIOS["ramp"].summary -> "a linear ramp from 30 % to 150 % of the knee over 2 h"
"""

from __future__ import annotations

import dataclasses
import math

from collector.backtest.scenario import (
    BACKTEST_COST,
    BACKTEST_ENGINE,
    Expect,
    Fault,
    Incident,
    Replica,
    RequestClass,
    Scenario,
    constant,
    linear,
    steps,
)

__all__ = ["SCENARIOS", "scenario_names"]

_H, _M = 3600.0, 60.0


def _daily(t_s: float) -> float:
    """Offered load over a day: 10 % of the knee at 04:00, 55 % at 16:00."""
    return 0.1 + 0.45 * (1 - math.cos(2 * math.pi * (t_s - 4 * _H) / (24 * _H))) / 2


def _with_spike(t_s: float) -> float:
    return 1.3 if 14 * _H <= t_s < 14 * _H + 2 * _M else _daily(t_s)


_SMALL_KV = dataclasses.replace(BACKTEST_ENGINE, kv_cache_tokens=16384)
# Eight LoRA adapters served on four adapter slots (vLLM --max-loras 4), 50 ms a load.
_LORA = dataclasses.replace(BACKTEST_ENGINE, lora_adapters=tuple(f"lora-{i}" for i in range(8)), max_loras=4)
_MID_KV = dataclasses.replace(BACKTEST_ENGINE, kv_cache_tokens=16384)
_DOCUMENTS = RequestClass("document", (3000, 4000), (64, 128))
_NIGHT_DOCUMENTS = RequestClass("document", (9000, 12000), (32, 64))
_FOUR = tuple(Replica(f"replica-{i}") for i in range(4))
_RAMP = linear(0.3, 1.5, 2 * _H)
# The same instance name in two clusters: only the `cluster` label tells their series apart.
_TWO_CLUSTERS = (
    Replica("replica-0", cluster="a", load=_RAMP),
    Replica("replica-0", cluster="b", load=constant(0.5)),
)
# No queue (max_waiting 0): the engine admits only what its batch has room for and answers the rest
# 429 at once, so overload is shed at the door and the admitted requests keep their TTFT.
_NO_QUEUE = dataclasses.replace(BACKTEST_ENGINE, max_waiting=0)
# Half the memory bandwidth: 0.19 s per decode step, so a simulated day costs half the steps.
_SLOW_GPU = Replica("replica-0", cost=dataclasses.replace(BACKTEST_COST, memory_bandwidth=0.75e12))

_ALL = (
    Scenario(
        "steady",
        "steady load at 50 % of the knee for 6 h",
        6 * _H,
        constant(0.5),
        expect=Expect(pages=0, warnings=0, breach=False),
    ),
    Scenario(
        "ramp",
        "a linear ramp from 30 % to 150 % of the knee over 2 h",
        2 * _H,
        _RAMP,
        expect=Expect(breach=True, lead_warning_s=15 * _M, lead_page_s=5 * _M, page_notifications=1),
    ),
    Scenario(
        "token_shift",
        "request rate flat at 55 % of the knee while long-context requests grow from "
        "5 % to 40 % (a KV cache of 16k tokens)",
        2 * _H,
        constant(0.55),
        long_share=linear(0.05, 0.40, 1 * _H, after_s=15 * _M),
        replicas=(Replica("replica-0", _SMALL_KV),),
        knee_tokens=None,  # what the product publishes: the knee x the first 15 min's tokens per request in flight
        expect=Expect(
            breach=True,
            lead_warning_s=15 * _M,
            lead_page_s=5 * _M,
            silent_before_breach=('{caliber="requests"}', "HeadroomQueueNotDraining"),
        ),
    ),
    Scenario(
        "kv_saturation",
        "30 minutes of long documents (3-4k-token prompts, 60 % of requests) "
        "fill a 16k-token KV cache at 50 % of the knee",
        2 * _H,
        constant(0.5),
        long_share=steps(0.02, (45 * _M, 75 * _M, 0.6)),
        long=_DOCUMENTS,
        replicas=(Replica("replica-0", _MID_KV),),
        knee_tokens=15000,
        incidents=(Incident("long documents fill the KV cache", 45 * _M, 75 * _M),),
        expect=Expect(fires=(("HeadroomKVCacheNearFull", 10 * _M), ("HeadroomKVCacheExhausted", 15 * _M))),
    ),
    Scenario(
        "shedding_storm",
        "at 50 % of the knee, the engine refuses 30 % of requests with 503 for 10 minutes",
        1.5 * _H,
        constant(0.5),
        faults=(Fault("shedding", 45 * _M, 55 * _M, share=0.3, status=503),),
        expect=Expect(
            fires=(("HeadroomAvailabilityBudgetBurnFast", 5 * _M), ("HeadroomLoadShedding", 8 * _M)),
            silent=("HeadroomNearCapacityLimit",),
        ),
    ),
    Scenario(
        "overload_shedding",
        "at 140 % of the knee for 45 minutes an engine without a queue answers a third of requests "
        "429 at once; the requests it admits keep their TTFT",
        2 * _H,
        steps(0.5, (30 * _M, 75 * _M, 1.4)),
        replicas=(Replica("replica-0", _NO_QUEUE),),
        incidents=(Incident("overload shed at the door", 30 * _M, 75 * _M),),
        expect=Expect(
            breach=True,
            page_notifications=1,
            fires=(("HeadroomGoodputBudgetBurnFast", 10 * _M), ("HeadroomLoadShedding", 8 * _M)),
            silent=(
                "HeadroomTTFTBudgetBurnFast",
                "HeadroomTTFTBudgetBurnSlow",
                "HeadroomTTFTRising",
                "HeadroomTailLatencyOverSLO",
            ),
        ),
    ),
    Scenario(
        "engine_metrics_down",
        "at 50 % of the knee, the engine's /metrics fails for 20 minutes (requests still served)",
        1.5 * _H,
        constant(0.5),
        faults=(Fault("engine_metrics_down", 40 * _M, 60 * _M),),
        expect=Expect(
            pages=0, fires=(("HeadroomEngineScrapeFailing", 5 * _M),), silent=("HeadroomNearCapacityLimit",)
        ),
    ),
    Scenario(
        "engine_outage",
        "at 50 % of the knee the engine is gone for 10 minutes: every request gets a 502",
        1.5 * _H,
        constant(0.5),
        faults=(Fault("engine_outage", 40 * _M, 50 * _M),),
        expect=Expect(
            fires=(("HeadroomAvailabilityBudgetBurnFast", 5 * _M),), silent=("HeadroomNearCapacityLimit",)
        ),
    ),
    Scenario(
        "log_sink_outage",
        "at 50 % of the knee the lake takes no writes for 20 minutes; rows spool on the sidecar",
        1.5 * _H,
        constant(0.5),
        faults=(Fault("log_sink_outage", 40 * _M, 60 * _M),),
        expect=Expect(pages=0, fires=(("HeadroomLogSinkDown", 8 * _M),)),
    ),
    Scenario(
        "daily_spike",
        "a day of traffic (10 % of the knee at night, 55 % in the afternoon) with one "
        "2-minute spike to 130 % at 14:00",
        24 * _H,
        _with_spike,
        incidents=(Incident("spike above the knee", 14 * _H, 14 * _H + 2 * _M),),
        replicas=(_SLOW_GPU,),
        scrape_interval_s=30.0,
        evaluation_interval_s=60.0,
        expect=Expect(pages=0, false_pages=0),
    ),
    Scenario(
        "night_trickle",
        "night traffic: about 6 requests in 5 minutes, one in six a 10k-token "
        "document whose TTFT misses the SLO",
        2 * _H,
        constant(0.0048),
        long_share=constant(1 / 6),
        long=_NIGHT_DOCUMENTS,
        expect=Expect(pages=0, breach=False),
    ),
    Scenario(
        "slow_replica",
        "four replicas at 50 % of the knee; from 30 minutes one runs 3x slower",
        1.5 * _H,
        constant(0.5),
        replicas=_FOUR,
        faults=(Fault("slow_replica", 30 * _M, 90 * _M, instance="replica-3"),),
        expect=Expect(
            fires=(('HeadroomSlowReplica{instance="replica-3"}', 20 * _M),),
            silent=(
                'HeadroomSlowReplica{instance="replica-0"}',
                'HeadroomSlowReplica{instance="replica-1"}',
                'HeadroomSlowReplica{instance="replica-2"}',
            ),
        ),
    ),
    Scenario(
        "sidecar_job_gone",
        "the sidecars' scrape job vanishes for 20 minutes (a relabelling change)",
        1 * _H,
        constant(0.5),
        faults=(Fault("sidecar_gone", 20 * _M, 40 * _M),),
        expect=Expect(fires=(("HeadroomSidecarJobAbsent", 8 * _M),)),
    ),
    Scenario(
        "two_clusters",
        'two clusters, each with a "replica-0": cluster a ramps from 30 % to 150 % of the knee '
        "over 2 h, cluster b stays at 50 %",
        2 * _H,
        _RAMP,
        replicas=_TWO_CLUSTERS,
        expect=Expect(
            breach=True,
            lead_warning_s=15 * _M,
            lead_page_s=5 * _M,
            page_notifications=1,
            fired=('{cluster="a"}',),
            silent=('{cluster="b"}',),
        ),
    ),
    Scenario(
        "adapter_thrash",
        "50 % of the knee, every request naming a LoRA adapter, on 4 adapter slots: 2 adapters "
        "in the mix, 8 from 70 to 110 minutes, then 2 again",
        150 * _M,
        constant(0.5),
        adapters=steps(2, (70 * _M, 110 * _M, 8)),
        replicas=(Replica("replica-0", _LORA),),
        incidents=(Incident("8 adapters over 4 slots", 70 * _M, 110 * _M),),
        expect=Expect(
            fires=(("HeadroomAdapterThrash", 10 * _M),),
            silent_before_problem=("HeadroomAdapterThrash",),
            false_warnings=0,
        ),
    ),
)

SCENARIOS: dict[str, Scenario] = {scenario.name: scenario for scenario in _ALL}


def scenario_names() -> list[str]:
    """Built-in scenario names, in the order of docs/rules.md's table."""
    return list(SCENARIOS)
