"""Alerts only a proxy can give: a request stuck in flight, and a capacity input that died.

- HeadroomRequestStuck: the oldest in-flight request of a model on a sidecar is older than
  max(`stuck_request_floor_seconds`, `stuck_request_p99_multiple` x the model's p99 end-to-end time).
  Engines record latency when a request ends, so until then this is the only sign of it. While the
  model completed nothing in the rate window its p99 is NaN and the floor alone applies.
- HeadroomSignalInvalid: `headroom_signal_valid == 0` for a reason other than scrape_failing
  (HeadroomEngineScrapeFailing says that one). The alert names the signal in `input`, not
  `signal`: that label marks the scale-out signals the composite counts and mutes.

`trusted(expr, signal)` is how rules built on an engine signal stay silent while it is invalid:
`expr unless on (instance) (headroom_signal_valid{source="engine",signal="..."} == 0)`. A sidecar
that exports no headroom_signal_valid (an older release) is trusted as before.
"""

from __future__ import annotations

from collector.alerts.alert import Alert, number
from collector.rules.config import RulesConfig
from collector.rules.naming import sample
from collector.rules.records import R

__all__ = ["integrity_alerts", "trusted"]


def trusted(expr: str, signal: str, source: str = "engine") -> str:
    """`expr` without the instances whose `signal` from `source` is marked invalid."""
    valid = sample("headroom_signal_valid")
    return f'({expr} unless on (instance) ({valid}{{source="{source}",signal="{signal}"}} == 0))'


def _request_stuck(c: RulesConfig) -> Alert:
    oldest = sample("headroom_inflight_oldest_age_seconds")
    floor, multiple = number(c.stuck_request_floor_seconds), number(c.stuck_request_p99_multiple)
    p99 = f'{R.E2E_QUANTILE}{{quantile="0.99"}}'
    return Alert(
        "HeadroomRequestStuck",
        "headroom-integrity",
        f"max by (instance, model) ({oldest})\n> on (model) group_left ()\n"
        f"(\n  clamp_min({multiple} * {p99} > 0, {floor})\n"
        f"  or on (model)\n  max by (model) ({oldest}) * 0 + {floor}\n)",
        "warning",
        "A request to <model> on <instance> is stuck in flight",
        f"The oldest in-flight request of <model> on <instance> was admitted <value:humanizeDuration> "
        f"ago, past max({c.stuck_request_floor_seconds:g}s, {c.stuck_request_p99_multiple:g}x the "
        f"model's p99 end-to-end time): a hung stream or a stuck engine holds it, and engines record "
        f"its latency only when it ends.",
        {"component": "integrity"},
    )


def _signal_invalid() -> Alert:
    valid = sample("headroom_signal_valid")
    renamed = f'label_replace({valid}{{reason!="scrape_failing"}}, "input", "$1", "signal", "(.+)")'
    return Alert(
        "HeadroomSignalInvalid",
        "headroom-integrity",
        f"max by (instance, source, input, reason) (\n  {renamed}\n) == 0",
        "warning",
        "The <input> signal from <source> on <instance> is invalid (<reason>)",
        "The sidecar on <instance> no longer trusts the <source>'s <input> signal (<reason>): the "
        "capacity rules built on it stay silent until it recovers, and autoscalers reading it act on "
        "a dead value.",
        {"component": "integrity"},
    )


def integrity_alerts(c: RulesConfig) -> list[Alert]:
    """The integrity group: a request stuck in flight, a capacity input that died."""
    return [_request_stuck(c), _signal_invalid()]
