"""LoRA adapters in the backtest: the `adapter_thrash` scenario's ground truth and the series it exports.

No Prometheus here (tests/test_backtest_scenarios.py runs the scenario through the rules): the
simulation itself, so the truth the alert is judged against is checked on its own. With 2 adapters
on 4 slots each is loaded once and TTFT is the base model's; with 8, adapters are loaded again and
again and TTFT climbs (docs/simulator.md, "LoRA adapters"); with 2 again it falls back.
"""

from __future__ import annotations

import statistics

import pytest

from collector.backtest.scenario import Replica, Scenario, constant, steps
from collector.backtest.scenario_series import scenario_series
from collector.backtest.scenarios import SCENARIOS
from collector.backtest.simulate import simulate
from collector.rules.config import DEFAULT

MIN = 60.0


@pytest.fixture(scope="module")
def thrash():
    return simulate(SCENARIOS["adapter_thrash"])


def _phase(result, start_min: float, end_min: float) -> list:
    return [r for r in result.records if start_min * MIN <= r.admitted - result.epoch < end_min * MIN]


def _median_ttft(records: list) -> float:
    return statistics.median(r.ttft_s for r in records if r.ttft_s is not None)


def test_eight_adapters_over_four_slots_raise_ttft_and_two_do_not(thrash):
    two, eight, after = _phase(thrash, 10, 70), _phase(thrash, 75, 110), _phase(thrash, 115, 150)
    assert {r.adapter for r in two} == {"lora-0", "lora-1"}
    assert {r.adapter for r in eight} == {f"lora-{i}" for i in range(8)}
    base = _median_ttft(two)
    assert _median_ttft(eight) > 5 * base > DEFAULT.adapter_ttft_rise_ratio * base, (
        base,
        _median_ttft(eight),
    )
    assert _median_ttft(after) < 1.2 * base
    assert all(r.outcome == "ok" for r in two + eight + after if r.completed is not None)


def test_adapters_are_loaded_again_and_again_only_past_the_slots(thrash):
    samples = thrash.engine["replica-0"]

    def loads(start_min: float, end_min: float) -> int:
        return sum(s.adapter_loads for s in samples if start_min * MIN < s.t - thrash.epoch <= end_min * MIN)

    assert loads(0, 70) == 2  # each of the two loaded once
    assert loads(70, 110) > 100
    assert loads(115, 150) == 0  # the two are still in their slots


def test_the_sidecar_series_count_distinct_adapters_in_flight_against_the_slots():
    scenario = Scenario(
        "short",
        "",
        10 * MIN,
        constant(0.5),
        adapters=steps(2, (5 * MIN, 10 * MIN, 8)),
        replicas=SCENARIOS["adapter_thrash"].replicas,
    )
    series = scenario_series(simulate(scenario), DEFAULT.sidecar_job)
    (distinct,) = [key for key in series.keys() if key[0] == "headroom_adapters_inflight"]
    (slots,) = [key for key in series.keys() if key[0] == "headroom_adapter_slots"]
    assert dict(distinct[1])["model"] == dict(slots[1])["model"] == scenario.model
    early = [v for t, v in series.samples(distinct) if t < series.samples(distinct)[0][0] + 5 * MIN]
    late = [v for t, v in series.samples(distinct) if t > series.samples(distinct)[0][0] + 6 * MIN]
    assert max(early) <= 2 and max(late) > 4
    assert {v for _, v in series.samples(slots)} == {4.0}
    per_adapter = {
        dict(key[1])["adapter"] for key in series.keys() if key[0] == "headroom_adapter_inflight_requests"
    }
    assert per_adapter == {f"lora-{i}" for i in range(8)}


def test_a_scenario_with_more_adapters_than_its_engine_serves_names_the_problem():
    scenario = Scenario(
        "too_many", "", 2 * MIN, constant(0.5), adapters=constant(3), replicas=(Replica("r"),)
    )
    with pytest.raises(ValueError, match="3 adapters in the mix.*serves 0"):
        simulate(scenario)
