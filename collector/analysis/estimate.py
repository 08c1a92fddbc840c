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

An estimate is built in one call (`build_estimate`) and never changed afterwards
(`CapacityEstimate` is frozen): what depends on the knee (the token capacity, a stored ladder's
rates) is passed as a function of the measured knee and pool, and the facts of the run (its task
class, its time, the engine's ceilings) as arguments.
"""

from __future__ import annotations

from collections import Counter, defaultdict
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import TYPE_CHECKING, NamedTuple

from collector.analysis.knee import detect_knee
from collector.analysis.levels import summarize_level
from collector.analysis.openloop import RateResult, little_check, rate_levels_from_rows, rate_result
from collector.analysis.passive import passive_curve
from collector.analysis.passive_rate import PassiveRate, passive_rate
from collector.analysis.recommend import recommended_pool
from collector.analysis.slo import slo_max
from collector.analysis.stats import seconds
from collector.analysis.token_knee import TokenCapacity, token_capacity_in_store
from collector.capacity import ALL_TASKS, CapacityEstimate, KneeResult, LevelStats, Slo
from collector.record import Row
from collector.store.db import RequestStore
from collector.store.decision import CONFIDENCE_RANK, MAX_ERROR_RATIO

if TYPE_CHECKING:  # the probe's client (aiohttp) is not the sidecar's: only its type is needed here
    from collector.analysis.probe import ProbeResult

__all__ = [
    "Measured",
    "Rates",
    "TokensAt",
    "build_estimate",
    "estimate_capacity",
    "estimate_from_probe",
    "estimate_probe_run",
    "measure",
    "probe_levels",
    "tokens_in_store",
]

# a traffic estimate carries the passive μ from this confidence up: the traffic knee's default bar
# (collector.store.decision.PublishPolicy.traffic_confidence)
_PASSIVE_RATE_CONFIDENCE = "medium"


class Measured(NamedTuple):
    """What the levels say before anything else is known: the knee, the SLO maximum, the pool."""

    levels: list[LevelStats]
    knee: KneeResult
    slo_max: int | None
    pool: int


@dataclass(frozen=True)
class Rates:
    """Capacity in rates an estimate publishes: μ_slo, V_P and the section the review reads."""

    requests_per_s: float | None
    prefill_tokens_per_s: float | None
    section: dict[str, object] | None

    @classmethod
    def of_ladder(cls, rates: RateResult | None) -> Rates | None:
        """An open-loop ladder's μ_slo and V_P (published with its knee); None: no ladder ran."""
        if rates is None:
            return None
        return cls(rates.mu_slo_per_s, rates.prefill_tokens_per_s, rates.to_dict())


# the token caliber of a measured knee (collector.analysis.token_knee): a function, because the
# capacity is the knee and the pool times the traffic's mix
TokensAt = Callable[[Measured], TokenCapacity]


def tokens_in_store(
    store: RequestStore | None,
    *,
    model: str | None,
    at: datetime | None,
    since: datetime | None = None,
    task_class: str | None = None,
    kv_capacity_tokens: int | None = None,
) -> TokensAt:
    """The token capacity at whatever knee is measured, with the length mix of the traffic in
    `store` (the week before `at`, or [since, at)); no store: withheld."""

    def at_knee(measured: Measured) -> TokenCapacity:
        return token_capacity_in_store(
            store,
            measured.knee.requests,
            model=model,
            at=at,
            since=since,
            reached=measured.knee.reached,
            task_class=task_class,
            kv_capacity_tokens=kv_capacity_tokens,
            admission_mean=measured.knee.tokens,
            pool=measured.pool,
        )

    return at_knee


def measure(levels: Sequence[LevelStats], slo: Slo, profile: str, knee: KneeResult | None = None) -> Measured:
    """Knee (detected unless given), SLO maximum and recommended pool of `levels`."""
    ordered = sorted(levels, key=lambda s: s.concurrency)
    found = knee or detect_knee(ordered)
    best = slo_max(ordered, slo)
    return Measured(ordered, found, best, recommended_pool(found, best, profile))


def build_estimate(
    levels: Sequence[LevelStats],
    *,
    slo: Slo = Slo(),
    profile: str = "interactive",
    model: str | None = None,
    source: str = "probe",
    run_id: str | None = None,
    confidence: str = "high",
    confidence_reason: str | None = None,
    knee: KneeResult | None = None,
    stopped_early: str | None = None,
    task_class: str = ALL_TASKS,
    replica_class: str | None = None,
    created_at: datetime | None = None,
    extra: Mapping[str, object] | None = None,
    tokens: TokensAt | None = None,
    rates: Rates | Callable[[Measured], Rates | None] | None = None,
    failures: tuple[float, str] | None = None,
) -> CapacityEstimate:
    """The one builder: knee, SLO max and pool of `levels`, the token caliber (`tokens`, None:
    not computed), the rates, and the error judgement, as one frozen CapacityEstimate.

    `failures` is (error ratio, where) measured outside the levels (the traffic's upstream
    errors); without it the worst level's non-capacity errors are judged.
    """
    measured = measure(levels, slo, profile, knee)
    error_ratio, where = failures if failures and failures[0] else _worst_level(measured.levels)
    if error_ratio > MAX_ERROR_RATIO:
        confidence = "none"
        confidence_reason = (
            f"{error_ratio:.0%} of the requests {where} failed for reasons other than capacity "
            f"(more than {MAX_ERROR_RATIO:.0%}): the measurement is broken, not the engine full; "
            "nothing is published"
        )
    details = dict(extra or {})
    if measured.pool == 0:
        details["pool_reason"] = _pool_reason(measured.levels, slo)
    capacity = tokens(measured) if tokens is not None else None
    rated = rates(measured) if callable(rates) else rates
    return CapacityEstimate(
        model=model,
        source=source,
        run_id=run_id,
        profile=profile,
        levels=measured.levels,
        knee=measured.knee,
        slo=slo,
        slo_max=measured.slo_max,
        slo_max_tokens=capacity.per_request(measured.slo_max) if capacity else None,
        recommended_pool=measured.pool,
        confidence=confidence,
        created_at=created_at or datetime.now(UTC),
        stopped_early=stopped_early,
        extra=details,
        task_class=task_class,
        **({"replica_class": replica_class} if replica_class else {}),
        error_ratio=error_ratio,
        token_knee_withheld=capacity.withheld if capacity else None,
        kv_capacity_tokens=capacity.kv_capacity_tokens if capacity else None,
        rate_requests_per_s=rated.requests_per_s if rated else None,
        prefill_tokens_per_s=rated.prefill_tokens_per_s if rated else None,
        rates=dict(rated.section) if rated and rated.section is not None else None,
        confidence_reason=confidence_reason,
        token_capacity=capacity.to_dict() if capacity else None,
    )


def _worst_level(levels: Sequence[LevelStats]) -> tuple[float, str]:
    """The largest non-capacity error ratio of a level, and where it was, for a reason."""
    worst = max(levels, key=lambda s: s.non_capacity_error_ratio or 0.0, default=None)
    if worst is None or not worst.non_capacity_error_ratio:
        return 0.0, ""
    mix = ", ".join(f"{name} {count}" for name, count in (worst.outcomes or {}).items())
    first = f"; first error: {worst.first_error}" if worst.first_error else ""
    where = f"at concurrency {worst.concurrency}" + (f" ({mix}{first})" if mix or first else "")
    return worst.non_capacity_error_ratio, where


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


def probe_levels(rows: Sequence[Row]) -> list[LevelStats]:
    """Levels of one stored probe run, by each row's closed-loop level (`probe_level`).

    Each level is measured from its first to its last measured (not warm-up) admission, as the
    probe measured it; every completion inside that window counts towards throughput, warm-up
    rows' too, so a queued level's long requests do not make it look slower than it was.
    """
    grouped: dict[int, list[Row]] = defaultdict(list)
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


def _latest_run(
    store: RequestStore, model: str | None, since: datetime | None, until: datetime | None
) -> str | None:
    sql, params = "SELECT run_id FROM requests WHERE source = 'probe' AND run_id IS NOT NULL", []
    for clause, value in (("admitted_at >= ?", since), ("admitted_at < ?", until), ("model = ?", model)):
        if value is not None:
            sql += f" AND {clause}"
            params.append(value)
    found = store.query(sql + " ORDER BY admitted_at DESC LIMIT 1", params)
    return str(found[0][0]) if found else None


def _from_probe_run(
    store: RequestStore, run_id: str, model: str | None, slo: Slo, profile: str
) -> CapacityEstimate | None:
    rows = store.query_dicts("SELECT * FROM requests WHERE run_id = ? ORDER BY admitted_at", [run_id])
    levels = probe_levels(rows)
    if not levels:
        return None
    classes = Counter(row.get("task_class") or ALL_TASKS for row in rows)
    named = model or rows[0]["model"]
    return build_estimate(
        levels,
        slo=slo,
        profile=profile,
        model=named,
        source="probe",
        run_id=run_id,
        task_class=classes.most_common(1)[0][0],  # the workload class the probe named
        # the run's own time: a probe stored hours ago must not look fresh when estimated now
        created_at=max(row["completed_at"] for row in rows if row["completed_at"]),
        # the traffic's length mix in the week before the probe, in the same store
        tokens=tokens_in_store(store, model=named, at=min(row["admitted_at"] for row in rows)),
        rates=lambda measured: Rates.of_ladder(_stored_rates(rows, measured, slo, run_id)),
    )


def _stored_rates(rows: Sequence[Row], measured: Measured, slo: Slo, run_id: str) -> RateResult | None:
    """The open-loop ladder of a stored run (its rows with an offered rate), checked against its knee."""
    knee = measured.knee
    levels = rate_levels_from_rows(rows, slo, batch=knee.requests)
    if not levels:
        return None
    rated = rate_result(levels)
    rated.run_id = run_id
    e2e = [
        r["e2e_s"]
        for r in rows
        if r.get("probe_level") == knee.requests
        and r["outcome"] == "ok"
        and r["e2e_s"]
        and not r.get("probe_warmup")
    ]
    if rated.mu_slo_per_s is not None and e2e:
        failing = next((lv for lv in levels if lv.offered_per_s > rated.mu_slo_per_s and lv.why_not), None)
        rated.little = little_check(
            knee.requests,
            sum(e2e) / len(e2e),
            rated.mu_slo_per_s,
            knee_reached=knee.reached,
            slo_bound=failing is not None and not failing.meets_slo,
        )
    return rated


def estimate_probe_run(
    store: RequestStore, run_id: str, *, slo_ttft_p95_s: float | None = None, profile: str = "interactive"
) -> CapacityEstimate | None:
    """The estimate of one stored probe run (rows through a sidecar, a store or a --db file);
    None when it has no measured level. Its token capacity takes the store's traffic mix."""
    return _from_probe_run(store, run_id, None, Slo(ttft_p95_s=slo_ttft_p95_s), profile)


_TRAFFIC_FAILURES = """SELECT count(*) FILTER (WHERE outcome = 'upstream_error'), count(*) FROM requests
    WHERE source = 'traffic' AND (? IS NULL OR admitted_at >= ?) AND (? IS NULL OR admitted_at < ?)
      AND (? IS NULL OR model = ?) AND (? IS NULL OR task_class = ?)"""


def _traffic_error_ratio(
    store: RequestStore,
    model: str | None,
    since: datetime | None,
    until: datetime | None,
    task_class: str | None,
) -> float:
    """Share of the window's traffic the engine failed (5xx other than 503, resets, malformed
    answers). Clients' own 4xx and cancellations say nothing about the engine and are not counted."""
    failed, total = store.query(
        _TRAFFIC_FAILURES, [since, since, until, until, model, model, task_class, task_class]
    )[0]
    return float(failed / total) if total else 0.0


def _from_traffic(
    store: RequestStore,
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
    return build_estimate(
        curve.usable_buckets(),
        slo=slo,
        profile=profile,
        model=model,
        source="traffic",
        confidence=curve.confidence,
        confidence_reason=curve.confidence_reason,
        knee=curve.knee,
        task_class=task_class or ALL_TASKS,
        extra={"window_s": curve.window_s, "token_curve": tokens.to_dict()},
        # the estimate's own window: the traffic it measured, the same rows the passive curve read
        tokens=tokens_in_store(store, model=model, at=until, since=since, task_class=task_class),
        rates=_passive_rates(passive_rate(store, since, until, model, slo=slo, task_class=task_class)),
        failures=(
            _traffic_error_ratio(store, model, since, until, task_class),
            "of the traffic in the window (upstream errors)",
        ),
    )


def _passive_rates(found: PassiveRate) -> Rates:
    """The traffic's μ and V_P (collector.analysis.passive_rate) for its estimate, so the one
    decision publishes them with the traffic knee: the `rates` section always (why there is no
    μ, too), the numbers only at _PASSIVE_RATE_CONFIDENCE or above."""
    section: dict[str, object] = dict(found.to_dict())
    if CONFIDENCE_RANK[found.confidence] >= CONFIDENCE_RANK[_PASSIVE_RATE_CONFIDENCE]:
        return Rates(found.mu_per_s, found.prefill_tokens_per_s, section)
    if found.mu_per_s is not None:  # readers of the section (the review) must not show it either
        section |= {
            "mu_slo_requests_per_s": None,
            "prefill_tokens_per_s": None,
            "withheld": f"μ {found.mu_per_s:.3g}/s at {found.confidence} confidence, below "
            f"{_PASSIVE_RATE_CONFIDENCE}: not published",
        }
    return Rates(None, None, section)


def estimate_capacity(
    store: RequestStore,
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
    result: ProbeResult,
    *,
    slo: Slo = Slo(),
    profile: str = "interactive",
    traffic: RequestStore | None = None,
    replica_class: str | None = None,
) -> CapacityEstimate:
    """The estimate of a finished probe run (collector.analysis.probe.ProbeResult).

    Its token capacity takes the length mix of `traffic` (a request log; None: no traffic, so the
    token figures are withheld), capped at the engine's KV capacity the probe read.
    """
    rows = [row for level in result.levels for row in level.rows]
    extra: dict[str, object] = {}
    if result.engine_max_concurrency is not None:
        extra["engine_max_concurrency"] = result.engine_max_concurrency
    if result.adapters:  # measured with LoRA adapters in the mix: how many
        extra["adapters"] = len(result.adapters)
    return build_estimate(
        [level.stats for level in result.levels],
        slo=slo,
        profile=profile,
        model=result.model,
        source="probe",
        run_id=result.run_id,
        stopped_early=result.stopped_early,
        task_class=result.task_class,
        replica_class=replica_class,
        extra=extra,
        tokens=tokens_in_store(
            traffic,
            model=result.model,
            at=min((row["admitted_at"] for row in rows), default=datetime.now(UTC)),
            kv_capacity_tokens=result.engine_kv_capacity_tokens,
        ),
        rates=Rates.of_ladder(result.rates),
    )
