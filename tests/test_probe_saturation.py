"""The probe's early-stop rule, table-driven: when is a level 'clearly saturated', and why.

Latency growth alone never stops the probe (a compute-bound engine slows with every request it
batches and still gains throughput); capacity errors, queueing past the knee, or a p95 far
beyond an explicit SLO do.
"""

from __future__ import annotations

import pytest

from collector.analysis.probe import ProbeSettings, saturation_reason
from collector.capacity import LevelStats, Slo


def _stats(
    concurrency,
    tokens_per_s,
    *,
    ttft_p50=0.05,
    ttft_p95=None,
    e2e_p50=1.0,
    capacity_errors=0,
    samples=100,
    persistent=None,
    waiting=None,
) -> LevelStats:
    return LevelStats(
        concurrency,
        samples,
        10.0,
        1.0,
        tokens_per_s / 2,
        tokens_per_s,
        ttft_p50,
        ttft_p95 if ttft_p95 is not None else ttft_p50 * 1.5,
        None,
        None,
        None,
        None,
        e2e_p50,
        None,
        None,
        0.0,
        0.0,
        capacity_errors / samples,
        None,
        None,
        persistent,
        capacity_errors,
        waiting,
    )


def _ladder(*last: LevelStats) -> list[LevelStats]:
    return [_stats(1, 100), _stats(2, 190), _stats(4, 380), *last]


NO_SLO = ProbeSettings(url="http://x")
SLO_2S = ProbeSettings(url="http://x", slo=Slo(ttft_p95_s=2.0))


@pytest.mark.parametrize(
    "levels,settings,expected",
    [
        # capacity errors: a quarter of the level, and at least a handful
        (_ladder(_stats(8, 700, capacity_errors=25)), NO_SLO, "25 capacity errors"),
        (_ladder(_stats(8, 700, capacity_errors=24)), NO_SLO, None),
        (_ladder(_stats(8, 700, capacity_errors=2, samples=4)), NO_SLO, None),  # 50 %, but only 2
        # plateau and queueing above it: more load only waits
        (_ladder(_stats(8, 390, ttft_p50=0.8, e2e_p50=1.6)), NO_SLO, "stopped rising at 4"),
        (_ladder(_stats(8, 390, waiting=3.5, ttft_p50=0.3)), NO_SLO, "engine queued 3.5 requests"),
        (_ladder(_stats(8, 390, waiting=3.5)), NO_SLO, None),  # queued a step, never waited
        # a plateau without queueing, or queueing while throughput still rises: keep measuring
        (_ladder(_stats(8, 390)), NO_SLO, None),
        (_ladder(_stats(8, 700, ttft_p50=0.8, e2e_p50=1.6)), NO_SLO, None),
        # TTFT 20x the low-load value, no queueing, no SLO: batching cost, not saturation
        (_ladder(_stats(8, 700, ttft_p50=0.3, ttft_p95=1.0, e2e_p50=3.0)), NO_SLO, None),
        # with an SLO: 10 x SLO / 3 (2 s -> 6.667 s) on the persistent p95 when known
        (_ladder(_stats(8, 700, ttft_p95=6.7)), SLO_2S, "far beyond the SLO (limit 6.667 s)"),
        (_ladder(_stats(8, 700, ttft_p95=6.6)), SLO_2S, None),
        (_ladder(_stats(8, 700, ttft_p95=9.0, persistent=0.5)), SLO_2S, None),
    ],
)
def test_saturation_reason(levels, settings, expected):
    reason = saturation_reason(levels, settings)
    if expected is None:
        assert reason is None
    else:
        assert reason is not None and expected in reason
