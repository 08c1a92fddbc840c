"""Knee of a concurrency gradient: where throughput reaches its plateau, confirmed by queueing.

Engines show two regimes (docs/domain.md §7). Memory-bound (a GPU at small batch, the simulator's
default profile): adding a request to the batch is nearly free, TTFT stays flat until the batch
is full, then requests wait and TTFT jumps. Compute-bound (llama.cpp on a CPU, long prompts on a
GPU): every prefill shares the compute with the running decodes, so TTFT and TPOT grow with the
batch *before* anything waits. A latency-ratio rule ("p95 TTFT > 2 x low load") reads the second
regime's batching cost as a knee and reports half the real one; this rule does not look at
latency growth at all, which is the SLO's business (collector.analysis.slo).

The rule, walking the levels upward (thresholds in KneeRule):

  1. Capacity errors cut the ladder. A level *fails* when its 429/503 answers and timeouts are
     more than a handful (>= min_capacity_errors) and more than max_capacity_error_ratio of its
     requests. Other failures (a reset, a stale keep-alive connection, a 400) never count, and
     one capacity error never does either. Levels from the first failing one up are left out.
  2. Queueing, where it shows, places the knee. With the engine's waiting count (averaged over
     the level's admissions), a level *queues* when that queue is real (min_engine_queue) and
     requests waited in it: median TTFT grew over the lowest level's by strong_queue_share of a
     request's duration, or the queue is engine_queue_share of the concurrency and TTFT grew by
     queue_share (a request that sits one scheduler step in the queue is no queue), or the queue
     is engine_queue_share of the concurrency and the median decode time (e2e - TTFT) grew by
     preempted_decode_growth (requests wait after their first token: preempted for KV). An engine
     that reports no queue is believed over any TTFT growth: that is prefill contention. Without
     the engine's count, a level queues when TTFT grew by strong_queue_share (a closed loop at
     twice the slots waits about half of a request's duration). Below the first level that
     queues, the knee is the highest level whose throughput is within retrograde_tolerance of
     the best below the queue: the engine serves that many at once, and more requests only wait
     (a flat compute-bound curve wobbles by several percent, and on some CPUs one request
     decodes faster alone than two together; a level below half the best is a collapse, not a
     knee). A closed loop with a queue keeps the batch fuller than one without,
     so throughput may still creep up at the queueing level. A level whose only evidence is TTFT
     and that gains max_queued_gain or more is prefill contention, not a full batch, and is
     ignored; the engine's own count is believed whatever the gain (a knee between two levels:
     12 slots queue at 16, which still gains 50 % over 8).
  3. Without queueing, the plateau places it: the first level whose throughput (total tokens/s)
     is within plateau_tolerance of the best measured; no level after it gains meaningfully.
  4. Evidence. The knee is `reached` when a measured level above it shows the plateau, queueing
     or capacity errors; a knee at the highest healthy level with nothing above it is a lower
     bound (`reached` False: measure higher levels).

TTFT and TPOT growth that is not queueing is the SLO's business (collector.analysis.slo): a
compute-bound engine slows every request it batches, and still serves them all at once.

Worked example (llama.cpp, 4 slots, docs/capacity.md): output tok/s 107, 116, 154, 150 and p95
TTFT 0.08, 0.11, 0.18, 2.5 s at 1, 2, 4, 8 -> 8 queues (median TTFT +2.3 s, ~40 % of a request's
duration); below it the best is 154 at 4: knee 4, reached. The old "2 x low-load TTFT" clause
would have tripped at 4 (0.18 > 2 x 0.08) and said 2.

Kneedle (the `kneed` package) runs on x = log2(concurrency) as a cross-check: tokens/s as a concave
increasing curve, p95 TTFT as a convex one. It judges the shape of the whole curve, so it shifts
with the range of levels; both answers are reported and `note` says why they differ.
"""

from __future__ import annotations

import math
import warnings
from collections.abc import Sequence
from dataclasses import dataclass

from collector.capacity import KneeResult, LevelStats

__all__ = ["KneeRule", "LevelVerdict", "judge_level", "detect_knee", "kneedle_knee"]


