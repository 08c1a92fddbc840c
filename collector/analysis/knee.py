"""Knee of a concurrency gradient: a documented rule, cross-checked with Kneedle.

The rule (method and caveats: docs/domain.md §7): walk the levels upward; the knee is the last level before one where
  * total tokens/s < 1.05 x the previous level's (throughput stopped rising), or
  * p95 TTFT > 2 x its low-load value and at least 50 ms above it (queueing began), or
    (both read as LevelStats.ttft_p95_persistent_s when known: the rise must show in both halves
    of the level's requests, so one scheduling stall on a busy host is not a knee)
  * the error ratio (429s, timeouts, failures) exceeds 5 %.
If no level trips the rule the knee is the highest level measured and `reached` is False.

Kneedle (the `kneed` package) runs on x = log2(concurrency): tokens/s as a concave increasing
curve, p95 TTFT as a convex increasing one. It judges the shape of the whole curve, so it shifts
with the range of levels and ignores latency; the rule judges each step. Both are reported, and
`note` says why they differ when they do. The rule's answer is the knee.
"""

from __future__ import annotations

import math
import warnings
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from typing import Any

from collector.analysis.levels import LevelStats

__all__ = ["KneeRule", "KneeResult", "detect_knee", "kneedle_knee"]


@dataclass(frozen=True)
class KneeRule:
    """Thresholds of the knee rule; docs/domain.md §7 discusses the defaults."""

    min_throughput_gain: float = 1.05
    ttft_factor: float = 2.0
    min_ttft_rise_s: float = 0.05  # a rise under 50 ms is scheduling noise no user notices
    max_error_ratio: float = 0.05


@dataclass(frozen=True)
class KneeResult:
    """The knee in both calibers, how each method placed it, and why they differ."""

    requests: int
    tokens: int
    reached: bool
    rule_reason: str
    kneedle_throughput: int | None
    kneedle_latency: int | None
    agree: bool
    note: str

    def to_dict(self) -> dict[str, Any]:
        """Plain dict for JSON."""
        return asdict(self)


def _tripped(prev: LevelStats, cur: LevelStats, baseline_ttft: float | None,
             rule: KneeRule) -> str | None:
    if cur.error_ratio > rule.max_error_ratio:
        return (f"error ratio {cur.error_ratio:.0%} at concurrency {cur.concurrency} "
                f"> {rule.max_error_ratio:.0%}")
    if cur.total_tokens_per_s < rule.min_throughput_gain * prev.total_tokens_per_s:
        return (f"throughput at {cur.concurrency} ({cur.total_tokens_per_s:.1f} tok/s) < "
                f"{rule.min_throughput_gain} x level {prev.concurrency} "
                f"({prev.total_tokens_per_s:.1f} tok/s)")
    ttft = _ttft(cur)
    if baseline_ttft is not None and ttft is not None and ttft > rule.ttft_factor * baseline_ttft \
            and ttft - baseline_ttft >= rule.min_ttft_rise_s:
        return (f"p95 TTFT at {cur.concurrency} ({ttft:.3f} s) > {rule.ttft_factor} x "
                f"low-load p95 ({baseline_ttft:.3f} s)")
    return None


def _ttft(level: LevelStats) -> float | None:
    """The p95 TTFT the rule reads: the persistent one when the level had enough samples."""
    return level.ttft_p95_s if level.ttft_p95_persistent_s is None else level.ttft_p95_persistent_s


def _nearest_level(x: float, levels: Sequence[int]) -> int:
    return min(levels, key=lambda level: abs(math.log2(level) - x))


def kneedle_knee(concurrency: Sequence[int], values: Sequence[float | None], *,
                 curve: str) -> int | None:
    """Kneedle's knee on x = log2(concurrency), snapped to a measured level; None if none."""
    points = [(math.log2(c), v) for c, v in zip(concurrency, values) if v is not None and c > 0]
    if len(points) < 3 or len({v for _, v in points}) < 2:
        return None
    from kneed import KneeLocator  # imported lazily: it pulls in scipy-sized dependencies

    xs, ys = zip(*points)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # kneed warns "no knee found"; None says it already
        knee = KneeLocator(xs, ys, curve=curve, direction="increasing").knee
    if knee is None or float(knee) in (xs[0], xs[-1]):
        return None  # a "knee" on the edge of the range is Kneedle finding no interior bend
    return _nearest_level(float(knee), list(concurrency))


def _explain(rule_knee: int, reason: str, kneedle: int | None, levels: Sequence[int]) -> str:
    if kneedle is None:
        return "Kneedle found no bend in tokens/s over these levels; the rule's answer stands."
    if kneedle == rule_knee:
        return f"rule and Kneedle agree on {rule_knee}."
    span = f"{levels[0]}-{levels[-1]}"
    if kneedle < rule_knee:
        return (f"Kneedle puts the knee at {kneedle}: it normalises the whole curve over levels "
                f"{span} and sees gains shrinking there, while each step up to {rule_knee} still "
                f"gained at least 5 %, so the rule kept going.")
    return (f"the rule stopped at {rule_knee} ({reason}); Kneedle looks only at the shape of "
            f"tokens/s over levels {span} and places the bend at {kneedle}.")


def detect_knee(levels: Sequence[LevelStats], rule: KneeRule = KneeRule()) -> KneeResult:
    """Knee of a gradient (levels in any order) by the rule, with Kneedle as a cross-check."""
    if not levels:
        raise ValueError("no levels to analyse; run at least one concurrency level")
    ordered = sorted(levels, key=lambda s: s.concurrency)
    baseline = _ttft(ordered[0])
    knee, reason, reached = ordered[-1], f"no level tripped the rule up to {ordered[-1].concurrency}", False
    if ordered[0].error_ratio > rule.max_error_ratio:
        knee, reason, reached = ordered[0], "the lowest level already failed", True
    else:
        for prev, cur in zip(ordered, ordered[1:]):
            why = _tripped(prev, cur, baseline, rule)
            if why:
                knee, reason, reached = prev, why, True
                break
    conc = [s.concurrency for s in ordered]
    by_throughput = kneedle_knee(conc, [s.total_tokens_per_s for s in ordered], curve="concave")
    by_latency = kneedle_knee(conc, [s.ttft_p95_s for s in ordered], curve="convex")
    return KneeResult(
        requests=knee.concurrency, tokens=int(round(knee.mean_active_tokens or 0)),
        reached=reached, rule_reason=reason, kneedle_throughput=by_throughput,
        kneedle_latency=by_latency, agree=by_throughput in (None, knee.concurrency),
        note=_explain(knee.concurrency, reason, by_throughput, conc),
    )
