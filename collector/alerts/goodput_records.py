"""Recording rules on goodput and the engine's own timings (collector.goodput, collector.engine_timings).

Goodput is the clients' requests per second that met every bound of the SLO the sidecar judged
them by (`headroom_slo_requests_total{verdict="met"}`); attainment is its share of every verdict
but `invalid` (the client's own 4xx, which no capacity could have served). A shed (429, 503),
aborted or failed request is in the denominator and not in the numerator: shedding load lowers
attainment, where it would only have made the TTFT of the admitted requests look better.

    R.GOODPUT_RATE        sum by (model) (rate(headroom_slo_requests_total{verdict="met"}[5m]))
    R.attainment("1h")    met / every verdict but invalid, over 1 h (each of SLO_WINDOWS; the
                          goodput burn alerts read 1 - it)
    R.GOODPUT_RATE_CLASS  goodput summed per model and replica class, each sidecar joined to its
                          class (R.REPLICA_CLASS) as the knee ratio is: what μ_slo x replicas caps
    R.GOOD_TOKENS_RATE    generated tokens/s of met requests (token goodput), and R.GOOD_TOKENS_RATIO
                          their share of every generated token (token goodput %)
    R.PREFILL_RATE_CLASS  the passive prefill rate V_P: prompt tokens the engine computed per second
                          of its own prefill time, per model and replica class (beside the published
                          headroom_capacity_prefill_tokens_per_second)
    R.PROMPT_CACHE_HIT_RATIO  the share of prompt tokens the engine read from its prefix cache

A model none of whose requests met the SLO reads goodput 0 and attainment 0 (`or ... * 0`), never
no series: an engine that sheds everything must burn the budget, not silence the alert. V_P and
the hit rate have no series while the engine reports no timings (llama.cpp and vLLM with
per-request metrics do; docs/engines.md) or nothing was prefilled.
"""

from __future__ import annotations

from typing import Any

from collector.rules.naming import sample
from collector.rules.records import RATE_WINDOW, SLO_WINDOWS, R

__all__ = ["goodput_rules"]

_VERDICTS = sample("headroom_slo_requests_total")
_MET, _JUDGED = 'verdict="met"', 'verdict!="invalid"'


def _rule(name: str, expr: str) -> dict[str, Any]:
    return {"record": name, "expr": expr}


def _rate(metric: str, by: str, window: str, matcher: str = "") -> str:
    selector = f"{{{matcher}}}" if matcher else ""
    return f"sum by ({by}) (rate({metric}{selector}[{window}]))"


def _per_class(per_instance: str) -> str:
    """`per_instance` (by instance, model) summed per model and its sidecars' replica class."""
    joined = f"{per_instance}\n* on (instance) group_left (replica_class) {R.REPLICA_CLASS}"
    return f"sum by (model, replica_class) (\n{joined}\n)"


def _or_zero(expr: str, zero_of: str) -> str:
    """`expr`, or 0 for the series of `zero_of` that `expr` lacks (a model with nothing met yet)."""
    return f"(\n  {expr}\n  or {zero_of} * 0\n)"


def _attainment(window: str) -> str:
    met, judged = _rate(_VERDICTS, "model", window, _MET), _rate(_VERDICTS, "model", window, _JUDGED)
    return f"{_or_zero(met, judged)}\n/ {judged}"


def _goodput_rules() -> list[dict[str, Any]]:
    w = RATE_WINDOW
    met, judged = _rate(_VERDICTS, "model", w, _MET), _rate(_VERDICTS, "model", w, _JUDGED)
    met_class = _per_class(_rate(_VERDICTS, "instance, model", w, _MET))
    judged_class = _per_class(_rate(_VERDICTS, "instance, model", w, _JUDGED))
    good = _rate(sample("headroom_slo_good_tokens_total"), "model", w)
    generated = _rate(sample("headroom_generated_tokens_total"), "model", w)
    return [
        _rule(R.GOODPUT_RATE, _or_zero(met, judged)),
        _rule(R.GOODPUT_RATE_CLASS, _or_zero(met_class, judged_class)),
        *(_rule(R.attainment(window), _attainment(window)) for window in SLO_WINDOWS),
        _rule(R.GOOD_TOKENS_RATE, _or_zero(good, generated)),
        _rule(R.GOOD_TOKENS_RATIO, f"{_or_zero(good, generated)}\n/ on (model) ({generated} > 0)"),
    ]


def _engine_timing_rules() -> list[dict[str, Any]]:
    """V_P per model and replica class, and the prefix cache's hit rate per model."""
    w, prompt = RATE_WINDOW, sample("headroom_engine_prompt_tokens_total")
    computed = _per_class(_rate(prompt, "instance, model", w, 'cache="computed"'))
    prefill = _per_class(_rate(sample("headroom_engine_prefill_seconds", "sum"), "instance, model", w))
    cached, every = _rate(prompt, "model", w, 'cache="cached"'), _rate(prompt, "model", w)
    return [
        _rule(R.PREFILL_RATE_CLASS, f"{computed}\n/ on (model, replica_class) (\n{prefill}\n> 0\n)"),
        _rule(R.PROMPT_CACHE_HIT_RATIO, f"{cached}\n/ on (model) ({every} > 0)"),
    ]


def goodput_rules() -> list[dict[str, Any]]:
    """The goodput and engine-timing records, in evaluation order (after R.REPLICA_CLASS's group)."""
    return _goodput_rules() + _engine_timing_rules()
