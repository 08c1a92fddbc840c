"""The open-loop probe: Poisson arrivals at fixed rates, and the capacity in rates it measures.

A closed loop measures concurrency (the knee); autoscalers act on rates. At a fixed concurrency
the in-flight backlog settles whatever the capacity, so rates must be measured open-loop
(docs/domain.md §13): requests arrive as a seeded Poisson process at a fixed offered rate,
whether or not the engine keeps up. Per rate level (`RateLevel`):

* achieved rate (answered completions in the window / its length) beside the offered and sent
  rates; errors (capacity: 429, 503, timeouts; and the rest);
* the queue over time: the client's outstanding requests (admitted, not yet answered), sampled
  across the window, and the engine's waiting count at admission where the engine says it. The
  queue **drifts** when a least-squares line through the outstanding count grows over the window
  by more than max(DRIFT_MIN_REQUESTS, DRIFT_SHARE x the requests sent in it): past capacity the
  backlog grows by (offered - μ) per second, below it it only fluctuates;
* p50/p95/p99 TTFT, TPOT and e2e of the requests admitted in the window, and the mean e2e;
* prefill tokens/s: prompt tokens minus the engine's `cached_tokens` (uncached, where the engine
  says what was cached) of the answered requests whose first token came in the window, and the
  same per such request.

μ_slo is the highest offered rate of the run of passing levels from the lowest one (a level that
passes above a failed one is noise): a level passes when its queue does not drift, it ended on
time, its capacity errors stay within the SLO's error ratio and its p95 TTFT/TPOT meet the SLO.
V_P is the prefill tokens/s at that rate: μ_slo x the level's uncached prompt tokens per
request (robust to a short level's sent rate straying from the offered one). When the failing level above it drifted, its completion
rate at a full batch (the gradient's knee: `full_batch_rate`, through the drain) is the saturation
throughput, and μ_slo is capped there (`rate_result`). Overload ends a level early (`overload_reason`: the
backlog grew by more than OVERLOAD_SHARE of the requests sent, at least OVERLOAD_MIN_REQUESTS)
and ends the ladder: it is reported, not waited out.

Little's law ties μ_slo to the knee (`little_check`): in a closed loop at the knee the engine
runs a full batch, so knee ≈ μ x mean e2e at the knee, within LITTLE_TOLERANCE. When not, the
check says why (a latency SLO that binds below the knee, a knee that was not reached, ...).

Rows are the probe's request-log rows (source 'probe'); each carries its offered rate
(`probe_rate_per_s`) and whether it warmed up (`probe_warmup`), as the sidecar recorded them from
the probe's headers, so a stored run can be re-analysed (`rate_levels_from_rows`).
"""

from __future__ import annotations

import asyncio
import bisect
import random
import statistics
import time
from collections import defaultdict
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, dataclass, field, replace
from typing import Any

from collector.analysis.levels import is_capacity_error, outcome_mix
from collector.analysis.stats import mean, percentiles, seconds
from collector.capacity import Slo

__all__ = [
    "RateSettings",
    "RateLevel",
    "RateResult",
    "LittleCheck",
    "rate_level",
    "full_batch_rate",
    "rate_result",
    "rate_levels_from_rows",
    "mu_slo",
    "little_check",
    "bracket_rates",
    "parse_rates",
    "run_rates",
    "DRIFT_SHARE",
    "DRIFT_MIN_REQUESTS",
    "OVERLOAD_SHARE",
    "OVERLOAD_MIN_REQUESTS",
    "LITTLE_TOLERANCE",
    "BRACKET",
]

DRIFT_SHARE = 0.1  # backlog growth over the window, as a share of the requests sent in it
DRIFT_MIN_REQUESTS = 3.0  # ... and at least this many requests
OVERLOAD_SHARE = 0.25  # growth that ends a level early: clearly past capacity
OVERLOAD_MIN_REQUESTS = 10
LITTLE_TOLERANCE = 0.2  # knee vs μ_slo x mean e2e at the knee, relative
# offered rates as multiples of the knee's rate (knee / mean e2e at the knee): dense around 1,
# where μ_slo lies when no latency target binds first
BRACKET = (0.5, 0.7, 0.8, 0.9, 0.95, 1.0, 1.05, 1.1, 1.2, 1.35, 1.5)
_SAMPLES = 120  # outstanding-count samples per window (the drift line and the time course)

