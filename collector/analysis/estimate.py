"""Building a CapacityEstimate (collector.capacity): from a probe run or from traffic.

An estimate comes from a probe run (measured levels) or from traffic (passive buckets). It holds
the levels, the knee in both calibers, the SLO maximum and the recommended pool for a profile.
The store keeps it (collector.store.estimates.save_estimate) and the one decision
(collector.store.decision) picks what the headroom_capacity_* gauges publish.

What an estimate says must be true, so building one checks two things (docs/capacity.md):

* errors: `error_ratio` is the worst level's share of requests that failed for reasons other than
  capacity (a 400, a malformed answer; 429, 503 and timeouts are capacity). Above
  collector.store.decision.MAX_ERROR_RATIO the estimate's confidence is "none", with the reason
  and the level's first error, and the gate never publishes it;
* the token caliber: its capacity is the time-weighted active tokens at the request knee with the
  traffic's own length mix (collector.analysis.token_knee), whatever measured the request knee;
  without enough traffic to know the mix every token figure is None and `token_knee_withheld`
  says why.

A recommended pool of 0 comes with `pool_reason` (which level failed which target).
"""

from __future__ import annotations

from collections import Counter, defaultdict
from collections.abc import Sequence
from datetime import datetime
from typing import Any

from collector.analysis.knee import detect_knee
from collector.analysis.levels import summarize_level
from collector.analysis.openloop import RateResult, little_check, rate_levels_from_rows, rate_result
from collector.analysis.passive import passive_curve
from collector.analysis.passive_rate import PassiveRate, passive_rate
from collector.analysis.recommend import recommended_pool
from collector.analysis.slo import slo_max
from collector.analysis.stats import seconds
from collector.analysis.token_knee import TokenCapacity, token_capacity_in_store
from collector.capacity import CapacityEstimate, KneeResult, LevelStats, Slo
from collector.store.db import RequestStore
from collector.store.decision import CONFIDENCE_RANK, MAX_ERROR_RATIO

__all__ = [
    "build_estimate",
    "estimate_capacity",
    "estimate_from_probe",
    "estimate_probe_run",
    "apply_token_capacity",
    "apply_rates",
    "judge_errors",
    "probe_levels",
]

# a traffic estimate carries the passive μ from this confidence up: the traffic knee's default bar
# (collector.store.decision.PublishPolicy.traffic_confidence)
_PASSIVE_RATE_CONFIDENCE = "medium"


def build_estimate(
    levels: Sequence[LevelStats],
    *,
    slo: Slo = Slo(),
    profile: str = "interactive",
    model: str | None = None,
    source: str = "probe",
    run_id: str | None = None,
    confidence: str = "high",
    knee: KneeResult | None = None,
    stopped_early: str | None = None,
) -> CapacityEstimate:
    """Knee, SLO max and pool from a list of levels (the token figures: apply_token_capacity)."""
    ordered = sorted(levels, key=lambda s: s.concurrency)
    knee = knee or detect_knee(ordered)
    best = slo_max(ordered, slo)
    estimate = CapacityEstimate(
        model,
        source,
        run_id,
        profile,
        ordered,
        knee,
        slo,
        best,
        None,
        recommended_pool(knee, best, profile),
        confidence,
        stopped_early=stopped_early,
    )
    if estimate.recommended_pool == 0:
        estimate.extra["pool_reason"] = _pool_reason(ordered, slo)
    worst = max(ordered, key=lambda s: s.non_capacity_error_ratio or 0.0, default=None)
    if worst is not None and worst.non_capacity_error_ratio:
        judge_errors(estimate, worst.non_capacity_error_ratio, _where(worst))
    return estimate


def _where(level: LevelStats) -> str:
    """'at concurrency 4 (ok 30, http 400 10; first error: HTTP 400: ...)' for a reason."""
    mix = ", ".join(f"{name} {count}" for name, count in (level.outcomes or {}).items())
    first = f"; first error: {level.first_error}" if level.first_error else ""
    return f"at concurrency {level.concurrency}" + (f" ({mix}{first})" if mix or first else "")


