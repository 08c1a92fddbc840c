"""The probe's early-stop rule, table-driven: when is a level 'clearly saturated', and why."""

from __future__ import annotations

import pytest

from collector.analysis.levels import LevelStats
from collector.analysis.probe import ProbeSettings, saturation_reason
from collector.analysis.slo import Slo


def _stats(ttft_p95_s=None, error_ratio=0.0, persistent=None, concurrency=8) -> LevelStats:
    return LevelStats(concurrency, 100, 10.0, 10.0, 100.0, 200.0, None, ttft_p95_s, None,
                      None, None, None, None, None, None, 0.0, 0.0, error_ratio, None, None,
                      persistent)


NO_SLO = ProbeSettings(url="http://x")
SLO_2S = ProbeSettings(url="http://x", slo=Slo(ttft_p95_s=2.0))


@pytest.mark.parametrize("stats,baseline,settings,expected", [
    # error ratio at the threshold stops, whatever the latency
    (_stats(0.1, error_ratio=0.25), 0.1, NO_SLO, "error ratio 25% at concurrency 8"),
    (_stats(0.1, error_ratio=0.24), 0.1, NO_SLO, None),
    # no SLO: 10 x the low-load p95 (0.1 s -> 1.0 s) is the limit
    (_stats(1.01), 0.1, NO_SLO, "far beyond low-load p95 (limit 1.000 s)"),
    (_stats(0.99), 0.1, NO_SLO, None),
    # a tiny baseline is floored at 50 ms so scheduler noise does not stop a healthy probe
    (_stats(0.04), 0.001, NO_SLO, None),
    (_stats(0.06), 0.001, NO_SLO, "limit 0.050 s"),
    # with an SLO: 10 x SLO / 3 (2 s -> 6.667 s), whatever the baseline
    (_stats(6.7), 0.1, SLO_2S, "far beyond the SLO (limit 6.667 s)"),
    (_stats(6.6), 0.1, SLO_2S, None),
    # one stall in half a level does not count: the persistent p95 is used when present
    (_stats(5.0, persistent=0.5), 0.1, NO_SLO, None),
    # nothing to compare with: no baseline, no SLO, or no TTFT at all
    (_stats(100.0), None, NO_SLO, None),
    (_stats(None), 0.1, SLO_2S, None),
])
def test_saturation_reason(stats, baseline, settings, expected):
    reason = saturation_reason(stats, baseline, settings)
    if expected is None:
        assert reason is None
    else:
        assert reason is not None and expected in reason
