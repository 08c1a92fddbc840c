"""The passive μ: the request rate a replica served within the SLO, read off production traffic.

The open-loop probe (openloop.py) offers fixed rates; traffic offers whatever rates it had. Cut
into windows, each window is a rate level the traffic ran by itself (`RateWindow`): its arrival
and completion rates, the p95 TTFT/TPOT of the requests admitted in it, its capacity errors, its
backlog growth (twice the rise of the mean in-flight count from its first half to its second) and
whether the engine's own queue was non-empty at every admission. Method:

1. Windows of max(MIN_WINDOW_S, WINDOW_GENERATIONS x the median generating time, e2e - TTFT, so
   an overload's queue wait does not stretch them); one with fewer than MIN_WINDOW_ARRIVALS
   arrivals says no rate and is left out.
2. **Saturated** windows measure μ where it is plain: the engine ran a full batch throughout, so
   their completion rate is the saturation throughput. Where the engine's queue was read, a
   window is saturated when every admission found that queue non-empty; where it was not, when
   it found the queue of the window before it (that window's backlog grew by more than
   max(DRIFT_MIN_REQUESTS, DRIFT_SHARE x its arrivals), the probe's drift rule, or it had
   capacity errors) and its own backlog still grew. μ_sat = the median completion rate of the
   saturated windows (at least MIN_BIN_WINDOWS of them).
3. **The SLO** binds on calm windows: neither saturated nor right after a queued or saturated one
   (that latency is the queue an earlier overload left behind, not this window's rate). They are
   binned by arrival rate (bins BIN_RATIO wide; a window's rate is the mean over it and its
   neighbours, since one Poisson count of ~30 strays by ~18 %); a bin of at least
   MIN_BIN_WINDOWS windows fails when the p95 TTFT/TPOT of its requests misses the SLO or its
   capacity errors exceed the SLO's error ratio. μ = min(μ_sat, the mean arrival rate of the
   highest bin of the run of passing bins from the lowest, when one failed); V_P = μ x the
   uncached prompt tokens per answered request. This is the probe's μ_slo read the other way
   round: the probe caps it at the saturation throughput too.
4. No μ (the reason says why) with fewer than MIN_WINDOWS windows, when the lowest bin already
   fails, or when nothing bound: the engine never saturated and no bin missed the SLO, so the
   traffic's highest rate is only a lower bound. The confidence comes from the data, as the
   passive knee's (passive.confidence_bar): the saturated windows, and when the SLO binds the
   bin at μ and the one that failed, each >= 5 windows and >= 200 requests for high, >= 3 and
   >= 50 for medium; else low. collector.analysis.estimate attaches μ to the traffic estimate
   from medium up, and the one decision (collector.store.decision) publishes it with that
   estimate, as the traffic knee.
5. Beside that V_P, read off μ, the engine's own: Σ prompt tokens it computed / Σ its prefill
   seconds over the window's traffic rows that carry both (collector.analysis.engine_split), as
   evidence in the `rates` section (`engine_prefill`); it changes neither μ nor the V_P above.

The windows are SQL that DuckDB runs (as passive.py's), over the store or rows loaded in memory.
"""

from __future__ import annotations

import math
import statistics
from collections import defaultdict
from dataclasses import dataclass, field, replace
from datetime import datetime
from typing import Any

from collector.analysis.engine_split import PrefillRate, prefill_rate
from collector.analysis.openloop import DRIFT_MIN_REQUESTS, DRIFT_SHARE
from collector.analysis.passive import RowSource, rows_sql
from collector.analysis.stats import seconds
from collector.capacity import Slo

__all__ = [
    "RateWindow",
    "PassiveRate",
    "passive_rate",
    "MIN_WINDOW_S",
    "WINDOW_GENERATIONS",
    "MIN_WINDOWS",
    "MIN_WINDOW_ARRIVALS",
    "MIN_BIN_WINDOWS",
    "BIN_RATIO",
]

MIN_WINDOW_S = 10.0
WINDOW_GENERATIONS = 10  # a window spans this many median generating times
MIN_WINDOWS = 6
MIN_WINDOW_ARRIVALS = 5
MIN_BIN_WINDOWS = 3  # a bin (and the saturated windows) needs this many windows to be judged
BIN_RATIO = 1.1  # arrival-rate bins 10 % wide
# (level, least windows, least requests) in each piece of evidence: saturated windows, the bins
_BARS = (("high", 5, 200), ("medium", 3, 50))