Row = Mapping[str, Any]


def parse_rates(text: str) -> tuple[float, ...]:
    """'1,2.5,4' -> (1.0, 2.5, 4.0); ValueError naming the fault (rates must be positive)."""
    try:
        rates = tuple(sorted({float(part) for part in text.split(",") if part.strip()}))
    except ValueError:
        raise ValueError(f"{text!r} is not a comma-separated list of requests/s, e.g. 0.5,1,2") from None
    if not rates or rates[0] <= 0 or rates[0] < 0.001:
        raise ValueError(f"{text!r}: rates must be positive requests/s (at least 0.001), e.g. 0.5,1,2")
    return rates


def bracket_rates(knee: int, mean_e2e_s: float, multiples: Sequence[float] = BRACKET) -> tuple[float, ...]:
    """Offered rates bracketing the knee's rate by Little's law: knee / mean e2e at the knee x each
    multiple. Example: knee 8 at 0.8 s -> 10 requests/s: 5, 7, 8, 9, 9.5, 10, 10.5, 11, 12."""
    if knee < 1 or not mean_e2e_s > 0:
        raise ValueError(f"knee {knee} and mean e2e {mean_e2e_s} s must be positive to bracket rates")
    guess = knee / mean_e2e_s
    return tuple(round(guess * m, 3) for m in multiples)


@dataclass(frozen=True)
class RateLevel:
    """What one offered rate measured; rates per second, latencies in seconds."""

    offered_per_s: float
    sent: int  # requests sent in the window
    window_s: float
    sent_per_s: float
    achieved_per_s: float  # answered completions in the window / its length
    full_batch_per_s: float | None  # answered per second while a full batch was outstanding (None: unknown)
    outstanding_mean: float
    outstanding_max: int
    outstanding_growth: float  # least-squares growth of the outstanding count over the window
    drifting: bool
    engine_waiting_mean: float | None
    ttft_p50_s: float | None
    ttft_p95_s: float | None
    ttft_p99_s: float | None
    tpot_p50_s: float | None
    tpot_p95_s: float | None
    tpot_p99_s: float | None
    e2e_p50_s: float | None
    e2e_p95_s: float | None
    e2e_p99_s: float | None
    e2e_mean_s: float | None
    prefill_tokens_per_s: float  # uncached prompt tokens of answered requests
    prefill_tokens_per_request: float | None  # ... per request prefilled in the window
    cached_prompt_share: float | None  # share of prompt tokens the engine said it had cached
    errors: int
    capacity_errors: int
    error_ratio: float
    outcomes: dict[str, int]
    ended_early: str | None = None  # why the level stopped sending before its time (overload)
    outstanding_series: tuple[tuple[float, int], ...] = ()  # (seconds into the window, count)
    meets_slo: bool = True
    why_not: str | None = None  # why the level does not count towards μ_slo

    def to_dict(self) -> dict[str, Any]:
        """Plain dict for JSON (floats rounded)."""
        data = asdict(self)
        data["outstanding_series"] = [[round(t, 3), n] for t, n in self.outstanding_series]
        return {k: (round(v, 6) if isinstance(v, float) else v) for k, v in data.items()}


def _outstanding_at(rows: Sequence[Row]) -> Callable[[float], int]:
    admitted = sorted(t for r in rows if (t := seconds(r.get("admitted_at"))) is not None)
    completed = sorted(
        t for r in rows if seconds(r.get("admitted_at")) is not None and (t := seconds(r.get("completed_at")))
    )
    return lambda t: bisect.bisect_right(admitted, t) - bisect.bisect_right(completed, t)


