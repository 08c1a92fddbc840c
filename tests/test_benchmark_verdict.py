"""benchmarks/_verdict.py: a target read off paired rounds is met, missed or undecided by the
median's distribution-free interval, never by the median alone."""

from __future__ import annotations

import doctest
import importlib.util
import math
import random
from pathlib import Path

import pytest

_PATH = Path(__file__).resolve().parents[1] / "benchmarks" / "_verdict.py"
_SPEC = importlib.util.spec_from_file_location("_verdict", _PATH)
assert _SPEC is not None and _SPEC.loader is not None
verdict_module = importlib.util.module_from_spec(_SPEC)
_SPEC.loader.exec_module(verdict_module)
median_interval, verdict = verdict_module.median_interval, verdict_module.verdict


def test_the_docstring_examples_hold():
    assert doctest.testmod(verdict_module).failed == 0


@pytest.mark.parametrize(("rounds", "k"), [(5, 1), (6, 1), (8, 1), (10, 2), (12, 3), (16, 4), (20, 6)])
def test_the_interval_is_the_narrowest_pair_of_order_statistics_with_95_percent(rounds, k):
    values = list(range(rounds))
    _, low, high, coverage = median_interval(values)
    assert (low, high) == (k - 1, rounds - k)
    tail = sum(math.comb(rounds, i) for i in range(k)) / 2**rounds
    assert coverage == round(1 - 2 * tail, 4)
    if rounds >= 6:  # five rounds cannot reach 95 %: the range is all there is
        assert coverage >= 0.95
        narrower = 1 - 2 * (tail + math.comb(rounds, k) / 2**rounds)
        assert narrower < 0.95


def test_a_median_over_the_target_is_not_met_while_its_interval_reaches_under_it():
    rounds = [0.90, 0.93, 0.94, 0.96, 0.96, 0.97, 0.97, 0.98, 0.99, 1.00, 1.01, 1.02]
    assert median_interval(rounds)[0] > 0.95
    assert verdict(rounds, at_least=0.95) == "undecided"
    assert verdict([x + 0.03 for x in rounds], at_least=0.95) == "met"
    assert verdict([x - 0.08 for x in rounds], at_least=0.95) == "missed"


def test_an_upper_target_reads_the_other_side():
    rounds = [1.10, 1.12, 1.13, 1.15, 1.16, 1.17, 1.18, 1.19, 1.20, 1.21, 1.30, 1.40]
    assert verdict(rounds, at_most=1.2) == "undecided"  # x(10) = 1.21
    assert verdict(rounds[:10] + [1.19, 1.18], at_most=1.2) == "met"
    assert verdict([x + 0.2 for x in rounds], at_most=1.2) == "missed"


def test_the_interval_holds_the_true_median_about_as_often_as_it_says():
    rng = random.Random(7)
    held = sum(
        low <= 1.0 <= high
        for low, high in (
            median_interval([rng.gauss(1.0, 0.05) for _ in range(12)])[1:3] for _ in range(2000)
        )
    )
    assert 0.94 <= held / 2000 <= 0.985  # 96.1 % for 12 rounds


def test_no_rounds_and_no_target_are_errors():
    with pytest.raises(ValueError, match="no rounds"):
        median_interval([])
    with pytest.raises(ValueError, match="give a target"):
        verdict([1.0])
