"""Multi-window, multi-burn-rate SLO alerts (Google SRE Workbook, "Alerting on SLOs") for four SLIs.

    availability  answered requests that failed: 429/503 load shedding, 5xx, resets, timeouts, the
                  sidecar's own 502s; an engine outage pages here, as no TTFT is ever observed
    ttft          streamed requests slower than the TTFT target
    e2e           ok requests slower end to end than the e2e target (non-streamed traffic has no TTFT)
    goodput       requests that did not meet their whole SLO (collector.goodput: a latency bound
                  missed, shed, aborted or failed; the client's own 4xx left out): shed load
                  counts against it, so refusing requests cannot make the latency look better

Fast burn pages: 14.4x the budget over 1 h and 5 m, or 6x over 6 h and 30 m, and only with at
least `slo_min_requests` requests in the last 5 minutes (at night one slow request in six is a
16.7 % miss ratio and no evidence). Slow burn opens a ticket: 1x over 3 d and 6 h, with as many
requests per 5 minutes on average over the 6 h. One rule per SLO class
(collector.alerts.slo_classes), each with its own budget. Every SLI counts clients' requests
only: `headroom probe`'s load is labelled source="probe" and left out (slo_classes.CLIENT_TRAFFIC;
the goodput counter counts clients' requests alone). Goodput burns read its attainment records
(R.attainment): the miss share is `1 - attainment`.
"""

from __future__ import annotations

from collector.alerts.alert import Alert, number
from collector.alerts.slo_classes import CLIENT_TRAFFIC, SloClass, model_alternatives, selector, slo_classes
from collector.rules.config import RulesConfig
from collector.rules.naming import sample
from collector.rules.records import R

__all__ = ["slo_alerts", "latency_matcher", "requests_in", "FAST_BURNS", "SLOW_BURN"]

FAST_BURNS = (("1h", "5m", 14.4), ("6h", "30m", 6.0))
SLOW_BURN = ("3d", "6h", 1.0)
_TITLES = {
    "availability": ("Availability", "failed"),
    "ttft": ("TTFT", "missed the {target} TTFT SLO"),
    "e2e": ("E2E", "missed the {target} end-to-end SLO"),
    "goodput": ("Goodput", "missed their SLO (latency, or shed, aborted or failed)"),
}
_GOODPUT_JUDGED = 'verdict!="invalid"'  # attainment's denominator: every verdict but the client's 4xx


def _indent(text: str) -> str:
    return "\n".join("  " + line for line in text.splitlines())


def requests_in(kind: str, matcher: str = "", window: str = "5m", by: str = "model") -> str:
    """Clients' requests counted by `kind`'s SLI over `window`: the minimum-traffic guard's left side
    (probe load is no evidence about what users get)."""
    if kind == "goodput":  # clients' requests only by construction: the counter has no probe load
        name = sample("headroom_slo_requests_total")
        return f"sum by ({by}) (increase({name}{selector(matcher, _GOODPUT_JUDGED)}[{window}]))"
    if kind == "availability":
        name, extra = sample("headroom_requests_total"), 'outcome!="client_cancelled"'
    elif kind == "ttft":
        name, extra = sample("headroom_time_to_first_token_seconds", "count"), ""
    else:
        name, extra = sample("headroom_request_duration_seconds", "count"), 'outcome="ok"'
    return f"sum by ({by}) (increase({name}{selector(matcher, CLIENT_TRAFFIC, extra)}[{window}]))"


def _per_5m(window: str) -> int:
    """How many 5-minute spans fit in `window` ('6h' -> 72)."""
    units = {"m": 1, "h": 60, "d": 1440}
    return int(window[:-1]) * units[window[-1]] // 5


def _misses(kind: str, window: str, matcher: str) -> str:
    """The miss ratio of `kind` over `window`: its record, or 1 - attainment for goodput."""
    if kind == "goodput":
        return f"1 - {R.attainment(window)}{selector(matcher)}"
    return f"{R.slo_misses(window, kind)}{selector(matcher)}"


def _burn(kind: str, matcher: str, long: str, short: str, factor: float, budget: float) -> str:
    limit = number(factor * budget)
    return f"{_misses(kind, long, matcher)} > {limit}\nand {_misses(kind, short, matcher)} > {limit}"


def _what(kind: str, slo_class: SloClass) -> str:
    target = {"ttft": slo_class.slo.ttft_seconds, "e2e": slo_class.slo.e2e_seconds}.get(kind)
    return _TITLES[kind][1].format(target=f"{target:g}s" if target is not None else "")


def _pair(kind: str, slo_class: SloClass, classes: list[SloClass], c: RulesConfig) -> list[Alert]:
    title, budget, matcher = _TITLES[kind][0], slo_class.slo.budget(kind), slo_class.matcher
    fast = "\nor\n".join(
        f"(\n{_indent(_burn(kind, matcher, long, short, factor, budget))}\n)"
        for long, short, factor in FAST_BURNS
    )
    fast_expr = f"(\n{_indent(fast)}\n)\nand on (model) {requests_in(kind, matcher)} >= {c.slo_min_requests}"
    long, short, factor = SLOW_BURN
    slow_expr = (
        f"{_burn(kind, matcher, long, short, factor, budget)}\n"
        f"and on (model) {requests_in(kind, matcher, short)} >= {c.slo_min_requests * _per_5m(short)}"
    )
    family = {"family": f"{kind}_slo"} | slo_class.labels(classes)
    return [
        Alert(
            f"Headroom{title}BudgetBurnFast",
            "headroom-slo",
            fast_expr,
            "critical",
            f"<model> is burning its {title} error budget fast",
            f"<value:humanizePercentage> of requests to <model> {_what(kind, slo_class)} over the long "
            f"window; at this burn rate the 30-day budget of {budget:.2%} is gone within days.",
            family,
        ),
        Alert(
            f"Headroom{title}BudgetBurnSlow",
            "headroom-slo",
            slow_expr,
            "warning",
            f"<model> is slowly burning its {title} error budget",
            f"<value:humanizePercentage> of requests to <model> {_what(kind, slo_class)} over 3 days, more "
            f"than the {budget:.2%} budget allows.",
            family,
        ),
    ]


def latency_matcher(c: RulesConfig) -> str:
    """A `model` matcher for the models that have a TTFT SLO (tail-latency signals apply to them)."""
    explicit_off = sorted(m for m, slo in c.model_slos.items() if slo.ttft_seconds is None)
    explicit_on = sorted(m for m, slo in c.model_slos.items() if slo.ttft_seconds is not None)
    if c.default_slo.ttft_seconds is not None:
        return f'model!~"{model_alternatives(explicit_off)}"' if explicit_off else ""
    return f'model=~"{model_alternatives(explicit_on)}"'


def slo_alerts(c: RulesConfig) -> list[Alert]:
    """Fast and slow burn for each SLI and SLO class, availability first, goodput last."""
    found = []
    for kind in ("availability", "ttft", "e2e", "goodput"):
        classes = slo_classes(c, kind)
        found += [alert for slo_class in classes for alert in _pair(kind, slo_class, classes, c)]
    return found
