"""Goodput in the backtest's series: every finished request judged once, consistently with its outcome.

The scenarios' sidecars count headroom_slo_requests_total the way the real sidecar does
(collector.goodput.verdict), judged by the rules' SLO (exposition.goodput_slo): per sidecar, the
verdicts add up to the outcomes, `shed` is the 429s and 503s, met + missed are the `ok` answers, and
the good tokens are the met requests' generated tokens.
"""

from __future__ import annotations

import dataclasses
from collections import Counter

from collector.backtest.exposition import goodput_slo
from collector.backtest.scenario_series import scenario_series
from collector.backtest.scenarios import SCENARIOS
from collector.backtest.simulate import simulate
from collector.goodput import RequestSlo
from collector.rules.config import DEFAULT, Slo

JOB = "headroom-sidecar"


def _totals(series, name: str, label: str) -> Counter:
    """The last value of each series of `name`, summed per value of `label`."""
    found: Counter = Counter()
    for key in series.keys():
        if key[0] == name:
            found[dict(key[1]).get(label, "")] += series.samples(key)[-1][1]
    return found


def test_verdicts_add_up_to_the_outcomes_and_shedding_is_shed():
    scenario = dataclasses.replace(SCENARIOS["overload_shedding"], duration_s=40 * 60.0)
    result = simulate(scenario)
    series = scenario_series(result, JOB)
    verdicts = _totals(series, "headroom_slo_requests_total", "verdict")
    outcomes = _totals(series, "headroom_requests_total", "outcome")
    assert sum(verdicts.values()) == sum(outcomes.values()) > 0
    assert verdicts["shed"] == outcomes["rate_limited"] + outcomes["overloaded"] > 0
    assert verdicts["met"] + verdicts["missed"] == outcomes["ok"]
    assert verdicts["met"] > 0.6 * sum(verdicts.values()), "the admitted requests keep their SLO"
    per_task = _totals(series, "headroom_task_slo_requests_total", "verdict")
    assert per_task == verdicts
    met_tokens = sum(
        r.completion_tokens
        for r in result.records
        if r.outcome == "ok"
        and r.completed is not None
        and r.completed <= result.end
        and (r.ttft_s or 0) <= 2
    )
    assert sum(_totals(series, "headroom_slo_good_tokens_total", "model").values()) == met_tokens


def test_the_sidecar_judges_by_the_rules_slo_of_each_model_without_a_tpot_bound():
    judge = goodput_slo(
        dataclasses.replace(DEFAULT, model_slos={"big": Slo(ttft_seconds=3.0, e2e_seconds=120)})
    )
    assert judge("big") == RequestSlo(ttft_s=3.0, e2e_s=120.0)
    assert judge("other") == RequestSlo(ttft_s=2.0, tpot_s=None, e2e_s=60.0)