def judge_errors(estimate: CapacityEstimate, error_ratio: float, where: str) -> None:
    """Record the estimate's non-capacity error ratio; above MAX_ERROR_RATIO its confidence is none.

    Such an estimate measured its own failures, not the engine's capacity: it is kept (and
    printed) with the reason, and the gate (collector.store.decision) never publishes it.
    """
    estimate.error_ratio = error_ratio
    if error_ratio > MAX_ERROR_RATIO:
        estimate.confidence = "none"
        estimate.confidence_reason = (
            f"{error_ratio:.0%} of the requests {where} failed for reasons other than capacity "
            f"(more than {MAX_ERROR_RATIO:.0%}): the measurement is broken, not the engine full; "
            "nothing is published"
        )


def _pool_reason(levels: Sequence[LevelStats], slo: Slo) -> str:
    """Why the recommended pool is 0: the lowest level and the targets it missed."""
    lowest = levels[0]
    missed = []
    for name, value, target in (
        ("p95 TTFT", lowest.ttft_p95_s, slo.ttft_p95_s),
        ("p95 TPOT", lowest.tpot_p95_s, slo.tpot_p95_s),
    ):
        if target is not None and (value is None or value > target):
            shown = "no answer" if value is None else f"{value:.3f} s"
            missed.append(f"{name} {shown} > {target:g} s")
    if lowest.error_ratio > slo.max_error_ratio:
        missed.append(f"error ratio {lowest.error_ratio:.0%} > {slo.max_error_ratio:.0%}")
    return f"no level met the SLO: at concurrency {lowest.concurrency}, " + ", ".join(
        missed or ["a target was missed"]
    )


def probe_levels(rows: Sequence[dict[str, Any]]) -> list[LevelStats]:
    """Levels of one stored probe run, by each row's closed-loop level (`probe_level`).

    Each level is measured from its first to its last measured (not warm-up) admission, as the
    probe measured it; every completion inside that window counts towards throughput, warm-up
    rows' too, so a queued level's long requests do not make it look slower than it was.
    """
    grouped: dict[int, list[dict[str, Any]]] = defaultdict(list)
    measured: dict[int, list[float]] = defaultdict(list)
    for row in rows:
        level = row.get("probe_level")
        if level:
            grouped[level].append(row)
            if not row.get("probe_warmup"):
                measured[level].append(seconds(row["admitted_at"]) or 0.0)
    return [
        summarize_level(
            grouped[level], level, window=(min(times), max(times)) if max(times) > min(times) else None
        )
        for level, times in sorted(measured.items())
    ]


def _latest_run(store: Any, model: str | None, since: datetime | None, until: datetime | None) -> str | None:
    sql, params = "SELECT run_id FROM requests WHERE source = 'probe' AND run_id IS NOT NULL", []
    for clause, value in (("admitted_at >= ?", since), ("admitted_at < ?", until), ("model = ?", model)):
        if value is not None:
            sql += f" AND {clause}"
            params.append(value)
    found = store.query(sql + " ORDER BY admitted_at DESC LIMIT 1", params)
    return found[0][0] if found else None


def _from_probe_run(
    store: Any, run_id: str, model: str | None, slo: Slo, profile: str
) -> CapacityEstimate | None:
    rows = store.query_dicts("SELECT * FROM requests WHERE run_id = ? ORDER BY admitted_at", [run_id])
    levels = probe_levels(rows)
    if not levels:
        return None
    estimate = build_estimate(
        levels, slo=slo, profile=profile, model=model or rows[0]["model"], source="probe", run_id=run_id
    )
    classes = Counter(row.get("task_class") or "all" for row in rows)
    estimate.task_class = classes.most_common(1)[0][0]  # the workload class the probe named
    # the run's own time: a probe stored hours ago must not look fresh when estimated now
    estimate.created_at = max(row["completed_at"] for row in rows if row["completed_at"])
    first = min(row["admitted_at"] for row in rows)
    # the traffic's length mix in the week before the probe, in the same store
    apply_token_capacity(
        estimate,
        token_capacity_in_store(
            store if isinstance(store, RequestStore) else None,
            estimate.knee.requests,
            model=estimate.model,
            at=first,
            reached=estimate.knee.reached,
            admission_mean=estimate.knee.tokens,
            pool=estimate.recommended_pool,
        ),
    )
    apply_rates(estimate, _stored_rates(rows, estimate))
    return estimate