_CAPACITY = "(r.outcome IN ('rate_limited', 'overloaded', 'timeout') OR r.status_code IN (429, 503))"
_WINDOWS = """WITH r AS ({rows}),
w AS (SELECT ? + range * ? AS lo, ? + (range + 1) * ? AS hi FROM range(?))
SELECT w.lo,
    count(*) FILTER (WHERE r.a >= w.lo AND r.a < w.hi) AS arrivals,
    count(*) FILTER (WHERE r.outcome = 'ok' AND r.e >= w.lo AND r.e < w.hi) AS completions,
    sum(greatest(0, least(r.e, w.lo + ? / 2) - greatest(r.a, w.lo))) / (? / 2) AS first_half,
    sum(greatest(0, least(r.e, w.hi) - greatest(r.a, w.lo + ? / 2))) / (? / 2) AS second_half,
    count(*) FILTER (WHERE r.a >= w.lo AND r.a < w.hi AND {capacity}) AS capacity_errors,
    min(r.engine_waiting_at_admit) FILTER (WHERE r.a >= w.lo AND r.a < w.hi) AS waiting_min,
    count(r.engine_waiting_at_admit) FILTER (WHERE r.a >= w.lo AND r.a < w.hi) AS waiting_told,
    sum(coalesce(r.prompt_tokens, 0) - coalesce(r.cached_prompt_tokens, 0))
        FILTER (WHERE r.outcome = 'ok' AND r.a >= w.lo AND r.a < w.hi) AS uncached,
    count(*) FILTER (WHERE r.outcome = 'ok' AND r.a >= w.lo AND r.a < w.hi) AS answered
FROM w JOIN r ON r.a < w.hi AND r.e >= w.lo GROUP BY w.lo ORDER BY w.lo"""
# the p95 TTFT and TPOT of all requests admitted in each bin's windows, pooled
_BIN_LATENCY = """WITH r AS ({rows}),
b AS (SELECT unnest(?::DOUBLE[]) AS lo, unnest(?::BIGINT[]) AS bin)
SELECT b.bin, quantile_cont(r.ttft_s, 0.95), quantile_cont(r.tpot_s, 0.95)
FROM b JOIN r ON r.a >= b.lo AND r.a < b.lo + ? AND r.outcome = 'ok' GROUP BY b.bin"""


@dataclass(frozen=True)
class RateWindow:
    """One window of traffic as a rate level: rates per second, counts of requests."""

    start_s: float  # POSIX seconds
    arrivals_per_s: float
    completions_per_s: float
    arrivals: int
    backlog_growth: float  # requests: twice the rise of the mean in-flight count between its halves
    capacity_errors: int
    queued: bool  # the backlog grew (the probe's drift rule) or capacity errors
    engine_told: bool  # every admission carried the engine's queue
    engine_full: bool  # ... and found it non-empty
    uncached_prompt_tokens: int
    answered: int
    saturated: bool = False  # set by _episodes
    inherited: bool = False  # found the queue of the window before it (_episodes)
    binned_per_s: float = 0.0  # the arrival rate it is binned by (_episodes)


@dataclass
class PassiveRate:
    """μ from traffic windows (module docstring), V_P there, and how far to trust them."""

    mu_per_s: float | None
    prefill_tokens_per_s: float | None
    saturation_per_s: float | None
    confidence: str
    reason: str
    window_s: float
    windows: list[RateWindow] = field(default_factory=list)
    bins: list[dict[str, Any]] = field(default_factory=list)
    engine_prefill: PrefillRate | None = None  # the engine's own V_P in the same window (step 5)

    def to_dict(self) -> dict[str, Any]:
        """The traffic estimate's `rates` section: the probe's keys (μ_slo, V_P, levels: one per
        arrival-rate bin) plus the windows' summary and the engine's own V_P with its evidence."""
        engine = self.engine_prefill
        return {
            "method": "passive",
            "mu_slo_requests_per_s": _round(self.mu_per_s, 6),
            "prefill_tokens_per_s": _round(self.prefill_tokens_per_s, 3),
            "saturation_requests_per_s": _round(self.saturation_per_s, 6),
            "confidence": self.confidence,
            "reason": self.reason,
            "window_s": round(self.window_s, 3),
            "windows": len(self.windows),
            "saturated_windows": sum(w.saturated for w in self.windows),
            "levels": self.bins,
            "engine_prefill_tokens_per_s": _round(engine.tokens_per_s if engine else None, 3),
            "engine_prefill": engine.to_dict() if engine else None,
        }


def _round(value: float | None, digits: int) -> float | None:
    return None if value is None else round(value, digits)


