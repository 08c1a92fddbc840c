"""Knee detection, table-driven: both engine regimes, transient and capacity errors, queueing
evidence, the llama.cpp shape, and the Kneedle cross-check with its notes."""

from __future__ import annotations

from dataclasses import replace

import pytest

from collector.analysis.knee import KneeRule, detect_knee, judge_level, kneedle_knee
from collector.capacity import LevelStats


def level(
    c,
    tokens_per_s,
    ttft_p95=None,
    *,
    ttft_p50=0.05,
    e2e_p50=1.0,
    errors=0.0,
    capacity_errors=0,
    waiting=None,
    samples=100,
    active=None,
    error_ratio=None,
):
    """One level; positional (c, tokens/s, p95 TTFT) as the other analysis tests use it."""
    errors = error_ratio if error_ratio is not None else errors
    ttft_p95 = ttft_p95 if ttft_p95 is not None else ttft_p50 * 1.5
    return LevelStats(
        concurrency=c,
        samples=samples,
        window_s=10.0,
        requests_per_s=tokens_per_s / 100,
        output_tokens_per_s=tokens_per_s / 2,
        total_tokens_per_s=tokens_per_s,
        ttft_p50_s=ttft_p50,
        ttft_p95_s=ttft_p95,
        ttft_p99_s=ttft_p95,
        tpot_p50_s=0.02,
        tpot_p95_s=0.03,
        tpot_p99_s=0.04,
        e2e_p50_s=e2e_p50,
        e2e_p95_s=e2e_p50 * 1.2,
        e2e_p99_s=e2e_p50 * 1.3,
        rate_limited_ratio=0.0,
        timeout_ratio=0.0,
        error_ratio=errors,
        mean_active_tokens=active if active is not None else c * 150.0,
        littles_law=None,
        capacity_errors=capacity_errors,
        engine_waiting_mean=waiting,
    )


def ladder(throughputs, ttft_p95=None, **per_level):
    """Levels 1, 2, 4, ... with per-level lists of keyword values (None = the default)."""
    if ttft_p95 is not None:
        per_level["ttft_p95"] = ttft_p95
    levels = []
    for i, tps in enumerate(throughputs):
        kwargs = {k: v[i] for k, v in per_level.items() if v[i] is not None}
        levels.append(level(2**i, tps, **kwargs))
    return levels


# The llama.cpp capture (docs/capacity.md): 4 slots, 128 output tokens, 2 CPU cores. TTFT grows
# with the batch before anything waits (compute-bound), then jumps when requests wait for a slot.
LLAMACPP = dict(
    ttft_p50=[0.07, 0.09, 0.15, 2.4], ttft_p95=[0.08, 0.11, 0.18, 2.5], e2e_p50=[1.2, 2.2, 3.3, 5.8]
)
# The simulator's memory-bound profile with 8 slots: flat TTFT until the batch is full.
MEMORY_BOUND = dict(
    ttft_p50=[0.006, 0.006, 0.007, 0.008, 0.2, 0.6], e2e_p50=[0.41, 0.41, 0.41, 0.42, 0.62, 1.1]
)

