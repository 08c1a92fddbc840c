"""The overview's goodput panels: goodput against offered load and μ_slo, attainment, where TTFT went.

Goodput is the clients' requests per second that met every bound of their SLO
(headroom_slo_requests_total{verdict="met"}, collector.goodput); every other verdict but `invalid`
(the client's own 4xx) misses it, shedding included. Next to load and capacity:

    A  sum by (model) (rate(headroom_slo_requests_total{...}[$__rate_interval]))       offered
    B  the same, verdict="met"                                                          goodput
    C  sum by (model) (each serving replica's own class μ_slo, queries.per_class)       μ_slo x replicas

A replica class near its limit shows goodput flattening (or falling) while the offered load keeps
rising, at or below μ_slo x replicas. The attainment stat is the worst selected model's met share
over 1 h; the breakdown of TTFT and the passive prefill rate read the engine's own timings
(collector.engine_timings: llama.cpp's `timings`, vLLM's per-request metrics) and are empty for an
engine that reports none. The recording rules of the same quantities (R.GOODPUT_RATE,
R.attainment, R.PREFILL_RATE_CLASS, R.PROMPT_CACHE_HIT_RATIO) feed the alerts; panels read the raw
series so that every variable filters them (dashboards.queries).
"""

from __future__ import annotations

from typing import Any

from collector.dashboards.panels import dashed, right_axis, stat, target, timeseries
from collector.dashboards.queries import per_class, published, rate, sel
from collector.rules.config import RulesConfig
from collector.rules.naming import sample
from collector.rules.records import R

__all__ = ["GOODPUT_PANEL_TITLE", "goodput_panels", "engine_timing_panels"]

GOODPUT_PANEL_TITLE = "Goodput and offered load vs μ_slo"
_VERDICTS = "headroom_slo_requests_total"
_MU = "headroom_capacity_rate_requests_per_second"
_CLIENTS = 'source!="probe"'


def _verdicts(by: str, verdict: str = "") -> str:
    return f"sum by ({by}) ({rate(_VERDICTS, sel('model', extra=verdict))})"


def _goodput_panel() -> dict[str, Any]:
    serving = f"group by (instance, model) ({sample('headroom_inflight_requests')}{sel('model')})"
    return timeseries(
        GOODPUT_PANEL_TITLE,
        "Goodput: clients' requests per second that met every bound of their SLO "
        '(headroom_slo_requests_total{verdict="met"}; record model:headroom_goodput:rate5m), against '
        "the offered load (the same counter, every verdict: met, missed, shed, aborted, error, "
        "invalid) and μ_slo × the replicas serving each model (dashed; "
        "headroom_capacity_rate_requests_per_second, each replica at its own class's). The gap "
        "between the two lines is the load that did not get its SLO. Goodput flattening, or falling, "
        "while the offered load keeps rising is a fleet at its limit: shedding or queueing past "
        "μ_slo. Probe load is not judged and not here.",
        [
            target(_verdicts("model"), "{{model}} offered load", "A"),
            target(_verdicts("model", 'verdict="met"'), "{{model}} goodput", "B"),
            target(f"sum by (model) ({per_class(serving, '*', _MU)})", "{{model}} μ_slo × replicas", "C"),
        ],
        "reqps",
        axis_label="requests/s",
        width=20,
        overrides=dashed("C"),
    )


def _attainment_stat(c: RulesConfig) -> dict[str, Any]:
    met, judged = (
        f"sum by (model) (rate({sample(_VERDICTS)}{sel('model', extra=matcher)}[1h]))"
        for matcher in ('verdict="met"', 'verdict!="invalid"')
    )
    objective, page_below = c.goodput_objective, 1 - 14.4 * c.default_slo.budget("goodput")
    panel = stat(
        "Goodput attainment (1 h)",
        "The share of clients' requests that met their whole SLO over the last hour, for the worst "
        "selected model: met ÷ every verdict but invalid (the client's own 4xx), from "
        "headroom_slo_requests_total (record model:headroom_goodput:ratio_rate1h). A shed, aborted "
        f"or failed request counts against it. Red below the {objective:.0%} objective; "
        f"HeadroomGoodputBudgetBurnFast pages when it stays below {page_below:.1%} for 1 h.",
        [target(f"min(\n(\n  {met}\n  or {judged} * 0\n)\n/ {judged}\n)", "attainment")],
        "percentunit",
        decimals=1,
        defaults={
            "thresholds": {
                "mode": "absolute",
                "steps": [{"color": "red", "value": None}, {"color": "green", "value": objective}],
            }
        },
    )
    return panel | {"height": 8}