def full_batch_rate(rows: Sequence[Row], all_rows: Sequence[Row], start: float, batch: int) -> float | None:
    """Answers per second while at least `batch` requests were outstanding, from `start` until the
    last of `rows` was answered: the window and the drain after it. Past capacity the batch stays
    full and this is the engine's saturation throughput, read off every answer it gave at a full
    batch rather than the window's alone (which an overload stop may cut to a few seconds, while
    the batch was still filling). None without an answer at a full batch."""
    ends = [t for r in rows if (t := seconds(r.get("completed_at"))) is not None]
    if not ends:
        return None
    until = max(ends)
    events: list[tuple[float, int, bool]] = []  # (time, +1 admitted / -1 answered, answered ok)
    outstanding = 0
    for row in all_rows:
        admitted, completed = seconds(row.get("admitted_at")), seconds(row.get("completed_at"))
        if admitted is None:
            continue
        if admitted <= start:
            outstanding += 1
        elif admitted <= until:
            events.append((admitted, 1, False))
        if completed is not None and completed <= start and admitted <= start:
            outstanding -= 1
        elif completed is not None and start < completed <= until:
            events.append((completed, -1, row.get("outcome") == "ok"))
    events.sort(key=lambda event: (event[0], -event[1]))  # admitted before answered at one instant
    full_s, answered, last = 0.0, 0, start
    for at, step, ok in events:
        if outstanding >= batch:
            full_s += at - last
            answered += step < 0 and ok
        outstanding += step
        last = at
    return answered / full_s if answered and full_s > 0 else None


def _judge(level: RateLevel, slo: Slo) -> RateLevel:
    why: list[str] = []
    if level.ended_early:
        why.append(f"ended early: {level.ended_early}")
    if level.drifting:
        why.append(f"queue drifts (+{level.outstanding_growth:.1f} requests over {level.window_s:.1f} s)")
    if level.sent and level.capacity_errors / level.sent > slo.max_error_ratio:
        why.append(f"{level.capacity_errors} capacity errors in {level.sent} requests")
    for name, value, target in (
        ("p95 TTFT", level.ttft_p95_s, slo.ttft_p95_s),
        ("p95 TPOT", level.tpot_p95_s, slo.tpot_p95_s),
    ):
        if target is not None and (value is None or value > target):
            shown = "none answered" if value is None else f"{value:.3f} s"
            why.append(f"{name} {shown} > SLO {target:g} s")
    meets = not any(w.startswith("p95") for w in why)
    return replace(level, meets_slo=meets, why_not="; ".join(why) or None)