@dataclass(frozen=True)
class KneeRule:
    """Thresholds of the knee rule (module docstring); each one is a documented default."""

    plateau_tolerance: float = 0.05  # within 5 % of the best throughput: on the plateau
    min_capacity_errors: int = 3  # fewer 429/503/timeouts than this are never a knee
    max_capacity_error_ratio: float = 0.05
    # In a closed loop at twice the slots, half the requests wait about one service time: TTFT
    # grows by ~50 % of e2e. Batching cost on a compute-bound engine stays near 2-5 %.
    queue_share: float = 0.15  # median TTFT grew by >= 15 % of a request's duration
    strong_queue_share: float = 0.3  # ... by 30 %: requests wait for a slot
    engine_queue_share: float = 0.2  # mean engine queue >= 20 % of the concurrency ...
    min_engine_queue: float = 0.75  # ... and most of a request: not an arrival between steps
    # A queue of engine_queue_share while TTFT stays flat and each request's decode takes this
    # much longer than at the lowest level: requests wait after their first token, preempted
    # because the KV cache is full (vLLM's recompute), not for a slot.
    preempted_decode_growth: float = 0.1
    # below a queue: within 50 % of the best throughput. A flat compute-bound curve on a shared
    # host wobbles by 15 % between levels of a dozen requests, and a CPU engine can lose a third
    # of its throughput from one request to two and still serve both at once (llama.cpp on one
    # AVX-512 core decodes 80 tok/s alone, 55 for two); a collapse (thrashing) halves it.
    retrograde_tolerance: float = 0.5
    # A queueing level that still gains this much is not past the knee: long prompts contend
    # for prefill (TTFT grows) while decode throughput still rises with the batch.
    max_queued_gain: float = 0.25


@dataclass(frozen=True)
class LevelVerdict:
    """What the rule reads off one level: capacity failure and queueing, each with its reason."""

    concurrency: int
    capacity_failure: str | None = None
    queueing: str | None = None  # the evidence, when the level queues at all
    strong_queueing: bool = False
    engine_said_so: bool = False  # the engine's own waiting count, not inferred from TTFT


def _capacity_failure(level: LevelStats, rule: KneeRule) -> str | None:
    errors, samples = level.capacity_errors, max(level.samples, 1)
    if errors >= rule.min_capacity_errors and errors / samples > rule.max_capacity_error_ratio:
        return (
            f"{errors} capacity errors (429/503/timeout) in {level.samples} requests at "
            f"concurrency {level.concurrency}"
        )
    return None


def _queue_share(level: LevelStats, baseline: LevelStats) -> float | None:
    """How much longer the median request waited for its first token, per second it lasted."""
    if level.ttft_p50_s is None or baseline.ttft_p50_s is None or not level.e2e_p50_s:
        return None
    return (level.ttft_p50_s - baseline.ttft_p50_s) / level.e2e_p50_s


def _decode_growth(level: LevelStats, baseline: LevelStats) -> float | None:
    """How much longer the median request decoded (e2e - TTFT) than at the lowest level."""
    if None in (level.e2e_p50_s, level.ttft_p50_s, baseline.e2e_p50_s, baseline.ttft_p50_s):
        return None
    before = baseline.e2e_p50_s - baseline.ttft_p50_s  # type: ignore[operator]
    after = level.e2e_p50_s - level.ttft_p50_s  # type: ignore[operator]
    return after / before - 1.0 if before > 0 else None


def _engine_queue(
    waiting: float, share: float | None, level: LevelStats, baseline: LevelStats, rule: KneeRule
) -> bool:
    """The engine reports a queue that requests waited in: some queue and a strong TTFT rise, or
    a queue of engine_queue_share of the concurrency and either a TTFT rise of queue_share or
    decode slowed by preempted_decode_growth (requests preempted after their first token)."""
    if waiting < rule.min_engine_queue:
        return False
    large = waiting >= rule.engine_queue_share * level.concurrency
    if share is None:  # no TTFT to look at (the lowest level, non-streamed traffic)
        return large
    if share >= rule.strong_queue_share:
        return True
    if not large:
        return False
    if share >= rule.queue_share:
        return True
    growth = _decode_growth(level, baseline) if level is not baseline else None
    return growth is not None and growth >= rule.preempted_decode_growth


