"""The open-loop analysis (collector.analysis.openloop) against the simulator's truth.

Ten seeded simulator configurations, both cost regimes, run in simulated time
(support.offline): the closed loop at the knee gives the mean e2e that brackets the offered
rates (Little's law), Poisson arrivals at each rate give a level, and μ_slo must be within 10 % of
the simulator's analytic rate (collector.sim.cost.predicted_rate) with the Little's-law check
consistent. The same analysis reads the probe's rows over HTTP (tests/test_openloop_sim.py).
"""

from __future__ import annotations

from dataclasses import replace
from datetime import timedelta

import pytest
from support.offline import Mix, closed_loop_rows, poisson_rows

from collector.analysis.openloop import (
    bracket_rates,
    little_check,
    parse_rates,
    rate_level,
    rate_levels_from_rows,
    rate_result,
)
from collector.analysis.stats import seconds
from collector.capacity import Slo
from collector.sim.config import SimConfig

# (cost profile, max_num_seqs, prompt tokens, output tokens, seed)
CONFIGS = [
    ("gpu", 2, 40, 64, 11),
    ("gpu", 4, 120, 32, 12),
    ("gpu", 8, 40, 64, 13),
    ("gpu", 12, 300, 48, 14),
    ("gpu", 16, 80, 128, 15),
    ("cpu", 2, 40, 32, 16),
    ("cpu", 3, 100, 24, 17),
    ("cpu", 4, 40, 64, 18),
    ("cpu", 6, 200, 16, 19),
    ("cpu", 8, 40, 32, 20),
]
LEVEL_REQUESTS = 400  # requests' worth of time per rate level (simulated: costs ~no wall time)


def tagged(rows: list[dict], rate: float, warm_until_s: float) -> list[dict]:
    """Offline traffic rows renamed as the probe names an open-loop level's requests."""
    start = min(seconds(r["admitted_at"]) for r in rows)
    for n, row in enumerate(rows):
        warm = seconds(row["admitted_at"]) - start < warm_until_s
        row.update(request_id=f"probe-x-{n:06d}", source="probe", probe_rate_per_s=rate, probe_warmup=warm)
    return rows


def offline_level(config: SimConfig, mix: Mix, rate: float, mu: float, seed: int) -> list[dict]:
    duration = LEVEL_REQUESTS / mu
    rows = poisson_rows(config, lambda t: rate, duration, mix, seed=seed)
    return tagged(rows, rate, 0.15 * duration)


@pytest.mark.parametrize(("profile", "seqs", "prompt", "output", "seed"), CONFIGS)
def test_mu_slo_matches_the_simulators_analytic_rate(profile, seqs, prompt, output, seed):
    config = SimConfig(max_num_seqs=seqs, cost_profile=profile, seed=seed, max_waiting=10_000)
    mix = Mix(prompt_tokens=prompt, output_tokens=output)
    truth = config.predicted_rate(prompt, output)
    # the closed loop at the knee: its mean e2e brackets the rates (knee / e2e by Little's law)
    closed = closed_loop_rows(config, [seqs], 60 / truth.requests_per_s * seqs, mix, seed=seed)
    e2e = [r["e2e_s"] for r in closed if not r["probe_warmup"]]
    e2e_at_knee = sum(e2e) / len(e2e)
    rows, levels = [], []
    for rate in bracket_rates(seqs, e2e_at_knee):
        level_rows = offline_level(config, mix, rate, truth.requests_per_s, seed)
        rows.append(level_rows)
        (level,) = rate_levels_from_rows(level_rows, batch=seqs)
        levels.append(level)
        if level.why_not:
            break
    result = rate_result(levels)
    assert result.mu_slo_per_s is not None, result.reason
    print(f"{profile} {seqs}: μ_slo {result.mu_slo_per_s:.3f} vs analytic {truth.requests_per_s:.3f}")
    assert result.mu_slo_per_s == pytest.approx(truth.requests_per_s, rel=0.10), (
        [(lv.offered_per_s, round(lv.outstanding_growth, 1)) for lv in levels],
        truth,
    )
    assert result.prefill_tokens_per_s == pytest.approx(result.mu_slo_per_s * prompt, rel=0.10)
    check = little_check(seqs, e2e_at_knee, result.mu_slo_per_s)
    assert check.consistent, check
    # past μ the queue drifts: the level above μ_slo is the one that failed, and for drift
    failed = next(lv for lv in levels if lv.why_not)
    assert failed.drifting and "queue drifts" in (failed.why_not or "")


@pytest.mark.parametrize(("profile", "seqs", "prompt", "output", "seed"), CONFIGS)
def test_a_level_cut_short_past_mu_reads_the_saturation_throughput_at_a_full_batch(
    profile, seqs, prompt, output, seed
):
    """An overload stop cuts a level past μ to a few seconds, while the batch still fills (the probe
    on llama-server: 3.6 s); its window's completions understate the saturation throughput (here
    down to 0.43 of μ), the answers at a full batch through the drain do not."""
    config = SimConfig(max_num_seqs=seqs, cost_profile=profile, seed=seed, max_waiting=10_000)
    mix = Mix(prompt_tokens=prompt, output_tokens=output)
    truth = config.predicted_rate(prompt, output).requests_per_s
    rate, duration = 1.3 * truth, 30 / truth  # 30 requests' worth, then the drain
    rows = tagged(poisson_rows(config, lambda t: rate, duration, mix, seed=seed), rate, 0.15 * duration)
    measured = [seconds(r["admitted_at"]) for r in rows if not r["probe_warmup"]]
    window = (min(measured), max(measured))
    cut = rate_level(rows, rate, window, batch=seqs, ended_early="overload")
    assert cut.full_batch_per_s == pytest.approx(truth, rel=0.10), (cut.full_batch_per_s, cut.achieved_per_s)
    assert cut.why_not and "ended early" in cut.why_not
    # a level at 1.2 μ that passed by luck below it: μ_slo capped at the full batch's throughput
    capped = rate_result([replace(cut, offered_per_s=1.2 * truth, ended_early=None, why_not=None), cut])
    assert capped.mu_slo_per_s == cut.full_batch_per_s and "at a full batch" in capped.reason