def goodput_panels(c: RulesConfig) -> list[dict[str, Any]]:
    """Goodput against offered load and μ_slo (20 wide), its attainment stat beside it."""
    return [_goodput_panel(), _attainment_stat(c)]


def _mean(histogram: str, by: str, selector: str) -> str:
    """Mean seconds per observation: rate of _sum / rate of _count."""
    return (
        f"sum by ({by}) ({rate(histogram, selector, 'sum')})\n"
        f"/ sum by ({by}) ({rate(histogram, selector, 'count')})"
    )


def _ttft_breakdown_panel() -> dict[str, Any]:
    clients = sel("model", extra=_CLIENTS)
    return timeseries(
        "Where TTFT went: sidecar hop, engine queue, prefill",
        "Mean seconds per request of each part of the time to first token, from the histograms' "
        "_sum and _count rates: the sidecar's own hop before the engine (headroom_sidecar_hop_seconds, "
        "per sidecar), the wait in the engine's queue (headroom_engine_queue_seconds) and its prefill "
        "(headroom_engine_prefill_seconds), per model, beside the clients' mean TTFT "
        "(headroom_time_to_first_token_seconds; dashed). Queue growing: too few slots for the load "
        "(capacity); prefill growing at the same load: longer prompts or a colder prefix cache; hop "
        "growing: the sidecar's host. Queue and prefill come from the engine's own timings (llama.cpp, "
        "vLLM with per-request metrics): empty for an engine that reports none.",
        [
            target(_mean("headroom_sidecar_hop_seconds", "instance", sel()), "{{instance}} sidecar hop", "A"),
            target(
                _mean("headroom_engine_queue_seconds", "model", sel("model")), "{{model}} engine queue", "B"
            ),
            target(_mean("headroom_engine_prefill_seconds", "model", sel("model")), "{{model}} prefill", "C"),
            target(
                _mean("headroom_time_to_first_token_seconds", "model", clients), "{{model}} mean TTFT", "D"
            ),
        ],
        "s",
        overrides=dashed("D"),
    )


def _prefill_rate_panel() -> dict[str, Any]:
    prompt, by = "headroom_engine_prompt_tokens_total", "sum by (instance, model)"
    computed, cached, every = (
        f"{by} ({rate(prompt, sel('model', extra=matcher))})"
        for matcher in ('cache="computed"', 'cache="cached"', "")
    )
    prefill = f"{by} ({rate('headroom_engine_prefill_seconds', sel('model'), 'sum')})"
    return timeseries(
        "Passive prefill rate V_P and prefix-cache hit rate",
        "V_P: prompt tokens each sidecar's engine computed per second of its own prefill time "
        '(headroom_engine_prompt_tokens_total{cache="computed"} ÷ headroom_engine_prefill_seconds_sum; '
        f"record {R.PREFILL_RATE_CLASS} per replica class), against the published V_P of its "
        "class (dashed; headroom_capacity_prefill_tokens_per_second, measured by `headroom probe "
        "--rates`). Passive V_P falling below the published one at the same prompts: the prefill is "
        "sharing the GPU with more decode than the probe saw. Right: the share of prompt tokens read "
        f"from the engine's prefix cache (cached ÷ cached + computed; record {R.PROMPT_CACHE_HIT_RATIO}). "
        "Empty for an engine that reports no timings.",
        [
            target(f"{computed}\n/ ({prefill} > 0)", "{{instance}} {{model}} V_P", "A"),
            target(
                published("headroom_capacity_prefill_tokens_per_second"),
                "{{model}} {{replica_class}} published V_P",
                "B",
            ),
            target(f"{cached}\n/ ({every} > 0)", "{{instance}} {{model}} prefix-cache hit rate", "C"),
        ],
        "short",
        axis_label="prompt tokens/s",
        overrides=(right_axis("C", "percentunit", "hit rate"), *dashed("B")),
    )


def engine_timing_panels() -> list[dict[str, Any]]:
    """Where TTFT went and the passive prefill rate with the prefix cache's hit rate (12 wide each)."""
    return [_ttft_breakdown_panel(), _prefill_rate_panel()]