CASES = [
    # name, throughput per level (1, 2, 4, ...), per-level keywords, knee, reached, reason
    (
        "memory-bound: full batch at 8",
        [313, 622, 1243, 2478, 2522, 2525],
        MEMORY_BOUND,
        8,
        True,
        "serves 8 at once",
    ),
    (
        "memory-bound without queueing evidence",
        [313, 622, 1243, 2478, 2522, 2525],
        {},
        8,
        True,
        "plateau at 8",
    ),
    ("compute-bound llama.cpp: 4, not 2", [107, 116, 154, 150], LLAMACPP, 4, True, "serves 4 at once"),
    (
        "compute-bound with the engine's waiting count",
        [107, 116, 154, 150],
        LLAMACPP | {"waiting": [0.0, 0.1, 0.3, 3.9]},
        4,
        True,
        "engine queued 3.9 requests",
    ),
    # measured here: 2 CPU cores, 2 threads, 64 tokens; throughput nearly flat from 1
    (
        "compute-bound, flat throughput",
        [54.7, 57.5, 59.1, 56.8],
        dict(ttft_p50=[0.043, 0.091, 0.193, 3.495], e2e_p50=[1.15, 2.24, 3.27, 6.85]),
        4,
        True,
        "serves 4 at once",
    ),
    # measured on a Zen 5 core (AVX-512), 1 thread, 2 slots: one request decodes faster alone
    # than two together (164 -> 113 total tok/s), and both are still served at once
    (
        "compute-bound, one request faster alone than two",
        [164.1, 113.2, 112.1],
        dict(waiting=[0.0, 0.0, 2.0], ttft_p50=[0.038, 0.062, 1.047], e2e_p50=[0.33, 0.96, 1.9]),
        2,
        True,
        "serves 2 at once",
    ),
    # the same core, 4 slots: down at 2, partly back at 4, queueing at 8
    (
        "compute-bound, retrograde then recovering below the queue",
        [176.5, 124.5, 141.2, 145.0],
        dict(
            waiting=[0.0, 0.0, 0.0, 1.9],
            ttft_p50=[0.029, 0.06, 0.119, 0.929],
            e2e_p50=[0.32, 0.9, 1.6, 2.5],
        ),
        4,
        True,
        "serves 4 at once",
    ),
    # measured here with 1 thread: the queue keeps the batch fuller, throughput creeps up at 8
    (
        "compute-bound, throughput creeping past the slots",
        [37.6, 37.0, 43.3, 48.6],
        dict(ttft_p50=[0.052, 0.128, 0.315, 2.915], e2e_p50=[0.83, 1.75, 2.86, 5.41]),
        4,
        True,
        "queue from concurrency 8",
    ),
    (
        "TTFT tripling with the batch is not a knee",
        [100, 190, 360, 700, 1300, 1320],
        dict(ttft_p50=[0.05, 0.08, 0.15, 0.3, 0.4, 1.5], e2e_p50=[2, 2, 2.2, 2.4, 2.6, 3.6]),
        16,
        True,
        "serves 16 at once",
    ),
    (
        "prefill contention while throughput doubles is not a queue",
        [100, 200, 400, 800],
        dict(ttft_p50=[0.05, 0.1, 0.8, 2.0], e2e_p50=[1.0, 1.5, 2.0, 3.0]),
        8,
        False,
        "still rising",
    ),
    (
        "12 slots on a 1-2-4 ladder: the engine's queue at 16",
        [100, 200, 400, 800, 1200, 1210],
        dict(waiting=[0, 0, 0.1, 0.4, 3.8, 19.5], ttft_p50=[0.05, 0.05, 0.05, 0.05, 0.4, 1.3]),
        8,
        True,
        "queue from concurrency 16",
    ),
    # the simulator KV-bound (4 slots, 512 KV tokens, 220-token answers): at 4 one request is
    # always preempted, TTFT stays flat (it already had its first token), decode slows 14 %
    (
        "KV preemption: a queue after the first token",
        [330, 660, 1166, 1163],
        dict(
            waiting=[0.0, 0.0, 1.0, 4.8],
            ttft_p50=[0.0059, 0.0060, 0.0064, 0.7955],
            e2e_p50=[0.7006, 0.7009, 0.7956, 1.5898],
        ),
        2,
        True,
        "queue from concurrency 4",
    ),
    (
        "a queue of one at 8 slots' level 8 while decode is flat is no preemption",
        [313, 622, 1243, 2478, 2522],
        dict(
            waiting=[0.0, 0.0, 0.0, 1.0, 4.0],
            ttft_p50=[0.006, 0.006, 0.007, 0.008, 0.2],
            e2e_p50=[0.41, 0.41, 0.41, 0.42, 0.62],
        ),
        8,
        True,
        "serves 8 at once",
    ),
    ("retrograde at 16", [100, 200, 400, 800, 1500, 1100], {}, 16, True, "plateau at 16"),
    (
        "queueing before throughput flattened",
        [100, 200, 400, 800, 1200, 1300],
        dict(ttft_p50=[0.05, 0.05, 0.05, 0.06, 0.2, 1.0]),
        16,
        True,
        "queue from concurrency 32",
    ),
    (
        "a collapse below the queue (thrashing: less than half the best)",
        [100, 200, 400, 180, 150],
        dict(ttft_p50=[0.05, 0.05, 0.05, 0.06, 1.0]),
        4,
        True,
        "serves 4 at once",
    ),
    (
        "a handful of 429s at 32",
        [100, 200, 400, 800, 1600, 3000],
        dict(capacity_errors=[0, 0, 0, 0, 1, 20]),
        16,
        True,
        "capacity errors",
    ),
    (
        "the lowest level already fails",
        [100, 120, 110],
        dict(capacity_errors=[40, 60, 70]),
        1,
        True,
        "lowest level already fails",
    ),
    ("never saturates", [100, 200, 400, 800, 1600], {}, 16, False, "still rising"),
    (
        "one transient error at every level",
        [313, 622, 1243, 2478, 2522, 2525],
        MEMORY_BOUND | {"errors": [0.05] * 6, "capacity_errors": [1] * 6},
        8,
        True,
        "serves 8 at once",
    ),
    (
        "one transient error at every level, compute-bound",
        [107, 116, 154, 150],
        LLAMACPP | {"errors": [0.05] * 4, "capacity_errors": [1] * 4},
        4,
        True,
        "serves 4 at once",
    ),
    (
        "resets are not capacity errors",
        [107, 116, 154, 150],
        LLAMACPP | {"errors": [0.5, 0.0, 0.0, 0.0]},
        4,
        True,
        "serves 4 at once",
    ),
]