def level_rows(at: list[tuple[float, float]], prompt: int = 100, cached: int | None = None) -> list[dict]:
    """Rows admitted and completed at the given seconds (first token 0.1 s after admission)."""
    from support.offline import START

    return [
        {
            "request_id": f"probe-x-{n:06d}",
            "probe_rate_per_s": 2.0,
            "probe_warmup": False,
            "admitted_at": START + timedelta(seconds=a),
            "first_token_at": START + timedelta(seconds=a + 0.1),
            "completed_at": START + timedelta(seconds=c),
            "outcome": "ok",
            "status_code": 200,
            "prompt_tokens": prompt,
            "cached_prompt_tokens": cached,
            "ttft_s": 0.1,
            "tpot_s": 0.01,
            "e2e_s": c - a,
            "engine_waiting_at_admit": 0,
        }
        for n, (a, c) in enumerate(at)
    ]


def test_a_steady_level_neither_drifts_nor_fails_and_counts_uncached_prefill():
    rows = level_rows([(i * 0.5, i * 0.5 + 0.4) for i in range(40)], prompt=100, cached=25)
    start, end = seconds(rows[0]["admitted_at"]), seconds(rows[-1]["admitted_at"])
    level = rate_level(rows, 2.0, (start, end), slo=Slo(ttft_p95_s=0.2))
    assert not level.drifting and level.why_not is None and level.meets_slo
    assert level.sent == 40 and level.achieved_per_s == pytest.approx(2.0, rel=0.05)
    assert level.prefill_tokens_per_s == pytest.approx(2.0 * 75, rel=0.05)  # 25 of 100 cached
    assert level.cached_prompt_share == pytest.approx(0.25)
    assert level.outstanding_max == 1


def test_a_growing_backlog_drifts_and_a_tight_slo_fails_the_level():
    # arrivals every 0.5 s, answers every 1 s: the backlog grows by one request per second
    rows = level_rows([(i * 0.5, 1.0 + i * 1.0) for i in range(40)])
    start, end = seconds(rows[0]["admitted_at"]), seconds(rows[-1]["admitted_at"])
    level = rate_level(rows, 2.0, (start, end), slo=Slo(ttft_p95_s=0.05))
    assert level.drifting and level.outstanding_growth > 15
    assert "queue drifts" in level.why_not and "p95 TTFT 0.100 s > SLO 0.05 s" in level.why_not
    assert not level.meets_slo
    with pytest.raises(ValueError, match="not after start"):
        rate_level(rows, 2.0, (end, start))


def test_mu_slo_is_the_top_of_the_passing_run_from_the_lowest_rate():
    steady = level_rows([(i * 0.5, i * 0.5 + 0.4) for i in range(40)])
    drifting = level_rows([(i * 0.5, 1.0 + i * 1.0) for i in range(40)])
    window = (seconds(steady[0]["admitted_at"]), seconds(steady[-1]["admitted_at"]))
    ok = rate_level(steady, 0.5, window)
    bad = rate_level(drifting, 2.0, window)
    ok_again = rate_level(steady, 3.0, window)
    result = rate_result([ok, bad, ok_again])
    assert result.mu_slo_per_s == 0.5 and "2/s fails" in result.reason
    # V_P at μ_slo: the offered rate x the level's uncached prompt tokens per request (these rows
    # arrive at 2/s, not the 0.5/s offered: the measured tokens/s would be 4x V_P)
    assert ok.prefill_tokens_per_request == 100 and ok.prefill_tokens_per_s == pytest.approx(200.0)
    assert result.prefill_tokens_per_s == pytest.approx(0.5 * 100)
    # a level that passed above what the drifting one completed: capped at that completion rate
    capped = rate_result([rate_level(steady, 1.5, window), bad])
    assert capped.mu_slo_per_s == pytest.approx(bad.achieved_per_s) and bad.achieved_per_s < 1.5
    assert "capped at the" in capped.reason
    assert capped.prefill_tokens_per_s == pytest.approx(bad.achieved_per_s * bad.prefill_tokens_per_request)
    lower_bound = rate_result([ok])  # nothing failed: no μ_slo, only a lower bound
    assert lower_bound.mu_slo_per_s is None and "at least 0.5/s" in lower_bound.reason
    assert rate_result([bad]).mu_slo_per_s is None


def test_littles_law_check_explains_a_disagreement():
    assert little_check(8, 0.8, 9.5).consistent
    slo = little_check(8, 0.8, 5.0, slo_bound=True)
    assert not slo.consistent and "latency SLO binds below the knee" in slo.explanation
    high = little_check(4, 0.8, 10.0)
    assert not high.consistent and "more than the knee implies" in high.explanation
    assert "lower bound" in little_check(4, 0.8, 10.0, knee_reached=False).explanation


def test_rates_parse_and_bracket():
    assert parse_rates("2, 0.5,1") == (0.5, 1.0, 2.0)
    for bad in ("", "a,b", "0,1", "-1"):
        with pytest.raises(ValueError, match="requests/s"):
            parse_rates(bad)
    assert bracket_rates(8, 0.8) == (5.0, 7.0, 8.0, 9.0, 9.5, 10.0, 10.5, 11.0, 12.0, 13.5, 15.0)
    with pytest.raises(ValueError, match="positive"):
        bracket_rates(0, 1.0)