def judge_level(level: LevelStats, baseline: LevelStats, rule: KneeRule = KneeRule()) -> LevelVerdict:
    """Capacity failure and queueing of one level, judged against the lowest level.

    The engine's own waiting count, when known, is the evidence; TTFT growth is read only when
    it is not (prefill contention also grows TTFT, and the engine can tell the two apart). A
    queue the engine reports counts when requests also waited for it: median TTFT grew by at
    least `queue_share` of a request's duration (a request that waits one scheduler step, or a
    prefill chunk's token budget, is in the engine's queue but not waiting for a slot); with a
    strong TTFT rise, any real queue the engine reports does (its waiting count is sampled, and
    short levels catch few samples).
    Examples: a mean engine queue of 3.8 at concurrency 8 with TTFT +2 s is queueing, 0.4 at 4
    is not, 1.0 at 4 with TTFT flat and decode 0.69 -> 0.79 s is (preempted for KV); with no engine figures, TTFT p50 0.04 -> 2.4 s at an e2e p50 of 3.4 s is a share of
    0.69: queueing.
    """
    failure = _capacity_failure(level, rule)
    waiting = level.engine_waiting_mean
    share = _queue_share(level, baseline) if level is not baseline else None
    if waiting is not None:
        if _engine_queue(waiting, share, level, baseline, rule):
            return LevelVerdict(
                level.concurrency,
                failure,
                f"the engine queued {waiting:.1f} requests on average at concurrency {level.concurrency}",
                True,
                True,
            )
        return LevelVerdict(level.concurrency, failure)
    if share is not None and share >= rule.queue_share:
        return LevelVerdict(
            level.concurrency,
            failure,
            f"median TTFT at concurrency {level.concurrency} grew by "
            f"{share:.0%} of a request's duration (queueing)",
            share >= rule.strong_queue_share,
        )
    return LevelVerdict(level.concurrency, failure)


def _plateau(healthy: Sequence[LevelStats], rule: KneeRule) -> tuple[LevelStats, LevelStats]:
    """(first level on the plateau, the level with the best throughput)."""
    best = max(healthy, key=lambda s: s.total_tokens_per_s)
    floor = (1.0 - rule.plateau_tolerance) * best.total_tokens_per_s
    return next(s for s in healthy if s.total_tokens_per_s >= floor), best


def _creeps(healthy: Sequence[LevelStats], index: int, rule: KneeRule) -> bool:
    """Level `index` gained less than max_queued_gain over the level below it."""
    if index == 0 or not healthy[index - 1].total_tokens_per_s:
        return index == 0
    gain = healthy[index].total_tokens_per_s / healthy[index - 1].total_tokens_per_s - 1
    return gain < rule.max_queued_gain


def _place(
    ordered: Sequence[LevelStats], verdicts: Sequence[LevelVerdict], rule: KneeRule
) -> tuple[LevelStats, str]:
    """The knee level and the reason the rule put it there (steps 1-3 of the docstring)."""
    first_failed = next((i for i, v in enumerate(verdicts) if v.capacity_failure), len(ordered))
    if first_failed == 0:
        return ordered[0], f"the lowest level already fails: {verdicts[0].capacity_failure}"
    healthy = ordered[:first_failed]
    queued = next(
        (
            i
            for i in range(len(healthy))
            if verdicts[i].strong_queueing and (verdicts[i].engine_said_so or _creeps(healthy, i, rule))
        ),
        None,
    )
    if queued == 0:
        return healthy[0], f"requests queue already at the lowest level ({verdicts[0].queueing})"
    if queued is not None:
        below = healthy[:queued]
        best = max(below, key=lambda s: s.total_tokens_per_s)
        floor = (1.0 - rule.retrograde_tolerance) * best.total_tokens_per_s
        knee = max((s for s in below if s.total_tokens_per_s >= floor), key=lambda s: s.concurrency)
        return knee, (
            f"the engine serves {knee.concurrency} at once without queueing, at "
            f"{knee.total_tokens_per_s:.1f} tok/s (within {rule.retrograde_tolerance:.0%} "
            f"of the best below the queue, {best.total_tokens_per_s:.1f}); requests "
            f"queue from concurrency {healthy[queued].concurrency}: "
            f"{verdicts[queued].queueing}"
        )
    plateau, best = _plateau(healthy, rule)
    if plateau is healthy[-1] and first_failed < len(ordered):
        return plateau, (
            f"throughput still rose up to {plateau.concurrency}, then "
            f"{verdicts[first_failed].capacity_failure}"
        )
    if plateau is healthy[-1]:
        return plateau, (
            f"throughput still rising at the highest level measured "
            f"({plateau.concurrency}: {plateau.total_tokens_per_s:.1f} tok/s); "
            "measure higher levels"
        )
    return plateau, (
        f"throughput reached its plateau at {plateau.concurrency} "
        f"({plateau.total_tokens_per_s:.1f} tok/s, within "
        f"{rule.plateau_tolerance:.0%} of the best, {best.total_tokens_per_s:.1f} "
        f"at {best.concurrency})"
    )