def rate_level(
    rows: Sequence[Row],
    offered_per_s: float,
    window: tuple[float, float],
    *,
    slo: Slo | None = None,
    all_rows: Sequence[Row] | None = None,
    ended_early: str | None = None,
    batch: int | None = None,
) -> RateLevel:
    """Summarise one rate level: `rows` are its requests (warm-up included), `window` its
    measuring window in POSIX seconds (first measured admission to the last admission), `all_rows`
    every request that may be in flight during it (default: `rows`), `batch` the engine's batch
    (the closed loop's knee; None: unknown, no full-batch rate). ValueError on an empty window.
    """
    start, end = window
    if not end > start:
        raise ValueError(f"rate level {offered_per_s}/s: window end {end} is not after start {start}")
    span = end - start
    everything = all_rows if all_rows is not None else rows
    at = _outstanding_at(everything)
    times = [start + span * i / (_SAMPLES - 1) for i in range(_SAMPLES)]
    counts = [at(t) for t in times]
    slope = statistics.linear_regression(times, counts).slope if len(set(counts)) > 1 else 0.0
    admitted = [r for r in rows if start <= (seconds(r.get("admitted_at")) or -1.0) <= end]
    sent = len(admitted)
    growth = slope * span
    drifting = growth > max(DRIFT_MIN_REQUESTS, DRIFT_SHARE * sent)
    ok = [r for r in admitted if r.get("outcome") == "ok"]
    done = [
        r
        for r in rows
        if r.get("outcome") == "ok" and start <= (seconds(r.get("completed_at")) or -1.0) <= end
    ]
    prefilled = [
        r
        for r in rows
        if r.get("outcome") == "ok" and start <= (seconds(r.get("first_token_at")) or -1.0) <= end
    ]
    prompt = sum(int(r.get("prompt_tokens") or 0) for r in prefilled)
    cached = sum(int(r.get("cached_prompt_tokens") or 0) for r in prefilled)
    told = any(r.get("cached_prompt_tokens") is not None for r in prefilled)
    waiting = [r.get("engine_waiting_at_admit") for r in admitted]
    ttft = percentiles([r.get("ttft_s") for r in ok])
    tpot = percentiles([r.get("tpot_s") for r in ok])
    e2e = percentiles([r.get("e2e_s") for r in ok])
    errors = sum(1 for r in admitted if r.get("outcome") != "ok")
    capacity_errors = sum(1 for r in admitted if is_capacity_error(r))
    level = RateLevel(
        offered_per_s=offered_per_s,
        sent=sent,
        window_s=span,
        sent_per_s=sent / span,
        achieved_per_s=len(done) / span,
        full_batch_per_s=None if batch is None else full_batch_rate(rows, everything, start, batch),
        outstanding_mean=sum(counts) / len(counts),
        outstanding_max=max(counts),
        outstanding_growth=growth,
        drifting=drifting,
        engine_waiting_mean=mean(w for w in waiting if w is not None),
        ttft_p50_s=ttft[0],
        ttft_p95_s=ttft[1],
        ttft_p99_s=ttft[2],
        tpot_p50_s=tpot[0],
        tpot_p95_s=tpot[1],
        tpot_p99_s=tpot[2],
        e2e_p50_s=e2e[0],
        e2e_p95_s=e2e[1],
        e2e_p99_s=e2e[2],
        e2e_mean_s=mean(r.get("e2e_s") for r in ok),
        prefill_tokens_per_s=(prompt - cached) / span,
        prefill_tokens_per_request=(prompt - cached) / len(prefilled) if prefilled else None,
        cached_prompt_share=(cached / prompt if prompt else 0.0) if told else None,
        errors=errors,
        capacity_errors=capacity_errors,
        error_ratio=errors / sent if sent else 0.0,
        outcomes=outcome_mix(admitted),
        ended_early=ended_early,
        outstanding_series=tuple(
            (t - start, n) for t, n in zip(times[:: _SAMPLES // 30], counts[:: _SAMPLES // 30], strict=True)
        ),
    )
    return _judge(level, slo or Slo())


def rate_levels_from_rows(
    rows: Sequence[Row], slo: Slo | None = None, batch: int | None = None
) -> list[RateLevel]:
    """The rate levels of one stored run, by each row's offered rate (module docstring); each
    level's window runs from its first measured to its last admission; `batch` as rate_level's."""
    grouped: dict[int, list[Row]] = defaultdict(list)
    measured: dict[int, list[float]] = defaultdict(list)
    for row in rows:
        rate = row.get("probe_rate_per_s")
        if rate:
            milli = round(rate * 1000)
            grouped[milli].append(row)
            admitted = seconds(row.get("admitted_at"))
            if admitted is not None and not row.get("probe_warmup"):
                measured[milli].append(admitted)
    levels = []
    for milli in sorted(grouped):
        times = measured.get(milli) or []
        last = max(seconds(r.get("admitted_at")) or 0.0 for r in grouped[milli])
        if times and last > min(times):
            levels.append(
                rate_level(
                    grouped[milli], milli / 1000, (min(times), last), slo=slo, all_rows=rows, batch=batch
                )
            )
    return levels


@dataclass(frozen=True)
class LittleCheck:
    """knee vs μ_slo x mean e2e at the knee (Little's law), and what a disagreement means."""

    knee: int
    mean_e2e_at_knee_s: float
    rate_per_s: float
    predicted_knee: float  # rate x mean e2e at the knee
    ratio: float  # predicted / knee
    tolerance: float
    consistent: bool
    explanation: str

    def to_dict(self) -> dict[str, Any]:
        return {k: (round(v, 6) if isinstance(v, float) else v) for k, v in asdict(self).items()}


def little_check(
    knee: int,
    mean_e2e_at_knee_s: float,
    rate_per_s: float,
    *,
    knee_reached: bool = True,
    slo_bound: bool = False,
    tolerance: float = LITTLE_TOLERANCE,
) -> LittleCheck:
    """Whether the closed-loop knee and the open-loop rate agree (module docstring).

    Example: knee 8, 0.8 s at the knee, μ_slo 9.5/s -> 7.6 predicted, ratio 0.95, consistent.
    """
    predicted = rate_per_s * mean_e2e_at_knee_s
    ratio = predicted / knee
    consistent = abs(ratio - 1.0) <= tolerance
    if consistent:
        why = (
            f"knee {knee} ≈ {rate_per_s:.3g}/s x {mean_e2e_at_knee_s:.3g} s = {predicted:.2f} "
            f"(within {tolerance:.0%})"
        )
    elif not knee_reached:
        why = f"the knee {knee} is a lower bound (not reached), so the rate it implies is too"
    elif ratio < 1 and slo_bound:
        why = (
            f"a latency SLO binds below the knee: μ_slo {rate_per_s:.3g}/s serves "
            f"{predicted:.2f} at once, fewer than the knee {knee}"
        )
    elif ratio < 1:
        why = (
            f"the open loop served less than the knee implies ({predicted:.2f} of {knee}): the queue "
            "drifted early (bursty arrivals need headroom below a full batch) or the knee is too high"
        )
    else:
        why = (
            f"the open loop served more than the knee implies ({predicted:.2f} vs {knee}): the knee "
            "is below the batch the engine runs, or e2e at the knee included queueing"
        )
    return LittleCheck(knee, mean_e2e_at_knee_s, rate_per_s, predicted, ratio, tolerance, consistent, why)


@dataclass
class RateResult:
    """An open-loop run: its levels, μ_slo and V_P, and why the ladder stopped."""

    levels: list[RateLevel]
    mu_slo_per_s: float | None
    prefill_tokens_per_s: float | None
    reason: str
    stopped_early: str | None = None
    little: LittleCheck | None = None
    run_id: str | None = None

    def to_dict(self) -> dict[str, Any]:
        """The estimate's `rates` section (docs/capacity.md, JSON output)."""
        return {
            "mu_slo_requests_per_s": None if self.mu_slo_per_s is None else round(self.mu_slo_per_s, 6),
            "prefill_tokens_per_s": (
                None if self.prefill_tokens_per_s is None else round(self.prefill_tokens_per_s, 3)
            ),
            "reason": self.reason,
            "stopped_early": self.stopped_early,
            "littles_law": self.little.to_dict() if self.little else None,
            "run_id": self.run_id,
            "levels": [level.to_dict() for level in self.levels],
        }


def mu_slo(levels: Sequence[RateLevel]) -> tuple[RateLevel | None, str]:
    """The highest passing level of the run of passing levels from the lowest rate, and why."""
    best: RateLevel | None = None
    for level in sorted(levels, key=lambda lv: lv.offered_per_s):
        if level.why_not is not None:
            if best is None:
                return None, f"the lowest rate {level.offered_per_s:g}/s already fails: {level.why_not}"
            return best, f"{level.offered_per_s:g}/s fails: {level.why_not}"
        best = level
    if best is None:
        return None, "no rate level measured"
    return best, f"every rate passed; μ_slo is at least {best.offered_per_s:g}/s (raise the rates)"


def _prefill_at(level: RateLevel, rate: float) -> float:
    """V_P at `rate`: the level's uncached prompt tokens per request x the rate (its measured
    prefill tokens/s when nothing was prefilled). A short level's Poisson arrivals stray from the
    offered rate by ~1/√n; per request, the prefill does not."""
    if level.prefill_tokens_per_request is None:
        return level.prefill_tokens_per_s
    return rate * level.prefill_tokens_per_request


def rate_result(levels: list[RateLevel], stopped_early: str | None = None) -> RateResult:
    """μ_slo and V_P of measured levels (module docstring); None when every rate passed (then the
    highest is only a lower bound) or the lowest failed.

    When the level that failed drifted, its completion rate at a full batch is the engine's
    saturation throughput (answers as fast as it can): no rate above it is sustainable, so μ_slo
    is capped there, with V_P measured at that level. Near saturation a short level's queue
    wanders like a random walk, and the cap keeps a level that passed by luck from overstating μ.
    The rate is `full_batch_per_s` (the window and the drain) where the batch is known, else the
    window's completions.
    """
    best, reason = mu_slo(levels)
    failed = (
        None if best is None else next((lv for lv in levels if lv.offered_per_s > best.offered_per_s), None)
    )
    if best is None or failed is None:
        return RateResult(levels, None, None, reason, stopped_early)
    rate, prefill = best.offered_per_s, _prefill_at(best, best.offered_per_s)
    saturated = failed.drifting or failed.ended_early is not None
    full_batch = failed.full_batch_per_s is not None
    throughput = failed.full_batch_per_s if failed.full_batch_per_s is not None else failed.achieved_per_s
    if saturated and throughput < rate:
        rate, prefill = throughput, _prefill_at(failed, throughput)
        where = "at a full batch" if full_batch else "in its window"
        reason += (
            f"; capped at the {throughput:.3g}/s it completed there {where} (saturation "
            f"throughput, below the {best.offered_per_s:g}/s that passed)"
        )
    return RateResult(levels, rate, prefill, reason, stopped_early)


@dataclass(frozen=True)
class RateSettings:
    """The open-loop ladder: offered rates and how long each one runs."""

    rates: tuple[float, ...]
    level_s: float = 30.0  # measuring time per rate (after warm-up)
    warmup_s: float = 5.0  # arrivals before measuring starts (the queue settles)
    drain_s: float = 60.0  # after the last arrival, wait at most this for answers
    seed: int = 0
    slo: Slo = field(default_factory=Slo)
    batch: int | None = None  # the engine's batch (the gradient's knee): saturation at a full batch


async def _send(runner: Any, spec: Any, rows: list[dict[str, Any]]) -> None:
    # lazy: the probe's client is aiohttp, which the estimates (collector.analysis.estimate, run by
    # a --db sidecar's jobs) never need; only a probe run sends
    from collector.analysis.probe_request import send_one

    answer = await send_one(runner.client, spec, runner.meter)
    row = answer.record.as_row()
    runner.calibrate(row)
    rows.append(row)


async def run_rates(
    runner: Any,
    settings: RateSettings,
    *,
    on_level: Callable[[RateLevel, list[dict[str, Any]]], None] | None = None,
) -> RateResult:
    """Run the ladder with a collector.analysis.probe runner (its client, model, prompts and
    meter): per rate, Poisson arrivals for warm-up + level_s seconds, then a bounded drain.

    A level ends early once its backlog grew by OVERLOAD_SHARE of the requests sent (at least
    OVERLOAD_MIN_REQUESTS), and the first level that fails ends the ladder.
    """
    rng = random.Random(settings.seed)
    all_rows: list[dict[str, Any]] = []
    levels: list[RateLevel] = []
    stopped: str | None = None
    for rate in sorted(settings.rates):
        rows: list[dict[str, Any]] = []
        tasks: set[asyncio.Task[None]] = set()
        begin = time.time()
        measure_from = begin + settings.warmup_s
        stop_at = measure_from + settings.level_s
        ended_early = None
        outstanding_at_start: int | None = None
        sent_measured = 0
        next_at = begin + rng.expovariate(rate)

        while next_at < stop_at:
            delay = next_at - time.time()
            if delay > 0:
                await asyncio.sleep(delay)  # the arrival process's own clock, not synchronisation
            warm = next_at < measure_from
            if not warm:
                if outstanding_at_start is None:
                    outstanding_at_start = runner.meter.requests
                sent_measured += 1
                growth = runner.meter.requests - outstanding_at_start
                if growth > max(OVERLOAD_MIN_REQUESTS, OVERLOAD_SHARE * sent_measured):
                    ended_early = (
                        f"overload: {growth} more requests outstanding after {sent_measured} sent "
                        f"({time.time() - measure_from:.1f} s into the level)"
                    )
                    break
            task = asyncio.create_task(_send(runner, runner.rate_spec(rate, warm), rows))
            tasks.add(task)
            task.add_done_callback(tasks.discard)
            next_at += rng.expovariate(rate)
        if tasks:
            done, pending = await asyncio.wait(set(tasks), timeout=settings.drain_s)
            for task in pending:
                task.cancel()
            await asyncio.gather(*pending, return_exceptions=True)
        all_rows.extend(rows)
        measured = [seconds(r["admitted_at"]) or 0.0 for r in rows if not r["probe_warmup"]]
        if len(measured) < 2:
            level = None
        else:
            level = rate_level(
                rows,
                rate,
                (min(measured), max(measured)),
                slo=settings.slo,
                all_rows=all_rows,
                ended_early=ended_early,
                batch=settings.batch,
            )
        if level is None:
            stopped = f"rate {rate:g}/s sent fewer than 2 measured requests (raise --rate-seconds)"
            break
        levels.append(level)
        if on_level is not None:
            on_level(level, rows)
        if level.why_not is not None:
            if rate != max(settings.rates):
                stopped = f"stopped after {rate:g}/s: {level.why_not}"
            break
    return rate_result(levels, stopped)