def apply_rates(estimate: CapacityEstimate, rates: RateResult | None) -> None:
    """Put an open-loop ladder's μ_slo and V_P on the estimate (published with its knee)."""
    if rates is None:
        return
    estimate.rate_requests_per_s = rates.mu_slo_per_s
    estimate.prefill_tokens_per_s = rates.prefill_tokens_per_s
    estimate.rates = rates.to_dict()


def _stored_rates(rows: Sequence[dict[str, Any]], estimate: CapacityEstimate) -> RateResult | None:
    """The open-loop ladder of a stored run (its rows with an offered rate), checked against its knee."""
    levels = rate_levels_from_rows(rows, estimate.slo, batch=estimate.knee.requests)
    if not levels:
        return None
    rated = rate_result(levels)
    rated.run_id = estimate.run_id
    e2e = [
        r["e2e_s"]
        for r in rows
        if r.get("probe_level") == estimate.knee.requests
        and r["outcome"] == "ok"
        and r["e2e_s"]
        and not r.get("probe_warmup")
    ]
    if rated.mu_slo_per_s is not None and e2e:
        failing = next((lv for lv in levels if lv.offered_per_s > rated.mu_slo_per_s and lv.why_not), None)
        rated.little = little_check(
            estimate.knee.requests,
            sum(e2e) / len(e2e),
            rated.mu_slo_per_s,
            knee_reached=estimate.knee.reached,
            slo_bound=failing is not None and not failing.meets_slo,
        )
    return rated


def apply_token_capacity(estimate: CapacityEstimate, capacity: TokenCapacity) -> None:
    """Put the token caliber's figures on the estimate: the capacity at the knee and its
    distribution, the SLO maximum in the same units, or withheld (with why) everywhere."""
    estimate.token_knee_withheld = capacity.withheld
    estimate.kv_capacity_tokens = capacity.kv_capacity_tokens
    estimate.token_capacity = capacity.to_dict()
    estimate.slo_max_tokens = capacity.per_request(estimate.slo_max)


def estimate_probe_run(
    store: Any, run_id: str, *, slo_ttft_p95_s: float | None = None, profile: str = "interactive"
) -> CapacityEstimate | None:
    """The estimate of one stored probe run (rows through a sidecar, a store or a --db file);
    None when it has no measured level. Its token capacity takes the store's traffic mix."""
    return _from_probe_run(store, run_id, None, Slo(ttft_p95_s=slo_ttft_p95_s), profile)


_TRAFFIC_FAILURES = """SELECT count(*) FILTER (WHERE outcome = 'upstream_error'), count(*) FROM requests
    WHERE source = 'traffic' AND (? IS NULL OR admitted_at >= ?) AND (? IS NULL OR admitted_at < ?)
      AND (? IS NULL OR model = ?) AND (? IS NULL OR task_class = ?)"""


def _traffic_error_ratio(
    store: Any, model: str | None, since: datetime | None, until: datetime | None, task_class: str | None
) -> float:
    """Share of the window's traffic the engine failed (5xx other than 503, resets, malformed
    answers). Clients' own 4xx and cancellations say nothing about the engine and are not counted."""
    failed, total = store.query(
        _TRAFFIC_FAILURES, [since, since, until, until, model, model, task_class, task_class]
    )[0]
    return failed / total if total else 0.0


def _from_traffic(
    store: Any,
    model: str | None,
    since: datetime | None,
    until: datetime | None,
    slo: Slo,
    profile: str,
    task_class: str | None = None,
) -> CapacityEstimate:
    curve = passive_curve(store, "requests", since, until, model, task_class=task_class)
    if curve.knee is None:
        raise ValueError(
            f"too little traffic between {since} and {until} for a capacity curve "
            f"({curve.rows} rows); widen the window"
        )
    tokens = passive_curve(store, "tokens", since, until, model, task_class=task_class)
    estimate = build_estimate(
        curve.usable_buckets(),
        slo=slo,
        profile=profile,
        model=model,
        source="traffic",
        confidence=curve.confidence,
        knee=curve.knee,
    )
    estimate.task_class = task_class or "all"
    estimate.confidence_reason = curve.confidence_reason
    apply_token_capacity(
        estimate,
        token_capacity_in_store(
            store,  # whatever the passive curve read: the same rows
            estimate.knee.requests,
            model=model,
            at=until,  # the estimate's own window: the traffic it measured
            since=since,
            reached=estimate.knee.reached,
            task_class=task_class,
            admission_mean=estimate.knee.tokens,
            pool=estimate.recommended_pool,
        ),
    )
    estimate.extra |= {
        "window_s": curve.window_s,
        "token_curve": tokens.to_dict(),
    }
    _apply_passive_rate(estimate, passive_rate(store, since, until, model, slo=slo, task_class=task_class))
    failed = _traffic_error_ratio(store, model, since, until, task_class)
    if failed:
        judge_errors(estimate, failed, "of the traffic in the window (upstream errors)")
    return estimate


