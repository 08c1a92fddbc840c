"""Knee detection, table-driven: the rule's three triggers, Kneedle cross-check and its notes."""

from __future__ import annotations

import pytest

from collector.analysis.knee import KneeRule, detect_knee, kneedle_knee
from collector.analysis.levels import LevelStats


def level(c, tokens_per_s, ttft_p95=0.1, error_ratio=0.0, active=None):
    return LevelStats(c, 100, 10.0, tokens_per_s / 10, tokens_per_s / 2, tokens_per_s,
                      ttft_p95 / 2, ttft_p95, ttft_p95, 0.02, 0.03, 0.04, 1.0, 1.2, 1.3,
                      0.0, 0.0, error_ratio, active if active is not None else c * 150.0, None)


def ladder(throughputs, ttfts=None, errors=None):
    ttfts = ttfts or [0.1] * len(throughputs)
    errors = errors or [0.0] * len(throughputs)
    return [level(2 ** i, t, f, e) for i, (t, f, e) in enumerate(zip(throughputs, ttfts, errors))]


CASES = [
    # name, throughput per level (1, 2, 4, ...), p95 TTFT, error ratios, expected knee, trigger
    ("plateau at 8", [100, 200, 400, 800, 810, 805], None, None, 8, "throughput"),
    ("retrograde at 16", [100, 200, 400, 800, 1500, 1100], None, None, 16, "throughput"),
    ("TTFT doubles before throughput flattens", [100, 200, 400, 800, 1200, 1300],
     [0.1, 0.1, 0.11, 0.12, 0.5, 2.0], None, 8, "p95 TTFT"),
    ("429s appear at 32", [100, 200, 400, 800, 1600, 3000], None,
     [0, 0, 0, 0, 0.01, 0.2], 16, "error ratio"),
    ("never saturates", [100, 200, 400, 800, 1600], None, None, 16, "no level"),
]


@pytest.mark.parametrize("name, throughput, ttft, errors, knee, trigger", CASES,
                         ids=[c[0] for c in CASES])
def test_rule_places_knee(name, throughput, ttft, errors, knee, trigger):
    result = detect_knee(ladder(throughput, ttft, errors))
    assert result.requests == knee
    assert trigger in result.rule_reason
    assert result.reached == (trigger != "no level")
    assert result.tokens == knee * 150


def test_small_ttft_rise_is_noise_not_a_knee():
    # 2 ms -> 9 ms is 4.5x but only 7 ms: below the 50 ms floor, so the knee stays at 8
    levels = ladder([100, 200, 400, 800, 805], [0.002, 0.002, 0.003, 0.009, 0.5])
    assert detect_knee(levels).requests == 8
    strict = detect_knee(levels, KneeRule(min_ttft_rise_s=0.0))
    assert strict.requests == 4 and "p95 TTFT at 8" in strict.rule_reason


def test_levels_order_does_not_matter():
    levels = ladder([100, 200, 400, 800, 810])
    assert detect_knee(list(reversed(levels))).requests == 8


def test_kneedle_agrees_on_a_clean_plateau_and_the_note_says_so():
    result = detect_knee(ladder([100, 200, 400, 800, 810, 805, 808]))
    assert result.kneedle_throughput == 8 and result.agree
    assert "agree" in result.note


def test_disagreement_is_reported_with_a_reason():
    # gains shrink gradually: each step still > 5 %, so the rule goes to 32; Kneedle bends earlier
    result = detect_knee(ladder([100, 190, 340, 520, 640, 700, 720]))
    assert result.requests == 32
    assert result.kneedle_throughput is not None and result.kneedle_throughput < 32
    assert not result.agree and "5 %" in result.note


def test_kneedle_edge_result_means_no_knee():
    # exponential in log2(x): no interior bend of a concave curve
    assert kneedle_knee([1, 2, 4, 8, 16], [1, 2, 4, 8, 16], curve="concave") is None
    assert kneedle_knee([1, 2], [1, 2], curve="concave") is None


def test_no_levels_is_an_error_naming_what_to_do():
    with pytest.raises(ValueError, match="run at least one"):
        detect_knee([])


def test_a_stall_in_one_half_of_a_level_is_not_a_knee():
    from dataclasses import replace

    levels = ladder([100, 200, 400, 800, 1600, 1610], [0.02] * 6)
    # level 8: p95 0.4 s from one stalled burst, but the other half of its requests was fine
    levels[3] = replace(levels[3], ttft_p95_s=0.4, ttft_p95_persistent_s=0.02)
    assert detect_knee(levels).requests == 16
    levels[3] = replace(levels[3], ttft_p95_persistent_s=0.3)  # both halves slow: queueing
    assert detect_knee(levels).requests == 4