def _evidence(
    knee: LevelStats, ordered: Sequence[LevelStats], verdicts: Sequence[LevelVerdict], rule: KneeRule
) -> list[str]:
    """What the levels above the knee showed: the plateau, queueing, capacity errors."""
    found = []
    for level, verdict in zip(ordered, verdicts):
        if level.concurrency <= knee.concurrency:
            continue
        if verdict.capacity_failure:
            found.append(verdict.capacity_failure)
            continue
        gain = level.total_tokens_per_s / knee.total_tokens_per_s - 1 if knee.total_tokens_per_s else math.inf
        if gain < rule.plateau_tolerance / (1 - rule.plateau_tolerance):
            found.append(
                f"concurrency {level.concurrency} gained {gain:+.0%} throughput over {knee.concurrency}"
            )
        if verdict.queueing:
            found.append(verdict.queueing)
    return found


def _nearest_level(x: float, levels: Sequence[int]) -> int:
    return min(levels, key=lambda level: abs(math.log2(level) - x))


def kneedle_knee(concurrency: Sequence[int], values: Sequence[float | None], *, curve: str) -> int | None:
    """Kneedle's knee on x = log2(concurrency), snapped to a measured level; None if none."""
    points = [(math.log2(c), v) for c, v in zip(concurrency, values) if v is not None and c > 0]
    if len(points) < 3 or len({v for _, v in points}) < 2:
        return None
    try:
        from kneed import KneeLocator  # imported lazily: it pulls in scipy-sized dependencies
    except ImportError:  # a slim sidecar install (no [analysis] extra): the rule's knee stands alone
        return None

    xs, ys = zip(*points)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # kneed warns "no knee found"; None says it already
        knee = KneeLocator(xs, ys, curve=curve, direction="increasing").knee
    if knee is None or float(knee) in (xs[0], xs[-1]):
        return None  # a "knee" on the edge of the range is Kneedle finding no interior bend
    return _nearest_level(float(knee), list(concurrency))


def _explain(rule_knee: int, kneedle: int | None, levels: Sequence[int]) -> str:
    if kneedle is None:
        return "Kneedle found no bend in tokens/s over these levels; the rule's answer stands."
    if kneedle == rule_knee:
        return f"rule and Kneedle agree on {rule_knee}."
    span = f"{levels[0]}-{levels[-1]}"
    if kneedle < rule_knee:
        return (
            f"Kneedle puts the knee at {kneedle}: it normalises the whole curve over levels "
            f"{span} and sees gains shrinking there, while throughput kept rising to "
            f"{rule_knee} by more than the rule's tolerance."
        )
    return (
        f"the rule stopped at {rule_knee}; Kneedle looks only at the shape of tokens/s over "
        f"levels {span} and places the bend at {kneedle}."
    )


def detect_knee(levels: Sequence[LevelStats], rule: KneeRule = KneeRule()) -> KneeResult:
    """Knee of a gradient (levels in any order) by the rule, with Kneedle as a cross-check."""
    if not levels:
        raise ValueError("no levels to analyse; run at least one concurrency level")
    ordered = sorted(levels, key=lambda s: s.concurrency)
    verdicts = [judge_level(level, ordered[0], rule) for level in ordered]
    knee, reason = _place(ordered, verdicts, rule)
    evidence = _evidence(knee, ordered, verdicts, rule)
    if verdicts[0].capacity_failure and knee is ordered[0]:
        evidence.insert(0, verdicts[0].capacity_failure)
    conc = [s.concurrency for s in ordered]
    by_throughput = kneedle_knee(conc, [s.total_tokens_per_s for s in ordered], curve="concave")
    by_latency = kneedle_knee(conc, [s.ttft_p95_s for s in ordered], curve="convex")
    return KneeResult(
        requests=knee.concurrency,
        tokens=int(round(knee.mean_active_tokens or 0)),
        reached=bool(evidence),
        rule_reason=reason,
        kneedle_throughput=by_throughput,
        kneedle_latency=by_latency,
        agree=by_throughput in (None, knee.concurrency),
        note=_explain(knee.concurrency, by_throughput, conc),
        evidence=evidence,
    )