def _apply_passive_rate(estimate: CapacityEstimate, found: PassiveRate) -> None:
    """The traffic's μ and V_P (collector.analysis.passive_rate) on its estimate, so the one
    decision publishes them with the traffic knee: the `rates` section always (why there is no
    μ, too), the numbers only at _PASSIVE_RATE_CONFIDENCE or above."""
    estimate.rates = found.to_dict()
    if CONFIDENCE_RANK[found.confidence] >= CONFIDENCE_RANK[_PASSIVE_RATE_CONFIDENCE]:
        estimate.rate_requests_per_s = found.mu_per_s
        estimate.prefill_tokens_per_s = found.prefill_tokens_per_s
    elif found.mu_per_s is not None:  # readers of the section (the review) must not show it either
        estimate.rates |= {
            "mu_slo_requests_per_s": None,
            "prefill_tokens_per_s": None,
            "withheld": f"μ {found.mu_per_s:.3g}/s at {found.confidence} confidence, below "
            f"{_PASSIVE_RATE_CONFIDENCE}: not published",
        }


def estimate_capacity(
    store: Any,
    model: str | None = None,
    since: datetime | None = None,
    until: datetime | None = None,
    slo_ttft_p95_s: float | None = None,
    profile: str = "interactive",
    *,
    source: str = "auto",
    task_class: str | None = None,
) -> CapacityEstimate:
    """Estimate from the newest probe run in the window ('auto' prefers it), else from traffic.

    Raises ValueError naming the window when there is too little data for either.
    """
    if source not in ("auto", "probe", "traffic"):
        raise ValueError(f"source {source!r} is not one of auto, probe, traffic")
    slo = Slo(ttft_p95_s=slo_ttft_p95_s)
    run_id = _latest_run(store, model, since, until) if source != "traffic" else None
    estimate = _from_probe_run(store, run_id, model, slo, profile) if run_id else None
    if estimate is not None:
        return estimate
    if source == "probe":
        raise ValueError(f"no probe run in the store between {since} and {until}; run headroom probe")
    return _from_traffic(store, model, since, until, slo, profile, task_class)


def estimate_from_probe(
    result: Any,
    *,
    slo: Slo = Slo(),
    profile: str = "interactive",
    traffic: RequestStore | None = None,
) -> CapacityEstimate:
    """The estimate of a finished probe run (collector.analysis.probe.ProbeResult).

    Its token capacity takes the length mix of `traffic` (a request log; None: no traffic, so the
    token figures are withheld), capped at the engine's KV capacity the probe read.
    """
    estimate = build_estimate(
        [level.stats for level in result.levels],
        slo=slo,
        profile=profile,
        model=result.model,
        source="probe",
        run_id=result.run_id,
        stopped_early=result.stopped_early,
    )
    estimate.task_class = result.task_class
    if getattr(result, "engine_max_concurrency", None) is not None:
        estimate.extra["engine_max_concurrency"] = result.engine_max_concurrency
    if getattr(result, "adapters", ()):  # measured with LoRA adapters in the mix: how many
        estimate.extra["adapters"] = len(result.adapters)
    rows = [row for level in result.levels for row in level.rows]
    started = min((row["admitted_at"] for row in rows), default=estimate.created_at)
    apply_token_capacity(
        estimate,
        token_capacity_in_store(
            traffic,
            estimate.knee.requests,
            model=result.model,
            at=started,
            reached=estimate.knee.reached,
            kv_capacity_tokens=getattr(result, "engine_kv_capacity_tokens", None),
            admission_mean=estimate.knee.tokens,
            pool=estimate.recommended_pool,
        ),
    )
    apply_rates(estimate, getattr(result, "rates", None))
    return estimate
