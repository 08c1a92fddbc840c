"""SLO truth from the request rows: when users were hurt, and the windows where an alert is earned.

At each evaluation time t and for each model (in each cluster, when the records carry one: a
cluster's users are hurt whatever the other clusters serve), the requests of the trailing 5 minutes
are judged
exactly (no histogram buckets): a **breach** is a window in which more than 5 % of them missed an
SLO, the same test as "p95 over the target":

    ttft          streamed requests whose first token came in the window: p95 TTFT > the TTFT SLO
    e2e           ok requests completed in the window: p95 end-to-end > the e2e SLO
    availability  requests answered in the window (not cancelled by the client): > 5 % errors
                  (rate_limited, overloaded, upstream_error, timeout)

Fewer than `min_requests` in a window say nothing about a p95, so such a window is no breach.
Consecutive breached evaluations form one Breach(kind, model, start, end, cluster).

    breaches(records, times, slo_for)  ->  [Breach("ttft", "m", start=..., end=...)]
"""

from __future__ import annotations

from bisect import bisect_right
from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol

import numpy as np

from collector.backtest.lifecycle import Lifecycle

__all__ = ["Breach", "breaches", "ERROR_OUTCOMES", "WINDOW_S", "BREACH_SHARE"]

ERROR_OUTCOMES = frozenset({"rate_limited", "overloaded", "upstream_error", "timeout"})
WINDOW_S = 300.0
BREACH_SHARE = 0.05  # more than this share missing the target in a window is a breach (the p95 test)


@dataclass(frozen=True)
class Breach:
    """Users were hurt: `kind` (ttft, e2e, availability) of `model` in `cluster`, start to end (POSIX s)."""

    kind: str
    model: str
    start: float
    end: float
    cluster: str = ""  # "" : the records carry no cluster


class _Window:
    """Values sorted by their event time, for trailing-window slices."""

    def __init__(self, pairs: list[tuple[float, float]]) -> None:
        pairs.sort()
        self.times = [t for t, _ in pairs]
        self.values = np.array([v for _, v in pairs], dtype=float)

    def slice(self, t: float) -> np.ndarray:
        return self.values[bisect_right(self.times, t - WINDOW_S) : bisect_right(self.times, t)]


def _share_over(values: np.ndarray, limit: float) -> float:
    return float(np.count_nonzero(values > limit)) / len(values)


class SloTargets(Protocol):
    """What the truth needs of an SLO (collector.rules.config.Slo has it): None means not judged."""

    @property
    def ttft_seconds(self) -> float | None: ...

    @property
    def e2e_seconds(self) -> float | None: ...


def _judged(records: list[Lifecycle], slo: SloTargets) -> dict[str, tuple[_Window, float]]:
    """kind -> (window of per-request values, the limit a value must not exceed)."""
    first_tokens, ends, answered = [], [], []
    for r in records:
        if r.completed is None:
            continue
        if r.first_token is not None:
            first_tokens.append((r.first_token, r.first_token - r.admitted))
        if r.outcome == "ok":
            ends.append((r.completed, r.completed - r.admitted))
        if r.outcome != "client_cancelled":
            answered.append((r.completed, 1.0 if r.outcome in ERROR_OUTCOMES else 0.0))
    kinds = {"availability": (_Window(answered), 0.5)}
    if slo.ttft_seconds is not None:
        kinds["ttft"] = (_Window(first_tokens), slo.ttft_seconds)
    if slo.e2e_seconds is not None:
        kinds["e2e"] = (_Window(ends), slo.e2e_seconds)
    return kinds


def breaches(
    records: list[Lifecycle],
    times: list[float],
    slo_for: Callable[[str], SloTargets],
    min_requests: int = 20,
) -> list[Breach]:
    """Every breach episode per model, cluster and kind, judged at each of `times` (trailing 5 minutes).

    `slo_for(model)` returns an object with `ttft_seconds` and `e2e_seconds` (None: not judged).
    """
    found = []
    for model, cluster in sorted({(r.model, r.cluster) for r in records}):
        chosen = [r for r in records if r.model == model and r.cluster == cluster]
        for kind, (window, limit) in _judged(chosen, slo_for(model)).items():
            start: float | None = None
            last = times[0]
            for t in times:
                values = window.slice(t)
                bad = len(values) >= min_requests and _share_over(values, limit) > BREACH_SHARE
                if bad and start is None:
                    start = t
                if not bad and start is not None:
                    found.append(Breach(kind, model, start, last, cluster))
                    start = None
                last = t
            if start is not None:
                found.append(Breach(kind, model, start, times[-1], cluster))
    return sorted(found, key=lambda b: (b.start, b.kind, b.model, b.cluster))
