"""`headroom probe --adapters`: the knee with LoRA adapters in the mix, on the simulator with 4
adapter slots (`headroom sim` in its own process, as tests/test_probe_sim.py).

The simulator's model (docs/simulator.md, "LoRA adapters"): with no more adapters than slots each
is loaded once and every later request is timed as without adapters, so the knee with 2 adapters
is the knee without (max_num_seqs 8); with 8 adapters over 4 slots a batch holds only the slots'
adapters' requests and loads repeat, so capacity falls: the knee is lower, or TTFT at it higher.
"""

from __future__ import annotations

import asyncio

import pytest
from support.processes import sim_process
from test_probe_sim import probe_sim

from collector.analysis.estimate import estimate_from_probe
from collector.analysis.render import print_estimate
from collector.terminal import output_console

# a real-time simulator: its knees are this machine's time to give (make test runs these alone)
pytestmark = [pytest.mark.subprocess, pytest.mark.serial]

NAMES = tuple(f"lora-{i}" for i in range(8))
SLOTS, SEQS, LEVELS = 4, 8, (1, 2, 4, 8, 16)


async def _three_probes(url: str):
    return [await probe_sim(url, levels=LEVELS, seed=3, adapters=NAMES[:n]) for n in (0, 2, 8)]


def test_the_knee_with_adapters_within_the_slots_is_the_knee_without_and_past_them_lower(capsys):
    flags = dict(max_num_seqs=SEQS, lora_adapters=",".join(NAMES), max_loras=SLOTS, seed=5, speed=1)
    with sim_process(**flags) as url:
        plain, calm, thrash = asyncio.run(_three_probes(url))
    estimates = [estimate_from_probe(result) for result in (plain, calm, thrash)]
    knees = [e.knee for e in estimates]
    assert all(k.reached for k in knees[:2]), knees

    # every request named an adapter in turn; the rows are the base model's, with the adapter
    for result, count in ((plain, 0), (calm, 2), (thrash, 8)):
        rows = [row for level in result.levels for row in level.rows]
        assert {row["model"] for row in rows} == {"headroom-sim"}
        assert {row["adapter"] for row in rows} == (set(NAMES[:count]) if count else {None})
        assert result.adapters == NAMES[:count]
    assert [e.to_dict().get("adapters") for e in estimates] == [None, 2, 8]

    assert knees[1].requests == knees[0].requests == SEQS, knees  # within the slots: nothing changes

    def ttft_at(estimate, level: int) -> float:
        return next(s.ttft_p95_s for s in estimate.levels if s.concurrency == level)

    # past the slots: 8 requests in flight name 8 different adapters (in turn), a batch holds the
    # 4 slots' adapters' requests, so throughput stops rising at the slots (measured: knee 4, p95
    # TTFT at 8 ~17x the plain run's); the knee is lower, or at least TTFT at the knee is higher
    knee, table = knees[0].requests, [(s.concurrency, s.ttft_p95_s) for s in estimates[2].levels]
    lower = not knees[2].reached or knees[2].requests < knee
    assert lower or ttft_at(estimates[2], knee) > 2 * ttft_at(estimates[0], knee), (knees, table)
    assert knees[2].requests <= SLOTS, (knees, table)

    print_estimate(estimates[2], output_console())
    assert "measured with 8 LoRA adapters in the mix" in capsys.readouterr().out