def _windows(
    db: RowSource, rows: str, params: list[Any], start: float, window_s: float, count: int
) -> list[RateWindow]:
    found: list[RateWindow] = []
    for lo, arrivals, done, first, second, errors, waiting_min, told, uncached, answered in db.query(
        _WINDOWS.format(rows=rows, capacity=_CAPACITY),
        [*params, start, window_s, start, window_s, count, *[window_s] * 4],
    ):
        if arrivals < MIN_WINDOW_ARRIVALS:
            continue
        growth = 2 * (second - first)  # a backlog growing linearly by g: its halves' means differ by g / 2
        moved = max(DRIFT_MIN_REQUESTS, DRIFT_SHARE * arrivals)
        found.append(
            RateWindow(
                start_s=lo,
                arrivals_per_s=arrivals / window_s,
                completions_per_s=done / window_s,
                arrivals=int(arrivals),
                backlog_growth=growth,
                capacity_errors=int(errors),
                queued=growth > moved or errors > 0,
                engine_told=told == arrivals,
                engine_full=told == arrivals and waiting_min is not None and waiting_min >= 1,
                uncached_prompt_tokens=int(uncached or 0),
                answered=int(answered),
            )
        )
    return _episodes(found, window_s)


def _episodes(windows: list[RateWindow], window_s: float) -> list[RateWindow]:
    """Mark the saturated windows and those that inherited a queue, and smooth the rate each is
    binned by (module docstring, steps 2 and 3)."""
    marked: list[RateWindow] = []
    for i, window in enumerate(windows):
        before = (
            marked[-1] if marked and math.isclose(marked[-1].start_s + window_s, window.start_s) else None
        )
        after = (
            windows[i + 1]
            if i + 1 < len(windows) and math.isclose(window.start_s + window_s, windows[i + 1].start_s)
            else None
        )
        inherited = before is not None and (before.queued or before.saturated)
        saturated = window.engine_full if window.engine_told else inherited and window.queued
        near = [w for w in (before, window, after) if w is not None]
        binned = sum(w.arrivals for w in near) / (len(near) * window_s)
        marked.append(replace(window, saturated=saturated, inherited=inherited, binned_per_s=binned))
    return marked


def _bin(rate_per_s: float) -> int:
    """The arrival-rate bin: 10 % wide on a log scale (BIN_RATIO)."""
    return math.floor(math.log(rate_per_s) / math.log(BIN_RATIO))


def _bins(
    db: RowSource, rows: str, params: list[Any], windows: list[RateWindow], window_s: float, slo: Slo
) -> list[dict[str, Any]]:
    """One level per arrival-rate bin of the calm windows, in the probe's level keys, judged
    against the SLO (module docstring, step 3)."""
    grouped: dict[int, list[RateWindow]] = defaultdict(list)
    for window in windows:
        if not window.inherited and not window.saturated:
            grouped[_bin(window.binned_per_s)].append(window)
    calm = [w for members in grouped.values() for w in members]
    latency = {
        int(b): (ttft, tpot)
        for b, ttft, tpot in db.query(
            _BIN_LATENCY.format(rows=rows),
            [*params, [w.start_s for w in calm], [_bin(w.binned_per_s) for w in calm], window_s],
        )
    }
    return [_level(grouped[key], latency.get(key, (None, None)), slo) for key in sorted(grouped)]


def _level(members: list[RateWindow], latency: tuple[float | None, float | None], slo: Slo) -> dict[str, Any]:
    """A bin as a level: mean rates, pooled latency, and why it fails (None: it passes)."""
    ttft, tpot = latency
    arrivals = sum(w.arrivals for w in members)
    errors = sum(w.capacity_errors for w in members)
    why = []
    if errors > slo.max_error_ratio * arrivals:
        why.append(f"{errors} capacity errors in {arrivals} requests")
    for name, value, target in (("p95 TTFT", ttft, slo.ttft_p95_s), ("p95 TPOT", tpot, slo.tpot_p95_s)):
        if target is not None and value is not None and value > target:
            why.append(f"{name} {value:.3f} s > SLO {target:g} s")
    return {
        "offered_per_s": round(statistics.fmean(w.binned_per_s for w in members), 6),
        "achieved_per_s": round(statistics.fmean(w.completions_per_s for w in members), 6),
        "ttft_p95_s": ttft,
        "tpot_p95_s": tpot,
        "drifting": False,  # calm windows only: the queue's evidence is in the saturated windows
        "windows": len(members),
        "requests": arrivals,
        "capacity_errors": errors,
        "judged": len(members) >= MIN_BIN_WINDOWS,
        "why_not": "; ".join(why) or None,
    }


def _confidence(evidence: list[tuple[int, int]]) -> tuple[str, str]:
    """high/medium/low from the (windows, requests) of each piece of evidence, the thinnest."""
    windows = min(w for w, _ in evidence)
    requests = min(n for _, n in evidence)
    for level, least_windows, least_requests in _BARS:
        if windows >= least_windows and requests >= least_requests:
            return level, f"{windows} windows and {requests} requests in the thinnest evidence"
    return "low", (
        f"only {windows} windows and {requests} requests in the thinnest evidence "
        f"(medium needs {_BARS[1][1]} and {_BARS[1][2]})"
    )