@pytest.mark.parametrize(
    "name, throughput, per_level, knee, reached, reason", CASES, ids=[c[0] for c in CASES]
)
def test_rule_places_knee(name, throughput, per_level, knee, reached, reason):
    result = detect_knee(ladder(throughput, **per_level))
    assert result.requests == knee, result.rule_reason
    assert reason in result.rule_reason
    assert result.reached == reached
    assert result.tokens == knee * 150
    assert bool(result.evidence) == reached


def test_llamacpp_evidence_names_the_queue_and_the_flat_throughput():
    result = detect_knee(ladder([107, 116, 154, 150], **LLAMACPP))
    assert any("gained -3%" in e for e in result.evidence)
    assert any("TTFT at concurrency 8 grew by" in e for e in result.evidence)


def test_the_old_latency_ratio_rule_would_have_said_2():
    # the corrected brief's point: 0.18 > 2 x 0.08 at 4 is batching cost, not a knee
    levels = ladder([107, 116, 154, 150], **LLAMACPP)
    assert levels[2].ttft_p95_s > 2 * levels[0].ttft_p95_s
    assert detect_knee(levels).requests == 4


@pytest.mark.parametrize(
    "errors, samples, fails",
    [
        (1, 20, False),  # one error is never a knee, even at 5 %
        (2, 20, False),  # two are not a handful
        (3, 20, True),  # three of twenty (15 %)
        (3, 100, False),  # three of a hundred is under 5 %
        (6, 100, True),
    ],
)
def test_capacity_errors_need_a_handful_and_a_share(errors, samples, fails):
    lv = level(4, 100, capacity_errors=errors, samples=samples)
    verdict = judge_level(lv, level(1, 50))
    assert (verdict.capacity_failure is not None) == fails


@pytest.mark.parametrize(
    "ttft_p50, e2e_p50, waiting, queueing, strong",
    [
        (0.05, 1.0, None, False, False),  # the baseline itself
        (0.15, 1.0, None, False, False),  # +0.1 s of a 1 s request: batching, not waiting
        (0.25, 1.0, None, True, False),  # +20 %: weak evidence
        (0.40, 1.0, None, True, True),  # +35 %: requests wait for a slot
        (0.05, 1.0, 0.7, False, False),  # arrivals waiting for the next step: no queue
        (0.05, 1.0, 1.5, False, False),  # 1.5 waiting at concurrency 8 is under 20 %
        (0.25, 1.0, 3.0, True, True),  # the engine says requests wait, and they waited
        (0.05, 1.0, 3.0, False, False),  # in the engine's queue for a step, not for a slot
    ],
)
def test_queueing_evidence(ttft_p50, e2e_p50, waiting, queueing, strong):
    verdict = judge_level(
        level(8, 100, ttft_p50=ttft_p50, e2e_p50=e2e_p50, waiting=waiting), level(1, 50, ttft_p50=0.05)
    )
    assert (verdict.queueing is not None) == queueing
    assert verdict.strong_queueing == strong


def test_tolerance_is_a_parameter():
    levels = ladder([100, 200, 400, 800, 830, 850])
    assert detect_knee(levels).requests == 16  # 830 is within 5 % of 850
    assert detect_knee(levels, KneeRule(plateau_tolerance=0.01)).requests == 32


def test_levels_order_does_not_matter():
    levels = ladder([100, 200, 400, 800, 810])
    assert detect_knee(list(reversed(levels))).requests == 8


def test_kneedle_agrees_on_a_clean_plateau_and_the_note_says_so():
    result = detect_knee(ladder([100, 200, 400, 800, 810, 805, 808]))
    assert result.kneedle_throughput == 8 and result.agree
    assert "agree" in result.note


def test_disagreement_is_reported_with_a_reason():
    # gains shrink gradually: throughput keeps rising past the tolerance to 32; Kneedle bends earlier
    result = detect_knee(ladder([100, 190, 340, 520, 640, 700, 720]))
    assert result.requests == 32
    assert result.kneedle_throughput is not None and result.kneedle_throughput < 32
    assert not result.agree and "tolerance" in result.note


def test_kneedle_edge_result_means_no_knee():
    # exponential in log2(x): no interior bend of a concave curve
    assert kneedle_knee([1, 2, 4, 8, 16], [1, 2, 4, 8, 16], curve="concave") is None
    assert kneedle_knee([1, 2], [1, 2], curve="concave") is None


def test_no_levels_is_an_error_naming_what_to_do():
    with pytest.raises(ValueError, match="run at least one"):
        detect_knee([])


def test_a_latency_stall_in_one_level_does_not_move_the_knee():
    levels = ladder([100, 200, 400, 800, 1600, 1610])
    levels[3] = replace(levels[3], ttft_p95_s=4.0, ttft_p95_persistent_s=0.05)
    assert detect_knee(levels).requests == 16