def _judge(windows: list[RateWindow], bins: list[dict[str, Any]], window_s: float) -> PassiveRate:
    """μ, V_P and the confidence from the windows and bins (module docstring, steps 3 and 4)."""
    saturated = [w for w in windows if w.saturated]
    enough = len(saturated) >= MIN_BIN_WINDOWS
    mu_sat = statistics.median(w.completions_per_s for w in saturated) if enough else None
    best = failed = None
    for level in (level for level in bins if level["judged"]):
        if level["why_not"] is not None:
            failed = level
            break
        best = level
    answered = sum(w.answered for w in windows)
    per_request = sum(w.uncached_prompt_tokens for w in windows) / answered if answered else 0.0
    if best is None and failed is not None:
        why = f"the lowest rate {failed['offered_per_s']:.3g}/s already fails: {failed['why_not']}"
        return PassiveRate(None, None, mu_sat, "none", why, window_s, windows, bins)
    if failed is None and mu_sat is None:
        judged = [level["offered_per_s"] for level in bins if level["judged"]]
        highest = max(judged) if judged else max(w.binned_per_s for w in windows)
        why = (
            f"nothing bound: the engine never saturated ({len(saturated)} windows ran a queue "
            f"throughout, {MIN_BIN_WINDOWS} needed) and no rate missed the SLO: μ lies above the "
            f"busiest rate the traffic held, {highest:.3g}/s (a lower bound, not published)"
        )
        return PassiveRate(None, None, None, "none", why, window_s, windows, bins)
    evidence: list[tuple[int, int]] = []
    mu, reasons = math.inf, []
    if best is not None and failed is not None:
        mu = best["offered_per_s"]
        reasons.append(
            f"{mu:.3g}/s is the highest rate within the SLO; {failed['offered_per_s']:.3g}/s fails: {failed['why_not']}"
        )
        evidence += [(best["windows"], best["requests"]), (failed["windows"], failed["requests"])]
    if mu_sat is not None:
        evidence.append((len(saturated), sum(w.arrivals for w in saturated)))
        if mu_sat < mu:
            mu = mu_sat
            reasons.append(
                f"the engine saturated at {mu_sat:.3g}/s (the median of {len(saturated)} saturated windows)"
            )
    confidence, why = _confidence(evidence)
    reason = "; ".join(reasons) + f" ({why})"
    return PassiveRate(mu, mu * per_request, mu_sat, confidence, reason, window_s, windows, bins)


def passive_rate(
    store_or_rows: Any,
    since: datetime | None = None,
    until: datetime | None = None,
    model: str | None = None,
    *,
    slo: Slo | None = None,
    window_s: float | None = None,
    task_class: str | None = None,
) -> PassiveRate:
    """μ of the traffic admitted in [since, until) (module docstring). `store_or_rows` is a
    RequestStore or row dicts. With too little traffic the result has no μ and says why."""
    slo = slo or Slo()
    db = RowSource(store_or_rows)
    try:
        found = _measure(db, since, until, model, slo, window_s, task_class)
        engine = prefill_rate(db, since, until, model=model, task_class=task_class)
    finally:
        db.close()
    return replace(found, engine_prefill=engine)


def _measure(
    db: RowSource,
    since: datetime | None,
    until: datetime | None,
    model: str | None,
    slo: Slo,
    window_s: float | None,
    task_class: str | None,
) -> PassiveRate:
    """μ from the windows and bins of the traffic (module docstring, steps 1 to 4)."""
    rows, params = rows_sql("traffic", since, until, model, task_class)
    n, first, last, generating = db.query(
        f"SELECT count(*), min(a), max(a), median(e2e_s - coalesce(ttft_s, 0)) "
        f"FILTER (WHERE outcome = 'ok') FROM ({rows})",
        params,
    )[0]
    window_s = window_s or max(MIN_WINDOW_S, WINDOW_GENERATIONS * (generating or 1.0))
    if not n:
        return PassiveRate(None, None, None, "none", "no traffic in the window", window_s)
    start, end = seconds(since) or first, seconds(until) or last
    count = max(int((end - start) // window_s), 0)
    windows = _windows(db, rows, params, start, window_s, count)
    if len(windows) < MIN_WINDOWS:
        why = (
            f"too little traffic for a rate: {len(windows)} windows of {window_s:.0f} s with "
            f"{MIN_WINDOW_ARRIVALS}+ arrivals ({n} requests; {MIN_WINDOWS} windows needed)"
        )
        return PassiveRate(None, None, None, "none", why, window_s, windows)
    return _judge(windows, _bins(db, rows, params, windows, window_s, slo), window_s)
